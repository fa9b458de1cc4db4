/*
 * Network namespaces held by fds, and the rtnetlink, sysctl and nftables work done inside them:
 * see netns.h.
 *
 * Rtnetlink is spoken directly (a few message types, one request at a time) rather than through
 * a library: each call opens one NETLINK_ROUTE socket inside the target namespace, so the request
 * acts on that namespace whatever namespace the calling thread is in, sends one request with
 * NLM_F_ACK, and reads until the answer carrying its sequence number, with a timeout. Sockets made
 * inside a namespace keep it for life, which is why almost nothing here needs the calling thread
 * to move: only making a socket, opening a /proc/sys file and running libnftables do, each inside
 * netns_run, which always brings the thread back.
 */
#include "net/netns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <nftables/libnftables.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

/* Our requests: a veth pair with both names and both namespace fds is under 200 bytes. */
#define NL_REQ_MAX 512
/* An ack: nlmsgerr (the request's header only, NETLINK_CAP_ACK) and the kernel's message. */
#define NL_ACK_MAX 8192
/* One read of an address dump: the kernel fills a dump skb up to about this, so a larger buffer
 * would only go unused and a smaller one could truncate a message (MSG_TRUNC is checked). */
#define NL_DUMP_MAX 32768
/* Address dumps restarted because an address changed during one (NLM_F_DUMP_INTR). */
#define DUMP_TRIES 3
/* A sysctl path below /proc/sys/net and the value written there. */
#define SYSCTL_PATH_MAX 200
#define SYSCTL_VALUE_MAX 64
/* How much of libnftables's error text goes into the message (the rest of WR_ERR_MSG_MAX is
 * the context prefixed on the way up). */
#define NFT_ERR_MAX 360

static const char thread_ns_path[] = "/proc/thread-self/ns/net";

/* Sequence numbers: each socket sees one request, but distinct numbers make a stray answer (a
 * bug) visible as a mismatch rather than taken for ours. */
static atomic_uint nl_seq_next = 1;

/* ---- names ---- */

static int ifname_check(const char *name, struct wr_err *err)
{
    size_t n = name ? strnlen(name, NETNS_IFNAME_MAX + 1) : 0;
    if (n == 0 || n > NETNS_IFNAME_MAX)
        return wr_err_kind(err, WR_E_INVALID, EINVAL,
                           "interface name must be 1..%d bytes of [a-zA-Z0-9_.-]",
                           NETNS_IFNAME_MAX);
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return wr_err_kind(err, WR_E_INVALID, EINVAL, "interface name '%s' is reserved", name);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int fine = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '_' || c == '.' || c == '-';
        if (!fine)
            return wr_err_kind(err, WR_E_INVALID, EINVAL,
                               "interface name has a byte 0x%02x outside [a-zA-Z0-9_.-]",
                               (unsigned char)c);
    }
    return 0;
}

/* ---- entering namespaces ---- */

int netns_run(int nsfd, int (*fn)(void *arg, struct wr_err *err), void *arg, struct wr_err *err)
{
    int home = open(thread_ns_path, O_RDONLY | O_CLOEXEC);
    if (home < 0)
        return wr_err_sys(err, errno, "opening %s", thread_ns_path);
    if (setns(nsfd, CLONE_NEWNET) < 0) {
        int e = errno;
        close(home);
        return wr_err_sys(err, e, "entering network namespace (fd %d)", nsfd);
    }
    int r = fn(arg, err);
    if (setns(home, CLONE_NEWNET) < 0) {
        /* Carrying on would run this worker's later requests (sockets, sysctls) inside a
         * sandbox's namespace. There is no safe way back, so stop here. */
        log_error(NULL, "netns.leave_failed", "errno=%d", errno);
        abort();
    }
    close(home);
    return r;
}

struct socket_args {
    int domain, type, protocol;
    int fd; /* OUT */
};

static int socket_inside(void *arg, struct wr_err *err)
{
    struct socket_args *a = arg;
    a->fd = socket(a->domain, a->type | SOCK_CLOEXEC, a->protocol);
    if (a->fd < 0)
        return wr_err_sys(err, errno, "socket(%d, %d, %d)", a->domain, a->type, a->protocol);
    return 0;
}

