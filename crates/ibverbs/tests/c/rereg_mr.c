/* ibv_rereg_mr: new access rights take effect with the keys kept (an RDMA WRITE that the
 * old rights allowed fails with a remote access error once REMOTE_WRITE is gone, and a
 * fresh pair's WRITE succeeds once it is back); a new PD (a QP of the old one meets a
 * remote access error) and a new range (the WRITE lands in the new memory, the old is
 * untouched) take effect too, and ibv_mr says so; input errors as libibverbs's (EINVAL).
 * Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

/* A fresh connected pair; WRITEs 64 bytes of `src` to `dst`; the send's status, or -1. */
static int write_status(struct ibv_mr *src, struct ibv_mr *dst) {
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *a = ibv_create_qp(pd, &init), *b = ibv_create_qp(pd, &init);
    if (!a || !b || connect_qp(a, b->qp_num, &gid) || connect_qp(b, a->qp_num, &gid))
        return -1;
    struct ibv_sge sge = {.addr = (uintptr_t)src->addr, .length = 64, .lkey = src->lkey};
    struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    wr.wr.rdma.remote_addr = (uintptr_t)dst->addr;
    wr.wr.rdma.rkey = dst->rkey;
    if (ibv_post_send(a, &wr, &bad))
        return -1;
    struct ibv_wc wc;
    for (int i = 0; i < 2000000; i++) {
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0)
            return -1;
        if (n == 1 && wc.wr_id == 1) {
            while (ibv_poll_cq(cq, 1, &wc) > 0) { /* flushes of the pair, if any */ }
            ibv_destroy_qp(a);
            ibv_destroy_qp(b);
            return n == 1 ? (int)wc.status : -1;
        }
        usleep(1);
    }
    return -1;
}

int main(void) {
    alarm(20);
    if (open_first(&ctx, &gid, &pd))
        return 1;
    cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    char *a = calloc(1, 4096), *b = calloc(1, 4096);
    struct ibv_mr *src = ibv_reg_mr(pd, a, 4096, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *dst = ibv_reg_mr(pd, b, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(src && dst, "ibv_reg_mr");
    uint32_t lkey = dst->lkey, rkey = dst->rkey;
    CHECK(ibv_rereg_mr(dst, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "no flag: EINVAL");
    CHECK(ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
          "a PD change without a PD: EINVAL");
    CHECK(ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 4096, 0) == IBV_REREG_MR_ERR_INPUT &&
              errno == EINVAL,
          "a translation without an address: EINVAL");
    CHECK(write_status(src, dst) == IBV_WC_SUCCESS, "a WRITE with REMOTE_WRITE");

    /* Another PD: a QP of the old PD may no longer reach it; back, it may. */
    struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
    CHECK(pd2, "ibv_alloc_pd (a second)");
    CHECK(ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0 && dst->pd == pd2, "rereg to another PD");
    CHECK(dst->lkey == lkey && dst->rkey == rkey, "the keys stay");
    CHECK(write_status(src, dst) == IBV_WC_REM_ACCESS_ERR, "a WRITE from a QP of the old PD: remote access error");
    CHECK(ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0 && dst->pd == pd, "rereg back to the PD");
    CHECK(write_status(src, dst) == IBV_WC_SUCCESS, "a WRITE once it is back");

    /* Another range: the WRITE lands in the new memory. */
    char *c = calloc(1, 4096);
    memset(a, 'x', 64);
    memset(b, 0, 4096);
    CHECK(ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, c, 4096, 0) == 0 && dst->addr == c &&
              dst->length == 4096,
          "rereg to another range");
    CHECK(write_status(src, dst) == IBV_WC_SUCCESS && memcmp(c, a, 64) == 0, "a WRITE lands in the new range");
    CHECK(b[0] == 0, "the old range is untouched");
    CHECK(ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) ==
              0,
          "rereg to LOCAL_WRITE | REMOTE_READ");
    CHECK(dst->lkey == lkey && dst->rkey == rkey, "the keys stay");
    CHECK(write_status(src, dst) == IBV_WC_REM_ACCESS_ERR, "a WRITE without REMOTE_WRITE: remote access error");
    CHECK(ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) ==
              0,
          "rereg to LOCAL_WRITE | REMOTE_WRITE");
    CHECK(write_status(src, dst) == IBV_WC_SUCCESS, "a WRITE with REMOTE_WRITE again");
    printf("ok\n");
    return 0;
}
