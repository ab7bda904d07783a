/* nameserver.c — see nameserver.h. */
#include "nameserver.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define NAMESERVER_CONNECT_MS 3000

static int watched = -1; /* the connection, -1 when none */
static int gone;
static char where[80];

static void went(const char *how)
{
    if (watched >= 0) close(watched);
    watched = -1;
    if (!gone) {
        printf("federation: the name service (ompi-server at %s) %s: this site calls it no more (one started "
               "there again has another name); a site out comes back when the sites start again with the new "
               "server (jobs/README.md)\n", where, how);
        fflush(stdout);
    }
    gone = 1;
}

void nameserver_watch(void)
{
    const char *v = getenv("ISTHMUS_NAME_SERVER");
    if (watched >= 0 || gone || !v || !*v) return;
    snprintf(where, sizeof where, "%s", v);
    const char *colon = strrchr(v, ':');
    char host[INET_ADDRSTRLEN], *end;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    const long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || (size_t)(colon - v) >= sizeof host || *end || port < 1 || port > 65535) {
        fprintf(stderr, "isthmus: warning: ISTHMUS_NAME_SERVER='%s' is not ADDR:PORT: the name service is not "
                "watched\n", v);
        return;
    }
    memcpy(host, v, (size_t)(colon - v));
    host[colon - v] = '\0';
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        fprintf(stderr, "isthmus: warning: ISTHMUS_NAME_SERVER='%s': not an IPv4 address: the name service is not "
                "watched\n", v);
        return;
    }
    a.sin_port = htons((unsigned short)port);
    watched = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (watched < 0) return; /* no watch: as without the variable */
    int err = connect(watched, (struct sockaddr *)&a, sizeof a) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
        struct pollfd p = {.fd = watched, .events = POLLOUT};
        socklen_t len = sizeof err;
        err = poll(&p, 1, NAMESERVER_CONNECT_MS) != 1 ? ETIMEDOUT
              : getsockopt(watched, SOL_SOCKET, SO_ERROR, &err, &len) ? errno
                                                                      : err;
    }
    if (err) went("does not answer");
}

int nameserver_gone(void)
{
    if (watched >= 0) {
        /* the server never writes to it: readable means closed or reset */
        struct pollfd p = {.fd = watched, .events = POLLIN | POLLRDHUP};
        if (poll(&p, 1, 0) > 0) went("went away (its connection ended)");
    }
    return gone;
}