int netns_socket(int nsfd, int domain, int type, int protocol, struct wr_err *err)
{
    struct socket_args a = {.domain = domain, .type = type, .protocol = protocol, .fd = -1};
    if (netns_run(nsfd, socket_inside, &a, err) < 0)
        return -1;
    return a.fd;
}

/* ---- rtnetlink ---- */

struct nl_req {
    _Alignas(struct nlmsghdr) uint8_t b[NL_REQ_MAX];
    size_t len;
    int full; /* an append did not fit: a bug in the caller's sizing, reported at send */
};

/* Starts a request of type with flags (NLM_F_REQUEST and NLM_F_ACK are added at send) and a
 * zeroed family header of hdrlen bytes, which is returned. */
static void *nl_start(struct nl_req *r, uint16_t type, uint16_t flags, size_t hdrlen)
{
    memset(r, 0, sizeof(*r));
    struct nlmsghdr *h = (struct nlmsghdr *)r->b;
    h->nlmsg_type = type;
    h->nlmsg_flags = flags;
    r->len = NLMSG_SPACE(hdrlen);
    return NLMSG_DATA(h);
}

static void *nl_reserve(struct nl_req *r, size_t len)
{
    size_t al = NLMSG_ALIGN(len);
    if (r->full || al > sizeof(r->b) - r->len) {
        r->full = 1;
        return NULL;
    }
    void *p = r->b + r->len;
    r->len += al;
    return p;
}

static struct rtattr *nl_attr(struct nl_req *r, unsigned short type, const void *data, size_t len)
{
    struct rtattr *a = nl_reserve(r, RTA_LENGTH(len));
    if (!a)
        return NULL;
    a->rta_type = type;
    a->rta_len = (unsigned short)RTA_LENGTH(len);
    if (len)
        memcpy(RTA_DATA(a), data, len);
    return a;
}

static void nl_attr_str(struct nl_req *r, unsigned short type, const char *s)
{
    nl_attr(r, type, s, strlen(s) + 1);
}

static void nl_attr_u32(struct nl_req *r, unsigned short type, uint32_t v)
{
    nl_attr(r, type, &v, sizeof(v));
}

/* A nested attribute: everything appended until nl_nest_end goes inside it. */
static struct rtattr *nl_nest_begin(struct nl_req *r, unsigned short type)
{
    return nl_attr(r, type | NLA_F_NESTED, NULL, 0);
}

static void nl_nest_end(struct nl_req *r, struct rtattr *nest)
{
    if (nest)
        nest->rta_len = (unsigned short)(r->b + r->len - (uint8_t *)nest);
}

