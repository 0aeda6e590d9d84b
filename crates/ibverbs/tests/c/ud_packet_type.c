/* A UD receive says in wc.sl which IP header fills its GRH area, as ConnectX does on RoCE
 * (bit 3: UDP, i.e. RoCE v2; bits 0-2: 2 IPv4, 1 IPv6): UCX's UD transport reads it to find
 * the destination address there, and drops every datagram whose address it cannot match.
 * Sends from one UD QP to another of softrdma_lo over each GID of the loopback interface
 * (::ffff:127.0.0.1, and ::1 when lo has it). Prints "ok". */
#include <arpa/inet.h>
#include <stdlib.h>

#include "common.h"

static int is_v4_mapped(const union ibv_gid *g) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, prefix, 12) == 0;
}

int main(void) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list, "ibv_get_device_list");
    struct ibv_device *dev = NULL;
    for (int i = 0; list[i]; i++)
        if (strcmp(ibv_get_device_name(list[i]), "softrdma_lo") == 0)
            dev = list[i];
    CHECK(dev, "softrdma_lo is listed");
    struct ibv_context *ctx = ibv_open_device(dev);
    CHECK(ctx, "ibv_open_device");
    struct ibv_port_attr port;
    CHECK(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    static char buf[4096];
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr");
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
                                            .max_recv_sge = 1}};
    struct ibv_qp *tx = ibv_create_qp(pd, &init), *rx = ibv_create_qp(pd, &init);
    CHECK(tx && rx, "ibv_create_qp (UD)");
    CHECK(ud_to_rts(tx, 0x11111111) == 0 && ud_to_rts(rx, 0x11111111) == 0, "UD QPs to RTS");

    int tested_v4 = 0, tested_v6 = 0;
    for (int index = 0; index < port.gid_tbl_len; index++) {
        union ibv_gid gid;
        CHECK(ibv_query_gid(ctx, 1, index, &gid) == 0, "ibv_query_gid");
        int v4 = is_v4_mapped(&gid);
        if ((v4 && tested_v4) || (!v4 && tested_v6))
            continue;
        struct ibv_sge rsge = {.addr = (uintptr_t)buf, .length = 1024, .lkey = mr->lkey};
        struct ibv_recv_wr rwr = {.wr_id = 2, .sg_list = &rsge, .num_sge = 1}, *bad_r;
        CHECK(ibv_post_recv(rx, &rwr, &bad_r) == 0, "ibv_post_recv");
        struct ibv_ah_attr ah_attr = {.is_global = 1, .port_num = 1,
                                      .grh = {.dgid = gid, .sgid_index = index, .hop_limit = 64}};
        struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
        CHECK(ah, "ibv_create_ah");
        strcpy(buf + 2048, "packet type");
        struct ibv_sge ssge = {.addr = (uintptr_t)(buf + 2048), .length = 12, .lkey = mr->lkey};
        struct ibv_send_wr swr = {.wr_id = 1, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                  .send_flags = IBV_SEND_SIGNALED,
                                  .wr.ud = {.ah = ah, .remote_qpn = rx->qp_num, .remote_qkey = 0x11111111}},
                           *bad_s;
        CHECK(ibv_post_send(tx, &swr, &bad_s) == 0, "ibv_post_send");
        struct ibv_wc wc[2];
        CHECK(completions(cq, 2, wc) == 2, "the send and the receive complete");
        struct ibv_wc *r = wc[0].wr_id == 2 ? &wc[0] : &wc[1];
        char text[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, gid.raw, text, sizeof text);
        if (!(r->wc_flags & IBV_WC_GRH) || r->sl != (v4 ? 0xa : 0x9) || r->byte_len != 40 + 12) {
            fprintf(stderr, "FAILED: over GID %d (%s): wc_flags %#x, sl %#x, byte_len %u; want IBV_WC_GRH, sl %#x, 52\n",
                    index, text, r->wc_flags, r->sl, r->byte_len, v4 ? 0xa : 0x9);
            return 1;
        }
        CHECK(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
        if (v4)
            tested_v4 = 1;
        else
            tested_v6 = 1;
    }
    CHECK(tested_v4, "lo has an IPv4 GID");
    ibv_destroy_qp(tx);
    ibv_destroy_qp(rx);
    ibv_destroy_cq(cq);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    printf("ok\n");
    return 0;
}
