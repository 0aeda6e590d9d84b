/* UD multicast over softrdma_lo (an IPv4 group on lo, which Linux loops back; TTL 1):
 * ibv_attach_mcast/ibv_detach_mcast and query_device's limits as rxe reports them. A send
 * to the group (AH with its GID, remote QPN 0xFFFFFF) reaches every attached QP, of this
 * process and of a forked child that attached its own, and no other; a detached QP gets
 * nothing more; EINVAL for a unicast GID, an RC QP, a detach of what is not attached.
 * Prints "ok". */
#include <arpa/inet.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define QKEY 0x11111111
#define MCAST_QPN 0xffffff

/* Polls `cq` for up to `ms` milliseconds; the number of completions put in wc. */
static int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, int max, int ms) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int got = 0;
    for (;;) {
        int k = ibv_poll_cq(cq, max - got, wc + got);
        if (k < 0)
            return -1;
        got += k;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (got == max || (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms)
            return got;
    }
}

struct ud {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_mr *mr;
    struct ibv_cq *cq;
    char *buf;
};

static int setup(struct ud *u) {
    u->ctx = open_lo();
    if (!u->ctx)
        return -1;
    u->pd = ibv_alloc_pd(u->ctx);
    u->buf = calloc(1, 1 << 16);
    u->mr = u->pd ? ibv_reg_mr(u->pd, u->buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE) : NULL;
    u->cq = ibv_create_cq(u->ctx, 64, NULL, NULL, 0);
    return u->mr && u->cq ? 0 : -1;
}

