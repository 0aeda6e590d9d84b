/* Device memory (ibv_alloc_dm(3)) and regions named by an iova (ibv_reg_mr_iova) over the
 * libraries, two RC QPs of one context connected to each other: ibv_query_device_ex gives
 * max_dm_size; copies in and out of device memory, 4-byte aligned (EINVAL otherwise) and
 * inside it (EFAULT otherwise); a zero-based region over it (ibv_reg_dm_mr, only with
 * IBV_ACCESS_ZERO_BASED) takes a WRITE and gives a READ at iova 64, and a SEND gathers from
 * it at iova 0; ibv_free_dm refuses (EBUSY) while a region is over it; the context holds
 * at most max_dm_size at once; a plain buffer registered at iova 0x1000000 takes a WRITE
 * there. Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

static struct ibv_cq *cq;

/* Posts `wr` (signaled) on `qp` and waits for it: its status, or -1. */
static int run(struct ibv_qp *qp, struct ibv_send_wr *wr) {
    return post_and_wait(qp, cq, wr, 9);
}

int main(void) {
    alarm(20);
    struct ibv_context *ctx;
    union ibv_gid gid;
    struct ibv_pd *pd;
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_device_attr_ex dx;
    CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0 && dx.max_dm_size >= 4096, "max_dm_size");

    /* Allocation and copies. */
    struct ibv_alloc_dm_attr da = {.length = 4096};
    struct ibv_dm *dm = ibv_alloc_dm(ctx, &da);
    CHECK(dm && dm->context == ctx, "ibv_alloc_dm");
    char in[16] = "device memory!!", out[16] = {0};
    CHECK(ibv_memcpy_to_dm(dm, 8, in, 16) == 0 && ibv_memcpy_from_dm(out, dm, 8, 16) == 0 && !memcmp(in, out, 16),
          "a copy in and out");
    CHECK(ibv_memcpy_to_dm(dm, 6, in, 16) == EINVAL && ibv_memcpy_to_dm(dm, 8, in, 15) == EINVAL,
          "an unaligned offset or length: EINVAL");
    CHECK(ibv_memcpy_from_dm(out, dm, 4092, 8) == EFAULT, "past the end: EFAULT");
    struct ibv_alloc_dm_attr huge = {.length = dx.max_dm_size + 4};
    errno = 0;
    CHECK(!ibv_alloc_dm(ctx, &huge) && errno == EINVAL, "more than max_dm_size: EINVAL");
    struct ibv_alloc_dm_attr masked = {.length = 64, .comp_mask = 1};
    errno = 0;
    CHECK(!ibv_alloc_dm(ctx, &masked) && errno == EINVAL, "a comp_mask: EINVAL");
    struct ibv_alloc_dm_attr rest = {.length = dx.max_dm_size - 4096};
    struct ibv_dm *all = ibv_alloc_dm(ctx, &rest);
    CHECK(all, "the rest of max_dm_size");
    struct ibv_alloc_dm_attr more = {.length = 4};
    errno = 0;
    CHECK(!ibv_alloc_dm(ctx, &more) && errno == ENOMEM, "past what the context may hold: ENOMEM");
    CHECK(ibv_free_dm(all) == 0, "ibv_free_dm");

    /* A zero-based region over it. */
    int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    errno = 0;
    CHECK(!ibv_reg_dm_mr(pd, dm, 0, 4096, acc) && errno == EINVAL, "ibv_reg_dm_mr without ZERO_BASED: EINVAL");
    errno = 0;
    CHECK(!ibv_reg_dm_mr(pd, dm, 1024, 4096, acc | IBV_ACCESS_ZERO_BASED) && errno == EINVAL,
          "ibv_reg_dm_mr past the end: EINVAL");
    struct ibv_mr *dmr = ibv_reg_dm_mr(pd, dm, 1024, 2048, acc | IBV_ACCESS_ZERO_BASED);
    CHECK(dmr && dmr->addr == NULL && dmr->length == 2048, "ibv_reg_dm_mr with ZERO_BASED");
    CHECK(ibv_free_dm(dm) == EBUSY, "ibv_free_dm while a region is over it: EBUSY");

    cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *a = ibv_create_qp(pd, &qa), *b = ibv_create_qp(pd, &qa);
    CHECK(cq && a && b, "a CQ and two QPs");
    CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0, "connecting them");
    char *buf = calloc(1, 4096);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, acc);
    CHECK(mr, "ibv_reg_mr");
    strcpy(buf, "into device memory");
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 20, .lkey = mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .wr.rdma = {.remote_addr = 64, .rkey = dmr->rkey}};
    CHECK(run(a, &wr) == IBV_WC_SUCCESS, "a WRITE to iova 64 of the zero-based region");
    char got[20];
    CHECK(ibv_memcpy_from_dm(got, dm, 1024 + 64, 20) == 0 && !memcmp(got, buf, 20),
          "it landed at device memory offset 1024 + 64");
    sge.addr = (uintptr_t)(buf + 100);
    wr.opcode = IBV_WR_RDMA_READ;
    CHECK(run(a, &wr) == IBV_WC_SUCCESS && !memcmp(buf + 100, buf, 20), "a READ from iova 64");
    CHECK(ibv_memcpy_to_dm(dm, 1024, "gathered from device memory", 28) == 0, "a message in device memory");
    struct ibv_sge rs = {.addr = (uintptr_t)(buf + 200), .length = 64, .lkey = mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 5, .sg_list = &rs, .num_sge = 1}, *rbad;
    CHECK(ibv_post_recv(b, &rwr, &rbad) == 0, "a receive");
    struct ibv_sge from_dm = {.addr = 0, .length = 28, .lkey = dmr->lkey};
    struct ibv_send_wr send = {.sg_list = &from_dm, .num_sge = 1, .opcode = IBV_WR_SEND};
    CHECK(run(a, &send) == IBV_WC_SUCCESS, "a SEND gathering from iova 0 of the region");
    CHECK(!strcmp(buf + 200, "gathered from device memory"), "the receive got the device memory's bytes");

    /* A plain buffer named by another iova. */
    char *other = calloc(1, 4096);
    struct ibv_mr *imr = ibv_reg_mr_iova(pd, other, 4096, 0x1000000, acc);
    CHECK(imr, "ibv_reg_mr_iova");
    sge.addr = (uintptr_t)buf;
    struct ibv_send_wr iw = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .wr.rdma = {.remote_addr = 0x1000000 + 512, .rkey = imr->rkey}};
    CHECK(run(a, &iw) == IBV_WC_SUCCESS && !memcmp(other + 512, buf, 20), "a WRITE to iova 0x1000000 + 512");

    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "ibv_destroy_qp");
    CHECK(ibv_dereg_mr(dmr) == 0 && ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(imr) == 0, "ibv_dereg_mr");
    CHECK(ibv_free_dm(dm) == 0, "ibv_free_dm once no region is over it");
    printf("ok\n");
    return 0;
}
