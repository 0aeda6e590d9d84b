/* The devices of a wildcard listener stay open once it is destroyed, as librdmacm never
 * closes a device it opened (ucma_put_device frees only the PD): the next rdma_bind_addr
 * to 0.0.0.0 finds them open. Opened anew, a device takes milliseconds (sockets, its
 * progress thread, joining the host's port) during which a peer's REQ met no listener:
 * perftest -R's server destroys the listener of its exchange connection and at once
 * listens for its QPs' connections. A device's progress thread, "softrdma-<interface>",
 * shows it open. Prints "ok" and exits 0, or names the failed check and exits 1. */
#include <dirent.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

/* Whether a thread of this process is named `name`. */
static int thread_named(const char *name) {
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = 0;
        fclose(f);
        found = strcmp(comm, name) == 0;
    }
    closedir(d);
    return found;
}

static int listen_on_all(struct rdma_event_channel *ch, struct rdma_cm_id **id, int port) {
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    CHECK(rdma_create_id(ch, id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_bind_addr(*id, (struct sockaddr *)&any) == 0, "rdma_bind_addr to 0.0.0.0");
    CHECK(rdma_listen(*id, 1) == 0, "rdma_listen");
    return 0;
}

int main(int argc, char **argv) {
    alarm(20);
    int port = argc > 1 ? atoi(argv[1]) : 7000 + getpid() % 1000;
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch, "rdma_create_event_channel");
    struct rdma_cm_id *first, *second;
    if (listen_on_all(ch, &first, port))
        return 1;
    CHECK(thread_named("softrdma-lo"), "softrdma_lo is open while the wildcard listener listens");
    CHECK(rdma_destroy_id(first) == 0, "rdma_destroy_id");
    usleep(200 * 1000); /* a closing device's thread has long ended by now */
    CHECK(thread_named("softrdma-lo"), "softrdma_lo is still open after the wildcard listener is destroyed");
    if (listen_on_all(ch, &second, port + 1))
        return 1;
    CHECK(rdma_destroy_id(second) == 0, "rdma_destroy_id (the second listener)");
    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
