/*
 * net/netns against the real kernel: a gateway namespace with the sandbox ruleset and two
 * sandbox namespaces wired to it exactly as the daemon does, then what a sandbox would see. TCP
 * to anywhere lands on the gateway's listener with the address it dialled as the original
 * destination, sandbox 2 included; UDP reaches the gateway's port 53 and nothing else, even with
 * forwarding switched on (and a control ruleset shows the same check does see a forwarded
 * datagram); IPv6 goes nowhere. Then the bookkeeping: the host gains no interfaces, teardown
 * leaves the gateway with only lo, 50 slot cycles leak no fd, threads always end in their own
 * namespace, and bad input fails with a clear error.
 *
 * Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); elsewhere it prints a SKIP line. All traffic
 * stays inside namespaces made here, and closing their fds at the end removes everything.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/netfilter_ipv4.h>

#include "common/util.h"
#include "net/netns.h"
#include "tap.h"

#define PROXY_PORT 15001
#define SB2_TCP_PORT 8080
/* How long a datagram or connection that should arrive may take: far beyond a veth hop. */
#define ARRIVE_MS 2000
/* How long we watch for one that should not arrive (an absence check). */
#define ABSENT_MS 300
#define CYCLES 50
#define THREADS 2
#define THREAD_CYCLES 10

/* The daemon's gateway ruleset. Written for nftables 1.0.6 (Debian 12): a rule or a chain's
 * closing brace must be followed by a newline or ';' before the next '}' or 'chain', and "fwd" is
 * a keyword there, not a usable chain name. */
static const char ruleset[] =
    "table inet wr {\n"
    "  chain pre {\n"
    "    type nat hook prerouting priority dstnat; policy accept;\n"
    "    iifname \"wrs*\" meta nfproto ipv4 meta l4proto tcp redirect to :15001\n"
    "  }\n"
    "  chain in {\n"
    "    type filter hook input priority filter; policy drop;\n"
    "    iif \"lo\" accept\n"
    "    ct state established,related accept\n"
    "    iifname \"wrs*\" meta nfproto ipv4 tcp dport 15001 accept\n"
    "    iifname \"wrs*\" meta nfproto ipv4 udp dport 53 accept\n"
    "  }\n"
    "  chain forward {\n"
    "    type filter hook forward priority filter; policy drop;\n"
    "  }\n"
    "}\n";

/* The control: the same gateway, but forwarding everything. */
static const char ruleset_open[] =
    "table inet wr {\n"
    "  chain pre {\n"
    "    type nat hook prerouting priority dstnat; policy accept;\n"
    "    iifname \"wrs*\" meta nfproto ipv4 meta l4proto tcp redirect to :15001\n"
    "  }\n"
    "  chain forward {\n"
    "    type filter hook forward priority filter; policy accept;\n"
    "  }\n"
    "}\n";

/* Everything made here, closed by cleanup() whatever failed. */
static int gw = -1, sb[2] = {-1, -1};
static int listener = -1, gw_udp = -1, sb2_tcp = -1, sb2_udp = -1;

