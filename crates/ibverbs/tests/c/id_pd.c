/* An rdma_cm_id bound to a device carries that device's protection domain in id->pd, as
 * librdmacm gives every ID its device's (cma_device.pd): one per device, the same for every
 * ID. UCX's rdmacm transport creates a UD QP in it to reserve a QPN for the connection, and
 * failed with EINVAL on a NULL PD. rdma_create_qp with a NULL PD uses it. Prints "ok". */
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include "common.h"

static int resolved(struct rdma_event_channel *ch, struct rdma_cm_id *id) {
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(7998), .sin_addr.s_addr = htonl(0x7f000001)};
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000))
        return -1;
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev))
        return -1;
    int ok = ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == id;
    rdma_ack_cm_event(ev);
    return ok ? 0 : -1;
}

int main(void) {
    alarm(20);
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *a, *b;
    CHECK(rdma_create_id(ch, &a, NULL, RDMA_PS_TCP) == 0 && rdma_create_id(ch, &b, NULL, RDMA_PS_TCP) == 0,
          "rdma_create_id, twice");
    CHECK(resolved(ch, a) == 0 && resolved(ch, b) == 0, "both IDs resolve 127.0.0.1");
    CHECK(a->verbs && a->verbs == b->verbs, "both IDs name the device's context");
    CHECK(a->pd, "a resolved ID has its device's PD in id->pd");
    CHECK(a->pd == b->pd && a->pd->context == a->verbs, "... one per device, of its context");

    /* What UCX does with it: a UD QP in id->pd, on a CQ of id->verbs. */
    struct ibv_cq *cq = ibv_create_cq(a->verbs, 1, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq on id->verbs");
    struct ibv_qp_init_attr ud = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
                                  .cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(a->pd, &ud);
    CHECK(qp && qp->pd == a->pd, "ibv_create_qp (UD) in id->pd");

    struct ibv_qp_init_attr rc = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1}};
    CHECK(rdma_create_qp(b, NULL, &rc) == 0, "rdma_create_qp with a NULL PD");
    CHECK(b->qp->pd == b->pd, "... makes the QP in id->pd");
    rdma_destroy_qp(b);
    CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(cq) == 0, "destroying the UD QP and its CQ");
    CHECK(rdma_destroy_id(a) == 0 && rdma_destroy_id(b) == 0, "rdma_destroy_id");
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