static struct ibv_qp *ud_qp(struct ud *u) {
    struct ibv_qp_init_attr init = {.send_cq = u->cq, .recv_cq = u->cq, .qp_type = IBV_QPT_UD,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
                                            .max_recv_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(u->pd, &init);
    return qp && ud_to_rts(qp, QKEY) == 0 ? qp : NULL;
}

/* A receive of 1024 bytes at slot `slot` of u's buffer, wr_id = slot. */
static int post_recv_at(struct ud *u, struct ibv_qp *qp, int slot) {
    struct ibv_sge sge = {.addr = (uintptr_t)(u->buf + slot * 1024), .length = 1024, .lkey = u->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(qp, &wr, &bad);
}

/* Whether the receive at `slot` holds a GRH to `group` (IPv4 header in bytes 20..40) and
 * then `msg`. */
static int holds(struct ud *u, int slot, struct in_addr group, const char *msg) {
    const char *at = u->buf + slot * 1024;
    return memcmp(at + 20 + 16, &group, 4) == 0 && memcmp(at + 40, msg, strlen(msg)) == 0;
}

/* The child: its own context, a QP attached to the group; says so on `ready`, then waits
 * for one datagram. Exit status 0 if it came, whole. */
static int child(struct in_addr group, union ibv_gid *mgid, int ready, const char *msg) {
    struct ud u;
    CHECK(setup(&u) == 0, "child: setup");
    struct ibv_qp *qp = ud_qp(&u);
    CHECK(qp, "child: UD QP");
    CHECK(ibv_attach_mcast(qp, mgid, 0) == 0, "child: ibv_attach_mcast");
    CHECK(post_recv_at(&u, qp, 3) == 0, "child: ibv_post_recv");
    CHECK(write(ready, "r", 1) == 1, "child: ready");
    struct ibv_wc wc;
    CHECK(poll_for(u.cq, &wc, 1, 5000) == 1, "child: the datagram to the group arrives");
    CHECK(wc.status == IBV_WC_SUCCESS && wc.qp_num == qp->qp_num && holds(&u, 3, group, msg),
          "child: the datagram is whole, behind a GRH naming the group");
    CHECK(ibv_detach_mcast(qp, mgid, 0) == 0, "child: ibv_detach_mcast");
    return 0;
}

int main(void) {
    struct in_addr group;
    char text[32];
    snprintf(text, sizeof text, "230.77.%d.%d", (getpid() >> 8) % 250 + 1, getpid() % 250 + 1);
    inet_pton(AF_INET, text, &group);
    union ibv_gid mgid = {0};
    mgid.raw[10] = mgid.raw[11] = 0xff;
    memcpy(&mgid.raw[12], &group, 4);
    const char *msg = "to the whole group";

    int ready[2];
    CHECK(pipe(ready) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        close(ready[0]);
        _exit(child(group, &mgid, ready[1], msg));
    }
    close(ready[1]);

    struct ud u;
    CHECK(setup(&u) == 0, "setup");
    struct ibv_device_attr attr;
    CHECK(ibv_query_device(u.ctx, &attr) == 0, "ibv_query_device");
    if (attr.max_mcast_grp != 8192 || attr.max_mcast_qp_attach != 56 || attr.max_total_mcast_qp_attach != 0x70000) {
        fprintf(stderr, "FAILED: max_mcast_grp %d, max_mcast_qp_attach %d, max_total_mcast_qp_attach %d; want rxe's\n",
                attr.max_mcast_grp, attr.max_mcast_qp_attach, attr.max_total_mcast_qp_attach);
        return 1;
    }
    CHECK(u.ctx->ops._compat_attach_mcast && u.ctx->ops._compat_detach_mcast, "the context's mcast ops are set");

    struct ibv_qp *tx = ud_qp(&u), *rx1 = ud_qp(&u), *rx2 = ud_qp(&u), *rx3 = ud_qp(&u);
    CHECK(tx && rx1 && rx2 && rx3, "UD QPs in RTS");
    union ibv_gid unicast;
    CHECK(ibv_query_gid(u.ctx, 1, 0, &unicast) == 0, "ibv_query_gid");
    CHECK(ibv_attach_mcast(rx1, &unicast, 0) == EINVAL, "attaching to a unicast GID is EINVAL");
    struct ibv_qp_init_attr rc_init = {.send_cq = u.cq, .recv_cq = u.cq, .qp_type = IBV_QPT_RC,
                                       .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
                                               .max_recv_sge = 1}};
    struct ibv_qp *rc = ibv_create_qp(u.pd, &rc_init);
    CHECK(rc, "ibv_create_qp (RC)");
    CHECK(ibv_attach_mcast(rc, &mgid, 0) == EINVAL, "attaching an RC QP is EINVAL");
    CHECK(ibv_destroy_qp(rc) == 0, "ibv_destroy_qp (RC)");

    CHECK(ibv_attach_mcast(rx1, &mgid, 0) == 0, "ibv_attach_mcast rx1");
    CHECK(ibv_attach_mcast(rx2, &mgid, 0) == 0, "ibv_attach_mcast rx2");
    CHECK(ibv_attach_mcast(rx2, &mgid, 0) == 0, "attaching twice is no error");
    CHECK(post_recv_at(&u, rx1, 1) == 0 && post_recv_at(&u, rx2, 2) == 0 && post_recv_at(&u, rx3, 4) == 0,
          "ibv_post_recv");
    char c;
    CHECK(read(ready[0], &c, 1) == 1, "the child attached (it failed otherwise)");

    struct ibv_ah_attr ah_attr = {.is_global = 1, .port_num = 1,
                                  .grh = {.dgid = mgid, .sgid_index = 0, .hop_limit = 1}};
    struct ibv_ah *ah = ibv_create_ah(u.pd, &ah_attr);
    CHECK(ah, "ibv_create_ah (the group)");
    strcpy(u.buf + 8 * 1024, msg);
    struct ibv_sge ssge = {.addr = (uintptr_t)(u.buf + 8 * 1024), .length = strlen(msg), .lkey = u.mr->lkey};
    struct ibv_send_wr swr = {.wr_id = 100, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED,
                              .wr.ud = {.ah = ah, .remote_qpn = MCAST_QPN, .remote_qkey = QKEY}},
                       *bad;
    CHECK(ibv_post_send(tx, &swr, &bad) == 0, "ibv_post_send to the group");
    struct ibv_wc wc[8];
    int n = poll_for(u.cq, wc, 8, 300);
    int sent = 0, got1 = 0, got2 = 0;
    for (int i = 0; i < n; i++) {
        CHECK(wc[i].status == IBV_WC_SUCCESS, "every completion succeeds");
        if (wc[i].wr_id == 100)
            sent++;
        else if (wc[i].wr_id == 1 && wc[i].qp_num == rx1->qp_num && wc[i].byte_len == 40 + strlen(msg))
            got1++;
        else if (wc[i].wr_id == 2 && wc[i].qp_num == rx2->qp_num && (wc[i].wc_flags & IBV_WC_GRH))
            got2++;
        else {
            fprintf(stderr, "FAILED: an unexpected completion: wr_id %lu on QP %#x\n", (unsigned long)wc[i].wr_id,
                    wc[i].qp_num);
            return 1;
        }
    }
    if (n != 3 || sent != 1 || got1 != 1 || got2 != 1) {
        fprintf(stderr, "FAILED: %d completions (send %d, rx1 %d, rx2 %d); want the send and one receive each\n", n,
                sent, got1, got2);
        return 1;
    }
    CHECK(holds(&u, 1, group, msg) && holds(&u, 2, group, msg), "each copy is whole, its GRH naming the group");
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the forked child's QP got its copy too");

    /* rx1 leaves; rx2 stays. */
    CHECK(ibv_detach_mcast(rx1, &mgid, 0) == 0, "ibv_detach_mcast rx1");
    CHECK(ibv_detach_mcast(rx1, &mgid, 0) == EINVAL, "detaching what is not attached is EINVAL");
    CHECK(post_recv_at(&u, rx1, 1) == 0 && post_recv_at(&u, rx2, 2) == 0, "ibv_post_recv again");
    CHECK(ibv_post_send(tx, &swr, &bad) == 0, "ibv_post_send to the group again");
    n = poll_for(u.cq, wc, 8, 300);
    int rx2_again = 0;
    for (int i = 0; i < n; i++) {
        CHECK(wc[i].qp_num != rx1->qp_num && wc[i].qp_num != rx3->qp_num, "no copy for a detached QP");
        rx2_again += wc[i].qp_num == rx2->qp_num;
    }
    CHECK(n == 2 && rx2_again == 1, "the send and rx2's copy");

    CHECK(ibv_detach_mcast(rx2, &mgid, 0) == 0, "ibv_detach_mcast rx2");
    ibv_destroy_ah(ah);
    ibv_destroy_qp(tx);
    ibv_destroy_qp(rx1);
    ibv_destroy_qp(rx2);
    ibv_destroy_qp(rx3);
    ibv_destroy_cq(u.cq);
    ibv_dereg_mr(u.mr);
    ibv_dealloc_pd(u.pd);
    ibv_close_device(u.ctx);
    printf("ok\n");
    return 0;
}
