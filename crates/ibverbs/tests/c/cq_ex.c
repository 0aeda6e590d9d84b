/* The extended CQ (ibv_create_cq_ex(3)) over the libraries: two RC QPs of one context
 * connected to each other, their completions on CQs made by ibv_create_cq_ex with
 * IBV_WC_STANDARD_FLAGS. A SEND with immediate and an RDMA WRITE with immediate are read
 * with ibv_start_poll / ibv_next_poll / ibv_end_poll and every ibv_wc_read_* the flags
 * ask for, each value what ibv_poll_cq gives for that completion; an empty CQ
 * answers ENOENT and leaves its poll section (a second start_poll does not wait);
 * completions left after end_poll are there for the next start_poll and for ibv_poll_cq
 * (ibv_cq_ex_to_cq); a CQ asks only for what it reads (unasked reads are NULL); creation
 * refuses what softrdma does not do (VLAN, flow tag, IGNORE_OVERRUN, unknown comp_mask
 * bits) and an invalid comp_vector. Completion timestamps: ibv_query_device_ex names the
 * clock (all 64 bits, 1 GHz), each completion's lies between ibv_query_rt_values_ex
 * before the post and after the poll, in the order they completed, and its wall-clock
 * time within a second of CLOCK_REALTIME. Prints "ok" and exits 0, or names the failed check and
 * exits 1. */
#include <arpa/inet.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

static struct ibv_cq_ex *cq_ex(struct ibv_context *ctx, uint64_t wc_flags) {
    struct ibv_cq_init_attr_ex a = {.cqe = 64, .wc_flags = wc_flags};
    return ibv_create_cq_ex(ctx, &a);
}

/* Polls `cq` until a completion is current (up to 2 s): 0, or the last error. */
static int start(struct ibv_cq_ex *cq) {
    struct ibv_poll_cq_attr pa = {0};
    int r = ENOENT;
    for (int i = 0; i < 2000 && (r = ibv_start_poll(cq, &pa)) == ENOENT; i++)
        usleep(1000);
    return r;
}

