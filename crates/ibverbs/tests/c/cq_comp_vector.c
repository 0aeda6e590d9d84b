/* ibv_create_cq takes a completion vector below ibv_context.num_comp_vectors and refuses
 * any other with EINVAL, as the kernel does (ib_uverbs_create_cq). Prints "ok". */
#include "common.h"

int main(void) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0], "ibv_get_device_list");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device");
    CHECK(ctx->num_comp_vectors >= 1, "num_comp_vectors is at least 1");
    for (int v = 0; v < ctx->num_comp_vectors; v++) {
        struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, v);
        CHECK(cq, "ibv_create_cq with a vector below num_comp_vectors");
        CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
    }
    int bad[] = {ctx->num_comp_vectors, ctx->num_comp_vectors + 7, -1};
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        errno = 0;
        struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, bad[i]);
        CHECK(cq == NULL, "ibv_create_cq refuses a vector past num_comp_vectors");
        CHECK(errno == EINVAL, "... with EINVAL");
    }
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    puts("ok");
    return 0;
}
