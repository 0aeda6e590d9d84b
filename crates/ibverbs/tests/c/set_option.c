/* rdma_set_option's ID options: RDMA_OPTION_ID_TOS gives the route (and both QPs' address
 * vectors, through the REQ's path) its traffic class; RDMA_OPTION_ID_ACK_TIMEOUT the RC QP's
 * local ACK timeout at RTS, as rdma_init_qp_attr reports them; a value of the wrong size is
 * EINVAL and an option not supported ENOSYS, as the kernel answers (they were all ENOSYS).
 * Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "cm_common.h"

int main(int argc, char **argv) {
    alarm(20);
    int port = argc > 1 ? atoi(argv[1]) : 7000 + getpid() % 1000;
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *listen_id, *client, *server;
    if (listen_loopback(ch, port, &listen_id))
        return 1;
    CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (client)");

    uint8_t tos = 0xb8, timeout = 14;
    int wide = 1;
    CHECK(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) == 0, "TOS");
    CHECK(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout) == 0,
          "ACK_TIMEOUT");
    errno = 0;
    CHECK(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &wide, sizeof wide) == -1 && errno == EINVAL,
          "a TOS of the wrong size is EINVAL");
    errno = 0;
    CHECK(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &wide, sizeof wide) == -1 &&
              errno == ENOSYS,
          "REUSEADDR is not supported: ENOSYS");

    if (connect_loopback(ch, client, port) || take_request(ch, &server))
        return 1;
    CHECK(rdma_accept(server, NULL) == 0, "rdma_accept");
    if (both_established(ch))
        return 1;

    struct ibv_qp_attr attr;
    int mask;
    attr.qp_state = IBV_QPS_RTR;
    CHECK(rdma_init_qp_attr(client, &attr, &mask) == 0, "rdma_init_qp_attr (client, RTR)");
    CHECK(attr.ah_attr.grh.traffic_class == tos, "the client's route has the TOS set");
    attr.qp_state = IBV_QPS_RTR;
    CHECK(rdma_init_qp_attr(server, &attr, &mask) == 0, "rdma_init_qp_attr (server, RTR)");
    CHECK(attr.ah_attr.grh.traffic_class == tos, "the REQ's path carries the TOS to the server");
    attr.qp_state = IBV_QPS_RTS;
    CHECK(rdma_init_qp_attr(client, &attr, &mask) == 0, "rdma_init_qp_attr (client, RTS)");
    CHECK((mask & IBV_QP_TIMEOUT) && attr.timeout == timeout, "the client's QP takes the ACK timeout set");

    rdma_disconnect(client);
    rdma_destroy_qp(client);
    rdma_destroy_qp(server);
    rdma_destroy_id(server);
    rdma_destroy_id(client);
    rdma_destroy_id(listen_id);
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
