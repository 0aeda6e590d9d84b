/* The extended send API (ibv_create_qp_ex, ibv_qp_to_qp_ex, ibv_wr_*: ibv_wr_post(3)) over
 * the libraries: two RC QPs of one context connected to each other; WRITE (from an SGE and
 * inline), READ and FETCH_AND_ADD built with the ibv_wr_* calls land and complete; a batch
 * with an operation the QP was not created for, or a setter before any builder, fails in
 * ibv_wr_complete and posts nothing; ibv_wr_abort discards; creation refuses operations
 * softrdma does not do. Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

/* Two threads building on one QP: each section is the thread's alone (ibv_wr_post(3),
 * CONCURRENCY), even when a thread pauses inside it. */
struct poster {
    struct ibv_qp_ex *qx;
    struct ibv_mr *mr;
    char *local, *remote;
    uint64_t first_id;
};

static void *post_four(void *arg) {
    struct poster *p = arg;
    for (int i = 0; i < 4; i++) {
        ibv_wr_start(p->qx);
        p->qx->wr_id = p->first_id + i;
        p->qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_rdma_write(p->qx, p->mr->rkey, (uintptr_t)(p->remote + 3500));
        usleep(2000); /* the other thread's wr_start waits meanwhile */
        ibv_wr_set_sge(p->qx, p->mr->lkey, (uintptr_t)p->local, 8);
        if (ibv_wr_complete(p->qx))
            return "ibv_wr_complete failed";
    }
    return NULL;
}

int main(void) {
    alarm(20); /* a call that blocks instead of failing ends the test, not the suite */
    struct ibv_context *ctx;
    union ibv_gid gid;
    struct ibv_pd *pd;
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    char *mem = aligned_alloc(4096, 8192);
    memset(mem, 0, 8192);
    struct ibv_mr *mr = ibv_reg_mr(pd, mem, 8192,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                       IBV_ACCESS_REMOTE_ATOMIC);
    CHECK(mr, "ibv_reg_mr");
    char *local = mem, *remote = mem + 4096; /* the requester's half, the target's half */

    struct ibv_qp_init_attr_ex ax = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                     .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2,
                                             .max_recv_sge = 2, .max_inline_data = 64},
                                     .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                     .pd = pd,
                                     .send_ops_flags = IBV_QP_EX_WITH_TSO};
    errno = 0;
    CHECK(ibv_create_qp_ex(ctx, &ax) == NULL && errno == EOPNOTSUPP, "creation refuses IBV_QP_EX_WITH_TSO");
    ax.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    struct ibv_qp *a = ibv_create_qp_ex(ctx, &ax);
    CHECK(a, "ibv_create_qp_ex with WRITE, READ and FETCH_AND_ADD");
    struct ibv_qp_init_attr plain = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                     .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
                                             .max_recv_sge = 1}};
    struct ibv_qp *b = ibv_create_qp(pd, &plain);
    CHECK(b, "ibv_create_qp");
    CHECK(ibv_qp_to_qp_ex(b) == NULL, "ibv_qp_to_qp_ex of a plain QP is NULL");
    struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(a);
    CHECK(qx && &qx->qp_base == a, "ibv_qp_to_qp_ex gives the QP's ibv_qp_ex");
    CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0, "connecting the QPs");

    /* WRITE from an SGE, WRITE inline, READ, FETCH_AND_ADD in one batch. */
    strcpy(local, "written from an SGE");
    char inline_data[16] = "inline write";
    *(uint64_t *)(remote + 512) = 40;
    strcpy(remote + 1024, "read me back");
    ibv_wr_start(qx);
    qx->wr_id = 1;
    qx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)remote);
    ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)local, 20);
    qx->wr_id = 2;
    ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)(remote + 256));
    ibv_wr_set_inline_data(qx, inline_data, 13);
    memset(inline_data, 'x', sizeof inline_data); /* the buffer may be reused at once */
    qx->wr_id = 3;
    ibv_wr_rdma_read(qx, mr->rkey, (uintptr_t)(remote + 1024));
    ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)(local + 1024), 13);
    qx->wr_id = 4;
    ibv_wr_atomic_fetch_add(qx, mr->rkey, (uintptr_t)(remote + 512), 2);
    ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)(local + 512), 8);
    CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_complete of four work requests");
    struct ibv_wc wc[8];
    CHECK(completions(cq, 4, wc) == 4, "four successful completions");
    CHECK(wc[0].wr_id == 1 && wc[1].wr_id == 2 && wc[2].wr_id == 3 && wc[3].wr_id == 4, "in order, with their wr_ids");
    CHECK(wc[0].opcode == IBV_WC_RDMA_WRITE && wc[2].opcode == IBV_WC_RDMA_READ && wc[3].opcode == IBV_WC_FETCH_ADD,
          "with their opcodes");
    CHECK(strcmp(remote, "written from an SGE") == 0, "the SGE's WRITE landed");
    CHECK(strcmp(remote + 256, "inline write") == 0, "the inline WRITE landed, as set");
    CHECK(strcmp(local + 1024, "read me back") == 0, "the READ came back");
    CHECK(*(uint64_t *)(local + 512) == 40 && *(uint64_t *)(remote + 512) == 42, "the FETCH_AND_ADD");

    /* An operation the QP was not created for: nothing of the batch is posted. */
    ibv_wr_start(qx);
    qx->wr_id = 5;
    ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)(remote + 2048));
    ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)local, 8);
    ibv_wr_send(qx);
    CHECK(ibv_wr_complete(qx) == EINVAL, "a SEND on a QP made without IBV_QP_EX_WITH_SEND fails the batch");
    /* A setter before any builder. */
    ibv_wr_start(qx);
    ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)local, 8);
    CHECK(ibv_wr_complete(qx) == EINVAL, "a setter before a builder fails the batch");
    /* Aborted. */
    ibv_wr_start(qx);
    qx->wr_id = 6;
    ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)(remote + 2048));
    ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)local, 8);
    ibv_wr_abort(qx);
    usleep(100000);
    CHECK(completions(cq, 1, wc) == 0, "nothing of the failed or aborted batches was posted");
    CHECK(remote[2048] == 0, "... and nothing was written");

    /* The QP still works. */
    ibv_wr_start(qx);
    qx->wr_id = 7;
    ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)(remote + 3000));
    ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)local, 8);
    CHECK(ibv_wr_complete(qx) == 0 && completions(cq, 1, wc) == 1 && wc[0].wr_id == 7, "a later batch completes");

    pthread_t t1, t2;
    struct poster p1 = {qx, mr, local, remote, 100}, p2 = {qx, mr, local, remote, 200};
    void *r1, *r2;
    CHECK(pthread_create(&t1, NULL, post_four, &p1) == 0 && pthread_create(&t2, NULL, post_four, &p2) == 0,
          "two posting threads");
    CHECK(pthread_join(t1, &r1) == 0 && pthread_join(t2, &r2) == 0 && !r1 && !r2, "both threads posted");
    CHECK(completions(cq, 8, wc) == 8, "eight completions from two threads' sections");
    int seen = 0;
    for (int i = 0; i < 8; i++)
        seen |= 1 << ((wc[i].wr_id >= 200 ? 4 : 0) + (int)(wc[i].wr_id % 100));
    CHECK(seen == 0xff, "every work request of both threads, none lost to the other");

    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "ibv_destroy_qp");
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    printf("ok\n");
    return 0;
}
