/* A plain TCP program (no rdma headers) that checks every byte it moves, for running
 * under librspreload.so: `tcp_check server PORT BYTES` accepts one connection, reads
 * BYTES, checks them, and sends them back; `tcp_check client HOST PORT BYTES` sends BYTES
 * of a pattern, reads the echo and checks it. Both wait with poll() on the connection and
 * a pipe that never becomes readable: an rsocket and an ordinary descriptor in one set.
 * Each prints "rsocket" when its connection is librspreload's (its descriptor is the
 * /dev/null placeholder librspreload hands out), "tcp" when it is the kernel's. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned char pattern(size_t i)
{
	return (unsigned char)(i * 7 + i / 251);
}

static int quiet_pipe[2];

/* Waits until fd is ready for `events`, with the pipe in the same poll set. */
static void wait_for(int fd, short events)
{
	struct pollfd p[2] = { { .fd = quiet_pipe[0], .events = POLLIN }, { .fd = fd, .events = events } };
	int n = poll(p, 2, 10000);
	if (n <= 0 || p[0].revents) {
		fprintf(stderr, "poll: %d (%s), pipe revents %d\n", n, n < 0 ? strerror(errno) : "timeout", p[0].revents);
		exit(1);
	}
}

static void move(int fd, unsigned char *buf, size_t len, int sending)
{
	size_t done = 0;
	while (done < len) {
		wait_for(fd, sending ? POLLOUT : POLLIN);
		size_t chunk = len - done < 100003 ? len - done : 100003; /* odd sizes */
		ssize_t n = sending ? write(fd, buf + done, chunk) : read(fd, buf + done, chunk);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0) {
			fprintf(stderr, "%s after %zu of %zu bytes: %s\n", sending ? "write" : "read", done, len,
				n < 0 ? strerror(errno) : "end of stream");
			exit(1);
		}
		done += (size_t)n;
	}
}

static void check(const unsigned char *buf, size_t len, const char *what)
{
	for (size_t i = 0; i < len; i++) {
		if (buf[i] != pattern(i)) {
			fprintf(stderr, "%s: byte %zu is %u, not %u\n", what, i, buf[i], pattern(i));
			exit(1);
		}
	}
}

static void say_kind(int fd)
{
	char path[64], target[256];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, target, sizeof target - 1);
	target[n > 0 ? n : 0] = 0;
	printf("%s\n", strcmp(target, "/dev/null") == 0 ? "rsocket" : "tcp");
}

int main(int argc, char **argv)
{
	if (pipe(quiet_pipe)) {
		perror("pipe");
		return 1;
	}
	int server = argc == 4 && strcmp(argv[1], "server") == 0;
	if (!server && !(argc == 5 && strcmp(argv[1], "client") == 0)) {
		fprintf(stderr, "usage: tcp_check server PORT BYTES | client HOST PORT BYTES\n");
		return 2;
	}
	size_t len = strtoul(argv[server ? 3 : 4], NULL, 0);
	unsigned char *buf = malloc(len);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[server ? 2 : 3])) };
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || !buf) {
		perror("socket");
		return 1;
	}
	int fd;
	if (server) {
		int one = 1;
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		a.sin_addr.s_addr = htonl(INADDR_ANY);
		if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1)) {
			perror("bind/listen");
			return 1;
		}
		printf("listening\n");
		fflush(stdout);
		wait_for(s, POLLIN);
		fd = accept(s, NULL, NULL);
		if (fd < 0) {
			perror("accept");
			return 1;
		}
		move(fd, buf, len, 0);
		check(buf, len, "server received");
		move(fd, buf, len, 1);
	} else {
		inet_pton(AF_INET, argv[2], &a.sin_addr);
		if (connect(s, (struct sockaddr *)&a, sizeof a)) {
			perror("connect");
			return 1;
		}
		fd = s;
		for (size_t i = 0; i < len; i++)
			buf[i] = pattern(i);
		move(fd, buf, len, 1);
		memset(buf, 0, len);
		move(fd, buf, len, 0);
		check(buf, len, "client received the echo");
	}
	say_kind(fd);
	printf("ok %zu bytes\n", len);
	close(fd);
	if (server)
		close(s);
	return 0;
}