int main(void) {
    alarm(20);
    struct ibv_context *ctx;
    union ibv_gid gid;
    struct ibv_pd *pd;
    if (open_first(&ctx, &gid, &pd))
        return 1;

    /* What creation refuses. */
    errno = 0;
    CHECK(!cq_ex(ctx, IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_CVLAN) && errno == EOPNOTSUPP,
          "a VLAN is refused with EOPNOTSUPP");
    struct ibv_cq_init_attr_ex bad = {.cqe = 4, .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
                                      .flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN};
    errno = 0;
    CHECK(!ibv_create_cq_ex(ctx, &bad) && errno == EOPNOTSUPP, "IGNORE_OVERRUN is refused with EOPNOTSUPP");
    bad.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
    struct ibv_cq_ex *single = ibv_create_cq_ex(ctx, &bad);
    CHECK(single, "SINGLE_THREADED is taken");
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(single)) == 0, "ibv_destroy_cq of an extended CQ");
    bad.comp_mask = 1 << 7;
    errno = 0;
    CHECK(!ibv_create_cq_ex(ctx, &bad) && errno == EINVAL, "an unknown comp_mask bit is refused with EINVAL");
    struct ibv_cq_init_attr_ex far = {.cqe = 4, .comp_vector = 1000};
    errno = 0;
    CHECK(!ibv_create_cq_ex(ctx, &far) && errno == EINVAL, "comp_vector past num_comp_vectors: EINVAL");

    /* Only what was asked for: a CQ of byte_len alone. */
    struct ibv_cq_ex *lean = cq_ex(ctx, IBV_WC_EX_WITH_BYTE_LEN);
    CHECK(lean && lean->read_byte_len && !lean->read_imm_data && !lean->read_qp_num && lean->read_opcode &&
              lean->read_wc_flags,
          "a CQ reads what its wc_flags name and no more");
    struct ibv_poll_cq_attr pa = {0};
    CHECK(ibv_start_poll(lean, &pa) == ENOENT, "an empty CQ: ENOENT");
    CHECK(ibv_start_poll(lean, &pa) == ENOENT, "ENOENT left the poll section: a second start_poll returns");
    pa.comp_mask = 1;
    CHECK(ibv_start_poll(lean, &pa) == EINVAL, "an unknown ibv_poll_cq_attr comp_mask bit: EINVAL");
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(lean)) == 0, "ibv_destroy_cq (lean)");

    /* Traffic: a's completions on an extended CQ, b's on another. */
    struct ibv_device_attr_ex dx;
    CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0, "ibv_query_device_ex");
    CHECK(dx.completion_timestamp_mask == UINT64_MAX && dx.hca_core_clock == 1000000,
          "completion_timestamp_mask all ones, hca_core_clock 1,000,000 kHz");
    struct ibv_values_ex before = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK};
    CHECK(ibv_query_rt_values_ex(ctx, &before) == 0 && before.comp_mask == IBV_VALUES_MASK_RAW_CLOCK,
          "ibv_query_rt_values_ex: the raw clock");
    const uint64_t ts = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    struct ibv_cq_ex *scq = cq_ex(ctx, IBV_WC_STANDARD_FLAGS | ts), *rcq = cq_ex(ctx, IBV_WC_STANDARD_FLAGS | ts);
    CHECK(scq && rcq, "ibv_create_cq_ex with IBV_WC_STANDARD_FLAGS and both timestamps");
    struct ibv_qp_init_attr qa = {.send_cq = ibv_cq_ex_to_cq(scq), .recv_cq = ibv_cq_ex_to_cq(rcq),
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *a = ibv_create_qp(pd, &qa), *b = ibv_create_qp(pd, &qa);
    CHECK(a && b, "ibv_create_qp");
    CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0, "connecting a and b");
    char *buf = calloc(1, 4096);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(mr, "ibv_reg_mr");
    struct ibv_sge rsge = {.addr = (uintptr_t)(buf + 1024), .length = 512, .lkey = mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 100, .sg_list = &rsge, .num_sge = 1}, *rbad;
    CHECK(ibv_post_recv(b, &rwr, &rbad) == 0, "a receive");
    rwr.wr_id = 101;
    CHECK(ibv_post_recv(b, &rwr, &rbad) == 0, "a second receive");
    strcpy(buf, "thirty-seven bytes of an extended CQ");
    struct ibv_sge ssge = {.addr = (uintptr_t)buf, .length = 37, .lkey = mr->lkey};
    struct ibv_send_wr w1 = {.wr_id = 1, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x12345678)};
    struct ibv_send_wr w2 = {.wr_id = 2, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0xabcdef01),
                             .wr.rdma = {.remote_addr = (uintptr_t)(buf + 2048), .rkey = mr->rkey}};
    w1.next = &w2;
    struct ibv_send_wr *sbad;
    CHECK(ibv_post_send(a, &w1, &sbad) == 0, "SEND with immediate, then WRITE with immediate");

    /* The sender's two completions, one section. */
    CHECK(start(scq) == 0, "ibv_start_poll: the sender's first completion");
    CHECK(scq->wr_id == 1 && scq->status == IBV_WC_SUCCESS && ibv_wc_read_opcode(scq) == IBV_WC_SEND &&
              ibv_wc_read_qp_num(scq) == a->qp_num,
          "the SEND's completion: wr_id, status, opcode, QP");
    int r = ENOENT;
    for (int i = 0; i < 2000 && (r = ibv_next_poll(scq)) == ENOENT; i++)
        usleep(1000);
    uint64_t send_ts = ibv_wc_read_completion_ts(scq);
    CHECK(r == 0 && scq->wr_id == 2 && ibv_wc_read_opcode(scq) == IBV_WC_RDMA_WRITE, "ibv_next_poll: the WRITE's");
    uint64_t write_ts = ibv_wc_read_completion_ts(scq);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t wall = ibv_wc_read_completion_wallclock_ns(scq), real = now.tv_sec * 1000000000ull + now.tv_nsec;
    CHECK(wall <= real + 1000000000ull && wall + 1000000000ull >= real,
          "ibv_wc_read_completion_wallclock_ns within a second of CLOCK_REALTIME");
    CHECK(ibv_next_poll(scq) == ENOENT, "then ENOENT");
    ibv_end_poll(scq);

    /* The receiver's: the SEND read in one section, the WRITE's left for ibv_poll_cq. */
    CHECK(start(rcq) == 0, "ibv_start_poll: the receiver's first completion");
    CHECK(rcq->wr_id == 100 && rcq->status == IBV_WC_SUCCESS && ibv_wc_read_opcode(rcq) == IBV_WC_RECV,
          "the receive: wr_id, status, opcode");
    CHECK(ibv_wc_read_byte_len(rcq) == 37, "ibv_wc_read_byte_len: 37");
    CHECK(ibv_wc_read_imm_data(rcq) == htonl(0x12345678), "ibv_wc_read_imm_data, in network order");
    CHECK(ibv_wc_read_wc_flags(rcq) & IBV_WC_WITH_IMM, "ibv_wc_read_wc_flags: IBV_WC_WITH_IMM");
    CHECK(ibv_wc_read_qp_num(rcq) == b->qp_num, "ibv_wc_read_qp_num: b");
    uint64_t recv_ts = ibv_wc_read_completion_ts(rcq);
    CHECK(ibv_wc_read_src_qp(rcq) == a->qp_num, "ibv_wc_read_src_qp: a, as ibv_poll_cq gives on RC");
    CHECK(ibv_wc_read_slid(rcq) == 0 && ibv_wc_read_sl(rcq) == 0 && ibv_wc_read_dlid_path_bits(rcq) == 0 &&
              ibv_wc_read_vendor_err(rcq) == 0,
          "slid, sl, dlid_path_bits, vendor_err: 0 on RC over RoCE, as ibv_poll_cq gives");
    ibv_end_poll(rcq);
    struct ibv_wc wc;
    int n = 0;
    for (int i = 0; i < 2000 && (n = ibv_poll_cq(ibv_cq_ex_to_cq(rcq), 1, &wc)) == 0; i++)
        usleep(1000);
    CHECK(n == 1 && wc.wr_id == 101 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
              wc.imm_data == htonl(0xabcdef01) && (wc.wc_flags & IBV_WC_WITH_IMM),
          "ibv_poll_cq on the extended CQ: the WRITE with immediate");
    CHECK(memcmp(buf + 1024, buf, 37) == 0 && memcmp(buf + 2048, buf, 37) == 0, "the bytes landed");
    struct ibv_values_ex after = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK};
    CHECK(ibv_query_rt_values_ex(ctx, &after) == 0, "ibv_query_rt_values_ex after");
    uint64_t t0 = before.raw_clock.tv_nsec, t1 = after.raw_clock.tv_nsec;
    if (!(t0 < recv_ts && recv_ts <= send_ts && send_ts <= write_ts && write_ts <= t1))
        fprintf(stderr, "clock %llu, receive %llu, SEND %llu, WRITE %llu, clock %llu\n", (unsigned long long)t0,
                (unsigned long long)recv_ts, (unsigned long long)send_ts, (unsigned long long)write_ts,
                (unsigned long long)t1);
    CHECK(t0 < recv_ts && recv_ts <= send_ts && send_ts <= write_ts && write_ts <= t1,
          "timestamps between the clock before and after, the receive's before the SEND's ACK, in order");
    struct ibv_values_ex odd = {.comp_mask = 2};
    CHECK(ibv_query_rt_values_ex(ctx, &odd) == EINVAL, "ibv_query_rt_values_ex: an unknown comp_mask bit, EINVAL");

    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "ibv_destroy_qp");
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(scq)) == 0 && ibv_destroy_cq(ibv_cq_ex_to_cq(rcq)) == 0,
          "ibv_destroy_cq");
    CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "cleanup");
    printf("ok\n");
    return 0;
}
