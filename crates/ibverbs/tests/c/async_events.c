/* Asynchronous events name their object (ibv_get_async_event(3): element.cq, element.srq,
 * element.qp): an SRQ whose limit is armed reports IBV_EVENT_SRQ_LIMIT_REACHED for itself
 * when receives consumed take it below the limit; a CQ that overflows reports
 * IBV_EVENT_CQ_ERR for itself. Prints "ok" and exits 0, or names the failed check. */
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

int main(void) {
    alarm(20); /* an event that never comes ends the test, not the suite */
    struct ibv_context *ctx;
    union ibv_gid gid;
    struct ibv_pd *pd;
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    struct ibv_cq *small = ibv_create_cq(ctx, 2, NULL, NULL, 0);
    CHECK(cq && small, "two CQs");
    char *mem = calloc(1, 4096);
    struct ibv_mr *mr = ibv_reg_mr(pd, mem, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(mr, "ibv_reg_mr");
    struct ibv_srq_init_attr sa = {.attr = {.max_wr = 8, .max_sge = 1}};
    struct ibv_srq *srq = ibv_create_srq(pd, &sa);
    CHECK(srq, "ibv_create_srq");

    /* A sends from a QP whose send CQ is the small one; B receives through the SRQ. */
    struct ibv_qp_init_attr ia = {.send_cq = small, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *a = ibv_create_qp(pd, &ia);
    struct ibv_qp_init_attr ib = {.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 16, .max_send_sge = 1}};
    struct ibv_qp *b = ibv_create_qp(pd, &ib);
    CHECK(a && b, "two RC QPs");
    CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0, "connecting the QPs");

    struct ibv_sge rsge = {.addr = (uintptr_t)(mem + 1024), .length = 64, .lkey = mr->lkey};
    struct ibv_recv_wr rwr = {.sg_list = &rsge, .num_sge = 1}, *bad_rwr;
    for (int i = 0; i < 3; i++)
        CHECK(ibv_post_srq_recv(srq, &rwr, &bad_rwr) == 0, "ibv_post_srq_recv");
    struct ibv_srq_attr limit = {.srq_limit = 2};
    CHECK(ibv_modify_srq(srq, &limit, IBV_SRQ_LIMIT) == 0, "arming the SRQ limit at 2");

    /* Two SENDs take the SRQ from 3 to 1 receives: below the limit. */
    struct ibv_sge sge = {.addr = (uintptr_t)mem, .length = 8, .lkey = mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND}, *bad;
    for (int i = 0; i < 2; i++)
        CHECK(ibv_post_send(a, &wr, &bad) == 0, "ibv_post_send (unsignaled SEND)");
    struct ibv_wc wc[4];
    CHECK(completions(cq, 2, wc) == 2, "B receives both");
    struct ibv_async_event ev;
    CHECK(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
    CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED, "the event is IBV_EVENT_SRQ_LIMIT_REACHED");
    CHECK(ev.element.srq == srq, "... and names the SRQ");
    ibv_ack_async_event(&ev);

    /* More signaled WRITEs than the small CQ holds, none polled: it overflows. */
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)(mem + 2048);
    wr.wr.rdma.rkey = mr->rkey;
    for (int i = 0; i < small->cqe + 2; i++)
        CHECK(ibv_post_send(a, &wr, &bad) == 0, "ibv_post_send (signaled WRITE)");
    do
        CHECK(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
    while (ev.event_type != IBV_EVENT_CQ_ERR && (ibv_ack_async_event(&ev), 1));
    CHECK(ev.element.cq == small, "IBV_EVENT_CQ_ERR names the CQ that overflowed");
    ibv_ack_async_event(&ev);
    printf("ok\n");
    return 0;
}
