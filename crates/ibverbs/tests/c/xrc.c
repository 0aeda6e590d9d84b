/* XRC through the C API, as ibv_xsrq_pingpong and rdma-core's tests use it: the device says
 * IBV_DEVICE_XRC (and xrc_odp_caps); ibv_open_xrcd without a file and with one (the same
 * file's domain again for a second open, EINVAL with O_EXCL then, EAGAIN for a new file
 * without O_CREAT, EINVAL without the FD and OFLAGS bits); XRC SRQs by ibv_create_srq_ex,
 * their numbers by ibv_get_srq_num; an XRC_RECV QP (a domain, no PD or CQ) and an XRC_SEND
 * QP (no receive CQ) by ibv_create_qp_ex, connected by the XRC rows of the modify table;
 * SENDs to each of two SRQs through the one TGT QP (qp_type.xrc.remote_srqn; each lands
 * in its SRQ's buffer and completes on its SRQ's CQ, naming the TGT QP); the same by
 * ibv_wr_send + ibv_wr_set_xrc_srqn; an RDMA WRITE into a region of the SRQ's PD;
 * ibv_post_recv on the XRC_SEND QP refused; ibv_close_xrcd EBUSY while an SRQ is in the
 * domain, then 0. Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

static struct ibv_context *ctx;
static union ibv_gid gid;

/* One completion of `cq` within 2 s into *wc: 1, or 0. */
static int one(struct ibv_cq *cq, struct ibv_wc *wc) {
    for (int i = 0; i < 2000; i++) {
        int k = ibv_poll_cq(cq, 1, wc);
        if (k)
            return k == 1;
        usleep(1000);
    }
    return 0;
}

