/* Parent and thread domains (ibv_alloc_parent_domain(3), ibv_alloc_td(3)) over the
 * libraries: a parent domain is its protection domain for every verb: a QP made with it
 * sends from an MR of the plain PD, a QP of the plain PD reads an MR registered through
 * it, an extended CQ takes it (IBV_CQ_INIT_ATTR_MASK_PD) where a plain PD is refused;
 * nesting, a NULL PD and unknown comp_mask bits are refused (EINVAL); a thread domain
 * cannot go (EBUSY) while a parent domain names it; the application's allocators are
 * never called (softrdma's queues live in the device). Prints "ok" and exits 0, or names
 * the failed check and exits 1. */
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

static int allocator_calls;

static void *count_alloc(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment, uint64_t type) {
    (void)pd, (void)pd_context, (void)size, (void)alignment, (void)type;
    allocator_calls++;
    return IBV_ALLOCATOR_USE_DEFAULT;
}

static void count_free(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t type) {
    (void)pd, (void)pd_context, (void)ptr, (void)type;
    allocator_calls++;
}

int main(void) {
    alarm(20);
    struct ibv_context *ctx;
    union ibv_gid gid;
    struct ibv_pd *pd;
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_td_init_attr ta = {0};
    struct ibv_td *td = ibv_alloc_td(ctx, &ta);
    CHECK(td && td->context == ctx, "ibv_alloc_td");
    int cookie;
    struct ibv_parent_domain_init_attr pa = {
        .pd = pd, .td = td,
        .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
        .alloc = count_alloc, .free = count_free, .pd_context = &cookie};
    struct ibv_pd *parent = ibv_alloc_parent_domain(ctx, &pa);
    CHECK(parent && parent != pd && parent->context == ctx, "ibv_alloc_parent_domain");

    /* What is refused. */
    struct ibv_parent_domain_init_attr nested = {.pd = parent};
    errno = 0;
    CHECK(!ibv_alloc_parent_domain(ctx, &nested) && errno == EINVAL, "a parent domain of a parent domain: EINVAL");
    struct ibv_parent_domain_init_attr none = {.pd = NULL};
    errno = 0;
    CHECK(!ibv_alloc_parent_domain(ctx, &none) && errno == EINVAL, "a parent domain of no PD: EINVAL");
    struct ibv_parent_domain_init_attr odd = {.pd = pd, .comp_mask = 1 << 9};
    errno = 0;
    CHECK(!ibv_alloc_parent_domain(ctx, &odd) && errno == EINVAL, "an unknown comp_mask bit: EINVAL");
    CHECK(ibv_dealloc_td(td) == EBUSY, "ibv_dealloc_td while a parent domain names it: EBUSY");
    struct ibv_cq_init_attr_ex plain_pd = {.cqe = 8, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = pd};
    errno = 0;
    CHECK(!ibv_create_cq_ex(ctx, &plain_pd) && errno == EINVAL, "an extended CQ with a plain PD as parent: EINVAL");

    /* Interchangeable with its PD. */
    struct ibv_cq_init_attr_ex ca = {.cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS,
                                     .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = parent};
    struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
    CHECK(cqx, "ibv_create_cq_ex with the parent domain");
    struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
    struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *a = ibv_create_qp(parent, &qa), *b = ibv_create_qp(pd, &qa);
    CHECK(a && b && a->pd == parent, "QPs with the parent domain and with its PD");
    CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0, "connecting them");
    char *buf = calloc(1, 4096);
    struct ibv_mr *plain = ibv_reg_mr(pd, buf, 2048, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *through = ibv_reg_mr(parent, buf + 2048, 2048, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    CHECK(plain && through && through->pd == parent, "MRs of the PD and through the parent domain");
    strcpy(buf, "from the plain PD's MR");
    strcpy(buf + 2048, "read through the parent domain");
    struct ibv_sge rs = {.addr = (uintptr_t)(buf + 512), .length = 64, .lkey = plain->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rs, .num_sge = 1}, *rbad;
    CHECK(ibv_post_recv(b, &rwr, &rbad) == 0, "a receive on the plain PD's QP");
    struct ibv_sge ss = {.addr = (uintptr_t)buf, .length = 23, .lkey = plain->lkey};
    struct ibv_send_wr swr = {.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED},
                       *sbad;
    CHECK(ibv_post_send(a, &swr, &sbad) == 0, "a SEND from the parent domain's QP, from the PD's MR");
    struct ibv_wc wc[2];
    CHECK(completions(cq, 2, wc) == 2 && strcmp(buf + 512, buf) == 0, "the SEND arrived");
    struct ibv_sge ds = {.addr = (uintptr_t)(buf + 1024), .length = 31, .lkey = plain->lkey};
    struct ibv_send_wr rd = {.wr_id = 3, .sg_list = &ds, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
                             .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {.remote_addr = (uintptr_t)(buf + 2048), .rkey = through->rkey}};
    CHECK(ibv_post_send(b, &rd, &sbad) == 0, "a READ by the PD's QP");
    CHECK(completions(cq, 1, wc) == 1 && strcmp(buf + 1024, buf + 2048) == 0,
          "it read the MR registered through the parent domain");
    CHECK(allocator_calls == 0, "the allocators were not called");

    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0 && ibv_destroy_cq(cq) == 0, "destroying QPs and CQ");
    CHECK(ibv_dereg_mr(plain) == 0 && ibv_dereg_mr(through) == 0, "ibv_dereg_mr");
    CHECK(ibv_dealloc_pd(parent) == 0, "ibv_dealloc_pd of the parent domain");
    CHECK(ibv_dealloc_td(td) == 0, "then ibv_dealloc_td");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "cleanup");
    printf("ok\n");
    return 0;
}
