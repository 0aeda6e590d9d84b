/* rdma_join_multicast on a UD (RDMA_PS_UDP) ID resolved from 127.0.0.1 to an IPv4 group:
 * RDMA_CM_EVENT_MULTICAST_JOIN carries param.ud as the kernel's rdma_cm gives it on RoCE
 * (ah_attr to the IPv4-mapped MGID from the ID's source GID, qp_num 0xFFFFFF, qkey
 * RDMA_UDP_QKEY) and the join's context in param.ud.private_data; the ID's QP is attached,
 * so a datagram it sends to the group comes back to it (multicast loops back to the host's
 * members). rdma_leave_multicast detaches it (EADDRNOTAVAIL for a group not joined), and
 * rdma_join_multicast_ex checks its attributes as librdmacm. Prints "ok". */
#include <arpa/inet.h>
#include <rdma/rdma_verbs.h>
#include <stdlib.h>
#include <unistd.h>

#include "cm_common.h"

int main(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *id;
    CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0, "rdma_create_id (UDP)");
    char text[32];
    snprintf(text, sizeof text, "230.78.%d.%d", (getpid() >> 8) % 250 + 1, getpid() % 250 + 1);
    struct sockaddr_in src = loopback_addr(0), group = {.sin_family = AF_INET};
    inet_pton(AF_INET, text, &group.sin_addr);
    CHECK(rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&group, 2000) == 0, "rdma_resolve_addr");
    CHECK(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED), "ADDR_RESOLVED");
    struct ibv_qp_init_attr init = {.qp_type = IBV_QPT_UD,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
                                            .max_recv_sge = 1}};
    CHECK(rdma_create_qp(id, NULL, &init) == 0, "rdma_create_qp (UD)");

    /* rdma_join_multicast_ex's checks come before anything is joined. */
    struct rdma_cm_join_mc_attr_ex ex = {.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS, .addr = (struct sockaddr *)&group};
    CHECK(rdma_join_multicast_ex(id, &ex, NULL) == -1 && errno == EINVAL, "no join flags: EINVAL");
    ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
    CHECK(rdma_join_multicast_ex(id, &ex, NULL) == -1 && errno == ENOTSUP, "a reserved comp_mask bit: ENOTSUP");
    struct sockaddr_in unicast = loopback_addr(0);
    CHECK(rdma_join_multicast(id, (struct sockaddr *)&unicast, NULL) == -1 && errno == EINVAL,
          "joining a unicast address: EINVAL");

    int context_tag;
    CHECK(rdma_join_multicast(id, (struct sockaddr *)&group, &context_tag) == 0, "rdma_join_multicast");
    struct rdma_cm_event *ev;
    CHECK(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
    CHECK(ev->event == RDMA_CM_EVENT_MULTICAST_JOIN && ev->status == 0 && ev->id == id, "MULTICAST_JOIN for the ID");
    struct rdma_ud_param ud = ev->param.ud;
    union ibv_gid sgid;
    CHECK(ibv_query_gid(id->verbs, 1, ud.ah_attr.grh.sgid_index, &sgid) == 0, "ibv_query_gid");
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    CHECK(ud.private_data == &context_tag, "param.ud.private_data is the join's context");
    CHECK(ud.qp_num == 0xffffff && ud.qkey == RDMA_UDP_QKEY, "qp_num 0xFFFFFF, qkey RDMA_UDP_QKEY");
    CHECK(ud.ah_attr.is_global && memcmp(ud.ah_attr.grh.dgid.raw, mapped, 12) == 0 &&
              memcmp(ud.ah_attr.grh.dgid.raw + 12, &group.sin_addr, 4) == 0,
          "the AH's dgid is the IPv4-mapped group");
    CHECK(memcmp(sgid.raw, mapped, 12) == 0 && memcmp(sgid.raw + 12, &src.sin_addr, 4) == 0,
          "the AH's sgid_index names the ID's source address");
    CHECK(ud.ah_attr.grh.hop_limit == 64 && ud.ah_attr.port_num == 1, "hop limit 64 (rdma_cm's), port 1");
    struct ibv_ah *ah = ibv_create_ah(id->pd, &ud.ah_attr);
    CHECK(ah, "ibv_create_ah from the event's ah_attr");
    rdma_ack_cm_event(ev);

    /* The ID's QP is a member: what it sends to the group comes back to it. */
    static char buf[2048];
    struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof buf);
    CHECK(mr, "rdma_reg_msgs");
    CHECK(rdma_post_recv(id, NULL, buf, 1024, mr) == 0, "rdma_post_recv");
    strcpy(buf + 1024, "loops back");
    CHECK(rdma_post_ud_send(id, NULL, buf + 1024, 11, mr, IBV_SEND_SIGNALED, ah, ud.qp_num) == 0, "rdma_post_ud_send");
    struct ibv_wc wc;
    CHECK(rdma_get_send_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the send completes");
    CHECK(rdma_get_recv_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 40 + 11 &&
              strcmp(buf + 40, "loops back") == 0,
          "the ID's own QP receives its datagram to the group");

    CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == 0, "rdma_leave_multicast");
    CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == -1 && errno == EADDRNOTAVAIL,
          "leaving a group not joined: EADDRNOTAVAIL");
    CHECK(ibv_detach_mcast(id->qp, &ud.ah_attr.grh.dgid, 0) == EINVAL, "the QP was detached by the leave");

    /* A send-only join attaches nothing. */
    ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    ex.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
    CHECK(rdma_join_multicast_ex(id, &ex, NULL) == 0, "rdma_join_multicast_ex (send-only)");
    CHECK(expect(ch, RDMA_CM_EVENT_MULTICAST_JOIN), "MULTICAST_JOIN (send-only)");
    CHECK(ibv_detach_mcast(id->qp, &ud.ah_attr.grh.dgid, 0) == EINVAL, "a send-only join attaches no QP");
    CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == 0, "rdma_leave_multicast (send-only)");

    ibv_destroy_ah(ah);
    rdma_dereg_mr(mr);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
