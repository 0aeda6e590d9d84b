/* What the rdma_cm C tests share, besides common.h. */
#ifndef SOFTRDMA_TEST_CM_COMMON_H
#define SOFTRDMA_TEST_CM_COMMON_H
#include <rdma/rdma_cma.h>
#include <stdio.h>

/* The next event of `ch`, which must be `type`: its ID (for CONNECT_REQUEST, the new one),
 * or NULL having said what came instead. */
static inline struct rdma_cm_id *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type) {
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev))
        return NULL;
    struct rdma_cm_id *id = ev->event == type ? ev->id : NULL;
    if (!id)
        fprintf(stderr, "got %s (status %d), expected %s\n", rdma_event_str(ev->event), ev->status,
                rdma_event_str(type));
    rdma_ack_cm_event(ev);
    return id;
}
#endif
