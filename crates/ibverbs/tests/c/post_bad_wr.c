/* ibv_post_send(3) and ibv_post_recv(3) through the C layer: on failure the call returns an
 * errno value and sets *bad_wr to the first WR it did not post, every WR before it posted;
 * on success *bad_wr is left alone. A post of one WR (the C layer's short path) and of lists
 * (its general one), on a UD QP of softrdma_lo sending to a UD QP of its own, so that the
 * WRs that were posted can be seen arriving. Prints "ok". */
#include "common.h"

int main(void) {
    struct ibv_context *ctx = open_lo();
    CHECK(ctx, "softrdma_lo opens");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    static char buf[8192];
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr");
    struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
                                    .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
                                            .max_recv_sge = 1}};
    struct ibv_qp *tx = ibv_create_qp(pd, &init), *rx = ibv_create_qp(pd, &init);
    CHECK(tx && rx, "ibv_create_qp (UD)");
    CHECK(ud_to_rts(tx, 0x11111111) == 0 && ud_to_rts(rx, 0x11111111) == 0, "UD QPs to RTS");
    union ibv_gid gid;
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid");
    struct ibv_ah_attr ah_attr = {.is_global = 1, .port_num = 1, .grh = {.dgid = gid, .sgid_index = 0, .hop_limit = 64}};
    struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
    CHECK(ah, "ibv_create_ah");

    /* Receives: one WR whose SGE count is negative; a list whose second WR is. */
    struct ibv_sge rsge[3];
    struct ibv_recv_wr rwr[3], *rbad = (struct ibv_recv_wr *)&rbad;
    for (int i = 0; i < 3; i++) {
        rsge[i] = (struct ibv_sge){.addr = (uintptr_t)(buf + 1024 * i), .length = 1024, .lkey = mr->lkey};
        rwr[i] = (struct ibv_recv_wr){.wr_id = 100 + i, .sg_list = &rsge[i], .num_sge = 1,
                                      .next = i < 2 ? &rwr[i + 1] : NULL};
    }
    struct ibv_recv_wr one_r = rwr[0];
    one_r.next = NULL;
    one_r.num_sge = -1;
    CHECK(ibv_post_recv(rx, &one_r, &rbad) == EINVAL && rbad == &one_r,
          "one receive WR with num_sge -1: EINVAL, *bad_wr the WR");
    rwr[1].num_sge = -1;
    CHECK(ibv_post_recv(rx, &rwr[0], &rbad) == EINVAL && rbad == &rwr[1],
          "a receive list whose second WR has num_sge -1: EINVAL, *bad_wr the second");
    rwr[1].num_sge = 1;
    rwr[1].next = NULL;
    rbad = (struct ibv_recv_wr *)&rbad;
    CHECK(ibv_post_recv(rx, &rwr[1], &rbad) == 0 && rbad == (struct ibv_recv_wr *)&rbad,
          "one good receive WR posts, *bad_wr left alone");
    /* rx now holds receives 100 (posted by the list before its bad WR) and 101. */

    /* Sends: one WR of an opcode that does not exist; a list whose second WR has one. */
    struct ibv_sge ssge = {.addr = (uintptr_t)(buf + 4096), .length = 16, .lkey = mr->lkey};
    struct ibv_send_wr swr[3], *sbad = (struct ibv_send_wr *)&sbad;
    for (int i = 0; i < 3; i++)
        swr[i] = (struct ibv_send_wr){.wr_id = 200 + i, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                      .send_flags = IBV_SEND_SIGNALED,
                                      .wr.ud = {.ah = ah, .remote_qpn = rx->qp_num, .remote_qkey = 0x11111111},
                                      .next = i < 2 ? &swr[i + 1] : NULL};
    struct ibv_send_wr one_s = swr[0];
    one_s.next = NULL;
    one_s.opcode = (enum ibv_wr_opcode)99;
    CHECK(ibv_post_send(tx, &one_s, &sbad) == EINVAL && sbad == &one_s,
          "one send WR of opcode 99: EINVAL, *bad_wr the WR");
    swr[1].opcode = (enum ibv_wr_opcode)99;
    CHECK(ibv_post_send(tx, &swr[0], &sbad) == EINVAL && sbad == &swr[1],
          "a send list whose second WR has opcode 99: EINVAL, *bad_wr the second");
    swr[1].opcode = IBV_WR_SEND;
    swr[1].next = NULL;
    sbad = (struct ibv_send_wr *)&sbad;
    CHECK(ibv_post_send(tx, &swr[1], &sbad) == 0 && sbad == (struct ibv_send_wr *)&sbad,
          "one good send WR posts, *bad_wr left alone");

    /* What was posted arrives, and only that: sends 200 and 201 into receives 100 and 101. */
    struct ibv_wc wc[4];
    CHECK(completions(cq, 4, wc) == 4, "two sends and two receives complete");
    int seen = 0;
    for (int i = 0; i < 4; i++)
        seen |= 1 << (wc[i].wr_id % 100 + (wc[i].wr_id >= 200 ? 4 : 0));
    CHECK(seen == 0x33, "the completions are of sends 200, 201 and receives 100, 101");
    CHECK(ibv_poll_cq(cq, 4, wc) == 0, "nothing else completes");

    ibv_destroy_qp(tx);
    ibv_destroy_qp(rx);
    ibv_destroy_ah(ah);
    ibv_destroy_cq(cq);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    puts("ok");
    return 0;
}
