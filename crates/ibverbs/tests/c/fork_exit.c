/* A child of fork that exits does not disconnect its parent's connections: librdmacm.so.1
 * disconnects a process's connections when it exits (as the kernel does when the process's
 * rdma_cm file closes), but after fork that file stays open in the parent, and so do the
 * connections. One process connects two rdma_cm IDs to each other, forks, the child calls
 * exit(); the parent's connection must see no DISCONNECTED and still carry a message.
 * Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "cm_common.h"

static struct rdma_event_channel *ch;

int main(int argc, char **argv) {
    alarm(20);
    int port = argc > 1 ? atoi(argv[1]) : 7000 + getpid() % 1000;
    ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *listen_id, *client, *server;
    if (listen_loopback(ch, port, &listen_id))
        return 1;
    CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (client)");
    if (connect_loopback(ch, client, port) || take_request(ch, &server))
        return 1;
    char *buf = calloc(1, 64);
    struct ibv_mr *mr = rdma_reg_msgs(server, buf, 64);
    CHECK(mr && rdma_post_recv(server, NULL, buf, 64, mr) == 0, "a receive on the server");
    CHECK(rdma_accept(server, NULL) == 0, "rdma_accept");
    if (both_established(ch))
        return 1;

    pid_t child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0)
        exit(0); /* atexit handlers run here */
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child exited");
    struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
    if (poll(&pfd, 1, 300) != 0) {
        struct rdma_cm_event *ev;
        if (rdma_get_cm_event(ch, &ev) == 0)
            fprintf(stderr, "FAILED: a CM event after the child's exit: %s\n", rdma_event_str(ev->event));
        else
            fprintf(stderr, "FAILED: the channel turned readable after the child's exit, with no event\n");
        return 1;
    }

    char *msg = calloc(1, 64);
    strcpy(msg, "still connected");
    struct ibv_mr *cmr = rdma_reg_msgs(client, msg, 64);
    CHECK(cmr && rdma_post_send(client, NULL, msg, 16, cmr, IBV_SEND_SIGNALED) == 0, "rdma_post_send");
    struct ibv_wc wc;
    CHECK(rdma_get_send_comp(client, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the send completes");
    CHECK(rdma_get_recv_comp(server, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the server receives it");
    CHECK(strcmp(buf, "still connected") == 0, "... intact");
    CHECK(rdma_disconnect(client) == 0, "rdma_disconnect");
    printf("ok\n");
    return 0;
}
