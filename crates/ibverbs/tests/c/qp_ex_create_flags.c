/* ibv_create_qp_ex takes IBV_QP_INIT_ATTR_CREATE_FLAGS with no flag set (programs fill the
 * mask whole and the flags only when they need one), and refuses a flag softrdma does not do
 * with EOPNOTSUPP, creating nothing. Prints "ok". */
#include "common.h"

int main(void) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0], "ibv_get_device_list");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    struct ibv_qp_init_attr_ex a = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
        .pd = pd,
        .create_flags = 0,
    };
    struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
    CHECK(qp, "ibv_create_qp_ex with IBV_QP_INIT_ATTR_CREATE_FLAGS and no flag");
    CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
    a.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
    errno = 0;
    qp = ibv_create_qp_ex(ctx, &a);
    CHECK(qp == NULL && errno == EOPNOTSUPP, "a creation flag softrdma does not do: EOPNOTSUPP");
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    puts("ok");
    return 0;
}
