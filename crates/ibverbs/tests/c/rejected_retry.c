/* perftest -R's client against a server that does not listen yet: its REQ meets REJ 8 (no
 * listener), it cleans up and tries again until the listener is there, as perftest's
 * rdma_cm_client_connection does. Two processes, possibly on two hosts:
 *
 *   rejected_retry server ADDR PORT          listens on PORT+1 at once (its process is there
 *                                            to answer REJ 8), on PORT once a line comes on
 *                                            its standard input; accepts one connection,
 *                                            takes one message, waits for DISCONNECTED
 *   rejected_retry client ADDR PORT CLEANUP  connects to ADDR:PORT, again after each REJ,
 *                                            printing "rejected N" after the Nth
 *
 * (The test that runs them lets the server listen after the client's second REJECTED.)
 *
 * CLEANUP is what the client does after a REJECTED before it tries again:
 *   upstream  perftest since 3d9d8d0: rdma_destroy_qp, rdma_destroy_id, a new ID on the same
 *             channel, a new QP with the same PD and CQs
 *   debian    perftest 4.5-0.17: rdma_destroy_id with the QP still attached (it stays the
 *             application's, ibv_destroy_qp frees it), rdma_destroy_event_channel, then a
 *             new channel, ID, PD, CQ and QP (4.5-0.17 itself then reads the IDs from the
 *             array it freed: a use-after-free that crashes with librdmacm as with softrdma)
 *
 * After each REJECTED the client checks what librdmacm leaves: the reason (8), the QP in
 * ERR with the receive posted before rdma_connect flushed, and an ID that refuses
 * rdma_resolve_addr again (EINVAL). Each side prints "ok" and exits 0, or names the failed
 * check and exits 1. */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "cm_common.h"

