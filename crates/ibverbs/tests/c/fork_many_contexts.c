/* A process that holds many open device contexts forks, and its child uses rdma_cm: the
 * child must join the host's softrdma group and connect as any process does (a report had
 * the child's host join time out, EIO from rdma_*, with ~60 contexts open in the parent).
 * The parent opens 60 contexts and keeps them; the child connects two rdma_cm IDs to each
 * other and moves a message over them, then the parent, still holding its contexts, does
 * the same. Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "cm_common.h"

#define CONTEXTS 60

/* Connects two IDs of one channel through 127.0.0.1:`port` and sends one message. */
static int connect_and_send(int port) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *listen_id, *client, *server;
    if (listen_loopback(ch, port, &listen_id))
        return 1;
    CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (client)");
    if (connect_loopback(ch, client, port) || take_request(ch, &server))
        return 1;
    char rbuf[16] = {0}, sbuf[16] = "over the child";
    struct ibv_mr *rmr = rdma_reg_msgs(server, rbuf, sizeof rbuf);
    struct ibv_mr *smr = rdma_reg_msgs(client, sbuf, sizeof sbuf);
    CHECK(rmr && smr, "rdma_reg_msgs");
    CHECK(rdma_post_recv(server, NULL, rbuf, sizeof rbuf, rmr) == 0, "rdma_post_recv");
    CHECK(rdma_accept(server, NULL) == 0, "rdma_accept");
    if (both_established(ch))
        return 1;
    CHECK(rdma_post_send(client, NULL, sbuf, sizeof sbuf, smr, IBV_SEND_SIGNALED) == 0, "rdma_post_send");
    struct ibv_wc wc;
    CHECK(rdma_get_send_comp(client, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the SEND's completion");
    CHECK(rdma_get_recv_comp(server, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the receive's completion");
    CHECK(memcmp(rbuf, sbuf, sizeof sbuf) == 0, "the message");
    return 0;
}

int main(int argc, char **argv) {
    alarm(40);
    int port = argc > 1 ? atoi(argv[1]) : 7000 + getpid() % 1000;
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0], "ibv_get_device_list");
    struct ibv_context *ctx[CONTEXTS];
    for (int i = 0; i < CONTEXTS; i++)
        CHECK((ctx[i] = ibv_open_device(list[0])) != NULL, "ibv_open_device");
    pid_t child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0)
        _exit(connect_and_send(port + 1));
    int status;
    CHECK(waitpid(child, &status, 0) == child, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child connects and sends");
    CHECK(connect_and_send(port + 2) == 0, "the parent connects and sends after its child");
    for (int i = 0; i < CONTEXTS; i++)
        CHECK(ibv_close_device(ctx[i]) == 0, "ibv_close_device");
    ibv_free_device_list(list);
    printf("ok\n");
    return 0;
}
