/*
 * The gateway: the one way out of every sandbox. The daemon owns a gateway network namespace,
 * held by an fd (never named, so it dies with the daemon); each running sandbox has a namespace
 * of its own joined to it by a veth pair, on a /30 of GATEWAY_NET chosen by its slot:
 *
 *   sandbox ns:  eth0 10.200.x.(4k+2)/30, default route via the gateway end
 *   gateway ns:  wrs<k> 10.200.x.(4k+1)/30; nftables there redirects every IPv4 TCP connection
 *                that comes in on a wrs* interface to the egress proxy's listener, accepts UDP to
 *                port 53 of the sandbox's own gateway address (its resolver), and drops the rest:
 *                no forwarding at all, no IPv6, no ICMP, no other UDP.
 *
 * The proxy (net/proxy.h) and each sandbox's resolver (net/resolver.h) run in the egress
 * process (net/netproc.h), unprivileged and under a seccomp filter, with the CA key in a signer
 * process of its own: the daemon's root process never parses a sandbox's network bytes. The
 * daemon makes the namespace, the proxy's listening socket in it and each slot's DNS socket,
 * and hands them over (net/netipc.h); they listen in the gateway namespace and reach out from
 * the host's. They know a sandbox by its address. The daemon sends a slot's state (its policy,
 * the secrets it may use now: gateway_hooks.slot_state) when the slot starts and whenever it
 * changes (gateway_slot_policy_changed, gateway_refresh), before it answers the call that
 * changed it, and the egress process reads what is waiting before each decision: a change
 * applies to the next lookup and connection, and the open connections it no longer allows are
 * closed. If the egress process or its signer dies or stops reading, both are stopped and
 * started again (after 0.1 s, doubling up to 5 s while they keep failing) with every slot's
 * state and socket; meanwhile connections wait in the listener's backlog: egress is down, never
 * open.
 *
 * Threads: gateway_open, gateway_close and the gateway_slot_* calls run on the loop's thread;
 * gateway_plumb and gateway_unplumb block (netlink) and run on workers.
 */
#ifndef WR_NET_GATEWAY_H
#define WR_NET_GATEWAY_H

#include <event2/event.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/err.h"
#include "net/addr.h"

#define GATEWAY_SLOTS 16384      /* /30s in 10.200.0.0/16 */
#define GATEWAY_PROXY_PORT 15001 /* the proxy's port in the gateway namespace */
#define GATEWAY_ID_MAX 31        /* a sandbox id (the daemon's are 24 characters) */

struct gateway_config {
    /* Where the resolvers and the proxy send their own queries: "a.b.c.d" or "a.b.c.d:port";
       "" = the first IPv4 nameserver of the host's /etc/resolv.conf. */
    char dns_upstream[64];
    /* Ranges that count as public besides the globally routable ones (tests; "" by default):
       comma-separated CIDRs (addr_ranges_parse). */
    char public_ranges[1024];
    /* Who the egress and signer processes run as ("": NETPROC_USER). */
    char user[64];
    /* The daemon's CA, which signs what the proxy shows sandboxes when it terminates their TLS;
       and certificates the proxy trusts upstream besides the system's (NULL: none). */
    const char *ca_cert, *ca_key, *upstream_extra_ca;
    /* The CA certificate's text (what ca_cert holds), which the egress process gets: it never
       sees the key. Required with ca_cert. */
    const char *ca_cert_pem;
    /* The proxy's cap on connections from all sandboxes (0: PROXY_MAX_CONNS); the daemon sizes
       it to its fd limit (proxy_conns_for_fds). */
    int proxy_max_conns;
};

struct gateway_hooks {
    /**
     * What sandbox id may reach, as a new object: {"policy": its normalised egress policy,
     * "inject": the secrets it may use now (daemon/secrets.h, secrets_injections_json)}; NULL
     * if there is no such sandbox (its connections are refused).
     */
    json_t *(*slot_state)(void *ctx, const char *id);
    /** A denied lookup (via "dns") or connection (via "proxy"). */
    void (*denied)(void *ctx, const char *id, const char *via, const char *host, int port,
                   const char *reason);
    /** A connection let through to host:port (may be NULL). */
    void (*allowed)(void *ctx, const char *id, const char *host, int port);
};

