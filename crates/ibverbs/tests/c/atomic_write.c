/* ATOMIC_WRITE (IBA 1.5) over the libraries, two RC QPs of one context connected to each
 * other: ibv_wr_atomic_write on a QP created with IBV_QP_EX_WITH_ATOMIC_WRITE, and
 * ibv_post_send with IBV_WR_ATOMIC_WRITE (its 8 bytes in the first SGE), each store 8 bytes
 * at an aligned remote address and complete with IBV_WC_ATOMIC_WRITE; a region without
 * REMOTE_WRITE is a remote access error; a UC QP cannot be created for it (EOPNOTSUPP).
 * Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

int main(void) {
    alarm(20);
    struct ibv_context *ctx;
    union ibv_gid gid;
    struct ibv_pd *pd;
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    struct ibv_qp_init_attr_ex xa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                     .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1},
                                     .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
                                     .send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE};
    struct ibv_qp *a = ibv_create_qp_ex(ctx, &xa), *b = ibv_create_qp_ex(ctx, &xa);
    CHECK(a && b, "ibv_create_qp_ex with IBV_QP_EX_WITH_ATOMIC_WRITE");
    CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0, "connecting them");
    uint64_t *target = aligned_alloc(4096, 4096), *ro = aligned_alloc(4096, 4096);
    memset(target, 0, 4096);
    struct ibv_mr *mr = ibv_reg_mr(pd, target, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_mr *rmr = ibv_reg_mr(pd, ro, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    CHECK(mr && rmr, "ibv_reg_mr");
    struct ibv_wc wc;

    struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(a);
    uint64_t v1 = 0x1122334455667788ull;
    ibv_wr_start(qx);
    qx->wr_id = 1;
    qx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(qx, mr->rkey, (uintptr_t)&target[3], &v1);
    v1 = 0; /* taken at the call */
    CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_atomic_write, ibv_wr_complete");
    CHECK(completions(cq, 1, &wc) == 1 && wc.wr_id == 1 && wc.opcode == IBV_WC_ATOMIC_WRITE, "IBV_WC_ATOMIC_WRITE");
    CHECK(target[3] == 0x1122334455667788ull, "the 8 bytes landed");

    uint64_t v2 = 0xa5a5a5a55a5a5a5aull;
    struct ibv_mr *src = ibv_reg_mr(pd, &v2, 8, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_sge sge = {.addr = (uintptr_t)&v2, .length = 8, .lkey = src ? src->lkey : 0};
    struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_WRITE,
                             .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {.remote_addr = (uintptr_t)&target[5], .rkey = mr->rkey}},
                       *bad;
    CHECK(src && ibv_post_send(a, &wr, &bad) == 0, "ibv_post_send IBV_WR_ATOMIC_WRITE");
    CHECK(completions(cq, 1, &wc) == 1 && wc.wr_id == 2 && target[5] == v2, "it landed");

    wr.wr_id = 3;
    wr.wr.rdma.remote_addr = (uintptr_t)ro;
    wr.wr.rdma.rkey = rmr->rkey;
    CHECK(ibv_post_send(a, &wr, &bad) == 0, "an ATOMIC_WRITE to a region without REMOTE_WRITE");
    int n = 0;
    for (int i = 0; i < 2000 && (n = ibv_poll_cq(cq, 1, &wc)) == 0; i++)
        usleep(1000);
    CHECK(n == 1 && wc.wr_id == 3 && wc.status == IBV_WC_REM_ACCESS_ERR, "a remote access error");

    xa.qp_type = IBV_QPT_UC;
    errno = 0;
    CHECK(!ibv_create_qp_ex(ctx, &xa) && errno == EOPNOTSUPP, "a UC QP for ATOMIC_WRITE: EOPNOTSUPP");
    printf("ok\n");
    return 0;
}