/* A NETLINK_ROUTE socket inside nsfd, its reads bounded by NETNS_NL_TIMEOUT_MS. */
static int nl_open(int nsfd, struct wr_err *err)
{
    cleanup_close int fd = netns_socket(nsfd, AF_NETLINK, SOCK_RAW, NETLINK_ROUTE, err);
    if (fd < 0)
        return wr_err_prefix(err, "opening rtnetlink");
    struct timeval tv = {.tv_sec = NETNS_NL_TIMEOUT_MS / 1000,
                         .tv_usec = (NETNS_NL_TIMEOUT_MS % 1000) * 1000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
        return wr_err_sys(err, errno, "setting the rtnetlink timeout");
    /* Only for better messages (the kernel's reason text) and smaller acks: without them the
     * answers still carry the errno, so a failure here is not one. */
    int one = 1;
    (void)setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
    (void)setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
    return steal_fd(&fd);
}

static int nl_send(int fd, struct nl_req *r, uint16_t extra_flags, uint32_t *seq,
                   struct wr_err *err)
{
    if (r->full)
        return wr_err_set(err, EMSGSIZE, "rtnetlink request over %d bytes", NL_REQ_MAX);
    struct nlmsghdr *h = (struct nlmsghdr *)r->b;
    h->nlmsg_len = (uint32_t)r->len;
    h->nlmsg_flags |= NLM_F_REQUEST | extra_flags;
    h->nlmsg_seq = *seq = atomic_fetch_add(&nl_seq_next, 1);
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    ssize_t n;
    do
        n = sendto(fd, r->b, r->len, 0, (struct sockaddr *)&kernel, sizeof(kernel));
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return wr_err_sys(err, errno, "sending to rtnetlink");
    if ((size_t)n != r->len)
        return wr_err_set(err, EIO, "short send to rtnetlink (%zd of %zu bytes)", n, r->len);
    return 0;
}

/* One datagram from the kernel into buf: its length, or -1 with err set (ETIMEDOUT when nothing
 * came within the socket's timeout). Datagrams from anyone but the kernel are skipped. */
static ssize_t nl_recv(int fd, void *buf, size_t size, struct wr_err *err)
{
    for (;;) {
        struct sockaddr_nl from;
        socklen_t fromlen = sizeof(from);
        ssize_t n = recvfrom(fd, buf, size, MSG_TRUNC, (struct sockaddr *)&from, &fromlen);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return wr_err_set(err, ETIMEDOUT, "no answer from rtnetlink within %d ms",
                              NETNS_NL_TIMEOUT_MS);
        if (n < 0)
            return wr_err_sys(err, errno, "reading from rtnetlink");
        if ((size_t)n > size)
            return wr_err_set(err, EMSGSIZE, "rtnetlink answer of %zd bytes over %zu", n, size);
        if (fromlen != sizeof(from) || from.nl_family != AF_NETLINK || from.nl_pid != 0)
            continue;
        return n;
    }
}

/* The kernel's reason text from an extended ack (NLMSGERR_ATTR_MSG), or "". */
static void nl_ext_msg(const struct nlmsghdr *h, char *out, size_t outlen)
{
    out[0] = 0;
    if (!(h->nlmsg_flags & NLM_F_ACK_TLVS))
        return;
    const struct nlmsgerr *e = NLMSG_DATA(h);
    size_t off = NLMSG_HDRLEN + sizeof(*e);
    if (!(h->nlmsg_flags & NLM_F_CAPPED))
        off += NLMSG_ALIGN(e->msg.nlmsg_len) - NLMSG_HDRLEN; /* the request's payload, echoed */
    while (off + NLA_HDRLEN <= h->nlmsg_len) {
        const struct nlattr *a = (const struct nlattr *)((const uint8_t *)h + off);
        if (a->nla_len < NLA_HDRLEN || a->nla_len > h->nlmsg_len - off)
            return;
        if ((a->nla_type & NLA_TYPE_MASK) == NLMSGERR_ATTR_MSG) {
            size_t n = strnlen((const char *)a + NLA_HDRLEN, a->nla_len - NLA_HDRLEN);
            if (n >= outlen)
                n = outlen - 1;
            memcpy(out, (const char *)a + NLA_HDRLEN, n);
            out[n] = 0;
            return;
        }
        off += NLA_ALIGN(a->nla_len);
    }
}

/*
 * Sends r with NLM_F_ACK on fd and waits for its ack. Returns 0 if the kernel accepted it, the
 * errno it refused it with (positive; err untouched, the kernel's reason text in why), or -1 with
 * err set if the exchange itself failed.
 */
static int nl_transact(int fd, struct nl_req *r, char *why, size_t whylen, struct wr_err *err)
{
    _Alignas(struct nlmsghdr) uint8_t buf[NL_ACK_MAX];
    uint32_t seq;
    why[0] = 0;
    if (nl_send(fd, r, NLM_F_ACK, &seq, err) < 0)
        return -1;
    for (;;) {
        ssize_t n = nl_recv(fd, buf, sizeof(buf), err);
        if (n < 0)
            return -1;
        size_t left = (size_t)n;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_seq != seq || h->nlmsg_type != NLMSG_ERROR)
                continue;
            if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct nlmsgerr)))
                return wr_err_set(err, EBADMSG, "short rtnetlink ack (%u bytes)", h->nlmsg_len);
            const struct nlmsgerr *e = NLMSG_DATA(h);
            if (e->error == 0)
                return 0;
            nl_ext_msg(h, why, whylen);
            return e->error < 0 ? -e->error : e->error;
        }
    }
}

/* Sets err for a request the kernel refused with errno code; returns -1. */
static int nl_refused(struct wr_err *err, int code, const char *why, const char *what)
{
    if (why[0])
        return wr_err_sys(err, code, "%s (kernel: %s)", what, why);
    return wr_err_sys(err, code, "%s", what);
}

