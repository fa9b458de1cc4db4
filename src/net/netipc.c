/*
 * Messages between the daemon and its egress process (netipc.h).
 */
#include "net/netipc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int netipc_send(int sock, int type, json_t *obj, const int *fds, int nfds, size_t max)
{
    if (nfds < 0 || nfds > NETIPC_FDS_MAX || type < 1 || type > 255) {
        errno = EINVAL;
        return -1;
    }
    char *body = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    size_t blen = body ? strlen(body) : 0;
    if (obj && !body) {
        errno = ENOMEM;
        return -1;
    }
    if (blen > max) {
        explicit_bzero(body, blen);
        free(body);
        errno = EMSGSIZE;
        return -1;
    }
    unsigned char t = (unsigned char)type;
    struct iovec iov[2] = {{.iov_base = &t, .iov_len = 1}, {.iov_base = body, .iov_len = blen}};
    union {
        char buf[CMSG_SPACE(sizeof(int) * NETIPC_FDS_MAX)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = blen ? 2 : 1};
    if (nfds > 0) {
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    do
        n = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    int e = errno;
    if (body) {
        explicit_bzero(body, blen);
        free(body);
    }
    if (n < 0) {
        errno = e;
        return -1;
    }
    return 0;
}

/* Takes the descriptors out of mh's control messages: into fds (up to cap, *nfds of them);
 * closes the rest. Returns how many arrived in all. */
static int take_fds(struct msghdr *mh, int *fds, int cap, int *nfds)
{
    int total = 0;
    *nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            total++;
            if (*nfds < cap)
                fds[(*nfds)++] = fd;
            else
                close(fd);
        }
    }
    return total;
}

static int broken(int *fds, int *nfds, struct wr_err *err, const char *why)
{
    for (int i = 0; i < *nfds; i++)
        close(fds[i]);
    *nfds = 0;
    wr_err_set(err, EPROTO, "egress process message: %s", why);
    errno = EPROTO;
    return -1;
}

int netipc_recv(int sock, int *type, json_t **obj, int *fds, int *nfds, char *buf, size_t max,
                struct wr_err *err)
{
    *obj = NULL;
    *nfds = 0;
    unsigned char t = 0;
    struct iovec iov[2] = {{.iov_base = &t, .iov_len = 1}, {.iov_base = buf, .iov_len = max + 1}};
    union {
        char cbuf[CMSG_SPACE(sizeof(int) * (NETIPC_FDS_MAX + 1))];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {
        .msg_iov = iov, .msg_iovlen = 2, .msg_control = u.cbuf, .msg_controllen = sizeof(u.cbuf)};
    ssize_t n;
    do
        n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    if (n == 0 && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
        return 0;
    int total = take_fds(&mh, fds, NETIPC_FDS_MAX, nfds);
    if (mh.msg_flags & MSG_CTRUNC || total > NETIPC_FDS_MAX)
        return broken(fds, nfds, err, "too many descriptors");
    if (mh.msg_flags & MSG_TRUNC || (size_t)n > max + 1)
        return broken(fds, nfds, err, "too long");
    *type = t;
    size_t blen = (size_t)n - 1;
    if (blen) {
        json_error_t je;
        json_t *o = json_loadb(buf, blen, JSON_REJECT_DUPLICATES, &je);
        explicit_bzero(buf, blen);
        if (!o || !json_is_object(o)) {
            json_decref(o);
            return broken(fds, nfds, err, "not a JSON object");
        }
        *obj = o;
    }
    return 1;
}

int netipc_peek(int sock)
{
    unsigned char t;
    ssize_t n;
    do
        n = recv(sock, &t, 1, MSG_DONTWAIT | MSG_PEEK);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return -1;
    return t;
}
