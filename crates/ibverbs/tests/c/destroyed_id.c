/* An rdma_cm_id that was destroyed is refused, not dereferenced: perftest 4.5's -R retry
 * calls rdma_resolve_addr on IDs it destroyed, read back from an array it freed (a
 * use-after-free in perftest, fixed upstream in 3d9d8d0, on which librdmacm crashes).
 * Here rdma_resolve_addr, rdma_bind_addr and rdma_destroy_id on such a pointer fail with
 * EINVAL and a live ID beside it keeps working. Prints "ok" and exits 0, or names the
 * failed check and exits 1. */
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include "common.h"

int main(void) {
    alarm(20);
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *gone, *live;
    CHECK(rdma_create_id(ch, &gone, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_create_id(ch, &live, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (a second)");
    CHECK(rdma_destroy_id(gone) == 0, "rdma_destroy_id");
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(7999), .sin_addr.s_addr = htonl(0x7f000001)};
    errno = 0;
    CHECK(rdma_resolve_addr(gone, NULL, (struct sockaddr *)&dst, 2000) == -1 && errno == EINVAL,
          "rdma_resolve_addr on a destroyed ID fails with EINVAL");
    errno = 0;
    CHECK(rdma_bind_addr(gone, (struct sockaddr *)&dst) == -1 && errno == EINVAL,
          "rdma_bind_addr on a destroyed ID fails with EINVAL");
    errno = 0;
    CHECK(rdma_destroy_id(gone) == -1 && errno == EINVAL, "rdma_destroy_id twice fails with EINVAL");
    CHECK(rdma_resolve_addr(live, NULL, (struct sockaddr *)&dst, 2000) == 0, "the live ID resolves");
    struct rdma_cm_event *ev;
    CHECK(rdma_get_cm_event(ch, &ev) == 0 && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == live,
          "ADDR_RESOLVED for the live ID");
    rdma_ack_cm_event(ev);
    CHECK(rdma_destroy_id(live) == 0, "rdma_destroy_id (the live one)");
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
