/* The four ways rdma-core reads a GID table agree on every entry of device argv[1] (on
 * interface argv[2]): ibv_query_gid, ibv_query_gid_type (what ibv_devinfo prints),
 * ibv_query_gid_ex and ibv_query_gid_table (ibv_query_gid_ex(3), ibv_query_gid_table(3)):
 * the same GID at each index, RoCE v2, on the interface's index. Past the table
 * ibv_query_gid_ex fails with EINVAL, and a table that does not fit in max_entries is
 * EINVAL, as the kernel's rdma_query_gid_table. Prints each GID as ibv_devinfo -v does
 * ("GID[  0]:\t\t::ffff:10.0.0.1, RoCE v2"), then "ok"; or names the failed check. */
#include <arpa/inet.h>
#include <net/if.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

/* rdma-core's <infiniband/driver.h>, which libibverbs-dev does not install: what
 * ibv_devinfo calls for the type of each GID. */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
                       enum ibv_gid_type_sysfs *type);

int main(int argc, char **argv) {
    alarm(20);
    CHECK(argc == 3, "usage: gid_table DEVICE INTERFACE");
    unsigned ifindex = if_nametoindex(argv[2]);
    CHECK(ifindex != 0, "if_nametoindex(INTERFACE)");
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list, "ibv_get_device_list");
    struct ibv_context *ctx = NULL;
    for (int i = 0; list[i]; i++)
        if (strcmp(ibv_get_device_name(list[i]), argv[1]) == 0)
            ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    CHECK(ctx, "ibv_open_device(DEVICE)");
    struct ibv_port_attr port;
    CHECK(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port");
    int n = port.gid_tbl_len;
    CHECK(n > 0, "a GID table");

    struct ibv_gid_entry table[64];
    CHECK(n + 1 <= 64, "a table of at most 63 GIDs here");
    ssize_t got = ibv_query_gid_table(ctx, table, 64, 0);
    CHECK(got == n, "ibv_query_gid_table gives gid_tbl_len entries (softrdma's table has no empty entry)");
    errno = 0;
    CHECK(ibv_query_gid_table(ctx, table + n, n - 1, 0) == -EINVAL, "a table larger than max_entries is EINVAL");

    for (int i = 0; i < n; i++) {
        struct ibv_gid_entry *t = &table[i];
        CHECK(t->gid_index == (uint32_t)i && t->port_num == 1, "ibv_query_gid_table: index and port");
        CHECK(t->gid_type == IBV_GID_TYPE_ROCE_V2, "ibv_query_gid_table: RoCE v2");
        CHECK(t->ndev_ifindex == ifindex, "ibv_query_gid_table: the interface's index");

        struct ibv_gid_entry ex;
        memset(&ex, 0xa5, sizeof ex);
        CHECK(ibv_query_gid_ex(ctx, 1, i, &ex, 0) == 0, "ibv_query_gid_ex");
        CHECK(memcmp(&ex, t, sizeof ex) == 0, "ibv_query_gid_ex equals ibv_query_gid_table's entry");

        union ibv_gid gid;
        CHECK(ibv_query_gid(ctx, 1, i, &gid) == 0, "ibv_query_gid");
        CHECK(memcmp(&gid, &t->gid, sizeof gid) == 0, "ibv_query_gid equals ibv_query_gid_ex");

        enum ibv_gid_type_sysfs type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
        CHECK(ibv_query_gid_type(ctx, 1, i, &type) == 0, "ibv_query_gid_type");
        CHECK(type == IBV_GID_TYPE_SYSFS_ROCE_V2, "ibv_query_gid_type: RoCE v2");

        char text[INET6_ADDRSTRLEN];
        CHECK(inet_ntop(AF_INET6, gid.raw, text, sizeof text), "inet_ntop");
        printf("\t\t\tGID[%3d]:\t\t%s, RoCE v2\n", i, text);
    }

    struct ibv_gid_entry past;
    CHECK(ibv_query_gid_ex(ctx, 1, n, &past, 0) == EINVAL, "ibv_query_gid_ex past the table is EINVAL");
    union ibv_gid none;
    CHECK(ibv_query_gid(ctx, 1, n, &none) == -1 && errno == EINVAL, "ibv_query_gid past the table");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    printf("ok\n");
    return 0;
}
