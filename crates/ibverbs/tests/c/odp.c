/* On-demand paging (IBV_ACCESS_ON_DEMAND, ibv_advise_mr(3)) over the libraries: two RC
 * QPs of one context connected to each other. ibv_query_device_ex names the capabilities;
 * a region on demand over pages never touched takes a WRITE and gives a READ; where its
 * pages do not allow the access (read-only for a WRITE, unmapped for a READ, unmapped
 * under a local SGE) the work fails with the error a protection fault gives, and the
 * process lives on; the implicit region (NULL, SIZE_MAX) covers any buffer, and only on
 * demand; ibv_advise_mr prefetches, refuses SGEs outside regions on demand (EINVAL) and
 * reports unmapped pages (EFAULT); a plain registration over an unmapped page is refused
 * (EFAULT), as the kernel's pinning refuses it. Prints "ok" and exits 0, or names the failed check and
 * exits 1. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

#define PAGE 4096

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static struct ibv_cq *cq;

/* A fresh pair of connected RC QPs on `cq`, in *a and *b. */
static int pair(struct ibv_qp **a, struct ibv_qp **b) {
    struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
    *a = ibv_create_qp(pd, &qa);
    *b = ibv_create_qp(pd, &qa);
    CHECK(*a && *b, "ibv_create_qp");
    CHECK(connect_qp(*a, (*b)->qp_num, &gid) == 0 && connect_qp(*b, (*a)->qp_num, &gid) == 0, "connecting");
    return 0;
}

/* Posts one signaled `op` of `len` bytes from `lkey`:`local` to `rkey`:`remote` on `qp`
 * and waits for its completion (2 s): its status, or -1. */
static int one(struct ibv_qp *qp, enum ibv_wr_opcode op, void *local, uint32_t lkey, void *remote, uint32_t rkey,
               uint32_t len) {
    struct ibv_sge sge = {.addr = (uintptr_t)local, .length = len, .lkey = lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = op,
                             .wr.rdma = {.remote_addr = (uintptr_t)remote, .rkey = rkey}};
    return post_and_wait(qp, cq, &wr, 7);
}