/* The index of ifname in fd's namespace (fd: any socket made there), or -1 with err set. */
static int ifindex_of(int fd, const char *ifname, struct wr_err *err)
{
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, ifname, strlen(ifname)); /* checked: at most NETNS_IFNAME_MAX */
    if (ioctl(fd, SIOCGIFINDEX, &ifr) < 0)
        return wr_err_sys(err, errno, "looking up interface %s", ifname);
    return ifr.ifr_ifindex;
}

int netns_veth_create(int a_nsfd, const char *a_name, int b_nsfd, const char *b_name,
                      struct wr_err *err)
{
    if (ifname_check(a_name, err) < 0 || ifname_check(b_name, err) < 0)
        return -1;
    cleanup_close int fd = nl_open(a_nsfd, err);
    if (fd < 0)
        return -1;
    struct nl_req r;
    nl_start(&r, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, sizeof(struct ifinfomsg));
    /* Both ends name their namespace, so neither ever appears where the request was sent from
     * and there is no window in which an end sits in the wrong namespace. */
    nl_attr_str(&r, IFLA_IFNAME, a_name);
    nl_attr_u32(&r, IFLA_NET_NS_FD, (uint32_t)a_nsfd);
    struct rtattr *linkinfo = nl_nest_begin(&r, IFLA_LINKINFO);
    nl_attr_str(&r, IFLA_INFO_KIND, "veth");
    struct rtattr *data = nl_nest_begin(&r, IFLA_INFO_DATA);
    struct rtattr *peer = nl_nest_begin(&r, VETH_INFO_PEER);
    nl_reserve(&r, sizeof(struct ifinfomsg)); /* the peer's own header, zero: AF_UNSPEC */
    nl_attr_str(&r, IFLA_IFNAME, b_name);
    nl_attr_u32(&r, IFLA_NET_NS_FD, (uint32_t)b_nsfd);
    nl_nest_end(&r, peer);
    nl_nest_end(&r, data);
    nl_nest_end(&r, linkinfo);
    char why[256];
    int e = nl_transact(fd, &r, why, sizeof(why), err);
    if (e < 0)
        return wr_err_prefix(err, "creating veth %s/%s", a_name, b_name);
    if (e) {
        char what[64];
        snprintf(what, sizeof(what), "creating veth %s/%s", a_name, b_name);
        return nl_refused(err, e, why, what);
    }
    return 0;
}

int netns_link_del(int nsfd, const char *ifname, struct wr_err *err)
{
    if (ifname_check(ifname, err) < 0)
        return -1;
    cleanup_close int fd = nl_open(nsfd, err);
    if (fd < 0)
        return -1;
    struct nl_req r;
    nl_start(&r, RTM_DELLINK, 0, sizeof(struct ifinfomsg));
    nl_attr_str(&r, IFLA_IFNAME, ifname);
    char why[256];
    int e = nl_transact(fd, &r, why, sizeof(why), err);
    if (e < 0)
        return wr_err_prefix(err, "deleting link %s", ifname);
    if (e && e != ENODEV) {
        char what[64];
        snprintf(what, sizeof(what), "deleting link %s", ifname);
        return nl_refused(err, e, why, what);
    }
    return 0;
}

int netns_link_up(int nsfd, const char *ifname, struct wr_err *err)
{
    if (ifname_check(ifname, err) < 0)
        return -1;
    cleanup_close int fd = nl_open(nsfd, err);
    if (fd < 0)
        return -1;
    struct nl_req r;
    struct ifinfomsg *ifi = nl_start(&r, RTM_NEWLINK, 0, sizeof(*ifi));
    ifi->ifi_family = AF_UNSPEC;
    ifi->ifi_flags = IFF_UP;
    ifi->ifi_change = IFF_UP;
    nl_attr_str(&r, IFLA_IFNAME, ifname);
    char why[256];
    int e = nl_transact(fd, &r, why, sizeof(why), err);
    if (e < 0)
        return wr_err_prefix(err, "setting link %s up", ifname);
    if (e) {
        char what[64];
        snprintf(what, sizeof(what), "setting link %s up", ifname);
        return nl_refused(err, e, why, what);
    }
    return 0;
}

