/* rdma_destroy_id waits until every event of the ID is acked (librdmacm's rule, and what
 * rping relies on: its main thread destroys the ID while its CM thread may still hold the
 * ID's last event, and reads event->id->context in it). A thread takes the ID's
 * ADDR_RESOLVED event and acks it 300 ms later; the main thread's rdma_destroy_id, called
 * meanwhile, must return only after the ack. A connect request's new ID counts against its
 * listener instead: rejecting and destroying the new ID before acking the request returns
 * at once. Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <netinet/in.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static struct rdma_event_channel *ch;
static atomic_int got, acked;

static void *taker(void *arg) {
    (void)arg;
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev) != 0 || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
        printf("FAIL: the taker's ADDR_RESOLVED\n");
        exit(1);
    }
    atomic_store(&got, 1);
    usleep(300 * 1000);
    /* The ID is still there: its context reads back. */
    if (ev->id->context != (void *)0x5eed) {
        printf("FAIL: the ID's context while its event is held\n");
        exit(1);
    }
    atomic_store(&acked, 1);
    rdma_ack_cm_event(ev);
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void) {
    alarm(20);
    ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *id;
    CHECK(rdma_create_id(ch, &id, (void *)0x5eed, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(7999), .sin_addr.s_addr = htonl(0x7f000001)};
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, taker, NULL) == 0, "pthread_create");
    while (!atomic_load(&got))
        usleep(1000);
    double start = now();
    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    CHECK(atomic_load(&acked), "rdma_destroy_id returned only after the event was acked");
    CHECK(now() - start > 0.2, "rdma_destroy_id waited for the ack");
    pthread_join(t, NULL);

    /* A listener, and a client that connects to it: the server rejects and destroys the new
     * ID before acking its CONNECT_REQUEST. */
    struct rdma_cm_id *listener, *client;
    CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (listener)");
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(0x7f000001)};
    CHECK(rdma_bind_addr(listener, (struct sockaddr *)&any) == 0, "rdma_bind_addr");
    CHECK(rdma_listen(listener, 1) == 0, "rdma_listen");
    dst.sin_port = rdma_get_src_port(listener);
    struct rdma_event_channel *cch = rdma_create_event_channel();
    CHECK(cch, "rdma_create_event_channel (client)");
    CHECK(rdma_create_id(cch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (client)");
    CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr (client)");
    struct rdma_cm_event *ev;
    CHECK(rdma_get_cm_event(cch, &ev) == 0 && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED, "ADDR_RESOLVED");
    rdma_ack_cm_event(ev);
    CHECK(rdma_resolve_route(client, 2000) == 0, "rdma_resolve_route");
    CHECK(rdma_get_cm_event(cch, &ev) == 0 && ev->event == RDMA_CM_EVENT_ROUTE_RESOLVED, "ROUTE_RESOLVED");
    rdma_ack_cm_event(ev);
    struct ibv_pd *pd = ibv_alloc_pd(client->verbs);
    CHECK(pd, "ibv_alloc_pd");
    struct ibv_cq *cq = ibv_create_cq(client->verbs, 4, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
    CHECK(rdma_create_qp(client, pd, &qa) == 0, "rdma_create_qp");
    struct rdma_conn_param cp = {.retry_count = 1};
    CHECK(rdma_connect(client, &cp) == 0, "rdma_connect");
    struct rdma_cm_event *req;
    CHECK(rdma_get_cm_event(ch, &req) == 0 && req->event == RDMA_CM_EVENT_CONNECT_REQUEST, "CONNECT_REQUEST");
    CHECK(req->listen_id == listener, "the request names its listener");
    CHECK(rdma_reject(req->id, NULL, 0) == 0, "rdma_reject");
    start = now();
    CHECK(rdma_destroy_id(req->id) == 0, "rdma_destroy_id (the request's new ID)");
    CHECK(now() - start < 0.2, "the new ID's destruction does not wait for its request's ack");
    rdma_ack_cm_event(req);
    CHECK(rdma_get_cm_event(cch, &ev) == 0 && ev->event == RDMA_CM_EVENT_REJECTED, "REJECTED");
    rdma_ack_cm_event(ev);
    rdma_destroy_qp(client);
    CHECK(rdma_destroy_id(client) == 0, "rdma_destroy_id (client)");
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    CHECK(rdma_destroy_id(listener) == 0, "rdma_destroy_id (listener)");
    rdma_destroy_event_channel(cch);
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
