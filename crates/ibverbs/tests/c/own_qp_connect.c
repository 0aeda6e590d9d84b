/* A connection whose QPs are the program's own, none attached to the rdma_cm_ids, as UCX's
 * rdmacm transport makes them: each side moves its QP with the attributes of
 * rdma_init_qp_attr, the server accepts, the client completes with rdma_establish after
 * CONNECT_RESPONSE (which carries the server's private data), the server gets ESTABLISHED
 * and the client no event; then a SEND crosses the connection. One process, one event
 * channel. Prints "ok". */
#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type want) {
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev))
        return NULL;
    if (ev->event != want) {
        fprintf(stderr, "FAILED: got %s (status %d), want %s\n", rdma_event_str(ev->event), ev->status,
                rdma_event_str(want));
        exit(1);
    }
    return ev;
}

/* Moves `qp` to INIT, RTR and RTS with the CM's attributes for `id`. */
static int drive(struct rdma_cm_id *id, struct ibv_qp *qp) {
    enum ibv_qp_state states[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
    for (int i = 0; i < 3; i++) {
        struct ibv_qp_attr a = {.qp_state = states[i]};
        int mask;
        if (rdma_init_qp_attr(id, &a, &mask)) {
            fprintf(stderr, "rdma_init_qp_attr(%d): %s\n", states[i], strerror(errno));
            return -1;
        }
        if (a.qp_state != states[i] || !(mask & IBV_QP_STATE) || ibv_modify_qp(qp, &a, mask)) {
            fprintf(stderr, "ibv_modify_qp to %d (mask %#x): %s\n", states[i], mask, strerror(errno));
            return -1;
        }
    }
    return 0;
}

static struct ibv_qp *own_qp(struct rdma_cm_id *id, struct ibv_cq *cq) {
    struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    return ibv_create_qp(id->pd, &ia);
}

int main(void) {
    alarm(20);
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *listener, *client;
    CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0 && rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0,
          "rdma_create_id");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(7000 + getpid() % 1000),
                               .sin_addr.s_addr = htonl(0x7f000001)};
    CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0 && rdma_listen(listener, 4) == 0, "listening");
    CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&addr, 2000) == 0, "rdma_resolve_addr");
    struct rdma_cm_event *ev = next(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(ev, "ADDR_RESOLVED");
    rdma_ack_cm_event(ev);
    CHECK(rdma_resolve_route(client, 2000) == 0, "rdma_resolve_route");
    CHECK((ev = next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED)), "ROUTE_RESOLVED");
    rdma_ack_cm_event(ev);

    struct ibv_cq *ccq = ibv_create_cq(client->verbs, 8, NULL, NULL, 0);
    CHECK(ccq, "ibv_create_cq (client)");
    struct ibv_qp *cqp = own_qp(client, ccq);
    CHECK(cqp, "the client's own QP");
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};
    int mask;
    errno = 0;
    CHECK(rdma_init_qp_attr(client, &a, &mask) == -1 && errno == EINVAL,
          "rdma_init_qp_attr(RTR) before the peer is known fails with EINVAL");
    struct rdma_conn_param cp = {.qp_num = cqp->qp_num, .private_data = "request", .private_data_len = 8,
                                 .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7};
    CHECK(rdma_connect(client, &cp) == 0, "rdma_connect");

    CHECK((ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST)), "CONNECT_REQUEST");
    struct rdma_cm_id *server = ev->id;
    CHECK(ev->listen_id == listener && ev->param.conn.private_data &&
              strcmp(ev->param.conn.private_data, "request") == 0,
          "the request names the listener and carries the client's private data");
    CHECK(ev->param.conn.qp_num == cqp->qp_num, "... and the client's QPN");
    rdma_ack_cm_event(ev);
    CHECK(server->pd && server->verbs, "the new ID has its device's context and PD");
    struct ibv_cq *scq = ibv_create_cq(server->verbs, 8, NULL, NULL, 0);
    struct ibv_qp *sqp = scq ? own_qp(server, scq) : NULL;
    CHECK(sqp, "the server's own QP");
    CHECK(drive(server, sqp) == 0, "the server moves its QP to RTS with rdma_init_qp_attr");
    char *mem = calloc(1, 64);
    struct ibv_mr *mr = ibv_reg_mr(server->pd, mem, 64, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr");
    struct ibv_sge rsge = {.addr = (uintptr_t)mem, .length = 32, .lkey = mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 7, .sg_list = &rsge, .num_sge = 1}, *bad_r;
    CHECK(ibv_post_recv(sqp, &rwr, &bad_r) == 0, "ibv_post_recv (server)");
    struct rdma_conn_param sp = {.qp_num = sqp->qp_num, .private_data = "reply", .private_data_len = 6,
                                 .responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7};
    CHECK(rdma_accept(server, &sp) == 0, "rdma_accept");

    CHECK((ev = next(ch, RDMA_CM_EVENT_CONNECT_RESPONSE)), "CONNECT_RESPONSE (the client has no QP attached)");
    CHECK(ev->id == client && ev->param.conn.private_data && strcmp(ev->param.conn.private_data, "reply") == 0,
          "the response carries the server's private data");
    rdma_ack_cm_event(ev);
    CHECK(drive(client, cqp) == 0, "the client moves its QP to RTS with rdma_init_qp_attr");
    CHECK(rdma_establish(client) == 0, "rdma_establish");
    CHECK((ev = next(ch, RDMA_CM_EVENT_ESTABLISHED)), "ESTABLISHED");
    CHECK(ev->id == server, "... on the server's ID only");
    rdma_ack_cm_event(ev);

    struct ibv_mr *cmr = ibv_reg_mr(client->pd, mem + 32, 32, IBV_ACCESS_LOCAL_WRITE);
    CHECK(cmr, "ibv_reg_mr (client)");
    strcpy(mem + 32, "over own QPs");
    struct ibv_sge ssge = {.addr = (uintptr_t)(mem + 32), .length = 13, .lkey = cmr->lkey};
    struct ibv_send_wr swr = {.wr_id = 1, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED},
                       *bad_s;
    CHECK(ibv_post_send(cqp, &swr, &bad_s) == 0, "ibv_post_send");
    struct ibv_wc wc[1];
    CHECK(completions(ccq, 1, wc) == 1 && completions(scq, 1, wc) == 1 && wc[0].wr_id == 7, "the SEND completes");
    CHECK(strcmp(mem, "over own QPs") == 0, "... and lands");

    /* rdma_establish is for IDs without a QP: librdmacm refuses it on one with. */
    struct rdma_cm_id *with_qp;
    CHECK(rdma_create_id(ch, &with_qp, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_resolve_addr(with_qp, NULL, (struct sockaddr *)&addr, 2000) == 0, "rdma_resolve_addr");
    CHECK((ev = next(ch, RDMA_CM_EVENT_ADDR_RESOLVED)), "ADDR_RESOLVED");
    rdma_ack_cm_event(ev);
    struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC, .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
                                                                 .max_recv_sge = 1}};
    CHECK(rdma_create_qp(with_qp, NULL, &ia) == 0, "rdma_create_qp");
    errno = 0;
    CHECK(rdma_establish(with_qp) == -1 && errno == EINVAL, "rdma_establish on an ID with a QP fails with EINVAL");
    usleep(100 * 1000);
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
    errno = 0;
    if (rdma_get_cm_event(ch, &ev) == 0) {
        fprintf(stderr, "FAILED: an event nobody should get: %s on %s\n", rdma_event_str(ev->event),
                ev->id == client ? "the client" : "another ID");
        return 1;
    }
    CHECK(errno == EAGAIN, "no event left (the client gets no ESTABLISHED)");
    printf("ok\n");
    return 0;
}
