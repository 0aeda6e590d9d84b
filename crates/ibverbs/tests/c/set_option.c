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
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    struct rdma_cm_id *listen_id, *client;
    CHECK(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (listener)");
    CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&addr) == 0 && rdma_listen(listen_id, 1) == 0, "listening");
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

    CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&addr, 2000) == 0, "rdma_resolve_addr");
    CHECK(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED) == client, "ADDR_RESOLVED");
    CHECK(rdma_resolve_route(client, 2000) == 0 && expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED) == client,
          "ROUTE_RESOLVED");
    struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    CHECK(rdma_create_qp(client, NULL, &qa) == 0, "rdma_create_qp (client)");
    CHECK(rdma_connect(client, NULL) == 0, "rdma_connect");
    struct rdma_cm_id *server = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(server, "CONNECT_REQUEST");
    struct ibv_qp_init_attr sa = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    CHECK(rdma_create_qp(server, NULL, &sa) == 0, "rdma_create_qp (server)");
    CHECK(rdma_accept(server, NULL) == 0, "rdma_accept");
    for (int i = 0; i < 2; i++)
        CHECK(expect(ch, RDMA_CM_EVENT_ESTABLISHED), "ESTABLISHED");

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
