/* Memory windows through the C API, as rxe offers them: ibv_query_device reports them
 * (IBV_DEVICE_MEM_WINDOW, IBV_DEVICE_MEM_WINDOW_TYPE_2B, max_mw; ibv_query_device_ex's
 * device_cap_flags_ex too); ibv_alloc_mw of type 1 and 2 (another type: EINVAL); a type 1
 * window bound by ibv_bind_mw (its rkey moved on at once, ibv_inc_rkey), unbound by a bind
 * of length 0; a type 2 window bound by an IBV_WR_BIND_MW work request and by
 * ibv_wr_bind_mw, freed by IBV_WR_SEND_WITH_INV and ibv_wr_send_inv (the receive says
 * IBV_WC_WITH_INV and invalidated_rkey) and by ibv_wr_local_inv; a region with no remote
 * right reached only through its windows, within their bounds and rights; ibv_dereg_mr
 * refusing a region with a window bound (EINVAL); the errors rxe gives (IBV_WC_MW_BIND_ERR,
 * IBV_WC_LOC_QP_OP_ERR, IBV_WC_REM_ACCESS_ERR). Two RC QPs of one context, connected to
 * each other. Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

/* An RC QP with the ibv_wr_* operations memory windows use. */
static struct ibv_qp *new_qp(void) {
    struct ibv_qp_init_attr_ex ax = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                     .cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 2,
                                             .max_recv_sge = 2, .max_inline_data = 64},
                                     .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                     .pd = pd,
                                     .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
                                                       IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |
                                                       IBV_QP_EX_WITH_SEND_WITH_INV};
    return ibv_create_qp_ex(ctx, &ax);
}

/* One completion (any status) within 2 s, into *wc; 1, or 0 if none came. */
static int one(struct ibv_wc *wc) {
    for (int i = 0; i < 2000; i++) {
        int k = ibv_poll_cq(cq, 1, wc);
        if (k)
            return k == 1;
        usleep(1000);
    }
    return 0;
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode opcode, uint64_t wr_id, struct ibv_sge *sge, uint32_t rkey,
                uint64_t remote_addr) {
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = sge, .num_sge = sge ? 1 : 0, .opcode = opcode,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    if (opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_READ) {
        wr.wr.rdma.rkey = rkey;
        wr.wr.rdma.remote_addr = remote_addr;
    } else {
        wr.invalidate_rkey = rkey;
    }
    return ibv_post_send(qp, &wr, &bad);
}

