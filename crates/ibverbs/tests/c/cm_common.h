/* What the rdma_cm C tests share, besides common.h. */
#ifndef SOFTRDMA_TEST_CM_COMMON_H
#define SOFTRDMA_TEST_CM_COMMON_H
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>

#include "common.h"

/* The next event of `ch`, which must be `type`: its ID (for CONNECT_REQUEST, the new one),
 * or NULL having said what came instead. */
static inline struct rdma_cm_id *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type) {
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev))
        return NULL;
    struct rdma_cm_id *id = ev->event == type ? ev->id : NULL;
    if (!id)
        fprintf(stderr, "got %s (status %d), expected %s\n", rdma_event_str(ev->event), ev->status,
                rdma_event_str(type));
    rdma_ack_cm_event(ev);
    return id;
}

/* 127.0.0.1:`port`. */
static inline struct sockaddr_in loopback_addr(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    return a;
}

/* A listener of `ch` on 127.0.0.1:`port` in *id; 0, or nonzero having said what failed. */
static inline int listen_loopback(struct rdma_event_channel *ch, int port, struct rdma_cm_id **id) {
    struct sockaddr_in addr = loopback_addr(port);
    CHECK(rdma_create_id(ch, id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (listener)");
    CHECK(rdma_bind_addr(*id, (struct sockaddr *)&addr) == 0 && rdma_listen(*id, 1) == 0, "listening");
    return 0;
}

/* An RC QP of 4 WRs each way, one SGE, on `id` (its own CQs, the ID's PD). */
static inline int create_rc_qp(struct rdma_cm_id *id) {
    /* A fresh attr each time: rdma_create_qp writes the CQs it made into it. */
    struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp");
    return 0;
}

/* Client ID `id` of `ch` resolved (address, then route) to 127.0.0.1:`port`, with an RC
 * QP, and connecting. */
static inline int connect_loopback(struct rdma_event_channel *ch, struct rdma_cm_id *id, int port) {
    struct sockaddr_in addr = loopback_addr(port);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0, "rdma_resolve_addr");
    CHECK(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED) == id, "ADDR_RESOLVED");
    CHECK(rdma_resolve_route(id, 2000) == 0 && expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED) == id, "ROUTE_RESOLVED");
    if (create_rc_qp(id))
        return 1;
    CHECK(rdma_connect(id, NULL) == 0, "rdma_connect");
    return 0;
}

/* The CONNECT_REQUEST that comes next on `ch`: its ID in *server, with an RC QP. */
static inline int take_request(struct rdma_event_channel *ch, struct rdma_cm_id **server) {
    *server = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(*server, "CONNECT_REQUEST");
    return create_rc_qp(*server);
}

/* Both sides' ESTABLISHED on `ch`, in either order. */
static inline int both_established(struct rdma_event_channel *ch) {
    for (int i = 0; i < 2; i++)
        CHECK(expect(ch, RDMA_CM_EVENT_ESTABLISHED), "ESTABLISHED");
    return 0;
}
#endif
