/*
 * The messages between the daemon and its egress process (net/netipc.h): what arrives is what
 * was sent, descriptors included; and what breaks the rules (too long, too many descriptors, a
 * body that is not a JSON object) is refused as a protocol error with its descriptors closed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/netipc.h"
#include "tap.h"

static int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        n += fcntl(fd, F_GETFD) >= 0;
    return n;
}

/* Sends a raw datagram: type byte + body, with nfds copies of fd. */
static void raw(int sock, int type, const char *body, size_t len, int fd, int nfds)
{
    char buf[8192];
    buf[0] = (char)type;
    memcpy(buf + 1, body, len);
    struct iovec iov = {.iov_base = buf, .iov_len = len + 1};
    union {
        char c[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr a;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds) {
        mh.msg_control = u.c;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        for (int i = 0; i < nfds; i++)
            memcpy(CMSG_DATA(c) + i * sizeof(int), &fd, sizeof(int));
    }
    if (sendmsg(sock, &mh, 0) < 0)
        abort();
}

int main(void)
{
    int sv[2];
    ok(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0, "a socket pair");
    char *buf = malloc(NETIPC_UP_MAX + 1);
    int type, fds[NETIPC_FDS_MAX], nfds;
    json_t *o;
    struct wr_err err = {0};

    ok(netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) < 0 && errno == EAGAIN,
       "nothing to read: EAGAIN, not a block");

    int pipefd[2];
    ok(pipe(pipefd) == 0, "a pipe to pass");
    json_t *msg = json_pack("{s:i, s:s}", "slot", 7, "id", "sb-x");
    ok(netipc_send(sv[0], NETIPC_SLOT_OPEN, msg, &pipefd[0], 1, NETIPC_UP_MAX) == 0, "sent");
    ok(netipc_peek(sv[1]) == NETIPC_SLOT_OPEN, "its type is seen without reading it");
    ok(netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) == 1 &&
           type == NETIPC_SLOT_OPEN && nfds == 1 && json_equal(o, msg),
       "what arrives is what was sent");
    ok(write(pipefd[1], "x", 1) == 1, "writing into the passed pipe");
    char c = 0;
    ok(nfds == 1 && read(fds[0], &c, 1) == 1 && c == 'x', "the descriptor is the pipe's end");
    ok((fcntl(fds[0], F_GETFD) & FD_CLOEXEC) != 0, "received descriptors are close-on-exec");
    close(fds[0]);
    json_decref(o);

    ok(netipc_send(sv[0], NETIPC_READY, NULL, NULL, 0, NETIPC_UP_MAX) == 0 &&
           netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) == 1 &&
           type == NETIPC_READY && !o && !nfds,
       "an empty body arrives as none");

    /* the sender's bound */
    json_t *big = json_pack("{s:s}", "x", "");
    char *s = malloc(NETIPC_UP_MAX + 10);
    memset(s, 'a', NETIPC_UP_MAX + 9);
    s[NETIPC_UP_MAX + 9] = '\0';
    json_object_set_new(big, "x", json_string(s));
    ok(netipc_send(sv[0], NETIPC_EVENT, big, NULL, 0, NETIPC_UP_MAX) < 0 && errno == EMSGSIZE,
       "a message over the bound is not sent");
    int three[3] = {0, 1, 2};
    ok(netipc_send(sv[0], NETIPC_EVENT, msg, three, 3, NETIPC_UP_MAX) < 0 && errno == EINVAL,
       "nor one with more descriptors than allowed");

    /* the receiver's rules, against raw datagrams */
    int before = open_fds();
    raw(sv[0], NETIPC_EVENT, s, NETIPC_UP_MAX + 5, -1, 0);
    ok(netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) < 0 && errno == EPROTO &&
           strstr(err.msg, "too long"),
       "a datagram over the receiver's bound is a protocol error: %s", err.msg);
    raw(sv[0], NETIPC_EVENT, "{}", 2, pipefd[0], 3);
    ok(netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) < 0 && errno == EPROTO &&
           nfds == 0,
       "three descriptors are a protocol error: %s", err.msg);
    ok(open_fds() == before, "and every descriptor it carried is closed");
    raw(sv[0], NETIPC_EVENT, "[1]", 3, -1, 0);
    ok(netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) < 0 && errno == EPROTO,
       "a body that is not a JSON object is a protocol error");
    raw(sv[0], NETIPC_EVENT, "{\"a\":1,\"a\":2}", 13, -1, 0);
    ok(netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) < 0 && errno == EPROTO,
       "and so is one with a key twice");
    raw(sv[0], NETIPC_EVENT, "{\"a\":", 5, -1, 0);
    ok(netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) < 0 && errno == EPROTO,
       "and one cut short");

    close(sv[0]);
    ok(netipc_recv(sv[1], &type, &o, fds, &nfds, buf, NETIPC_UP_MAX, &err) == 0,
       "the peer's close reads as the end");
    ok(netipc_peek(sv[1]) < 0, "and there is nothing to peek at");
    close(sv[1]);
    close(pipefd[0]);
    close(pipefd[1]);
    json_decref(msg);
    json_decref(big);
    free(s);
    free(buf);
    return tap_done();
}
