/* rdma_set_local_ece and rdma_get_remote_ece as librdmacm's (they answered ENOSYS): EINVAL
 * for vendor ID 0, a comp_mask, or an ID with a QP; the remote ECE of an ID reads all zero
 * (no ECE comes over softrdma's CM, as from a peer that sets none); ibv_query_ece answers
 * EOPNOTSUPP, as rxe's. rdma-core's test_rdmacm_async_traffic_external_qp takes this path.
 * Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <errno.h>
#include <infiniband/verbs.h>
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
    struct rdma_cm_id *id;
    CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct ibv_ece ece = {.vendor_id = 0, .options = 1, .comp_mask = 0};
    CHECK(rdma_set_local_ece(id, &ece) == -1 && errno == EINVAL, "vendor ID 0 is EINVAL");
    ece.vendor_id = 0x15b3;
    ece.comp_mask = 1;
    CHECK(rdma_set_local_ece(id, &ece) == -1 && errno == EINVAL, "a comp_mask is EINVAL");
    ece.comp_mask = 0;
    CHECK(rdma_set_local_ece(id, &ece) == 0, "rdma_set_local_ece");
    struct ibv_ece remote = {.vendor_id = 7, .options = 7, .comp_mask = 7};
    CHECK(rdma_get_remote_ece(id, &remote) == 0, "rdma_get_remote_ece");
    CHECK(remote.vendor_id == 0 && remote.options == 0 && remote.comp_mask == 0, "the remote ECE is all zero");
    CHECK(rdma_get_remote_ece(id, NULL) == -1 && errno == EINVAL, "no ECE is EINVAL");
    struct sockaddr_in addr = loopback_addr(port);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0, "rdma_resolve_addr");
    CHECK(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED) == id, "ADDR_RESOLVED");
    CHECK(create_rc_qp(id) == 0, "rdma_create_qp");
    CHECK(ibv_query_ece(id->qp, &remote) == EOPNOTSUPP, "ibv_query_ece is EOPNOTSUPP, as rxe's");
    CHECK(rdma_set_local_ece(id, &ece) == -1 && errno == EINVAL, "an ID with a QP is EINVAL (set)");
    CHECK(rdma_get_remote_ece(id, &remote) == -1 && errno == EINVAL, "an ID with a QP is EINVAL (get)");
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