static void cleanup(void)
{
    int *fds[] = {&listener, &gw_udp, &sb2_tcp, &sb2_udp, &sb[0], &sb[1], &gw};
    for (size_t i = 0; i < WR_ARRAY_LEN(fds); i++) {
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
}

/* ---- helpers ---- */

static struct in_addr ip4(const char *text)
{
    struct in_addr a;
    inet_pton(AF_INET, text, &a);
    return a;
}

static struct sockaddr_in sin_of(const char *text, int port)
{
    struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    s.sin_addr = ip4(text);
    return s;
}

/* "net:[4026531840]" of the calling thread. */
static void thread_ns(char *out, size_t len)
{
    ssize_t n = readlink("/proc/thread-self/ns/net", out, len - 1);
    out[n < 0 ? 0 : n] = 0;
}

static ino_t fd_ino(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 3; /* ".", ".." and the directory's own fd */
}

/* The calling thread's interface names, sorted by index, as "lo,wrs1,". */
static void ifnames_here(char *out, size_t len)
{
    out[0] = 0;
    struct if_nameindex *ni = if_nameindex();
    if (!ni) {
        snprintf(out, len, "(if_nameindex failed: %s)", strerror(errno));
        return;
    }
    for (struct if_nameindex *p = ni; p->if_index; p++) {
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%s,", p->if_name);
    }
    if_freenameindex(ni);
}

struct names_args {
    char names[1024];
};

static int ifnames_fn(void *arg, struct wr_err *err)
{
    struct names_args *a = arg;
    ifnames_here(a->names, sizeof(a->names));
    return 0;
}

/* nsfd's interface names, or "" if entering it failed. */
static const char *ifnames_in(int nsfd, struct names_args *a)
{
    struct wr_err err = {0};
    a->names[0] = 0;
    netns_run(nsfd, ifnames_fn, a, &err);
    return a->names;
}

struct read_args {
    const char *path;
    char value[64];
};

static int read_fn(void *arg, struct wr_err *err)
{
    struct read_args *a = arg;
    a->value[0] = 0;
    int fd = open(a->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wr_err_sys(err, errno, "open %s", a->path);
    ssize_t n = read(fd, a->value, sizeof(a->value) - 1);
    close(fd);
    a->value[n < 0 ? 0 : n] = 0;
    return 0;
}

/* A TCP connection from namespace nsfd to dst:port, made non-blocking: the fd once connected,
 * -1 (errno set) when connect failed at once, or -2 when it did not complete in ms. */
static int tcp_connect_from(int nsfd, const char *dst, int port, int ms)
{
    struct wr_err err = {0};
    int fd = netns_socket(nsfd, AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0, &err);
    if (fd < 0) {
        printf("# %s\n", err.msg);
        return -1;
    }
    struct sockaddr_in to = sin_of(dst, port);
    if (connect(fd, (struct sockaddr *)&to, sizeof(to)) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    if (poll(&p, 1, ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
        close(fd);
        errno = soerr ? soerr : ETIMEDOUT;
        return -2;
    }
    return fd;
}

static int readable_within(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* A connection accepted on the gateway's listener within ms, its peer and original destination
 * formatted as "a.b.c.d:port"; the accepted fd is closed. 1 if one came, else 0. */
static int accept_one(int ms, char *peer, char *orig, size_t len)
{
    peer[0] = orig[0] = 0;
    if (!readable_within(listener, ms))
        return 0;
    struct sockaddr_in from, dst;
    socklen_t fl = sizeof(from), dl = sizeof(dst);
    int fd = accept4(listener, (struct sockaddr *)&from, &fl, SOCK_CLOEXEC);
    if (fd < 0)
        return 0;
    char a[INET_ADDRSTRLEN];
    snprintf(peer, len, "%s:%d", inet_ntop(AF_INET, &from.sin_addr, a, sizeof(a)),
             ntohs(from.sin_port));
    if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &dst, &dl) == 0)
        snprintf(orig, len, "%s:%d", inet_ntop(AF_INET, &dst.sin_addr, a, sizeof(a)),
                 ntohs(dst.sin_port));
    else
        snprintf(orig, len, "(SO_ORIGINAL_DST: %s)", strerror(errno));
    close(fd);
    return 1;
}

/* Sends one UDP datagram from namespace nsfd to dst:port; 0 if the send went out. */
static int udp_send_from(int nsfd, const char *dst, int port)
{
    struct wr_err err = {0};
    int fd = netns_socket(nsfd, AF_INET, SOCK_DGRAM, 0, &err);
    if (fd < 0)
        return -1;
    struct sockaddr_in to = sin_of(dst, port);
    ssize_t n = sendto(fd, "ping", 4, 0, (struct sockaddr *)&to, sizeof(to));
    close(fd);
    return n == 4 ? 0 : -1;
}

/* A socket of type bound to addr:port inside nsfd (listening if TCP), or -1. */
static int bound_in(int nsfd, int type, const char *addr, int port)
{
    struct wr_err err = {0};
    int fd = netns_socket(nsfd, AF_INET, type, 0, &err);
    if (fd < 0) {
        printf("# %s\n", err.msg);
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in s = sin_of(addr, port);
    if (bind(fd, (struct sockaddr *)&s, sizeof(s)) < 0 ||
        (type == SOCK_STREAM && listen(fd, 16) < 0)) {
        printf("# bind %s:%d: %s\n", addr, port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads and discards whatever is queued on a datagram socket. */
static void drain(int fd)
{
    char buf[64];
    while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) >= 0)
        ;
}

/* Slot k's uplink: wrs<k> in the gateway at 10.<net>.<k>.1/30, eth0 in the sandbox at .2. */
struct slot {
    char gw_ifname[16];
    char gw_addr[16], sb_addr[16];
    struct netns_uplink up;
};

static void slot_init(struct slot *s, int net, int k, const char *prefix)
{
    snprintf(s->gw_ifname, sizeof(s->gw_ifname), "%s%d", prefix, k);
    snprintf(s->gw_addr, sizeof(s->gw_addr), "10.%d.%d.1", net, k);
    snprintf(s->sb_addr, sizeof(s->sb_addr), "10.%d.%d.2", net, k);
    s->up = (struct netns_uplink){.gw_ifname = s->gw_ifname,
                                  .sb_ifname = "eth0",
                                  .gw_addr = ip4(s->gw_addr),
                                  .sb_addr = ip4(s->sb_addr),
                                  .prefix = 30};
}

/* One slot's whole life as the daemon runs it: namespace, IPv6 off, uplink, teardown. */
static int slot_cycle(int net, int k, const char *prefix, struct wr_err *err)
{
    struct slot s;
    slot_init(&s, net, k, prefix);
    int ns;
    if (netns_create(&ns, err) < 0)
        return -1;
    int r = netns_ipv6_disable(ns, err) < 0 || netns_uplink_create(gw, ns, &s.up, err) < 0 ||
                    netns_link_del(gw, s.gw_ifname, err) < 0
                ? -1
                : 0;
    close(ns);
    return r;
}

/* ---- the checks ---- */

static int fail_fn(void *arg, struct wr_err *err)
{
    char *seen = arg;
    thread_ns(seen, 64);
    return wr_err_set(err, EPERM, "fn failed on purpose");
}

static void test_run_returns(void)
{
    char before[64], inside[64], after[64];
    struct wr_err err = {0};
    thread_ns(before, sizeof(before));
    int r = netns_run(gw, fail_fn, inside, &err);
    thread_ns(after, sizeof(after));
    ok(r == -1 && err.code == EPERM && strstr(err.msg, "on purpose"),
       "netns_run returns fn's failure and error: %s", err.msg);
    ok(strcmp(inside, before) != 0, "fn ran in another namespace (%s, not %s)", inside, before);
    char gw_link[64];
    snprintf(gw_link, sizeof(gw_link), "net:[%lu]", (unsigned long)fd_ino(gw));
    ok(strcmp(inside, gw_link) == 0, "that namespace is the gateway's (%s)", gw_link);
    ok(strcmp(after, before) == 0, "the thread is back in %s after fn failed", before);

    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    inside[0] = 0;
    wr_err_clear(&err);
    r = netns_run(devnull, fail_fn, inside, &err);
    close(devnull);
    thread_ns(after, sizeof(after));
    ok(r == -1 && err.code == EINVAL && inside[0] == 0 && strstr(err.msg, "entering"),
       "an fd that is no namespace: fn not run, %s", err.msg);
    ok(strcmp(after, before) == 0, "the thread is still in %s", before);
}

static void test_bad_input(void)
{
    struct wr_err err = {0};
    static const char *const bad[] = {"", "abcdefghijklmnop", "a b", "a/b", "..", "eth0\n", "é"};
    int all = 1;
    for (size_t i = 0; i < WR_ARRAY_LEN(bad); i++) {
        wr_err_clear(&err);
        if (netns_link_up(gw, bad[i], &err) != -1 || err.code != EINVAL ||
            !strstr(err.msg, "interface name")) {
            printf("# '%s' was not refused: %s\n", bad[i], err.msg);
            all = 0;
        }
    }
    ok(all, "bad interface names are refused with EINVAL (last: %s)", err.msg);
    wr_err_clear(&err);
    ok(netns_link_del(gw, "abcdefghijklmno", &err) == 0, "a 15-byte name is a name %s", err.msg);
}

static void test_errors(void)
{
    struct wr_err err = {0};
    ok(netns_link_del(gw, "nosuch0", &err) == 0, "deleting a missing link succeeds");
    wr_err_clear(&err);
    ok(netns_link_up(gw, "nosuch0", &err) == -1 && err.code == ENODEV && strstr(err.msg, "nosuch0"),
       "setting a missing link up: %s", err.msg);
    wr_err_clear(&err);
    ok(netns_addr_add(gw, "nosuch0", ip4("10.9.9.9"), 24, &err) == -1 && err.code == ENODEV &&
           strstr(err.msg, "nosuch0"),
       "an address on a missing link: %s", err.msg);
    wr_err_clear(&err);
    ok(netns_addr_add(gw, "lo", ip4("127.0.0.2"), 0, &err) == -1 && err.code == EINVAL,
       "prefix 0 is refused: %s", err.msg);
    wr_err_clear(&err);
    ok(netns_veth_create(gw, "wrs1", sb[1], "eth7", &err) == -1 && err.code == EEXIST,
       "a veth whose gateway end's name is taken: %s", err.msg);
    struct names_args names;
    ok(strcmp(ifnames_in(sb[1], &names), "lo,eth0,") == 0,
       "and it left nothing in the sandbox (%s)", names.names);
    wr_err_clear(&err);
    ok(netns_addr_add(gw, "wrs1", ip4("10.200.1.1"), 30, &err) == 0,
       "adding an address that is there already succeeds");
    ok(netns_route_default(sb[0], "eth0", ip4("10.200.1.1"), &err) == 0,
       "setting the same default route again succeeds (replace)");
    wr_err_clear(&err);
    ok(netns_route_default(sb[0], "lo", ip4("10.77.0.1"), &err) == -1 && err.code != 0,
       "a default route via an unreachable gateway fails: %s", err.msg);

    static const char *const bad_paths[] = {"",
                                            "/ipv4/ip_forward",
                                            "ipv4/../../kernel/x",
                                            "ipv4//ip_forward",
                                            "ipv4/./ip_forward",
                                            "ipv4/ip forward"};
    int all = 1;
    for (size_t i = 0; i < WR_ARRAY_LEN(bad_paths); i++) {
        wr_err_clear(&err);
        if (netns_sysctl(gw, bad_paths[i], "1", &err) != -1 || err.code != EINVAL) {
            printf("# sysctl path '%s' was not refused\n", bad_paths[i]);
            all = 0;
        }
    }
    ok(all, "bad sysctl paths are refused (last: %s)", err.msg);
    wr_err_clear(&err);
    ok(netns_sysctl(gw, "ipv4/no_such_knob", "1", &err) == -1 && err.code == ENOENT,
       "a missing sysctl: %s", err.msg);

    /* A failed uplink (the sandbox's address is in another /30 than its gateway, so the route
     * is refused at the last step) leaves no link behind. */
    struct slot s;
    slot_init(&s, 200, 9, "wrs");
    s.up.sb_addr = ip4("10.200.9.6");
    int ns = -1;
    wr_err_clear(&err);
    if (netns_create(&ns, &err) == 0) {
        ok(netns_uplink_create(gw, ns, &s.up, &err) == -1 && strstr(err.msg, "default route"),
           "an uplink failing at its last step: %s", err.msg);
        ok(strstr(ifnames_in(gw, &names), "wrs9") == NULL, "and its veth was deleted again (%s)",
           names.names);
        close(ns);
    } else {
        ok(0, "netns_create: %s", err.msg);
    }
}

static void test_nft_errors(void)
{
    struct wr_err err = {0};
    ok(netns_nft_load(gw, "table inet wr {\n  chain c {\n    bogus\n  }\n}\n", &err) == -1 &&
           err.code == EINVAL && strstr(err.msg, "line 3:") && strstr(err.msg, "Error:") &&
           !strchr(err.msg, '\n'),
       "a bad ruleset is refused, with nft's reason and its line: %s", err.msg);
    wr_err_clear(&err);
    ok(netns_nft_load(gw, "table inet wr { chain fwd { type filter hook forward priority 0; } }",
                      &err) == -1 &&
           strstr(err.msg, "line 1:"),
       "a one-line ruleset's error: %s", err.msg);
}

static void test_traffic(void)
{
    char peer[64], orig[64];
    struct wr_err err = {0};

    int c = tcp_connect_from(sb[0], "203.0.113.7", 443, ARRIVE_MS);
    ok(c >= 0, "sandbox 1 connects to 203.0.113.7:443 (%s)", c >= 0 ? "ok" : strerror(errno));
    ok(accept_one(ARRIVE_MS, peer, orig, sizeof(peer)) && strncmp(peer, "10.200.1.2:", 11) == 0,
       "the gateway's listener accepts it, from %s", peer);
    ok(strcmp(orig, "203.0.113.7:443") == 0, "its original destination is %s", orig);
    if (c >= 0)
        close(c);

    c = tcp_connect_from(sb[0], "10.200.2.2", SB2_TCP_PORT, ARRIVE_MS);
    int got = accept_one(ARRIVE_MS, peer, orig, sizeof(peer));
    ok(c >= 0 && got, "TCP from sandbox 1 to sandbox 2 lands on the gateway's listener");
    ok(strcmp(orig, "10.200.2.2:8080") == 0, "with original destination %s", orig);
    ok(!readable_within(sb2_tcp, ABSENT_MS), "and sandbox 2's listener saw nothing");
    if (c >= 0)
        close(c);

    drain(gw_udp);
    ok(udp_send_from(sb[0], "10.200.1.1", 53) == 0 && readable_within(gw_udp, ARRIVE_MS),
       "UDP from sandbox 1 to 10.200.1.1:53 reaches the gateway");
    struct sockaddr_in from;
    socklen_t fl = sizeof(from);
    char buf[16];
    ssize_t n = recvfrom(gw_udp, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
    ok(n == 4 && from.sin_addr.s_addr == ip4("10.200.1.2").s_addr, "from 10.200.1.2");

    /* Once with the gateway as the daemon leaves it (forwarding off), once with forwarding on,
     * so that it is the ruleset's forward policy that stops them. */
    for (int fwd = 0; fwd <= 1; fwd++) {
        if (fwd)
            ok(netns_sysctl(gw, "ipv4/ip_forward", "1", &err) == 0, "forwarding on in the gateway");
        drain(gw_udp);
        drain(sb2_udp);
        udp_send_from(sb[0], "10.200.2.2", 53);
        udp_send_from(sb[0], "203.0.113.7", 53);
        ok(!readable_within(sb2_udp, ABSENT_MS) && !readable_within(gw_udp, 0),
           "UDP from sandbox 1 to sandbox 2 and to 203.0.113.7:53 is delivered nowhere "
           "(forwarding %s)",
           fwd ? "on" : "off");
    }

    /* The control: with a forward-all ruleset the same datagram does arrive, so the check above
     * can see one. Then the real ruleset again. */
    wr_err_clear(&err);
    ok(netns_nft_load(gw, ruleset_open, &err) == 0, "control ruleset loaded %s", err.msg);
    drain(sb2_udp);
    udp_send_from(sb[0], "10.200.2.2", 53);
    ok(readable_within(sb2_udp, ARRIVE_MS), "control: a forwarded datagram reaches sandbox 2");
    ok(netns_nft_load(gw, ruleset, &err) == 0 &&
           netns_sysctl(gw, "ipv4/ip_forward", "0", &err) == 0,
       "real ruleset back, forwarding off %s", err.msg);
    drain(sb2_udp);
    udp_send_from(sb[0], "10.200.2.2", 53);
    ok(!readable_within(sb2_udp, ABSENT_MS), "and sandbox 2 is unreachable again");

    int fd6 = netns_socket(sb[0], AF_INET6, SOCK_STREAM | SOCK_NONBLOCK, 0, &err);
    struct sockaddr_in6 to6 = {.sin6_family = AF_INET6, .sin6_port = htons(80)};
    inet_pton(AF_INET6, "2001:db8::1", &to6.sin6_addr);
    int r = fd6 >= 0 ? connect(fd6, (struct sockaddr *)&to6, sizeof(to6)) : -1;
    int e = errno;
    ok(fd6 >= 0 && r == -1 && (e == ENETUNREACH || e == EHOSTUNREACH || e == EADDRNOTAVAIL),
       "IPv6 from a sandbox to [2001:db8::1]:80 fails at once: %s", strerror(e));
    if (fd6 >= 0)
        close(fd6);
    struct read_args ra = {.path = "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"};
    ok(netns_run(sb[0], read_fn, &ra, &err) == 0 && strcmp(ra.value, "1\n") == 0,
       "the sandbox's eth0 was born with IPv6 off");
}

static void test_addr_is_local(void)
{
    struct wr_err err = {0};
    ok(netns_addr_is_local(gw, ip4("10.200.1.1"), &err) == 1, "10.200.1.1 is the gateway's");
    ok(netns_addr_is_local(gw, ip4("10.200.2.1"), &err) == 1, "10.200.2.1 is the gateway's");
    ok(netns_addr_is_local(gw, ip4("127.0.0.1"), &err) == 1, "127.0.0.1 is (lo is up)");
    ok(netns_addr_is_local(gw, ip4("10.200.1.2"), &err) == 0, "10.200.1.2 is not the gateway's");
    ok(netns_addr_is_local(gw, ip4("10.200.1.3"), &err) == 0, "nor its /30's broadcast address");
    ok(netns_addr_is_local(sb[0], ip4("10.200.1.2"), &err) == 1, "10.200.1.2 is sandbox 1's");
    ok(netns_addr_is_local(sb[0], ip4("10.200.2.2"), &err) == 0, "10.200.2.2 is not");
}

struct worker {
    int t;
    int failures;
    int moved; /* the thread ended a call outside its own namespace */
    char first_error[WR_ERR_MSG_MAX];
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    char home[64], now[64];
    thread_ns(home, sizeof(home));
    for (int i = 0; i < THREAD_CYCLES; i++) {
        struct wr_err err = {0};
        char prefix[8];
        snprintf(prefix, sizeof(prefix), "wrt%d_", w->t);
        if (slot_cycle(201 + w->t, i, prefix, &err) < 0 && w->failures++ == 0)
            snprintf(w->first_error, sizeof(w->first_error), "%s", err.msg);
        thread_ns(now, sizeof(now));
        if (strcmp(now, home) != 0)
            w->moved++;
    }
    return NULL;
}

static void test_cycles(void)
{
    struct wr_err err = {0};
    struct names_args names;
    int fds = count_fds();
    int failures = 0;
    for (int k = 0; k < CYCLES; k++) {
        wr_err_clear(&err);
        if (slot_cycle(200, 10 + k, "wrs", &err) < 0 && failures++ == 0)
            printf("# cycle %d: %s\n", k, err.msg);
    }
    ok(failures == 0, "%d create/connect/destroy cycles of a sandbox slot", CYCLES);
    ok(count_fds() == fds, "no fd left behind (%d before, %d after)", fds, count_fds());
    ok(strcmp(ifnames_in(gw, &names), "lo,") == 0, "the gateway has only lo left (%s)",
       names.names);

    pthread_t th[THREADS];
    struct worker w[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t] = (struct worker){.t = t};
        pthread_create(&th[t], NULL, worker_main, &w[t]);
    }
    int bad = 0, moved = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        bad += w[t].failures;
        moved += w[t].moved;
        if (w[t].failures)
            printf("# thread %d: %s\n", t, w[t].first_error);
    }
    ok(bad == 0, "%d threads cycling slots on one gateway at once", THREADS);
    ok(moved == 0, "every thread stayed in its own namespace");
    ok(count_fds() == fds, "still no fd left behind");
    ok(strcmp(ifnames_in(gw, &names), "lo,") == 0, "the gateway has only lo (%s)", names.names);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (geteuid() != 0) {
        printf("ok 1 # SKIP not root: namespaces cannot be made\n1..1\n");
        return 0;
    }
    char host_before[4096], host_after[4096], home[64], now[64];
    ifnames_here(host_before, sizeof(host_before));
    thread_ns(home, sizeof(home));
    struct wr_err err = {0};

    if (netns_create(&gw, &err) < 0) {
        printf("Bail out! netns_create: %s\n", err.msg);
        return 1;
    }
    thread_ns(now, sizeof(now));
    ok(strcmp(now, home) == 0, "netns_create leaves the thread in %s", home);
    ok(fd_ino(gw) != 0 && strstr(home, "net:[") && fd_ino(gw) != strtoul(home + 5, NULL, 10),
       "the gateway is a new namespace");
    ok((fcntl(gw, F_GETFD) & FD_CLOEXEC) != 0, "its fd is close-on-exec");
    struct names_args names;
    ok(strcmp(ifnames_in(gw, &names), "lo,") == 0, "it has only lo (%s)", names.names);
    ok(netns_ipv6_disable(gw, &err) == 0, "IPv6 off in the gateway %s", err.msg);
    ok(netns_nft_load(gw, ruleset, &err) == 0, "ruleset loaded %s", err.msg);
    test_nft_errors(); /* after the good one: the traffic below shows the good one still holds */

    listener = bound_in(gw, SOCK_STREAM, "0.0.0.0", PROXY_PORT);
    ok(listener >= 0, "gateway listens on :%d", PROXY_PORT);

    int wired = 1;
    for (int i = 0; i < 2; i++) {
        struct slot s;
        slot_init(&s, 200, i + 1, "wrs");
        wr_err_clear(&err);
        int made = netns_create(&sb[i], &err) == 0 && netns_ipv6_disable(sb[i], &err) == 0 &&
                   netns_uplink_create(gw, sb[i], &s.up, &err) == 0;
        ok(made, "sandbox %d wired to %s %s", i + 1, s.gw_ifname, err.msg);
        wired &= made;
    }
    ok(strcmp(ifnames_in(gw, &names), "lo,wrs1,wrs2,") == 0, "the gateway has %s", names.names);
    ok(strcmp(ifnames_in(sb[0], &names), "lo,eth0,") == 0, "sandbox 1 has %s", names.names);

    gw_udp = bound_in(gw, SOCK_DGRAM, "10.200.1.1", 53);
    sb2_tcp = bound_in(sb[1], SOCK_STREAM, "0.0.0.0", SB2_TCP_PORT);
    sb2_udp = bound_in(sb[1], SOCK_DGRAM, "0.0.0.0", 53);
    if (wired && listener >= 0 && gw_udp >= 0 && sb2_tcp >= 0 && sb2_udp >= 0) {
        test_traffic();
        test_addr_is_local();
        test_errors();
        test_bad_input();
    } else {
        ok(0, "setup failed; traffic checks not run");
    }
    test_run_returns();

    for (int i = 0; i < 2; i++) {
        char name[8];
        snprintf(name, sizeof(name), "wrs%d", i + 1);
        wr_err_clear(&err);
        ok(netns_link_del(gw, name, &err) == 0, "deleting %s %s", name, err.msg);
        close(sb[i]);
        sb[i] = -1;
    }
    close(sb2_tcp);
    close(sb2_udp);
    sb2_tcp = sb2_udp = -1;
    ok(strcmp(ifnames_in(gw, &names), "lo,") == 0, "after teardown the gateway has %s",
       names.names);
    test_cycles();

    cleanup();
    ifnames_here(host_after, sizeof(host_after));
    ok(strcmp(host_before, host_after) == 0, "the host's interfaces are unchanged (%s)",
       host_after);
    thread_ns(now, sizeof(now));
    ok(strcmp(now, home) == 0, "the main thread ends in %s", home);
    return tap_done();
}
