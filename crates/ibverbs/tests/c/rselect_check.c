/* rselect over rsockets and an ordinary descriptor, in one process: `rselect_check PORT`.
 * A client rsocket connects to a listener of the same process; rselect reports the
 * listener readable, then the accepted socket readable once the client sent, never the
 * pipe beside them, and times out when nothing is ready. Prints "ok". */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>
#include <rdma/rsocket.h>

static int fail(const char *what)
{
	perror(what);
	return 1;
}

/* rselect for reading on `fd` and the pipe's read end; the descriptors reported. */
static int wait_read(int fd, int quiet, int ms, fd_set *r)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
	FD_ZERO(r);
	FD_SET(fd, r);
	FD_SET(quiet, r);
	return rselect((fd > quiet ? fd : quiet) + 1, r, NULL, NULL, &tv);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: rselect_check PORT\n");
		return 2;
	}
	int p[2];
	if (pipe(p))
		return fail("pipe");
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[1])) };
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	int l = rsocket(AF_INET, SOCK_STREAM, 0);
	if (l < 0 || rbind(l, (struct sockaddr *)&a, sizeof a) || rlisten(l, 1))
		return fail("rsocket/rbind/rlisten");
	fd_set r;
	if (wait_read(l, p[0], 50, &r) != 0) {
		fprintf(stderr, "rselect reported a listener with no connection\n");
		return 1;
	}
	int c = rsocket(AF_INET, SOCK_STREAM, 0);
	if (c < 0 || rconnect(c, (struct sockaddr *)&a, sizeof a))
		return fail("rsocket/rconnect");
	if (wait_read(l, p[0], 5000, &r) != 1 || !FD_ISSET(l, &r) || FD_ISSET(p[0], &r)) {
		fprintf(stderr, "rselect did not report the listener (alone) readable\n");
		return 1;
	}
	int s = raccept(l, NULL, NULL);
	if (s < 0)
		return fail("raccept");
	if (wait_read(s, p[0], 50, &r) != 0) {
		fprintf(stderr, "rselect reported data before any was sent\n");
		return 1;
	}
	if (rsend(c, "hello", 5, 0) != 5)
		return fail("rsend");
	if (wait_read(s, p[0], 5000, &r) != 1 || !FD_ISSET(s, &r) || FD_ISSET(p[0], &r)) {
		fprintf(stderr, "rselect did not report the accepted socket (alone) readable\n");
		return 1;
	}
	char buf[8] = { 0 };
	if (rrecv(s, buf, sizeof buf, 0) != 5 || memcmp(buf, "hello", 5))
		return fail("rrecv");
	rclose(c);
	rclose(s);
	rclose(l);
	printf("ok\n");
	return 0;
}