int netns_addr_add(int nsfd, const char *ifname, struct in_addr addr, int prefix,
                   struct wr_err *err)
{
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr, text, sizeof(text));
    if (ifname_check(ifname, err) < 0)
        return -1;
    if (prefix < 1 || prefix > 32)
        return wr_err_kind(err, WR_E_INVALID, EINVAL, "prefix length %d for %s not in 1..32",
                           prefix, text);
    cleanup_close int fd = nl_open(nsfd, err);
    if (fd < 0)
        return -1;
    int index = ifindex_of(fd, ifname, err);
    if (index < 0)
        return wr_err_prefix(err, "adding address %s/%d", text, prefix);
    struct nl_req r;
    struct ifaddrmsg *ifa =
        nl_start(&r, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, sizeof(struct ifaddrmsg));
    ifa->ifa_family = AF_INET;
    ifa->ifa_prefixlen = (unsigned char)prefix;
    ifa->ifa_scope = RT_SCOPE_UNIVERSE;
    ifa->ifa_index = (unsigned)index;
    nl_attr(&r, IFA_LOCAL, &addr, sizeof(addr));
    nl_attr(&r, IFA_ADDRESS, &addr, sizeof(addr));
    if (prefix < 31) { /* /31 and /32 have no broadcast address (RFC 3021) */
        uint32_t mask = htonl(~0u << (32 - prefix));
        struct in_addr bcast = {.s_addr = addr.s_addr | ~mask};
        nl_attr(&r, IFA_BROADCAST, &bcast, sizeof(bcast));
    }
    char why[256];
    int e = nl_transact(fd, &r, why, sizeof(why), err);
    char what[80];
    snprintf(what, sizeof(what), "adding address %s/%d to %s", text, prefix, ifname);
    if (e < 0)
        return wr_err_prefix(err, "%s", what);
    if (e && e != EEXIST)
        return nl_refused(err, e, why, what);
    return 0;
}

int netns_route_default(int nsfd, const char *ifname, struct in_addr gw, struct wr_err *err)
{
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &gw, text, sizeof(text));
    if (ifname_check(ifname, err) < 0)
        return -1;
    cleanup_close int fd = nl_open(nsfd, err);
    if (fd < 0)
        return -1;
    int index = ifindex_of(fd, ifname, err);
    if (index < 0)
        return wr_err_prefix(err, "setting the default route via %s", text);
    struct nl_req r;
    struct rtmsg *rtm =
        nl_start(&r, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, sizeof(struct rtmsg));
    rtm->rtm_family = AF_INET;
    rtm->rtm_dst_len = 0;
    rtm->rtm_table = RT_TABLE_MAIN;
    rtm->rtm_protocol = RTPROT_STATIC;
    rtm->rtm_scope = RT_SCOPE_UNIVERSE;
    rtm->rtm_type = RTN_UNICAST;
    nl_attr(&r, RTA_GATEWAY, &gw, sizeof(gw));
    nl_attr_u32(&r, RTA_OIF, (uint32_t)index);
    char why[256];
    int e = nl_transact(fd, &r, why, sizeof(why), err);
    char what[80];
    snprintf(what, sizeof(what), "setting the default route via %s on %s", text, ifname);
    if (e < 0)
        return wr_err_prefix(err, "%s", what);
    if (e)
        return nl_refused(err, e, why, what);
    return 0;
}

/* 1 if the RTM_NEWADDR message h gives addr as an interface's own address, else 0. */
static int ifaddr_matches(const struct nlmsghdr *h, struct in_addr addr)
{
    if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifaddrmsg)))
        return 0;
    const struct ifaddrmsg *ifa = NLMSG_DATA(h);
    if (ifa->ifa_family != AF_INET)
        return 0;
    /* IFA_LOCAL is the interface's own address; IFA_ADDRESS is the same except on
     * point-to-point links, where it is the peer's. */
    const struct rtattr *local = NULL, *address = NULL;
    unsigned len = h->nlmsg_len - NLMSG_LENGTH(sizeof(*ifa));
    for (const struct rtattr *a = IFA_RTA(ifa); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        if (a->rta_type == IFA_LOCAL)
            local = a;
        else if (a->rta_type == IFA_ADDRESS)
            address = a;
    }
    const struct rtattr *own = local ? local : address;
    return own && RTA_PAYLOAD(own) == sizeof(addr) &&
           memcmp(RTA_DATA(own), &addr, sizeof(addr)) == 0;
}

