/* An rsocket client that connects, sends "bye" and returns from main without rclose:
 * `rsocket_exit HOST PORT`. Its peer must still see the connection end. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <rdma/rsocket.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: rsocket_exit HOST PORT\n");
		return 2;
	}
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
	inet_pton(AF_INET, argv[1], &a.sin_addr);
	int s = rsocket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || rconnect(s, (struct sockaddr *)&a, sizeof a)) {
		perror("rsocket/rconnect");
		return 1;
	}
	if (rsend(s, "bye", 3, 0) != 3) {
		perror("rsend");
		return 1;
	}
	return 0; /* no rclose */
}
