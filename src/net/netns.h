/*
 * Network namespaces for the gateway and the sandboxes, and the plumbing between them: veth
 * pairs, IPv4 addresses, default routes, sysctls and an nftables ruleset.
 *
 * A namespace here is only ever an fd (O_CLOEXEC): never named under /run/netns, never
 * bind-mounted, so when the daemon dies every namespace it made dies with it and nothing is left
 * on the host to clean up. Nothing in this file creates anything in the namespace the caller runs
 * in: links are made straight into their target namespaces.
 *
 * Every call blocks (netlink round trips of well under a millisecond, a 5 s bound on each) and is
 * meant for worker threads, never the event loop. Calls are independent: several threads may work
 * on different namespaces, or on the same one, at once. Functions that enter a namespace do so on
 * the calling thread and always bring it back (or abort the process: see netns_run).
 *
 * Errors: every function returns 0 (or a value documented with it) or -1 with err set to a
 * message naming the step that failed, and err->code to its errno. Interface names are 1..15
 * bytes of [a-zA-Z0-9_.-] (not "." or ".."); anything else is EINVAL before any syscall.
 */
#ifndef WR_NET_NETNS_H
#define WR_NET_NETNS_H

#include <netinet/in.h>

#include "common/err.h"

/* The longest interface name the kernel takes (IFNAMSIZ less the NUL). */
#define NETNS_IFNAME_MAX 15
/* How long one netlink request may wait for its answer before it is an error (ETIMEDOUT). */
#define NETNS_NL_TIMEOUT_MS 5000

/**
 * Makes a new, empty network namespace with lo up (so 127.0.0.1 works inside) and stores an fd
 * holding it (O_CLOEXEC) in *nsfd (OUT); the caller owns it, and closing the last fd (with no
 * socket or process left inside) destroys the namespace and any interfaces in it. The namespace
 * is made on a short-lived helper thread, so the calling thread never leaves its own.
 */
int netns_create(int *nsfd, struct wr_err *err);

/**
 * Runs fn(arg, err) on the calling thread while it is inside nsfd, then returns the thread to the
 * namespace it started in, whether fn succeeded or not. Returns fn's result, or -1 with err set
 * if the thread could not enter nsfd (fn is then not called). If the thread cannot get back, the
 * process aborts: a worker thread left in a sandbox's namespace would do the daemon's later work
 * from inside it. fn must not create threads that are meant to stay in nsfd (they would inherit
 * it, but nothing here tracks them) and must not switch namespaces itself.
 */
int netns_run(int nsfd, int (*fn)(void *arg, struct wr_err *err), void *arg, struct wr_err *err);

/**
 * socket(domain, type | SOCK_CLOEXEC, protocol) made inside nsfd. A socket belongs to the
 * namespace it was made in for its whole life, wherever it is then used, so the daemon can listen
 * in the gateway or connect from a sandbox without its threads living there. Returns the fd
 * (the caller owns it) or -1 with err set.
 */
int netns_socket(int nsfd, int domain, int type, int protocol, struct wr_err *err);

/**
 * Makes a veth pair with one end named a_name in namespace a_nsfd and the other named b_name in
 * b_nsfd, in a single request (each end is created directly in its namespace). Both ends start
 * down and without addresses. EEXIST if either name is taken in its namespace.
 */
int netns_veth_create(int a_nsfd, const char *a_name, int b_nsfd, const char *b_name,
                      struct wr_err *err);

/**
 * Deletes interface ifname in nsfd (for a veth, both ends go, wherever the peer is). A missing
 * interface is success: teardown may run after a half-done setup, or twice.
 */
int netns_link_del(int nsfd, const char *ifname, struct wr_err *err);

/** Sets interface ifname in nsfd up. */
int netns_link_up(int nsfd, const char *ifname, struct wr_err *err);

/**
 * Adds addr/prefix (prefix 1..32; the broadcast address is derived from it) to interface ifname
 * in nsfd. The same address already there is success.
 */
int netns_addr_add(int nsfd, const char *ifname, struct in_addr addr, int prefix,
                   struct wr_err *err);

/**
 * Sets the IPv4 default route of nsfd's main table to gw via interface ifname, replacing any
 * default route there was. ifname must be up and gw on one of its subnets.
 */
int netns_route_default(int nsfd, const char *ifname, struct in_addr gw, struct wr_err *err);

/**
 * Writes value to /proc/sys/net/<path> as nsfd sees it, e.g. path
 * "ipv6/conf/all/disable_ipv6". path is relative, of [a-zA-Z0-9_.-] components separated by
 * single '/', none "." or "..".
 */
int netns_sysctl(int nsfd, const char *path, const char *value, struct wr_err *err);

/**
 * Replaces nsfd's whole nftables ruleset with ruleset (nft syntax, as text) in one transaction:
 * the kernel gets "flush ruleset" and the new rules in one batch, so the namespace is never
 * without rules, and a ruleset that fails to parse or load leaves the old one in place. On
 * failure err->code is EINVAL and the message carries libnftables's reasons with their places in
 * ruleset ("line 4:8-8: Error: syntax error, ..."), cut to fit. Loads are serialised process-wide.
 */
int netns_nft_load(int nsfd, const char *ruleset, struct wr_err *err);

/**
 * Whether addr is an address assigned to one of nsfd's interfaces (a broadcast or network
 * address of a subnet is not): 1 if it is, 0 if not, -1 with err set.
 */
int netns_addr_is_local(int nsfd, struct in_addr addr, struct wr_err *err);

/**
 * Turns IPv6 off in nsfd, for interfaces there now and made later (conf/all and conf/default).
 * Call it before any interface but lo is made so none ever gets a link-local address.
 */
int netns_ipv6_disable(int nsfd, struct wr_err *err);

/** One sandbox's link to the gateway: a /prefix with the gateway at gw_addr, sandbox at sb_addr. */
struct netns_uplink {
    const char *gw_ifname; /* its end in the gateway ("wrs7") */
    const char *sb_ifname; /* its end in the sandbox ("eth0") */
    struct in_addr gw_addr;
    struct in_addr sb_addr;
    int prefix;
};

/**
 * Connects sandbox namespace sb_nsfd to gateway namespace gw_nsfd as up describes: a veth pair,
 * each end addressed and up, and the sandbox's default route via up->gw_addr. On failure the
 * pair is deleted again (nothing is left behind) and err names the step. Undo with
 * netns_link_del(gw_nsfd, up->gw_ifname) (closing the sandbox's last fd also removes it).
 */
int netns_uplink_create(int gw_nsfd, int sb_nsfd, const struct netns_uplink *up,
                        struct wr_err *err);

#endif
