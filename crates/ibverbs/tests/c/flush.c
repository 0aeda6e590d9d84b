/* FLUSH through the C API as rdma-core 47 defines it (Debian's headers are 44's, which
 * lack it, so its names are spelled here): IBV_QP_EX_WITH_FLUSH (1 << 11) in send_ops_flags,
 * ibv_wr_flush in the slot after wr_atomic_write (where rdma-core 47's struct ibv_qp_ex puts
 * it, past the end of 44's), IBV_ACCESS_FLUSH_GLOBAL/_PERSISTENT (1 << 8, 1 << 9) on the
 * region and the QP, IBV_WC_FLUSH (8). An RDMA WRITE into a file-backed region, then a
 * FLUSH of its range to persistence and one of the whole region to global visibility:
 * both succeed; a FLUSH to persistence of a region that allows only global visibility is
 * IBV_WC_REM_ACCESS_ERR. Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

#define WITH_FLUSH (1 << 11)
#define ACCESS_FLUSH_GLOBAL (1 << 8)
#define ACCESS_FLUSH_PERSISTENT (1 << 9)
#define FLUSH_GLOBAL 1
#define FLUSH_PERSISTENT 2
#define FLUSH_RANGE 0
#define FLUSH_MR 1
#define WC_FLUSH 8

typedef void (*wr_flush_fn)(struct ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t);

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

static struct ibv_qp *new_qp(void) {
    struct ibv_qp_init_attr_ex ax = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                     .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
                                             .max_recv_sge = 1},
                                     .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                     .pd = pd,
                                     .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | WITH_FLUSH};
    return ibv_create_qp_ex(ctx, &ax);
}

/* FLUSH of `len` bytes at `addr` through `rkey` by `qx`, `type` and `level`: its completion's
 * status, or -1. */
static int flush(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr, size_t len, uint8_t type, uint8_t level) {
    wr_flush_fn wr_flush = *(wr_flush_fn *)((char *)qx + sizeof(struct ibv_qp_ex));
    ibv_wr_start(qx);
    qx->wr_id = 77;
    qx->wr_flags = IBV_SEND_SIGNALED;
    wr_flush(qx, rkey, addr, len, type, level);
    if (ibv_wr_complete(qx))
        return -1;
    struct ibv_wc wc;
    for (int i = 0; i < 2000; i++) {
        if (ibv_poll_cq(cq, 1, &wc) == 1)
            return wc.wr_id == 77 && (wc.status != IBV_WC_SUCCESS || wc.opcode == WC_FLUSH) ? (int)wc.status : -1;
        usleep(1000);
    }
    return -1;
}

int main(void) {
    alarm(20);
    if (open_first(&ctx, &gid, &pd))
        return 1;
    cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    struct ibv_qp *a = new_qp(), *b = new_qp();
    CHECK(a && b, "ibv_create_qp_ex with IBV_QP_EX_WITH_FLUSH");
    CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0, "connecting the QPs");
    struct ibv_qp_attr qa = {.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | ACCESS_FLUSH_GLOBAL | ACCESS_FLUSH_PERSISTENT};
    CHECK(ibv_modify_qp(b, &qa, IBV_QP_ACCESS_FLAGS) == 0, "the target QP allows FLUSH");

    char path[] = "/tmp/softrdma-flush-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && ftruncate(fd, 8192) == 0, "a file");
    unlink(path);
    char *file = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(file != MAP_FAILED, "mmap of the file");
    int both = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | ACCESS_FLUSH_GLOBAL | ACCESS_FLUSH_PERSISTENT;
    struct ibv_mr *target = ibv_reg_mr(pd, file, 8192, both);
    struct ibv_mr *global = ibv_reg_mr(pd, file, 4096, IBV_ACCESS_LOCAL_WRITE | ACCESS_FLUSH_GLOBAL);
    char *src = aligned_alloc(4096, 4096);
    strcpy(src, "durable bytes");
    struct ibv_mr *local = ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
    CHECK(target && global && local, "ibv_reg_mr with IBV_ACCESS_FLUSH_*");

    struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(a);
    CHECK(qx, "ibv_qp_to_qp_ex");
    struct ibv_sge s = {.addr = (uintptr_t)src, .length = 14, .lkey = local->lkey};
    struct ibv_send_wr w = {.sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
    w.wr.rdma.remote_addr = (uintptr_t)(file + 100);
    w.wr.rdma.rkey = target->rkey;
    CHECK(post_and_wait(a, cq, &w, 1) == IBV_WC_SUCCESS, "RDMA WRITE into the file");
    CHECK(flush(qx, target->rkey, (uintptr_t)(file + 100), 14, FLUSH_PERSISTENT, FLUSH_RANGE) == IBV_WC_SUCCESS,
          "FLUSH of the range to persistence");
    char back[14];
    CHECK(pread(fd, back, 14, 100) == 14 && memcmp(back, "durable bytes", 14) == 0, "the file holds the bytes");
    CHECK(flush(qx, target->rkey, 0, 0, FLUSH_GLOBAL, FLUSH_MR) == IBV_WC_SUCCESS,
          "FLUSH of the whole region to global visibility");
    CHECK(flush(qx, global->rkey, (uintptr_t)file, 8, FLUSH_PERSISTENT, FLUSH_RANGE) == IBV_WC_REM_ACCESS_ERR,
          "FLUSH to persistence of a region that allows only global visibility: IBV_WC_REM_ACCESS_ERR");
    printf("ok\n");
    return 0;
}
