/* ibv_query_device_ex reaches softrdma's query_device_ex (it fell back to
 * ibv_query_device, leaving phys_port_cnt_ex 0): orig_attr as ibv_query_device gives it,
 * one physical port, the extended capabilities softrdma has (completion timestamps, on-demand
 * paging, for XRC too, device memory) and zeros for the rest; an input with a comp_mask is EINVAL. And the
 * context's cmd_fd is an open file a program can dup (it was -1).
 * Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

int main(void) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0], "ibv_get_device_list");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device");
    struct ibv_device_attr plain;
    CHECK(ibv_query_device(ctx, &plain) == 0, "ibv_query_device");
    struct ibv_device_attr_ex ex;
    memset(&ex, 0xa5, sizeof ex);
    CHECK(ibv_query_device_ex(ctx, NULL, &ex) == 0, "ibv_query_device_ex");
    CHECK(ex.phys_port_cnt_ex == 1, "one physical port in phys_port_cnt_ex");
    CHECK(ex.orig_attr.max_qp == plain.max_qp && ex.orig_attr.max_qp_wr == plain.max_qp_wr &&
              ex.orig_attr.phys_port_cnt == 1 && ex.orig_attr.node_guid == plain.node_guid,
          "orig_attr is ibv_query_device's");
    CHECK(ex.completion_timestamp_mask == UINT64_MAX && ex.hca_core_clock == 1000000 &&
              ex.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT) && ex.max_dm_size == 256 * 1024,
          "timestamps, on-demand paging and device memory");
    /* RC's capabilities, FLUSH (1 << 6, rdma-core 47's IBV_ODP_SUPPORT_FLUSH) apart: no XRC
     * opcode carries one. */
    CHECK(ex.odp_caps.per_transport_caps.rc_odp_caps == (0x3f | 1 << 6) && ex.xrc_odp_caps == 0x3f,
          "on demand: every RC operation with FLUSH, XRC without");
    CHECK(ex.comp_mask == 0 && ex.tm_caps.max_num_tags == 0 && ex.tso_caps.max_tso == 0 &&
              ex.rss_caps.max_rwq_indirection_tables == 0,
          "no other extended capability (and nothing left of the caller's bytes)");
    struct ibv_query_device_ex_input input = {.comp_mask = 1};
    CHECK(ibv_query_device_ex(ctx, &input, &ex) == EINVAL, "an input comp_mask is EINVAL");
    CHECK(ctx->cmd_fd >= 0, "cmd_fd is a file descriptor");
    int copy = dup(ctx->cmd_fd);
    CHECK(copy >= 0 && close(copy) == 0, "dup(cmd_fd)");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    ibv_free_device_list(list);
    printf("ok\n");
    return 0;
}