/* One dump of nsfd's IPv4 addresses: 1 found, 0 not found, 2 not found in a dump the kernel
 * marked inconsistent (worth repeating), -1 with err set. */
static int addr_dump_once(int fd, struct in_addr addr, uint8_t *buf, struct wr_err *err)
{
    struct nl_req r;
    struct ifaddrmsg *ifa = nl_start(&r, RTM_GETADDR, NLM_F_DUMP, sizeof(struct ifaddrmsg));
    ifa->ifa_family = AF_INET;
    uint32_t seq;
    /* No NLM_F_ACK: a dump ends with NLMSG_DONE (or NLMSG_ERROR), which is its ack. */
    if (nl_send(fd, &r, 0, &seq, err) < 0)
        return -1;
    int found = 0, intr = 0;
    for (;;) {
        ssize_t n = nl_recv(fd, buf, NL_DUMP_MAX, err);
        if (n < 0)
            return -1;
        size_t left = (size_t)n;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_seq != seq)
                continue;
            if (h->nlmsg_flags & NLM_F_DUMP_INTR)
                intr = 1;
            if (h->nlmsg_type == NLMSG_DONE) {
                int code = 0;
                if (h->nlmsg_len >= NLMSG_LENGTH(sizeof(int)))
                    memcpy(&code, NLMSG_DATA(h), sizeof(code));
                if (code < 0)
                    return wr_err_sys(err, -code, "dumping addresses");
                return found ? 1 : intr ? 2 : 0;
            }
            if (h->nlmsg_type == NLMSG_ERROR) {
                if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct nlmsgerr)))
                    return wr_err_set(err, EBADMSG, "short rtnetlink error");
                const struct nlmsgerr *e = NLMSG_DATA(h);
                return wr_err_sys(err, e->error < 0 ? -e->error : EPROTO, "dumping addresses");
            }
            if (h->nlmsg_type == RTM_NEWADDR && ifaddr_matches(h, addr))
                found = 1;
        }
    }
}

int netns_addr_is_local(int nsfd, struct in_addr addr, struct wr_err *err)
{
    cleanup_close int fd = nl_open(nsfd, err);
    if (fd < 0)
        return -1;
    cleanup_free uint8_t *buf = malloc(NL_DUMP_MAX);
    if (!buf)
        return wr_err_sys(err, ENOMEM, "allocating an rtnetlink buffer");
    for (int i = 0; i < DUMP_TRIES; i++) {
        int r = addr_dump_once(fd, addr, buf, err);
        if (r != 2)
            return r;
    }
    return wr_err_set(err, EAGAIN, "addresses kept changing during %d dumps", DUMP_TRIES);
}

/* ---- making namespaces ---- */

struct create_job {
    int fd;           /* OUT: the new namespace */
    int code;         /* OUT: errno of the failed step */
    const char *step; /* OUT: which step failed */
};

static void *create_main(void *arg)
{
    struct create_job *j = arg;
    /* This thread lives only to be moved: unshare changes the calling thread's namespace, and it
     * is this one's, never a worker's, that is left in the new namespace when the thread ends. */
    if (unshare(CLONE_NEWNET) < 0) {
        j->code = errno;
        j->step = "unshare(CLONE_NEWNET)";
        return NULL;
    }
    j->fd = open(thread_ns_path, O_RDONLY | O_CLOEXEC);
    if (j->fd < 0) {
        j->code = errno;
        j->step = "opening the new namespace";
    }
    return NULL;
}

