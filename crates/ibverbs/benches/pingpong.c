/* The C layer's cost: an 8-byte SEND ping-pong written against rdma-core's API (librdmacm's
 * synchronous endpoints and the header inlines ibv_post_send/ibv_poll_cq), run over
 * softrdma's drop-in libraries, to set beside `softrdma perf send lat` (the same exchange
 * through the Rust API). scripts/c-layer-bench builds and runs both.
 *
 *   pingpong server|client [PORT [ITERS [signaled]]]
 *
 * Like `softrdma perf`, one send in 64 is signaled; with "signaled" every send is, and each
 * side waits for its send's completion before going on (ibv_rc_pingpong's and perftest's
 * ib_send_lat pattern). The client prints the mean one-way latency (half the round trip). */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int fail(const char *what) {
    perror(what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: %s server|client [PORT [ITERS [signaled]]]\n", argv[0]);
        return 2;
    }
    int server = !strcmp(argv[1], "server");
    const char *port = argc > 2 ? argv[2] : "24555";
    int iters = argc > 3 ? atoi(argv[3]) : 50000;
    int all_signaled = argc > 4 && !strcmp(argv[4], "signaled");

    struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP, .ai_flags = server ? RAI_PASSIVE : 0}, *res;
    if (rdma_getaddrinfo(server ? NULL : "127.0.0.1", port, &hints, &res))
        return fail("rdma_getaddrinfo");
    struct ibv_qp_init_attr attr = {.cap = {.max_send_wr = 128, .max_recv_wr = 128, .max_send_sge = 1, .max_recv_sge = 1}};
    struct rdma_cm_id *id, *listen_id;
    if (server) {
        if (rdma_create_ep(&listen_id, res, NULL, &attr) || rdma_listen(listen_id, 1) || rdma_get_request(listen_id, &id))
            return fail("listening");
    } else if (rdma_create_ep(&id, res, NULL, &attr)) {
        return fail("rdma_create_ep");
    }
    char *buf = calloc(1, 4096);
    struct ibv_mr *mr = rdma_reg_msgs(id, buf, 4096);
    if (!mr)
        return fail("rdma_reg_msgs");
    for (int i = 0; i < 64; i++)
        if (rdma_post_recv(id, NULL, buf + 2048, 8, mr))
            return fail("rdma_post_recv");
    if (server ? rdma_accept(id, NULL) : rdma_connect(id, NULL))
        return fail(server ? "rdma_accept" : "rdma_connect");

    struct ibv_wc wc;
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        int flags = (all_signaled || i % 64 == 63) ? IBV_SEND_SIGNALED : 0;
        if (!server && rdma_post_send(id, NULL, buf, 8, mr, flags))
            return fail("rdma_post_send");
        int received = 0, sending = !server && all_signaled;
        while (!received || sending) {
            int n = ibv_poll_cq(id->recv_cq, 1, &wc);
            if (n < 0 || (n && wc.status != IBV_WC_SUCCESS))
                return fail("receive completion");
            if (n) {
                received = 1;
                if (rdma_post_recv(id, NULL, buf + 2048, 8, mr))
                    return fail("rdma_post_recv");
            }
            if (sending && ibv_poll_cq(id->send_cq, 1, &wc) > 0)
                sending = 0;
        }
        if (server && rdma_post_send(id, NULL, buf, 8, mr, flags))
            return fail("rdma_post_send");
        if (server && all_signaled)
            while (ibv_poll_cq(id->send_cq, 1, &wc) == 0)
                ;
        /* Unsignaled sends complete with the next signaled one: drain those. */
        if (!all_signaled && flags)
            while (ibv_poll_cq(id->send_cq, 1, &wc) == 0)
                ;
    }
    double us = now_us() - t0;
    if (!server)
        printf("C pingpong (%s): %d iterations, %.2f us one way (mean)\n",
               all_signaled ? "every send signaled and waited for" : "1 send in 64 signaled", iters,
               us / iters / 2);
    rdma_disconnect(id);
    return 0;
}
