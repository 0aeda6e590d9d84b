/* RDMA WRITE bandwidth through a memory window against through the region it is bound to:
 * two contexts of one process (two ends on 127.0.0.1), an RC QP each; B registers 1 MiB
 * (REMOTE_WRITE | MW_BIND) and binds a type 2 window over all of it; A WRITEs SIZE bytes,
 * DEPTH at a time, ITERS times, first with the region's rkey, then with the window's,
 * ROUNDS times alternately. Prints GB/s for each.
 *
 *   mw_bw [SIZE [ITERS [ROUNDS]]]     (scripts/mw-bench builds and runs it) */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/c/common.h"

#define DEPTH 64
#define LEN (1 << 20)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* ITERS WRITEs of SIZE bytes to rkey:addr, DEPTH in flight: GB/s, or -1. */
static double run(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *src, uint64_t addr, uint32_t rkey, size_t size,
                  long iters) {
    struct ibv_sge sge = {.addr = (uintptr_t)src->addr, .length = size, .lkey = src->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED, .wr.rdma = {.remote_addr = addr, .rkey = rkey}},
                       *bad;
    long posted = 0, done = 0;
    struct ibv_wc wc[16];
    double t0 = now_s();
    while (done < iters) {
        while (posted < iters && posted - done < DEPTH) {
            if (ibv_post_send(qp, &wr, &bad))
                return -1;
            posted++;
        }
        int n = ibv_poll_cq(cq, 16, wc);
        for (int i = 0; i < n; i++)
            if (wc[i].status != IBV_WC_SUCCESS)
                return -1;
        done += n;
    }
    return size * (double)iters / (now_s() - t0) / 1e9;
}

int main(int argc, char **argv) {
    size_t size = argc > 1 ? strtoul(argv[1], NULL, 10) : 65536;
    long iters = argc > 2 ? atol(argv[2]) : 20000;
    int rounds = argc > 3 ? atoi(argv[3]) : 3;
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ca = ibv_open_device(list[0]), *cb = ibv_open_device(list[0]);
    union ibv_gid gid;
    ibv_query_gid(ca, 1, 0, &gid);
    struct ibv_pd *pa = ibv_alloc_pd(ca), *pb = ibv_alloc_pd(cb);
    struct ibv_cq *qa_cq = ibv_create_cq(ca, 256, NULL, NULL, 0), *qb_cq = ibv_create_cq(cb, 256, NULL, NULL, 0);
    struct ibv_qp_init_attr init = {.qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = DEPTH, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    init.send_cq = init.recv_cq = qa_cq;
    struct ibv_qp *qa = ibv_create_qp(pa, &init);
    init.send_cq = init.recv_cq = qb_cq;
    struct ibv_qp *qb = ibv_create_qp(pb, &init);
    unsigned int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    if (!qa || !qb || connect_qp_as(qa, qb->qp_num, &gid, IBV_MTU_4096, access, IBV_QPT_RC) ||
        connect_qp_as(qb, qa->qp_num, &gid, IBV_MTU_4096, access, IBV_QPT_RC)) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    char *src = aligned_alloc(4096, LEN), *dst = aligned_alloc(4096, LEN);
    memset(src, 7, LEN);
    struct ibv_mr *smr = ibv_reg_mr(pa, src, LEN, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *dmr =
        ibv_reg_mr(pb, dst, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
    struct ibv_mw *mw = ibv_alloc_mw(pb, IBV_MW_TYPE_2);
    if (!smr || !dmr || !mw) {
        fprintf(stderr, "registration or window failed\n");
        return 1;
    }
    uint32_t wrkey = ibv_inc_rkey(mw->rkey);
    struct ibv_send_wr bind = {.wr_id = 1, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED,
                               .bind_mw = {.mw = mw, .rkey = wrkey,
                                           .bind_info = {.mr = dmr, .addr = (uintptr_t)dst, .length = LEN,
                                                         .mw_access_flags = IBV_ACCESS_REMOTE_WRITE}}},
                       *bad;
    struct ibv_wc wc;
    if (ibv_post_send(qb, &bind, &bad))
        return 1;
    while (ibv_poll_cq(qb_cq, 1, &wc) == 0) {
    }
    if (wc.status != IBV_WC_SUCCESS) {
        fprintf(stderr, "bind failed: %s\n", ibv_wc_status_str(wc.status));
        return 1;
    }
    printf("%zu B RDMA WRITE, %ld per run, %d in flight, two contexts on %s\n", size, iters, DEPTH,
           ibv_get_device_name(list[0]));
    for (int r = 0; r < rounds; r++) {
        double via_mr = run(qa, qa_cq, smr, (uintptr_t)dst, dmr->rkey, size, iters);
        double via_mw = run(qa, qa_cq, smr, (uintptr_t)dst, wrkey, size, iters);
        printf("through the region %6.2f GB/s   through a window %6.2f GB/s   (%.2f x)\n", via_mr, via_mw,
               via_mw / via_mr);
    }
    return 0;
}