int main(void) {
    alarm(20);
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_device_attr_ex dx;
    CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0, "ibv_query_device_ex");
    CHECK((dx.odp_caps.general_caps & (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT)) ==
              (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT),
          "odp_caps.general_caps: ODP and implicit ODP");
    uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                  IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
    /* and FLUSH (rdma-core 47's IBV_ODP_SUPPORT_FLUSH, 1 << 6) */
    CHECK(dx.odp_caps.per_transport_caps.rc_odp_caps == (rc | 1 << 6), "RC: every operation on demand");
    cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");

    /* The target: four pages never touched, on demand. */
    char *region = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(region != MAP_FAILED, "mmap");
    int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *odp = ibv_reg_mr(pd, region, 4 * PAGE, remote | IBV_ACCESS_ON_DEMAND);
    CHECK(odp, "ibv_reg_mr with IBV_ACCESS_ON_DEMAND");
    char *src = calloc(1, PAGE), *dst = calloc(1, PAGE);
    struct ibv_mr *plain = ibv_reg_mr(pd, src, PAGE, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *plain_dst = ibv_reg_mr(pd, dst, PAGE, IBV_ACCESS_LOCAL_WRITE);
    CHECK(plain && plain_dst, "ibv_reg_mr of the local buffers");
    strcpy(src, "faulted in by a WRITE");

    struct ibv_qp *a, *b;
    if (pair(&a, &b))
        return 1;
    CHECK(one(a, IBV_WR_RDMA_WRITE, src, plain->lkey, region + 100, odp->rkey, 22) == IBV_WC_SUCCESS,
          "a WRITE into untouched pages on demand");
    CHECK(strcmp(region + 100, src) == 0, "the WRITE's bytes are there");
    strcpy(region + PAGE + 8, "read on demand");
    CHECK(one(a, IBV_WR_RDMA_READ, dst, plain_dst->lkey, region + PAGE + 8, odp->rkey, 15) == IBV_WC_SUCCESS &&
              strcmp(dst, "read on demand") == 0,
          "a READ from a page on demand");

    /* ibv_advise_mr. */
    struct ibv_sge s = {.addr = (uintptr_t)(region + 3 * PAGE), .length = PAGE, .lkey = odp->lkey};
    CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &s, 1) == 0,
          "ibv_advise_mr PREFETCH_WRITE of a page on demand");
    CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &s, 1) == 0, "PREFETCH_NO_FAULT");
    struct ibv_sge not_odp = {.addr = (uintptr_t)src, .length = 8, .lkey = plain->lkey};
    CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &not_odp, 1) == EINVAL,
          "ibv_advise_mr of a region not on demand: EINVAL");
    struct ibv_sge past = {.addr = (uintptr_t)(region + 3 * PAGE), .length = 2 * PAGE, .lkey = odp->lkey};
    CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &past, 1) == EINVAL,
          "ibv_advise_mr past the region's end: EINVAL");
    CHECK(ibv_advise_mr(pd, 7, 0, &s, 1) == EINVAL, "an unknown advice: EINVAL");

    /* Pages that do not allow the access: the error a fault gives, and the process lives. */
    CHECK(mprotect(region + PAGE, PAGE, PROT_READ) == 0, "mprotect a page read-only");
    CHECK(munmap(region + 2 * PAGE, PAGE) == 0, "munmap a page");
    struct ibv_sge gone = {.addr = (uintptr_t)(region + 2 * PAGE), .length = 64, .lkey = odp->lkey};
    CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &gone, 1) == EFAULT,
          "ibv_advise_mr of an unmapped page: EFAULT");
    errno = 0;
    CHECK(!ibv_reg_mr(pd, region + PAGE, 2 * PAGE, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT,
          "a plain registration over an unmapped page: EFAULT, as the kernel's pinning");
    struct ibv_mr *on_demand_hole = ibv_reg_mr(pd, region + PAGE, 2 * PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
    CHECK(on_demand_hole && ibv_dereg_mr(on_demand_hole) == 0, "the same range on demand: taken");
    CHECK(one(a, IBV_WR_RDMA_WRITE, src, plain->lkey, region + PAGE + 8, odp->rkey, 22) == IBV_WC_REM_ACCESS_ERR,
          "a WRITE into a read-only page on demand: IBV_WC_REM_ACCESS_ERR");
    CHECK(strcmp(region + PAGE + 8, "read on demand") == 0, "the read-only page is unchanged");
    if (pair(&a, &b))
        return 1;
    CHECK(one(a, IBV_WR_RDMA_READ, dst, plain_dst->lkey, region + 2 * PAGE, odp->rkey, 64) == IBV_WC_REM_ACCESS_ERR,
          "a READ from an unmapped page on demand: IBV_WC_REM_ACCESS_ERR");
    if (pair(&a, &b))
        return 1;
    CHECK(one(a, IBV_WR_RDMA_WRITE, region + 2 * PAGE, odp->lkey, dst, 0, 0) == IBV_WC_SUCCESS,
          "a zero-length WRITE names no page");
    struct ibv_mr *dst_remote = ibv_reg_mr(pd, dst, PAGE, remote);
    CHECK(dst_remote, "ibv_reg_mr (remote)");
    CHECK(one(a, IBV_WR_RDMA_WRITE, region + 2 * PAGE, odp->lkey, dst, dst_remote->rkey, 64) == IBV_WC_LOC_PROT_ERR,
          "a WRITE gathering from an unmapped page on demand: IBV_WC_LOC_PROT_ERR");

    /* The implicit region: the whole address space, on demand only. */
    errno = 0;
    CHECK(!ibv_reg_mr(pd, NULL, SIZE_MAX, remote) && errno == EFAULT,
          "the whole address space without IBV_ACCESS_ON_DEMAND: EFAULT");
    struct ibv_mr *all = ibv_reg_mr(pd, NULL, SIZE_MAX, remote | IBV_ACCESS_ON_DEMAND);
    CHECK(all, "the implicit region on demand (NULL, SIZE_MAX)");
    char *anywhere = malloc(256);
    strcpy(src, "through the implicit region");
    if (pair(&a, &b))
        return 1;
    CHECK(one(a, IBV_WR_RDMA_WRITE, src, plain->lkey, anywhere, all->rkey, 28) == IBV_WC_SUCCESS &&
              strcmp(anywhere, src) == 0,
          "a WRITE to any buffer through the implicit region's rkey");
    CHECK(ibv_dereg_mr(all) == 0 && ibv_dereg_mr(odp) == 0 && ibv_dereg_mr(plain) == 0 &&
              ibv_dereg_mr(plain_dst) == 0 && ibv_dereg_mr(dst_remote) == 0,
          "ibv_dereg_mr");
    printf("ok\n");
    return 0;
}