int netns_create(int *nsfd, struct wr_err *err)
{
    struct create_job job = {.fd = -1};
    /* No signal is handled on the helper: a handler run there would do its work (a socket, a
     * log line to a file) inside the new namespace. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int rc = pthread_create(&t, NULL, create_main, &job);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return wr_err_sys(err, rc, "starting the namespace helper thread");
    pthread_join(t, NULL);
    if (job.fd < 0)
        return wr_err_sys(err, job.code, "making a network namespace: %s", job.step);
    cleanup_close int fd = job.fd;
    if (netns_link_up(fd, "lo", err) < 0)
        return wr_err_prefix(err, "making a network namespace");
    *nsfd = steal_fd(&fd);
    return 0;
}

/* ---- sysctls ---- */

static int sysctl_path_check(const char *path, struct wr_err *err)
{
    size_t n = strnlen(path, SYSCTL_PATH_MAX + 1);
    if (n == 0 || n > SYSCTL_PATH_MAX)
        return wr_err_kind(err, WR_E_INVALID, EINVAL, "sysctl path must be 1..%d bytes",
                           SYSCTL_PATH_MAX);
    const char *p = path;
    for (;;) {
        size_t len = strcspn(p, "/");
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return wr_err_kind(err, WR_E_INVALID, EINVAL,
                               "sysctl path '%s' has an empty, '.' or '..' component", path);
        for (size_t i = 0; i < len; i++) {
            char c = p[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-'))
                return wr_err_kind(err, WR_E_INVALID, EINVAL,
                                   "sysctl path has a byte 0x%02x outside [a-zA-Z0-9_.-/]",
                                   (unsigned char)c);
        }
        if (p[len] == 0)
            return 0;
        p += len + 1;
    }
}

struct sysctl_args {
    const char *file;
    const char *value;
};

static int sysctl_write(void *arg, struct wr_err *err)
{
    struct sysctl_args *a = arg;
    /* The namespace a net sysctl acts on is the opener's, fixed at open: so the open must
     * happen in here, and the write may as well. */
    cleanup_close int fd = open(a->file, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return wr_err_sys(err, errno, "opening %s", a->file);
    if (write_all(fd, a->value, strlen(a->value)) < 0)
        return wr_err_sys(err, errno, "writing '%s' to %s", a->value, a->file);
    return 0;
}

int netns_sysctl(int nsfd, const char *path, const char *value, struct wr_err *err)
{
    if (sysctl_path_check(path, err) < 0)
        return -1;
    size_t vn = strnlen(value, SYSCTL_VALUE_MAX + 1);
    if (vn == 0 || vn > SYSCTL_VALUE_MAX)
        return wr_err_kind(err, WR_E_INVALID, EINVAL, "sysctl value must be 1..%d bytes",
                           SYSCTL_VALUE_MAX);
    char file[SYSCTL_PATH_MAX + 32];
    snprintf(file, sizeof(file), "/proc/sys/net/%s", path);
    struct sysctl_args a = {.file = file, .value = value};
    return netns_run(nsfd, sysctl_write, &a, err);
}

int netns_ipv6_disable(int nsfd, struct wr_err *err)
{
    /* default first: an interface made between the two writes still starts with IPv6 off. */
    if (netns_sysctl(nsfd, "ipv6/conf/default/disable_ipv6", "1", err) < 0 ||
        netns_sysctl(nsfd, "ipv6/conf/all/disable_ipv6", "1", err) < 0)
        return wr_err_prefix(err, "disabling IPv6");
    return 0;
}

/* ---- nftables ---- */

/* libnftables does not promise thread safety and sets process-wide state when a context is made
 * (the bignum library's allocator hooks); loads are rare (a gateway's start, a policy change),
 * so they take turns. */
static pthread_mutex_t nft_mu = PTHREAD_MUTEX_INITIALIZER;

/*
 * The ruleset is handed to libnftables as a file, /proc/self/fd/N of a memfd, included from a
 * one-line buffer that flushes first. Two reasons. A buffer's errors are reported (in 1.0.6)
 * against the buffer's first line whatever line they are on, while a file's carry the right
 * "file:line:col". And "flush ruleset" on a line of its own ahead of the caller's text would
 * shift every line number by one. The include is expanded by the parser, so the flush and the
 * ruleset still go to the kernel as one batch.
 */

/* Writes libnftables's error text into out as "line L:C-C: Error: reason; ...": only the lines
 * that locate an error in the ruleset file (prefix, "path:"), without the quoted source and its
 * carets. If no line has the prefix, the whole text with whitespace runs made single spaces. */
static void nft_err_summary(const char *in, const char *prefix, char *out, size_t outlen)
{
    size_t o = 0, plen = strlen(prefix);
    int any = 0;
    out[0] = 0;
    for (const char *line = in; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (len > plen && strncmp(line, prefix, plen) == 0 && o + 8 < outlen) {
            int w = snprintf(out + o, outlen - o, "%sline %.*s", any ? "; " : "", (int)(len - plen),
                             line + plen);
            if (w > 0)
                o = (size_t)w >= outlen - o ? outlen - 1 : o + (size_t)w;
            any = 1;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (any)
        return;
    int space = 0;
    for (const char *p = in ? in : ""; *p && o + 1 < outlen; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '\n' || c == '\t' || c == ' ' || c == '\r') {
            space = o > 0;
            continue;
        }
        if (space && o + 2 < outlen)
            out[o++] = ' ';
        space = 0;
        out[o++] = c < 0x20 ? '?' : (char)c;
    }
    out[o] = 0;
}

struct nft_args {
    int memfd; /* the ruleset */
};

static int nft_load_inside(void *arg, struct wr_err *err)
{
    struct nft_args *a = arg;
    char path[64], prefix[80], cmd[128];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", a->memfd);
    snprintf(prefix, sizeof(prefix), "%s:", path);
    snprintf(cmd, sizeof(cmd), "flush ruleset\ninclude \"%s\"\n", path);
    /* Made in here: the context's netlink socket must belong to the target namespace. */
    struct nft_ctx *ctx = nft_ctx_new(NFT_CTX_DEFAULT);
    if (!ctx)
        return wr_err_set(err, ENOMEM, "making an nftables context");
    int r = 0;
    if (nft_ctx_buffer_output(ctx) != 0 || nft_ctx_buffer_error(ctx) != 0) {
        r = wr_err_set(err, ENOMEM, "buffering nftables output");
    } else if (nft_run_cmd_from_buffer(ctx, cmd) != 0) {
        char why[NFT_ERR_MAX];
        nft_err_summary(nft_ctx_get_error_buffer(ctx), prefix, why, sizeof(why));
        r = wr_err_set(err, EINVAL, "nftables refused the ruleset: %s",
                       why[0] ? why : "(no message)");
    }
    nft_ctx_free(ctx);
    return r;
}

int netns_nft_load(int nsfd, const char *ruleset, struct wr_err *err)
{
    cleanup_close int memfd = memfd_create("wr-nft-ruleset", MFD_CLOEXEC);
    if (memfd < 0)
        return wr_err_sys(err, errno, "loading nftables ruleset: memfd_create");
    if (write_all(memfd, ruleset, strlen(ruleset)) < 0)
        return wr_err_sys(err, errno, "loading nftables ruleset: writing it to a memfd");
    struct nft_args a = {.memfd = memfd};
    pthread_mutex_lock(&nft_mu);
    int r = netns_run(nsfd, nft_load_inside, &a, err);
    pthread_mutex_unlock(&nft_mu);
    if (r < 0)
        return wr_err_prefix(err, "loading nftables ruleset");
    return 0;
}

/* ---- a sandbox's uplink ---- */

int netns_uplink_create(int gw_nsfd, int sb_nsfd, const struct netns_uplink *up, struct wr_err *err)
{
    if (ifname_check(up->gw_ifname, err) < 0 || ifname_check(up->sb_ifname, err) < 0)
        return -1;
    if (up->prefix < 1 || up->prefix > 30)
        return wr_err_kind(err, WR_E_INVALID, EINVAL, "uplink prefix %d not in 1..30", up->prefix);
    if (netns_veth_create(gw_nsfd, up->gw_ifname, sb_nsfd, up->sb_ifname, err) < 0)
        return -1; /* nothing of ours to undo: the names may belong to someone else */
    if (netns_addr_add(gw_nsfd, up->gw_ifname, up->gw_addr, up->prefix, err) < 0 ||
        netns_link_up(gw_nsfd, up->gw_ifname, err) < 0 ||
        netns_addr_add(sb_nsfd, up->sb_ifname, up->sb_addr, up->prefix, err) < 0 ||
        netns_link_up(sb_nsfd, up->sb_ifname, err) < 0 ||
        netns_route_default(sb_nsfd, up->sb_ifname, up->gw_addr, err) < 0) {
        struct wr_err undo;
        if (netns_link_del(gw_nsfd, up->gw_ifname, &undo) < 0)
            log_warn(NULL, "netns.uplink_undo_failed", "ifname=%s error=\"%s\"", up->gw_ifname,
                     undo.msg);
        return wr_err_prefix(err, "connecting %s to %s", up->sb_ifname, up->gw_ifname);
    }
    return 0;
}
