/* rdma_get_src_port and rdma_get_dst_port read the ports of an ID's addresses, in network
 * byte order, as librdmacm's do (they returned 0). A listener bound to port P, a client
 * that connects to it, and the ID of the request: each side's ports mirror the other's.
 * Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <arpa/inet.h>
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
    struct sockaddr_in addr = loopback_addr(port);
    struct rdma_cm_id *listen_id, *client;
    CHECK(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (listener)");
    CHECK(rdma_get_src_port(listen_id) == 0 && rdma_get_dst_port(listen_id) == 0, "an unbound ID's ports are 0");
    CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&addr) == 0 && rdma_listen(listen_id, 1) == 0, "listening");
    CHECK(rdma_get_src_port(listen_id) == htons(port), "the listener's source port is the one it bound");
    CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (client)");
    CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&addr, 2000) == 0, "rdma_resolve_addr");
    CHECK(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED) == client, "ADDR_RESOLVED");
    CHECK(rdma_get_dst_port(client) == htons(port), "the client's destination port is the listener's");
    __be16 client_port = rdma_get_src_port(client);
    CHECK(client_port != 0, "the client has a source port once resolved");
    CHECK(rdma_resolve_route(client, 2000) == 0 && expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED) == client,
          "ROUTE_RESOLVED");
    CHECK(rdma_connect(client, NULL) == 0, "rdma_connect");
    struct rdma_cm_id *server = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(server, "CONNECT_REQUEST");
    CHECK(rdma_get_src_port(server) == htons(port), "the request's ID has the listener's port");
    CHECK(rdma_get_dst_port(server) == client_port, "the request's ID's peer port is the client's");
    CHECK(rdma_reject(server, NULL, 0) == 0, "rdma_reject");
    CHECK(expect(ch, RDMA_CM_EVENT_REJECTED) == client, "REJECTED");
    rdma_destroy_id(server);
    rdma_destroy_id(client);
    rdma_destroy_id(listen_id);
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