struct gateway;

/**
 * Makes the gateway namespace, its rules, the proxy and its DNS client. Blocks briefly (netlink,
 * nftables); call at start-up on the loop's thread. Returns NULL with err saying why this host
 * cannot run sandbox networking.
 */
struct gateway *gateway_open(struct event_base *base, const struct gateway_config *cfg,
                             const struct gateway_hooks *hooks, void *ctx, struct wr_err *err);

/** Closes every connection and resolver and drops the namespace (the sandboxes' veths go with
 * it). NULL is a no-op. */
void gateway_close(struct gateway *g);

/** Reserves a slot for sandbox id. Returns it, or -1 with err set when all are taken. */
int gateway_slot_take(struct gateway *g, const char *id, struct wr_err *err);

/** The sandbox in slot runs: serve its DNS on dns_fd (taken; closed on failure too). */
int gateway_slot_activate(struct gateway *g, int slot, int dns_fd, struct wr_err *err);

/** Gives slot back: its resolver stops, the proxy's connections from it are closed. Call after
 * gateway_unplumb. Negative slots are a no-op. */
void gateway_slot_release(struct gateway *g, int slot);

/**
 * Worker: a new network namespace for slot's sandbox joined to the gateway, addresses and route
 * set (runsc takes them over at each start, so this runs before each). Fills *netns_fd (the
 * namespace), *dns_fd (a UDP socket bound to the slot's gateway address, port 53, for
 * gateway_slot_activate) and nameserver (that address as text). On failure nothing is left.
 */
int gateway_plumb(struct gateway *g, int slot, int *netns_fd, int *dns_fd, char nameserver[16],
                  struct wr_err *err);

/** Worker: removes slot's veth pair (and with it the sandbox's only link). Idempotent. */
int gateway_unplumb(struct gateway *g, int slot, struct wr_err *err);

/** The policy of slot's sandbox changed: its state goes to the egress process, which closes
 * its open connections that the new policy does not allow (proxy_recheck_peer). Negative slots
 * are a no-op. */
void gateway_slot_policy_changed(struct gateway *g, int slot);

/** Secrets or keys changed: every running sandbox's state goes again. NULL is a no-op. */
void gateway_refresh(struct gateway *g);

/** The address of slot's sandbox (host 2) or of its end in the gateway (host 1). */
struct in_addr gateway_slot_addr(int slot, int host);

/** The slot whose sandbox address sa is (in use or not), or -1. */
int gateway_slot_of_addr(const struct sockaddr *sa, socklen_t len);

/** Counters for health and the tests. */
struct gateway_stats {
    unsigned slots_used;
    unsigned resolvers;
    uint64_t proxy_bytes_up;   /* sandboxes to upstream, through the proxy */
    uint64_t proxy_bytes_down; /* upstream to sandboxes */
    uint64_t proxy_connections;
    int egress_pid, signer_pid; /* 0 while they are down */
    unsigned egress_restarts;   /* times they were started again */
};
void gateway_stats(const struct gateway *g, struct gateway_stats *out);

/**
 * For `doctor`: builds a throwaway gateway and sandbox namespace with the real rules and a veth
 * pair between them. Returns 0 with detail filled, or -1 with err saying what this host lacks.
 */
int gateway_probe(char *detail, size_t detail_len, struct wr_err *err);

/**
 * Parses "a.b.c.d[:port]" (port default 53) into out. Returns 0 or -1 with err set. "" reads the
 * first IPv4 nameserver of /etc/resolv.conf.
 */
int gateway_parse_upstream(const char *text, struct sockaddr_in *out, struct wr_err *err);

#endif
