/*
 * The HTTP server out of file descriptors: with the process's RLIMIT_NOFILE at a few dozen and
 * every fd but one taken, a client's connection makes the server's accept() fail (EMFILE). The
 * server must count the error, pause its listeners without touching evhttp's memory (the error
 * callback's argument is evhttp's own, not our server), and once fds are free again accept the
 * waiting client and answer it. A process of its own: the fd limit is the whole process's.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http/http.h"
#include "tap.h"

#define FD_LIMIT 40

static struct event_base *base;
static struct http_server *server;
static atomic_int handled;

static void handler(struct http_req *r, void *ctx)
{
    atomic_fetch_add(&handled, 1);
    http_reply(r, 200, "text/plain", "hello", 5);
}

static void keepalive(evutil_socket_t fd, short what, void *arg)
{
}

static void *loop_main(void *arg)
{
    event_base_dispatch(base);
    return NULL;
}

/* The server's counters, read on the loop's thread. */
struct stats_ask {
    struct http_conn_stats st;
    atomic_int done;
};

static void read_stats(evutil_socket_t fd, short what, void *arg)
{
    struct stats_ask *a = arg;
    http_server_conn_stats(server, &a->st);
    atomic_store(&a->done, 1);
}

static unsigned long long accept_errors(void)
{
    struct stats_ask a = {0};
    struct timeval zero = {0, 0};
    if (event_base_once(base, -1, EV_TIMEOUT, read_stats, &a, &zero) < 0)
        return 0;
    while (!atomic_load(&a.done)) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    return a.st.accept_errors;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int connect_tcp(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Reads until the peer closes or n bytes; returns how many. */
static size_t read_some(int fd, char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        if (memmem(buf, got, "hello", 5))
            break;
    }
    return got;
}

int main(void)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = FD_LIMIT;
    ok(setrlimit(RLIMIT_NOFILE, &rl) == 0, "RLIMIT_NOFILE set to %d", FD_LIMIT);

    evthread_use_pthreads();
    base = event_base_new();
    struct wr_err err = {0};
    server = http_server_new(base, handler, NULL, 1024, &err);
    int port = free_port();
    ok(server && http_server_listen_tcp(server, "127.0.0.1", port, &err) == 0,
       "the server listens on 127.0.0.1:%d", port);
    struct event *ka = event_new(base, -1, EV_PERSIST, keepalive, NULL);
    struct timeval sec = {1, 0};
    event_add(ka, &sec);
    pthread_t loop;
    pthread_create(&loop, NULL, loop_main, NULL);

    /* Every fd but one taken; the client's socket takes the last, so accept() has none. */
    int fillers[FD_LIMIT], nfill = 0;
    int fd;
    while (nfill < FD_LIMIT && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
        fillers[nfill++] = fd;
    ok(errno == EMFILE && nfill > 0, "%d fds filled the table up to its limit", nfill);
    close(fillers[--nfill]);
    int c = connect_tcp(port);
    ok(c >= 0, "a client connects while the server has no fd left");
    ok(c >= 0 && send(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, MSG_NOSIGNAL) == 27,
       "and sends its request");

    unsigned long long errs = 0;
    for (int t = 0; t < 10000 && errs == 0; t += 10) {
        errs = accept_errors();
        if (errs == 0) {
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
        }
    }
    ok(errs >= 1, "the server counts its failed accept (%llu)", errs);
    ok(atomic_load(&handled) == 0, "nothing was answered while out of fds");

    /* fds free again: the paused listener comes back and the waiting client is answered. */
    while (nfill > 0)
        close(fillers[--nfill]);
    char buf[512] = {0};
    size_t n = c >= 0 ? read_some(c, buf, sizeof(buf) - 1) : 0;
    ok(n > 0 && strncmp(buf, "HTTP/1.1 200", 12) == 0 && memmem(buf, n, "hello", 5),
       "once fds are free the server accepts the client and answers it");
    ok(atomic_load(&handled) == 1, "the handler ran once");
    if (c >= 0)
        close(c);

    int c2 = connect_tcp(port);
    memset(buf, 0, sizeof(buf));
    n = c2 >= 0 && send(c2, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, MSG_NOSIGNAL) == 27
            ? read_some(c2, buf, sizeof(buf) - 1)
            : 0;
    ok(n > 0 && strncmp(buf, "HTTP/1.1 200", 12) == 0, "and a new client after it");
    if (c2 >= 0)
        close(c2);

    event_base_loopbreak(base);
    pthread_join(loop, NULL);
    event_free(ka);
    http_server_free(server);
    event_base_free(base);
    return tap_done();
}