int main(void) {
    alarm(20); /* a call that blocks instead of failing ends the test, not the suite */
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_device_attr attr;
    CHECK(ibv_query_device(ctx, &attr) == 0, "ibv_query_device");
    CHECK((attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW) && (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
          "IBV_DEVICE_MEM_WINDOW and IBV_DEVICE_MEM_WINDOW_TYPE_2B");
    CHECK(attr.max_mw > 0, "max_mw");
    struct ibv_device_attr_ex ex;
    CHECK(ibv_query_device_ex(ctx, NULL, &ex) == 0 && ex.device_cap_flags_ex == attr.device_cap_flags,
          "device_cap_flags_ex says the same");
    cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    char *mem = aligned_alloc(4096, 8192);
    memset(mem, 0, 8192);
    char *local = mem, *target = mem + 4096;
    struct ibv_mr *mr = ibv_reg_mr(pd, local, 4096, IBV_ACCESS_LOCAL_WRITE);
    /* The windows' region: it binds windows, and gives no remote right of its own. */
    struct ibv_mr *wmr = ibv_reg_mr(pd, target, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    CHECK(mr && wmr, "ibv_reg_mr");
    struct ibv_qp *a = new_qp(), *b = new_qp();
    CHECK(a && b, "ibv_create_qp_ex with BIND_MW, LOCAL_INV and SEND_WITH_INV");
    CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0, "connecting the QPs");
    struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a), *bx = ibv_qp_to_qp_ex(b);
    struct ibv_wc wc;

    errno = 0;
    CHECK(ibv_alloc_mw(pd, 3) == NULL && errno == EINVAL, "a window of type 3: EINVAL");
    struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1), *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(mw1 && mw2, "ibv_alloc_mw of type 1 and type 2");
    CHECK(mw1->type == IBV_MW_TYPE_1 && mw2->type == IBV_MW_TYPE_2 && mw1->pd == pd && mw1->context == ctx,
          "the windows' fields");
    CHECK(mw1->rkey != mw2->rkey && mw1->rkey != wmr->rkey, "distinct R_Keys");

    /* Type 1: ibv_bind_mw. */
    struct ibv_mw_bind bind = {.wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
                               .bind_info = {.mr = wmr, .addr = (uintptr_t)(target + 64), .length = 64,
                                             .mw_access_flags = IBV_ACCESS_REMOTE_WRITE}};
    uint32_t old = mw1->rkey;
    CHECK(ibv_bind_mw(b, mw2, &bind) == EINVAL, "ibv_bind_mw of a type 2 window: EINVAL");
    bind.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
    CHECK(ibv_bind_mw(b, mw1, &bind) == EINVAL, "a zero-based type 1 window: EINVAL");
    bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    CHECK(ibv_bind_mw(b, mw1, &bind) == 0, "ibv_bind_mw");
    CHECK(mw1->rkey == ibv_inc_rkey(old), "mw->rkey moved on at once");
    CHECK(one(&wc) && wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW,
          "IBV_WC_BIND_MW");
    strcpy(local, "through window 1");
    struct ibv_sge sge = {.addr = (uintptr_t)local, .length = 17, .lkey = mr->lkey};
    CHECK(post(a, IBV_WR_RDMA_WRITE, 2, &sge, mw1->rkey, (uintptr_t)(target + 64)) == 0, "WRITE through it");
    CHECK(one(&wc) && wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS, "the WRITE completes");
    CHECK(strcmp(target + 64, "through window 1") == 0, "and landed");
    errno = 0;
    CHECK(ibv_dereg_mr(wmr) == EINVAL, "ibv_dereg_mr of a region with a window bound: EINVAL");

    /* Type 2: IBV_WR_BIND_MW, READ through it, SEND_WITH_INV gives it back. */
    struct ibv_send_wr wr = {.wr_id = 3, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED}, *bad;
    wr.bind_mw.mw = mw2;
    wr.bind_mw.rkey = ibv_inc_rkey(mw2->rkey);
    wr.bind_mw.bind_info = (struct ibv_mw_bind_info){.mr = wmr, .addr = (uintptr_t)(target + 1024), .length = 128,
                                                     .mw_access_flags = IBV_ACCESS_REMOTE_READ};
    CHECK(ibv_post_send(b, &wr, &bad) == 0, "IBV_WR_BIND_MW");
    CHECK(one(&wc) && wc.wr_id == 3 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW,
          "the bind completes");
    uint32_t k2 = wr.bind_mw.rkey;
    strcpy(target + 1024, "read through window 2");
    sge.addr = (uintptr_t)(local + 512);
    sge.length = 22;
    CHECK(post(a, IBV_WR_RDMA_READ, 4, &sge, k2, (uintptr_t)(target + 1024)) == 0, "READ through it");
    CHECK(one(&wc) && wc.wr_id == 4 && wc.status == IBV_WC_SUCCESS, "the READ completes");
    CHECK(strcmp(local + 512, "read through window 2") == 0, "with the window's bytes");
    struct ibv_sge rsge = {.addr = (uintptr_t)(local + 2048), .length = 64, .lkey = mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 5, .sg_list = &rsge, .num_sge = 1}, *rbad;
    CHECK(ibv_post_recv(b, &rwr, &rbad) == 0, "ibv_post_recv");
    strcpy(local, "given back");
    sge.addr = (uintptr_t)local;
    sge.length = 10;
    CHECK(post(a, IBV_WR_SEND_WITH_INV, 6, &sge, k2, 0) == 0, "IBV_WR_SEND_WITH_INV");
    struct ibv_wc two[2];
    CHECK(one(&two[0]) && one(&two[1]), "two completions");
    struct ibv_wc *recv = two[0].wr_id == 5 ? &two[0] : &two[1], *send = two[0].wr_id == 5 ? &two[1] : &two[0];
    CHECK(send->wr_id == 6 && send->status == IBV_WC_SUCCESS && send->opcode == IBV_WC_SEND, "the send: IBV_WC_SEND");
    CHECK(recv->status == IBV_WC_SUCCESS && recv->opcode == IBV_WC_RECV && recv->byte_len == 10,
          "the receive: IBV_WC_RECV");
    CHECK((recv->wc_flags & IBV_WC_WITH_INV) && !(recv->wc_flags & IBV_WC_WITH_IMM) && recv->invalidated_rkey == k2,
          "IBV_WC_WITH_INV and invalidated_rkey");

    /* Type 2 again: free, so ibv_wr_bind_mw binds it (a new key), ibv_wr_local_inv frees it. */
    ibv_wr_start(bx);
    bx->wr_id = 7;
    bx->wr_flags = IBV_SEND_SIGNALED;
    struct ibv_mw_bind_info info = {.mr = wmr, .addr = (uintptr_t)(target + 2048), .length = 32,
                                    .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};
    uint32_t k3 = ibv_inc_rkey(k2);
    ibv_wr_bind_mw(bx, mw2, k3, &info);
    bx->wr_id = 8;
    ibv_wr_local_inv(bx, k3);
    CHECK(ibv_wr_complete(bx) == 0, "ibv_wr_bind_mw, ibv_wr_local_inv");
    CHECK(one(&wc) && wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "bound");
    CHECK(one(&wc) && wc.wr_id == 8 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV,
          "IBV_WC_LOCAL_INV");
    /* ... and once more, for ibv_wr_send_inv from the peer. */
    ibv_wr_start(bx);
    bx->wr_id = 9;
    uint32_t k4 = ibv_inc_rkey(k3);
    ibv_wr_bind_mw(bx, mw2, k4, &info);
    CHECK(ibv_wr_complete(bx) == 0 && one(&wc) && wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS, "bound again");
    CHECK(ibv_post_recv(b, &rwr, &rbad) == 0, "ibv_post_recv");
    ibv_wr_start(ax);
    ax->wr_id = 10;
    ax->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send_inv(ax, k4);
    ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)local, 10);
    CHECK(ibv_wr_complete(ax) == 0, "ibv_wr_send_inv");
    CHECK(one(&two[0]) && one(&two[1]), "two completions");
    recv = two[0].wr_id == 5 ? &two[0] : &two[1];
    CHECK(recv->status == IBV_WC_SUCCESS && (recv->wc_flags & IBV_WC_WITH_INV) && recv->invalidated_rkey == k4,
          "invalidated by ibv_wr_send_inv");

    /* Type 1 unbound by a bind of length 0: the region can go then. */
    bind.wr_id = 11;
    bind.bind_info.length = 0;
    bind.bind_info.addr = 0;
    CHECK(ibv_bind_mw(b, mw1, &bind) == 0 && one(&wc) && wc.wr_id == 11 && wc.status == IBV_WC_SUCCESS,
          "a bind of length 0");
    uint32_t k1 = mw1->rkey;

    /* Errors, each failing its QP: a WRITE through the unbound window (REM_ACCESS_ERR),
     * a LOCAL_INV of a type 1 window (LOC_QP_OP_ERR), a bind to a region that does not
     * allow binding (MW_BIND_ERR). */
    CHECK(post(a, IBV_WR_RDMA_WRITE, 12, &sge, k1, (uintptr_t)(target + 64)) == 0, "WRITE through nothing");
    CHECK(one(&wc) && wc.wr_id == 12 && wc.status == IBV_WC_REM_ACCESS_ERR, "IBV_WC_REM_ACCESS_ERR");
    struct ibv_qp *c = new_qp(), *d = new_qp();
    CHECK(c && d && connect_qp(c, d->qp_num, &gid) == 0 && connect_qp(d, c->qp_num, &gid) == 0, "another pair");
    CHECK(post(c, IBV_WR_LOCAL_INV, 13, NULL, k1, 0) == 0, "IBV_WR_LOCAL_INV of a type 1 window");
    CHECK(one(&wc) && wc.wr_id == 13 && wc.status == IBV_WC_LOC_QP_OP_ERR && wc.opcode == IBV_WC_LOCAL_INV,
          "IBV_WC_LOC_QP_OP_ERR");
    bind.wr_id = 14;
    bind.bind_info = (struct ibv_mw_bind_info){.mr = mr, .addr = (uintptr_t)local, .length = 8,
                                               .mw_access_flags = IBV_ACCESS_REMOTE_READ};
    CHECK(ibv_bind_mw(d, mw1, &bind) == 0, "ibv_bind_mw to a region without IBV_ACCESS_MW_BIND is posted");
    CHECK(one(&wc) && wc.wr_id == 14 && wc.status == IBV_WC_MW_BIND_ERR && wc.opcode == IBV_WC_BIND_MW,
          "IBV_WC_MW_BIND_ERR");
    CHECK(strcmp(ibv_wc_status_str(IBV_WC_MW_BIND_ERR), "memory management operation error") == 0,
          "ibv_wc_status_str");

    CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw");
    CHECK(ibv_dereg_mr(wmr) == 0, "ibv_dereg_mr once no window is bound");
    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0 && ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0,
          "ibv_destroy_qp");
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
    ibv_close_device(ctx);
    printf("ok\n");
    return 0;
}
