/* What the C tests share: CHECK, waiting for completions, connecting two RC QPs of one
 * context to each other through GID 0. */
#ifndef SOFTRDMA_TEST_COMMON_H
#define SOFTRDMA_TEST_COMMON_H
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define CHECK(cond, what)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FAILED: %s (errno %d: %s)\n", what, errno, strerror(errno)); \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

/* Waits up to 2 s for `n` completions of `cq`; how many came, all successful or -1. */
static inline int completions(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int got = 0;
    while (got < n) {
        int k = ibv_poll_cq(cq, n - got, wc + got);
        if (k < 0)
            return -1;
        for (int i = got; i < got + k; i++)
            if (wc[i].status != IBV_WC_SUCCESS)
                return -1;
        got += k;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec >= 2)
            break;
    }
    return got;
}

/* Posts `wr` on `qp` signaled, as wr_id `id`, and waits up to 2 s for its completion on
 * `cq`, passing over others: its status, or -1. */
static inline int post_and_wait(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_send_wr *wr, uint64_t id) {
    struct ibv_send_wr *bad;
    wr->wr_id = id;
    wr->send_flags |= IBV_SEND_SIGNALED;
    if (ibv_post_send(qp, wr, &bad))
        return -1;
    struct ibv_wc wc;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0)
            return -1;
        if (n == 1 && wc.wr_id == id)
            return wc.status;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec >= 2)
            return -1;
    }
}

/* INIT → RTR → RTS of a QP of type `type` (RC, XRC_SEND or XRC_RECV) to QP `dest` at
 * `gid`, with `access` and `mtu`, setting the bits the type's rows of the modify table
 * require: the responder's (max_dest_rd_atomic, min_rnr_timer) at RTR for RC and XRC_RECV,
 * the requester's (retries, max_rd_atomic) at RTS for RC and XRC_SEND, and XRC_RECV's
 * timeout. Both sides start at PSN 0. */
static inline int connect_qp_as(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid, enum ibv_mtu mtu,
                                unsigned int access, enum ibv_qp_type type) {
    int responder = type != IBV_QPT_XRC_SEND, requester = type != IBV_QPT_XRC_RECV;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qp_access_flags = access};
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = dest;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (responder)
        rtr |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (ibv_modify_qp(qp, &a, rtr))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 4;
    int rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
    if (requester)
        rts |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    return ibv_modify_qp(qp, &a, rts);
}

/* An RC QP to QP `dest` at `gid`: every remote right, MTU 1024. */
static inline int connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid) {
    return connect_qp_as(qp, dest, gid, IBV_MTU_1024,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                             IBV_ACCESS_REMOTE_ATOMIC,
                         IBV_QPT_RC);
}

/* The first device, opened, its GID 0 and a PD; 0, or nonzero having said what failed. */
static inline int open_first(struct ibv_context **ctx, union ibv_gid *gid, struct ibv_pd **pd) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0], "ibv_get_device_list gives a device");
    *ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    CHECK(*ctx, "ibv_open_device");
    CHECK(ibv_query_gid(*ctx, 1, 0, gid) == 0, "ibv_query_gid");
    *pd = ibv_alloc_pd(*ctx);
    CHECK(*pd, "ibv_alloc_pd");
    return 0;
}
/* The context of softrdma_lo (the loopback interface's device), or NULL. */
static inline struct ibv_context *open_lo(void) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = NULL;
    for (int i = 0; list && list[i]; i++)
        if (strcmp(ibv_get_device_name(list[i]), "softrdma_lo") == 0)
            ctx = ibv_open_device(list[i]);
    if (list)
        ibv_free_device_list(list);
    return ctx;
}

/* RESET → INIT → RTR → RTS of a UD QP on port 1 with Q_Key `qkey`: 0, or -1. */
static inline int ud_to_rts(struct ibv_qp *qp, uint32_t qkey) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = qkey};
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
        return -1;
    a.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
        return -1;
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

#endif
