/* Completion and CM event channels in an event loop, through the libraries' C API:
 * made non-blocking with fcntl, an empty channel fails with EAGAIN at once (rdma-core reads
 * the fd), poll(2) reports it readable when an event is there, and the event is then
 * returned. Prints "ok" and exits 0, or names the check that failed and exits 1. */
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include "common.h"

static double ms_since(struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

int main(void) {
    struct timespec t0;
    alarm(20); /* a call that blocks instead of failing ends the test, not the suite */

    /* A completion channel. */
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0], "ibv_get_device_list gives a device");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device");
    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch, "ibv_create_comp_channel");
    struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, ch, 0);
    CHECK(cq, "ibv_create_cq on the channel");
    CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl O_NONBLOCK (comp channel)");
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    errno = 0;
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
          "ibv_get_cq_event on an empty non-blocking channel fails with EAGAIN");
    CHECK(ms_since(&t0) < 100, "... at once");
    struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
    CHECK(poll(&pfd, 1, 0) == 0, "poll: an empty completion channel is not readable");
    CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(ch) == 0, "destroying the CQ and channel");

    /* The asynchronous event queue likewise. */
    CHECK(fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl O_NONBLOCK (async_fd)");
    struct ibv_async_event aev;
    errno = 0;
    CHECK(ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN, "ibv_get_async_event on an empty queue: EAGAIN");
    pfd.fd = ctx->async_fd;
    CHECK(poll(&pfd, 1, 0) == 0, "poll: an empty async_fd is not readable");

    /* A CM event channel: address resolution to 127.0.0.1 raises ADDR_RESOLVED. */
    struct rdma_event_channel *ech = rdma_create_event_channel();
    CHECK(ech, "rdma_create_event_channel");
    CHECK(fcntl(ech->fd, F_SETFL, fcntl(ech->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl O_NONBLOCK (event channel)");
    struct rdma_cm_event *ev;
    errno = 0;
    CHECK(rdma_get_cm_event(ech, &ev) == -1 && errno == EAGAIN,
          "rdma_get_cm_event on an empty non-blocking channel fails with EAGAIN");
    struct rdma_cm_id *id;
    CHECK(rdma_create_id(ech, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(7999), .sin_addr.s_addr = htonl(0x7f000001)};
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr 127.0.0.1");
    pfd.fd = ech->fd;
    CHECK(poll(&pfd, 1, 2000) == 1 && (pfd.revents & POLLIN), "poll: the event channel turns readable");
    CHECK(rdma_get_cm_event(ech, &ev) == 0, "rdma_get_cm_event after poll");
    CHECK(ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == id, "the event is ADDR_RESOLVED for the ID");
    CHECK(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event");
    CHECK(poll(&pfd, 1, 0) == 0, "poll: the channel is not readable once its last event is taken");
    errno = 0;
    CHECK(rdma_get_cm_event(ech, &ev) == -1 && errno == EAGAIN, "then the channel is empty again: EAGAIN");
    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    rdma_destroy_event_channel(ech);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    printf("ok\n");
    return 0;
}
