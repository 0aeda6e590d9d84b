/* ibv_resize_cq: a CQ grows (cq->cqe says its new size) and its new room is real: an RC QP
 * connected to itself completes more SENDs and receives than the old size held, with no CQ
 * error; a size of 0, or below the completions it holds, is EINVAL, and those completions
 * stay. It answered EOPNOTSUPP. Prints "ok" and exits 0, or names the failed check and
 * exits 1. */
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>

#include "common.h"

enum { N = 8 };

/* Posts N receives and N signaled SENDs of 8 bytes on `qp`. */
static int post_round(struct ibv_qp *qp, struct ibv_mr *mr, char *buf) {
    for (int i = 0; i < N; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)buf + 32, .length = 8, .lkey = mr->lkey};
        struct ibv_recv_wr rwr = {.wr_id = 100 + i, .sg_list = &sge, .num_sge = 1}, *bad_r;
        CHECK(ibv_post_recv(qp, &rwr, &bad_r) == 0, "ibv_post_recv");
    }
    for (int i = 0; i < N; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
        struct ibv_send_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;
        CHECK(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send");
    }
    return 0;
}

int main(void) {
    struct ibv_context *ctx;
    union ibv_gid gid;
    struct ibv_pd *pd;
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_cq *cq = ibv_create_cq(ctx, 2, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    CHECK(ibv_resize_cq(cq, 0) == EINVAL, "a size of 0 is EINVAL");
    CHECK(ibv_resize_cq(cq, 4 * N) == 0 && cq->cqe >= 4 * N, "grown to 4N, and cq->cqe says so");

    static char buf[64] = "resized";
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr");
    struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = N, .max_recv_wr = N, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(pd, &qa);
    CHECK(qp && connect_qp(qp, qp->qp_num, &gid) == 0, "an RC QP connected to itself");

    /* 2N completions in a CQ made for 2: all of them, all successful. */
    struct ibv_wc wc[2 * N];
    CHECK(post_round(qp, mr, buf) == 0, "the first round");
    CHECK(completions(cq, 2 * N, wc) == 2 * N, "2N completions in the grown CQ");

    /* Again, left in the CQ: shrinking below them fails and loses none. */
    CHECK(post_round(qp, mr, buf) == 0, "the second round");
    usleep(200 * 1000);
    CHECK(ibv_resize_cq(cq, 1) == EINVAL, "below the completions held is EINVAL");
    CHECK(ibv_resize_cq(cq, 2 * N) == 0 && cq->cqe >= 2 * N, "shrunk to what it holds");
    CHECK(completions(cq, 2 * N, wc) == 2 * N, "the completions held are all there");

    struct ibv_async_event ev;
    CHECK(ibv_destroy_qp(qp) == 0 && ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0, "cleanup");
    /* No CQ error was raised on the way. */
    int flags = fcntl(ctx->async_fd, F_GETFL);
    fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
    CHECK(ibv_get_async_event(ctx, &ev) != 0, "no asynchronous event (no CQ overflow)");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "closing");
    printf("ok\n");
    return 0;
}
