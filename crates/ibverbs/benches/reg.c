/* What registering memory costs, in time and resident memory: SIZE MiB of anonymous memory
 * never touched, registered with ibv_reg_mr (access LOCAL_WRITE | REMOTE_WRITE) plainly and
 * with IBV_ACCESS_ON_DEMAND, then the implicit on-demand region (NULL, SIZE_MAX); each
 * deregistered before the next. A kernel RDMA device pins (and so faults in) every page of
 * a plain registration; a software NIC needs to pin none.
 *
 *   reg [SIZE_MIB]      (scripts/reg-bench builds and runs it over this build's libraries) */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static long rss_kib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2)
        return -1;
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int one(struct ibv_pd *pd, const char *what, void *addr, size_t len, int access) {
    long before = rss_kib();
    double t0 = now_us();
    struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
    double t1 = now_us();
    long after = rss_kib();
    if (!mr) {
        perror(what);
        return 1;
    }
    double t2 = now_us();
    ibv_dereg_mr(mr);
    double t3 = now_us();
    printf("%-28s reg %9.1f us  dereg %7.1f us  resident +%ld KiB\n", what, t1 - t0, t3 - t2, after - before);
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
    size_t len = mib << 20;
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    if (!pd) {
        fprintf(stderr, "no device\n");
        return 1;
    }
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    printf("%zu MiB of untouched memory on %s\n", mib, ibv_get_device_name(list[0]));
    return one(pd, "ibv_reg_mr", mem, len, acc) || one(pd, "ibv_reg_mr ON_DEMAND", mem, len, acc | IBV_ACCESS_ON_DEMAND) ||
           one(pd, "implicit ON_DEMAND", NULL, SIZE_MAX, acc | IBV_ACCESS_ON_DEMAND);
}
