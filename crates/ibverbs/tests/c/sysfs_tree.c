/* The files ibv_device.ibdev_path and dev_path name (softrdma's sysfs-shaped tree) say what
 * the verbs say: for every device and GID, ports/1/{state,phys_state,link_layer,rate,
 * cap_mask}, gids/<i>, gid_attrs/types/<i> and gid_attrs/ndevs/<i> agree with
 * ibv_query_port, ibv_query_gid, ibv_query_gid_type and ibv_query_gid_ex; node_guid with
 * ibv_get_device_guid; dev_path's ibdev names the device; ibv_read_sysfs_file reads the
 * same files. Prints "ok". */
#include <arpa/inet.h>
#include <endian.h>
#include <net/if.h>
#include <stdlib.h>

#include "common.h"

/* rdma-core's <infiniband/driver.h>, which libibverbs-dev does not install. */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
                       enum ibv_gid_type_sysfs *type);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

/* The first line of <dir>/<file>, without its newline; NULL if unreadable. */
static char *read_line(const char *dir, const char *file) {
    static char buf[256];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *ok = fgets(buf, sizeof buf, f);
    fclose(f);
    if (!ok)
        return NULL;
    buf[strcspn(buf, "\n")] = 0;
    return buf;
}

#define EXPECT(dir, file, want)                                                                        \
    do {                                                                                               \
        char *got_ = read_line(dir, file);                                                             \
        if (!got_ || strcmp(got_, want) != 0) {                                                        \
            fprintf(stderr, "FAILED: %s/%s is \"%s\", the verbs say \"%s\"\n", dir, file, got_ ? got_ : "(unreadable)", \
                    want);                                                                             \
            return 1;                                                                                  \
        }                                                                                              \
    } while (0)

int main(void) {
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n > 0, "ibv_get_device_list lists devices");
    for (int d = 0; d < n; d++) {
        struct ibv_device *dev = list[d];
        const char *dir = dev->ibdev_path;
        char want[256], file[128];
        CHECK(strncmp(dir, "/sys/", 5) != 0, "ibdev_path names softrdma's tree, not /sys");
        EXPECT(dev->dev_path, "ibdev", ibv_get_device_name(dev));
        uint64_t guid = be64toh(ibv_get_device_guid(dev));
        snprintf(want, sizeof want, "%04x:%04x:%04x:%04x", (unsigned)(guid >> 48), (unsigned)(guid >> 32) & 0xffff,
                 (unsigned)(guid >> 16) & 0xffff, (unsigned)guid & 0xffff);
        EXPECT(dir, "node_guid", want);
        EXPECT(dir, "node_type", "1: CA");
        char via[64];
        CHECK(ibv_read_sysfs_file(dir, "ports/1/link_layer", via, sizeof via) > 0 && strcmp(via, "Ethernet") == 0,
              "ibv_read_sysfs_file reads the tree");

        struct ibv_context *ctx = ibv_open_device(dev);
        CHECK(ctx, "ibv_open_device");
        struct ibv_port_attr p;
        CHECK(ibv_query_port(ctx, 1, &p) == 0, "ibv_query_port");
        static const char *states[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE"};
        snprintf(want, sizeof want, "%d: %s", p.state, p.state <= 4 ? states[p.state] : "?");
        EXPECT(dir, "ports/1/state", want);
        static const char *phys[] = {"", "Sleep", "Polling", "Disabled", "", "LinkUp"};
        snprintf(want, sizeof want, "%d: %s", p.phys_state, p.phys_state <= 5 ? phys[p.phys_state] : "?");
        EXPECT(dir, "ports/1/phys_state", want);
        EXPECT(dir, "ports/1/link_layer", p.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
        snprintf(want, sizeof want, "0x%08x", p.port_cap_flags);
        EXPECT(dir, "ports/1/cap_mask", want);
        CHECK(p.active_width == 2 && p.active_speed == 32, "4X EDR, as the rate below says");
        EXPECT(dir, "ports/1/rate", "100 Gb/sec (4X EDR)");

        for (int i = 0; i < p.gid_tbl_len; i++) {
            union ibv_gid gid;
            CHECK(ibv_query_gid(ctx, 1, i, &gid) == 0, "ibv_query_gid");
            char *w = want;
            for (int b = 0; b < 16; b += 2)
                w += sprintf(w, "%s%02x%02x", b ? ":" : "", gid.raw[b], gid.raw[b + 1]);
            snprintf(file, sizeof file, "ports/1/gids/%d", i);
            EXPECT(dir, file, want);
            enum ibv_gid_type_sysfs type;
            CHECK(ibv_query_gid_type(ctx, 1, i, &type) == 0, "ibv_query_gid_type");
            snprintf(file, sizeof file, "ports/1/gid_attrs/types/%d", i);
            EXPECT(dir, file, type == IBV_GID_TYPE_SYSFS_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1");
            struct ibv_gid_entry entry;
            CHECK(ibv_query_gid_ex(ctx, 1, i, &entry, 0) == 0, "ibv_query_gid_ex");
            char ifname[IF_NAMESIZE];
            CHECK(if_indextoname(entry.ndev_ifindex, ifname), "if_indextoname(ndev_ifindex)");
            snprintf(file, sizeof file, "ports/1/gid_attrs/ndevs/%d", i);
            EXPECT(dir, file, ifname);
        }
        snprintf(file, sizeof file, "ports/1/gids/%d", p.gid_tbl_len);
        CHECK(read_line(dir, file) == NULL, "no GID file past the table");
        ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    printf("ok\n");
    return 0;
}