static struct sockaddr_in addr_of(const char *ip, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

static int server(const char *ip, int port) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct sockaddr_in other = addr_of(ip, port + 1), addr = addr_of(ip, port);
    struct rdma_cm_id *other_id, *listen_id;
    CHECK(rdma_create_id(ch, &other_id, NULL, RDMA_PS_TCP) == 0 &&
              rdma_bind_addr(other_id, (struct sockaddr *)&other) == 0 && rdma_listen(other_id, 1) == 0,
          "a listener on PORT+1");
    char go[16];
    CHECK(fgets(go, sizeof go, stdin), "a line on standard input: listen now");
    CHECK(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0 &&
              rdma_bind_addr(listen_id, (struct sockaddr *)&addr) == 0 && rdma_listen(listen_id, 1) == 0,
          "the listener on PORT, late");
    struct rdma_cm_id *id = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(id, "CONNECT_REQUEST");
    struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp");
    char *buf = calloc(1, 64);
    struct ibv_mr *mr = rdma_reg_msgs(id, buf, 64);
    CHECK(mr && rdma_post_recv(id, NULL, buf, 64, mr) == 0, "a receive");
    CHECK(rdma_accept(id, NULL) == 0, "rdma_accept");
    CHECK(expect(ch, RDMA_CM_EVENT_ESTABLISHED) == id, "ESTABLISHED");
    struct ibv_wc wc;
    CHECK(rdma_get_recv_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the client's message");
    CHECK(strcmp(buf, "connected after a REJ") == 0, "the message's bytes");
    CHECK(expect(ch, RDMA_CM_EVENT_DISCONNECTED) == id, "DISCONNECTED");
    rdma_disconnect(id);
    printf("ok\n");
    return 0;
}

/* What the client keeps across attempts (perftest's pingpong_context). */
struct client {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    char *buf;
    struct ibv_mr *mr;
};

/* perftest's ctx_init on the first ROUTE_RESOLVED: a PD, one CQ, a buffer. */
static int client_resources(struct client *c) {
    c->pd = ibv_alloc_pd(c->id->verbs);
    CHECK(c->pd, "ibv_alloc_pd");
    c->cq = ibv_create_cq(c->id->verbs, 16, NULL, NULL, 0);
    CHECK(c->cq, "ibv_create_cq");
    c->buf = calloc(1, 128);
    c->mr = ibv_reg_mr(c->pd, c->buf, 128, IBV_ACCESS_LOCAL_WRITE);
    CHECK(c->mr, "ibv_reg_mr");
    return 0;
}

/* One attempt: resolve, QP, a receive, connect. 0 connected, 1 failed, 2 rejected (and
 * checked). */
static int attempt(struct client *c, struct sockaddr_in *dst) {
    CHECK(rdma_resolve_addr(c->id, NULL, (struct sockaddr *)dst, 2000) == 0, "rdma_resolve_addr");
    CHECK(expect(c->ch, RDMA_CM_EVENT_ADDR_RESOLVED) == c->id, "ADDR_RESOLVED");
    CHECK(rdma_resolve_route(c->id, 2000) == 0, "rdma_resolve_route");
    CHECK(expect(c->ch, RDMA_CM_EVENT_ROUTE_RESOLVED) == c->id, "ROUTE_RESOLVED");
    if (!c->pd && client_resources(c))
        return 1;
    struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC, .send_cq = c->cq, .recv_cq = c->cq,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    CHECK(rdma_create_qp(c->id, c->pd, &qa) == 0, "rdma_create_qp");
    struct ibv_sge sge = {.addr = (uintptr_t)(c->buf + 64), .length = 64, .lkey = c->mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 77, .sg_list = &sge, .num_sge = 1}, *bad;
    CHECK(ibv_post_recv(c->id->qp, &rwr, &bad) == 0, "a receive before rdma_connect");
    struct rdma_conn_param cp = {.retry_count = 7, .rnr_retry_count = 7};
    CHECK(rdma_connect(c->id, &cp) == 0, "rdma_connect");
    struct rdma_cm_event *ev;
    CHECK(rdma_get_cm_event(c->ch, &ev) == 0, "rdma_get_cm_event after rdma_connect");
    enum rdma_cm_event_type type = ev->event;
    int status = ev->status;
    CHECK(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event");
    if (type == RDMA_CM_EVENT_ESTABLISHED)
        return 0;
    if (type != RDMA_CM_EVENT_REJECTED || status != 8) {
        fprintf(stderr, "FAILED: got %s (status %d), expected ESTABLISHED or REJECTED (8)\n", rdma_event_str(type),
                status);
        return 1;
    }
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    CHECK(ibv_query_qp(c->id->qp, &a, IBV_QP_STATE, &ia) == 0, "ibv_query_qp");
    CHECK(a.qp_state == IBV_QPS_ERR, "a rejected ID's QP is in ERR");
    return 2;
}

/* The receive posted before rdma_connect, flushed when the REJ came. */
static int flushed(struct client *c) {
    struct ibv_wc wc;
    for (int i = 0; i < 2000; i++) {
        int n = ibv_poll_cq(c->cq, 1, &wc);
        CHECK(n >= 0, "ibv_poll_cq");
        if (n == 1) {
            CHECK(wc.wr_id == 77 && wc.status == IBV_WC_WR_FLUSH_ERR, "the receive flushed (WR_FLUSH_ERR)");
            return 0;
        }
        usleep(1000);
    }
    CHECK(0, "the receive posted before rdma_connect completes once the REJ came");
}

static int client(const char *ip, int port, const char *cleanup) {
    int upstream = strcmp(cleanup, "upstream") == 0;
    CHECK(upstream || strcmp(cleanup, "debian") == 0, "CLEANUP is upstream or debian");
    struct sockaddr_in dst = addr_of(ip, port);
    struct client c = {.ch = rdma_create_event_channel()};
    CHECK(c.ch, "rdma_create_event_channel");
    CHECK(rdma_create_id(c.ch, &c.id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    int rejected = 0;
    for (;;) {
        int r = attempt(&c, &dst);
        if (r == 0)
            break;
        if (r == 1)
            return 1;
        rejected++;
        CHECK(rejected < 100, "connected within 100 attempts");
        printf("rejected %d\n", rejected);
        fflush(stdout);
        if (flushed(&c))
            return 1;
        errno = 0;
        CHECK(rdma_resolve_addr(c.id, NULL, (struct sockaddr *)&dst, 2000) == -1 && errno == EINVAL,
              "rdma_resolve_addr on the rejected ID fails with EINVAL");
        if (upstream) {
            rdma_destroy_qp(c.id);
            CHECK(rdma_destroy_id(c.id) == 0, "rdma_destroy_id");
        } else {
            struct ibv_qp *qp = c.id->qp;
            CHECK(rdma_destroy_id(c.id) == 0, "rdma_destroy_id with its QP attached");
            rdma_destroy_event_channel(c.ch);
            CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp of the destroyed ID's QP");
            CHECK(ibv_dereg_mr(c.mr) == 0 && ibv_destroy_cq(c.cq) == 0 && ibv_dealloc_pd(c.pd) == 0,
                  "freeing the first attempt's PD, CQ and MR");
            free(c.buf);
            c.pd = NULL;
            c.ch = rdma_create_event_channel();
            CHECK(c.ch, "rdma_create_event_channel again");
        }
        CHECK(rdma_create_id(c.ch, &c.id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id again");
        usleep(100 * 1000); /* perftest's delay between attempts */
    }
    CHECK(rejected >= 2, "the first attempts met REJ 8 (the server listened after two)");
    strcpy(c.buf, "connected after a REJ");
    struct ibv_sge sge = {.addr = (uintptr_t)c.buf, .length = 64, .lkey = c.mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    CHECK(ibv_post_send(c.id->qp, &wr, &bad) == 0, "ibv_post_send");
    struct ibv_wc wc = {0};
    int n = completions(c.cq, 1, &wc);
    if (n != 1 || wc.wr_id != 1)
        fprintf(stderr, "completions: %d, wr_id %llu, status %s\n", n, (unsigned long long)wc.wr_id,
                ibv_wc_status_str(wc.status));
    CHECK(n == 1 && wc.wr_id == 1, "the SEND completes");
    CHECK(rdma_disconnect(c.id) == 0, "rdma_disconnect");
    CHECK(expect(c.ch, RDMA_CM_EVENT_DISCONNECTED) == c.id, "DISCONNECTED");
    rdma_destroy_qp(c.id);
    CHECK(rdma_destroy_id(c.id) == 0, "rdma_destroy_id at the end");
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv) {
    alarm(30);
    if (argc == 4 && strcmp(argv[1], "server") == 0)
        return server(argv[2], atoi(argv[3]));
    if (argc == 5 && strcmp(argv[1], "client") == 0)
        return client(argv[2], atoi(argv[3]), argv[4]);
    fprintf(stderr, "usage: %s server ADDR PORT | client ADDR PORT upstream|debian\n", argv[0]);
    return 2;
}