int main(void) {
    alarm(20);
    struct ibv_pd *pd;
    if (open_first(&ctx, &gid, &pd))
        return 1;
    struct ibv_device_attr attr;
    CHECK(ibv_query_device(ctx, &attr) == 0 && (attr.device_cap_flags & IBV_DEVICE_XRC), "IBV_DEVICE_XRC");
    struct ibv_device_attr_ex ex;
    CHECK(ibv_query_device_ex(ctx, NULL, &ex) == 0 && (ex.xrc_odp_caps & IBV_ODP_SUPPORT_SRQ_RECV),
          "xrc_odp_caps");

    /* Domains. */
    struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1,
                                    .oflags = O_CREAT};
    struct ibv_xrcd *xrcd = ibv_open_xrcd(ctx, &xa);
    CHECK(xrcd && xrcd->context == ctx, "ibv_open_xrcd without a file");
    struct ibv_xrcd_init_attr bad = {.comp_mask = IBV_XRCD_INIT_ATTR_FD, .fd = -1};
    errno = 0;
    CHECK(!ibv_open_xrcd(ctx, &bad) && errno == EINVAL, "ibv_open_xrcd without IBV_XRCD_INIT_ATTR_OFLAGS: EINVAL");
    char path[] = "/tmp/softrdma-xrc-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    unlink(path);
    struct ibv_xrcd_init_attr fa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = fd,
                                    .oflags = 0};
    errno = 0;
    CHECK(!ibv_open_xrcd(ctx, &fa) && errno == EAGAIN, "a file with no domain, without O_CREAT: EAGAIN");
    fa.oflags = O_CREAT;
    struct ibv_xrcd *f1 = ibv_open_xrcd(ctx, &fa), *f2 = ibv_open_xrcd(ctx, &fa);
    CHECK(f1 && f2, "ibv_open_xrcd of a file, twice");
    fa.oflags = O_CREAT | O_EXCL;
    errno = 0;
    CHECK(!ibv_open_xrcd(ctx, &fa) && errno == EINVAL, "O_EXCL on a file with a domain: EINVAL");

    struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    struct ibv_cq *rcq[2] = {ibv_create_cq(ctx, 16, NULL, NULL, 0), ibv_create_cq(ctx, 16, NULL, NULL, 0)};
    CHECK(scq && rcq[0] && rcq[1], "ibv_create_cq");

    /* Two XRC SRQs of the domain, each with its CQ; one in the file's domain (f1) too, to
     * hold it: closing f2 leaves the domain to f1 and its SRQ. */
    struct ibv_srq *srq[2];
    uint32_t num[2];
    for (int i = 0; i < 2; i++) {
        struct ibv_srq_init_attr_ex sa = {
            .attr = {.max_wr = 8, .max_sge = 1},
            .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ,
            .srq_type = IBV_SRQT_XRC, .pd = pd, .xrcd = xrcd, .cq = rcq[i]};
        srq[i] = ibv_create_srq_ex(ctx, &sa);
        CHECK(srq[i], "ibv_create_srq_ex (IBV_SRQT_XRC)");
        CHECK(ibv_get_srq_num(srq[i], &num[i]) == 0, "ibv_get_srq_num");
    }
    CHECK(num[0] != num[1], "two SRQs, two numbers");
    struct ibv_srq_init_attr_ex fs = {
        .attr = {.max_wr = 2, .max_sge = 1},
        .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ,
        .srq_type = IBV_SRQT_XRC, .pd = pd, .xrcd = f1, .cq = rcq[0]};
    struct ibv_srq *file_srq = ibv_create_srq_ex(ctx, &fs);
    CHECK(file_srq, "an SRQ in the file's domain");
    CHECK(ibv_close_xrcd(f2) == 0, "closing one of two handles of the file's domain");
    CHECK(ibv_close_xrcd(f1) == EBUSY, "ibv_close_xrcd of a domain with an SRQ: EBUSY");
    struct ibv_srq_init_attr_ex basic = {.attr = {.max_wr = 2, .max_sge = 1},
                                         .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
                                         .srq_type = IBV_SRQT_BASIC, .pd = pd};
    struct ibv_srq *plain = ibv_create_srq_ex(ctx, &basic);
    CHECK(plain && ibv_destroy_srq(plain) == 0, "ibv_create_srq_ex (IBV_SRQT_BASIC)");

    /* The QPs. */
    struct ibv_qp_init_attr_ex ta = {.qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD, .xrcd = xrcd};
    struct ibv_qp *tgt = ibv_create_qp_ex(ctx, &ta);
    CHECK(tgt && !tgt->pd && !tgt->send_cq && !tgt->recv_cq && tgt->qp_type == IBV_QPT_XRC_RECV,
          "ibv_create_qp_ex (IBV_QPT_XRC_RECV): a domain's, no PD or CQ");
    struct ibv_qp_init_attr_ex ia = {.send_cq = scq, .qp_type = IBV_QPT_XRC_SEND,
                                     .cap = {.max_send_wr = 16, .max_send_sge = 1, .max_inline_data = 64},
                                     .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
                                     .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE};
    struct ibv_qp *ini = ibv_create_qp_ex(ctx, &ia);
    CHECK(ini && !ini->recv_cq && ini->qp_type == IBV_QPT_XRC_SEND, "ibv_create_qp_ex (IBV_QPT_XRC_SEND)");
    /* The XRC rows of the modify table: the TGT QP a responder, the INI QP a requester. */
    CHECK(connect_qp_as(tgt, ini->qp_num, &gid, IBV_MTU_1024, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                        IBV_QPT_XRC_RECV) == 0,
          "connecting the XRC_RECV QP");
    CHECK(connect_qp_as(ini, tgt->qp_num, &gid, IBV_MTU_1024, 0, IBV_QPT_XRC_SEND) == 0,
          "connecting the XRC_SEND QP");

    char *mem = aligned_alloc(4096, 8192);
    memset(mem, 0, 8192);
    struct ibv_mr *mr = ibv_reg_mr(pd, mem, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(mr, "ibv_reg_mr");
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 2; k++) {
            struct ibv_sge rs = {.addr = (uintptr_t)(mem + 4096 + i * 1024 + k * 256), .length = 256, .lkey = mr->lkey};
            struct ibv_recv_wr rw = {.wr_id = 100 + i * 10 + k, .sg_list = &rs, .num_sge = 1}, *bad_rw;
            CHECK(ibv_post_srq_recv(srq[i], &rw, &bad_rw) == 0, "ibv_post_srq_recv");
        }
    }
    struct ibv_recv_wr rw = {.wr_id = 1}, *bad_rw;
    CHECK(ibv_post_recv(ini, &rw, &bad_rw) != 0, "ibv_post_recv on an XRC_SEND QP is refused");

    /* A SEND to each SRQ, by ibv_post_send. */
    for (int i = 0; i < 2; i++) {
        snprintf(mem + i * 64, 64, "to SRQ %u", num[i]);
        struct ibv_sge s = {.addr = (uintptr_t)(mem + i * 64), .length = 16, .lkey = mr->lkey};
        struct ibv_send_wr w = {.wr_id = i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                                .send_flags = IBV_SEND_SIGNALED}, *bad_w;
        w.qp_type.xrc.remote_srqn = num[i];
        CHECK(ibv_post_send(ini, &w, &bad_w) == 0, "ibv_post_send with remote_srqn");
    }
    struct ibv_wc wc;
    for (int i = 0; i < 2; i++) {
        CHECK(one(scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "the SEND completes");
        CHECK(one(rcq[i], &wc) && wc.status == IBV_WC_SUCCESS, "the receive completes on its SRQ's CQ");
        CHECK(wc.wr_id == 100u + i * 10 && wc.byte_len == 16 && wc.qp_num == tgt->qp_num,
              "the receive: the SRQ's WR, 16 bytes, the XRC_RECV QP's number");
        CHECK(strcmp(mem + 4096 + i * 1024, mem + i * 64) == 0, "the bytes are in the SRQ's buffer");
    }

    /* ibv_wr_send with ibv_wr_set_xrc_srqn, to SRQ 1. */
    struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(ini);
    CHECK(qx, "ibv_qp_to_qp_ex");
    strcpy(mem + 128, "by the wr API");
    ibv_wr_start(qx);
    qx->wr_id = 7;
    qx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qx);
    ibv_wr_set_xrc_srqn(qx, num[1]);
    ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)(mem + 128), 14);
    CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_complete");
    CHECK(one(scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.wr_id == 7, "the wr API's SEND completes");
    CHECK(one(rcq[1], &wc) && wc.wr_id == 111 && wc.byte_len == 14, "it lands in SRQ 1's second receive");
    CHECK(strcmp(mem + 4096 + 1024 + 256, "by the wr API") == 0, "its bytes");

    /* An RDMA WRITE into a region of the SRQ's PD. */
    strcpy(mem + 192, "written");
    struct ibv_sge s = {.addr = (uintptr_t)(mem + 192), .length = 8, .lkey = mr->lkey};
    struct ibv_send_wr w = {.sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
    w.wr.rdma.remote_addr = (uintptr_t)(mem + 6000);
    w.wr.rdma.rkey = mr->rkey;
    w.qp_type.xrc.remote_srqn = num[0];
    CHECK(post_and_wait(ini, scq, &w, 9) == IBV_WC_SUCCESS, "RDMA WRITE through the XRC_RECV QP");
    CHECK(strcmp(mem + 6000, "written") == 0, "the written bytes");

    CHECK(ibv_close_xrcd(xrcd) == EBUSY, "ibv_close_xrcd with SRQs and a QP in the domain: EBUSY");
    CHECK(ibv_destroy_qp(ini) == 0 && ibv_destroy_qp(tgt) == 0, "ibv_destroy_qp");
    CHECK(ibv_destroy_srq(srq[0]) == 0 && ibv_destroy_srq(srq[1]) == 0, "ibv_destroy_srq");
    CHECK(ibv_close_xrcd(xrcd) == 0, "ibv_close_xrcd of a domain left empty");
    CHECK(ibv_destroy_srq(file_srq) == 0 && ibv_close_xrcd(f1) == 0, "the file's domain, closed");
    close(fd);
    printf("ok\n");
    return 0;
}
