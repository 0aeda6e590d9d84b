/* The librdmacm behaviour libfabric's verbs provider builds on, in one process over
 * 127.0.0.1:
 * - rdma_get_devices lists the connection manager's contexts (an ID's id->verbs is one
 *   of them), NULL-terminated, their number in *num_devices;
 * - rdma_bind_addr to a loopback address succeeds with no device (id->verbs NULL), as
 *   the kernel's does; rdma_resolve_addr then gives the ID its device;
 * - rdma_getaddrinfo with no node and no service takes the hints' addresses;
 * - rdma_connect and rdma_accept take 0xff (RDMA_MAX_INIT_DEPTH, RDMA_MAX_RESP_RES) as the
 *   device's maximum, and refuse another value past it with EINVAL.
 * Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type, struct rdma_cm_id **id) {
    struct rdma_cm_event *ev;
    CHECK(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
    if (ev->event != type) {
        fprintf(stderr, "FAILED: expected %s, got %s (status %d)\n", rdma_event_str(type), rdma_event_str(ev->event),
                ev->status);
        return 1;
    }
    if (id)
        *id = ev->id;
    CHECK(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event");
    return 0;
}

int main(int argc, char **argv) {
    alarm(20);
    int port = argc > 1 ? atoi(argv[1]) : 7000 + getpid() % 1000;
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

    /* rdma_getaddrinfo(NULL, NULL, hints): the hints' destination. */
    struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP, .ai_dst_addr = (struct sockaddr *)&lo,
                                  .ai_dst_len = sizeof lo}, *rai;
    CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &rai) == 0, "rdma_getaddrinfo(NULL, NULL, hints with a destination)");
    CHECK(rai->ai_dst_addr && memcmp(rai->ai_dst_addr, &lo, sizeof lo) == 0, "the hints' destination in ai_dst_addr");
    rdma_freeaddrinfo(rai);
    struct rdma_addrinfo nothing = {.ai_port_space = RDMA_PS_TCP};
    CHECK(rdma_getaddrinfo(NULL, NULL, &nothing, &rai) != 0, "rdma_getaddrinfo with no node, service or destination fails");

    /* A listener bound to 127.0.0.1 has no device. */
    struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
    CHECK(sch && cch, "rdma_create_event_channel");
    struct rdma_cm_id *listener, *client, *server;
    CHECK(rdma_create_id(sch, &listener, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_bind_addr(listener, (struct sockaddr *)&lo) == 0, "rdma_bind_addr to 127.0.0.1");
    CHECK(listener->verbs == NULL, "id->verbs is NULL after rdma_bind_addr to 127.0.0.1");
    CHECK(rdma_listen(listener, 1) == 0, "rdma_listen");

    /* The client resolves 127.0.0.1: its id->verbs is one of rdma_get_devices'. */
    CHECK(rdma_create_id(cch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (client)");
    CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&lo, 2000) == 0, "rdma_resolve_addr");
    if (expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL))
        return 1;
    CHECK(client->verbs != NULL, "id->verbs after rdma_resolve_addr");
    int n = -1, found = 0;
    struct ibv_context **list = rdma_get_devices(&n);
    CHECK(list && n >= 1, "rdma_get_devices lists a device");
    CHECK(list[n] == NULL, "rdma_get_devices' list ends with NULL");
    for (int i = 0; i < n; i++) {
        CHECK(list[i] && list[i]->device, "a context of rdma_get_devices");
        found |= list[i] == client->verbs;
    }
    CHECK(found, "the client's id->verbs is among rdma_get_devices' contexts");
    rdma_free_devices(list);
    CHECK(rdma_get_devices(NULL) != NULL, "rdma_get_devices(NULL)");

    struct ibv_device_attr attr;
    CHECK(ibv_query_device(client->verbs, &attr) == 0, "ibv_query_device");
    CHECK(rdma_resolve_route(client, 2000) == 0, "rdma_resolve_route");
    if (expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL))
        return 1;
    struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
                                  .qp_type = IBV_QPT_RC};
    CHECK(rdma_create_qp(client, NULL, &qa) == 0, "rdma_create_qp (client)");

    /* A depth past the device's maximum is refused; 0xff is the maximum. */
    if (attr.max_qp_rd_atom < 0xfe) {
        struct rdma_conn_param too_many = {.responder_resources = attr.max_qp_rd_atom + 1, .initiator_depth = 1};
        errno = 0;
        CHECK(rdma_connect(client, &too_many) != 0 && errno == EINVAL, "rdma_connect past max_qp_rd_atom is EINVAL");
    }
    struct rdma_conn_param max = {.responder_resources = RDMA_MAX_RESP_RES, .initiator_depth = RDMA_MAX_INIT_DEPTH,
                                  .retry_count = 7, .rnr_retry_count = 7};
    CHECK(rdma_connect(client, &max) == 0, "rdma_connect with RDMA_MAX_RESP_RES and RDMA_MAX_INIT_DEPTH");
    if (expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &server))
        return 1;
    CHECK(server->verbs != NULL, "the request's id->verbs");
    CHECK(rdma_create_qp(server, NULL, &qa) == 0, "rdma_create_qp (server)");
    CHECK(rdma_accept(server, &max) == 0, "rdma_accept with RDMA_MAX_RESP_RES and RDMA_MAX_INIT_DEPTH");
    if (expect(cch, RDMA_CM_EVENT_ESTABLISHED, NULL) || expect(sch, RDMA_CM_EVENT_ESTABLISHED, NULL))
        return 1;
    struct ibv_qp_attr q;
    struct ibv_qp_init_attr qi;
    CHECK(ibv_query_qp(client->qp, &q, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &qi) == 0, "ibv_query_qp");
    CHECK(q.max_rd_atomic == attr.max_qp_init_rd_atom, "the client's READ depth is the device's maximum");
    CHECK(q.max_dest_rd_atomic == attr.max_qp_rd_atom, "the client's READ resources are the device's maximum");

    rdma_disconnect(client);
    rdma_destroy_qp(client);
    rdma_destroy_qp(server);
    rdma_destroy_id(client);
    rdma_destroy_id(server);
    rdma_destroy_id(listener);
    printf("ok\n");
    return 0;
}
