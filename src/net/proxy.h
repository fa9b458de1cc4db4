/*
 * The egress proxy: where every TCP connection out of a sandbox ends up. The gateway DNATs them
 * (nftables `redirect`) to one listening socket that the daemon owns; the proxy accepts there,
 * reads the connection's first bytes, and decides from them alone where it goes: the SNI of a TLS
 * ClientHello, or the Host of an HTTP/1.x request head (net/sniff.h). That name and the port the
 * sandbox dialed are checked against the sandbox's egress policy (net/netpolicy.h); then the
 * proxy resolves the name itself (net/lookup.h) and dials, from the daemon's own network
 * namespace, only addresses it resolved that are public (net/addr.h) and not the host's own. The
 * address the sandbox dialed is never dialed: names are pinned, so lying about DNS gets a sandbox
 * nowhere.
 *
 * HTTP is relayed with its client-to-server direction followed at request boundaries: each
 * kept-alive request must pass the policy again and name the host the connection is pinned to. A
 * denied HTTP request gets a 403 that says why, after the answers to the requests before it (the
 * server-to-client direction is followed answer by answer, status and framing only); anything
 * else denied is closed. An HTTP connection becomes a raw tunnel only on the 101 that answers a
 * WebSocket handshake (what the client sends behind the handshake waits for that answer); any
 * other Upgrade is refused.
 *
 * TLS is relayed byte for byte once its SNI passed, unless the proxy is given an interception
 * context (proxy_config.mitm, net/tlsmitm.h). Then it terminates every TLS connection whose SNI
 * passed: it answers the sandbox's handshake with a certificate for the SNI from the daemon's CA
 * (HTTP/1.1 only: a client whose ALPN list lacks it is refused), reads what comes through as
 * HTTP/1.x like plain HTTP, with one more rule (every request's Host must name the SNI, and the
 * port dialed if it gives one), and opens its own verified TLS connection upstream. Each request
 * head may be rewritten on its way (proxy_hooks.rewrite_head): that is how secrets get into
 * headers without entering the sandbox. Refusals after the handshake are HTTP answers over the
 * sandbox's TLS connection.
 *
 * One proxy runs on one event_base and is used from that base's thread only. Memory is bounded:
 * max_conns connections, each holding at most its sniff buffer (SNIFF_HTTP_HEAD_MAX or a
 * ClientHello) or about buffer_max per direction (TLS records on their way included), plus
 * OpenSSL's own per-connection state when intercepting.
 */
#ifndef WR_NET_PROXY_H
#define WR_NET_PROXY_H

#include <event2/event.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/err.h"
#include "net/addr.h"
#include "net/lookup.h"

struct tlsmitm;

/* Defaults for a proxy_config field left 0. */
#define PROXY_MAX_CONNS 4096
#define PROXY_MAX_CONNS_PER_PEER 256
/* At the global cap, a sandbox below its fair share (max_conns / sandboxes with connections,
 * never less than this) still gets a connection: the sandbox holding the most, over its own
 * share, gives one up. */
#define PROXY_SHARE_FLOOR 16
/* Lookups (net/lookup.h) one sandbox may have in flight; and, once the lookup table is half
 * full, its fair share of LOOKUP_PENDING_MAX, never less than this. */
#define PROXY_LOOKUPS_PER_PEER (LOOKUP_PENDING_MAX / 4)
#define PROXY_LOOKUP_SHARE_FLOOR 8
/* proxy_conns_for_fds: fds kept for the daemon's own files (the state database and its WAL,
 * logs, listeners, DNS sockets) and the bounds of what it returns. */
#define PROXY_FD_RESERVE 128
#define PROXY_MIN_CONNS 32
#define PROXY_FIRST_BYTES_MS 10000
#define PROXY_CONNECT_MS 10000
#define PROXY_IDLE_MS (5 * 60 * 1000)
#define PROXY_BUFFER_MAX (256 * 1024)
/* Kernel buffers: the upstream socket's receive buffer (set before connect; the kernel doubles
 * it for its bookkeeping), and the sandbox side's unsent bytes (TCP_NOTSENT_LOWAT). With the
 * relay's own buffer_max, what a connection whose sandbox reads nothing holds is bounded: about
 * 2 x PROXY_UPSTREAM_RCVBUF unread on the upstream socket, buffer_max (plus one read) in the
 * proxy, PROXY_CLIENT_NOTSENT (plus one write) unsent to the sandbox. The upstream is read only
 * as fast as the sandbox reads. 128 KiB windows still carry ~60 MiB/s at 2 ms of round trip,
 * ~6 MiB/s at 20 ms. */
#define PROXY_UPSTREAM_RCVBUF (128 * 1024)
#define PROXY_CLIENT_NOTSENT (64 * 1024)
/* A sandbox id as the policy hook writes it (the daemon's ids are far shorter). */
#define PROXY_ID_MAX 64

/** What the proxy asks of whoever owns it; called on the loop's thread. */
struct proxy_hooks {
    /**
     * The egress policy (normalised, netpolicy.h) of the sandbox at peer, and its id copied into
     * id (idcap bytes, NUL-terminated); NULL for an unknown peer (the connection is closed and
     * logged as denied "unknown_client"). Borrowed: valid until the call returns. Called for
     * every decision, so a policy change takes effect for the next connection or request.
     * Required.
     */
    json_t *(*policy)(void *ctx, const struct sockaddr *peer, socklen_t len, char *id,
                      size_t idcap);
    /** Where the sandbox meant to go: SO_ORIGINAL_DST in production. 0, or -1. Required. */
    int (*original_dst)(void *ctx, int fd, struct sockaddr_in *out /* OUT */);
    /** Whether addr is one of the host's own addresses (never dialed). NULL: none is. */
    int (*is_local)(void *ctx, const struct sockaddr *addr, socklen_t len);
    /**
     * A denied attempt (may be NULL): the sandbox's id ("" if unknown), the host (the name asked
     * for, or the dialed address as text when no name was read), the port, and a reason: one of
     * netpolicy_reason's, or "unknown_client", "too_many_connections", "fair_share" (an open
     * connection closed to make room for a sandbox below its fair share), "policy_changed" (an open
     * connection the sandbox's new policy no longer allows, proxy_recheck_peer),
     * "no_original_dst",
     * "protocol", "malformed", "timeout" (no decision within first_bytes_ms), "no_sni", "address",
     * "connect", "port_mismatch", "host_changed", "private_address", a lookup's failure
     * ("nxdomain", "no_address", "timeout", ...), or "connect_failed"; when intercepting TLS
     * also "host_mismatch" (a request's Host is not the SNI), "alpn" (the client offered no
     * http/1.1), "tls_handshake" (the handshake with the sandbox failed) or "upstream_tls" (the
     * upstream's handshake or certificate failed). Valid only for the call.
     */
    void (*denied)(void *ctx, const char *id, const char *host, int port, const char *reason);
    /** A connection let through: dialed and relaying to host:port (may be NULL). */
    void (*allowed)(void *ctx, const char *id, const char *host, int port);
    /**
     * For each request head on an intercepted TLS connection to host:port (the SNI, already
     * checked to match the request's Host, and the port dialed): may return a replacement head
     * (malloc'd, *outlen bytes; the
     * proxy frees it), which is forwarded upstream as it is (the replacement must keep the
     * head's body framing) -- the daemon puts secrets into header fields here -- or NULL to
     * forward the head as it is. head is len bytes, request line to blank line, valid only for
     * the call. May be NULL.
     */
    char *(*rewrite_head)(void *ctx, const char *id, const char *host, int port, const char *head,
                          size_t len, size_t *outlen /* OUT */);
};

/** Limits; a field left 0 takes its default (PROXY_*). */
struct proxy_config {
    const struct addr_ranges *extra_public; /* ranges that count as public (copied; NULL: none) */
    int max_conns;                          /* connections open at once, in any state */
    int max_conns_per_peer;                 /* of which from one sandbox address */
    int first_bytes_ms;                     /* to send enough to decide on */
    int connect_ms;    /* to connect upstream, over all of a name's addresses */
    int idle_ms;       /* a relay with no bytes either way is closed */
    size_t buffer_max; /* bytes queued per direction before its source is no longer read */
    /* Intercept TLS (borrowed: must outlive the proxy); NULL: relay TLS byte for byte. The
       sandbox's handshake must finish within first_bytes_ms, the upstream's within connect_ms. */
    struct tlsmitm *mitm;
    /* Intercepted handshakes one sandbox may start: a bucket of handshake_burst, refilled at
       handshakes_per_s (0: PROXY_HANDSHAKES_PER_S, PROXY_HANDSHAKE_BURST). Each costs the
       daemon a signature; past it a connection is refused (handshake_rate). */
    double handshakes_per_s;
    int handshake_burst;
};

/* An intercepted handshake costs the daemon about a millisecond of CPU (a signature): at 50 a
 * second one sandbox that replays ClientHellos holds a few percent of a core, and a burst of
 * 200 covers a build that opens its connections at once. */
#define PROXY_HANDSHAKES_PER_S 50
#define PROXY_HANDSHAKE_BURST 200

/** Counters since proxy_new, for the network log and the tests. */
struct proxy_stats {
    uint64_t accepted;       /* connections accepted (refused ones included) */
    uint64_t denied;         /* denials: connections and kept-alive requests (the hook's calls) */
    uint64_t requests;       /* HTTP request heads that passed the policy */
    uint64_t dialed;         /* connections established upstream */
    uint64_t connect_failed; /* decisions that ended with no address reachable */
    uint64_t bytes_up;       /* sandbox to upstream, first bytes included */
    uint64_t bytes_down;     /* upstream to sandbox */
    size_t queued_max;       /* the most one direction ever held queued for its destination */
    uint64_t evicted;        /* closed to make room for a sandbox below its fair share */
    unsigned active;         /* connections open now */
    unsigned active_max;     /* the most open at once */
};

struct proxy;

/**
 * Starts the proxy on base: accepts on listen_fd (a listening TCP socket; owned: closed by
 * proxy_free, or here on failure), resolving with lk (borrowed: it must outlive the proxy). cfg
 * and hooks are copied; ctx is passed to the hooks. Returns the proxy, or NULL with err set.
 */
struct proxy *proxy_new(struct event_base *base, int listen_fd, struct lookup *lk,
                        const struct proxy_config *cfg, const struct proxy_hooks *hooks, void *ctx,
                        struct wr_err *err);

/** Closes every connection and the listening socket and frees p. NULL is a no-op. */
void proxy_free(struct proxy *p);

/**
 * The sandbox at peer is gone: closes every connection from its address (peer's port is
 * ignored), in any state, without calling the denied hook.
 */
void proxy_close_peer(struct proxy *p, const struct sockaddr *peer, socklen_t len);

/**
 * The egress policy of the sandbox at peer changed (peer's port is ignored): each of its
 * connections that has a host (past the first bytes) is checked again as a new one would be,
 * and closed if the policy no longer allows that host and port, reported to the denied hook as
 * "policy_changed". One still deciding is checked when it decides.
 */
void proxy_recheck_peer(struct proxy *p, const struct sockaddr *peer, socklen_t len);

/** Copies p's counters into out. */
void proxy_stats(const struct proxy *p, struct proxy_stats *out /* OUT */);

/** A sandbox's fair share of total among sandboxes (those holding any), at least floor. */
unsigned proxy_fair_share(unsigned total, unsigned sandboxes, unsigned floor);

/**
 * The proxy's global connection cap for a daemon whose fd limit (RLIMIT_NOFILE) is fd_limit:
 * half the fds go to the API (its own cap, serve's listen_all, is at most fd_limit / 2),
 * PROXY_FD_RESERVE to the daemon's files, and of the rest half to the proxy at 2 fds a
 * connection, the other half to the sandboxes' own (agent channels, runsc, logs):
 * (fd_limit - fd_limit / 2 - PROXY_FD_RESERVE) / 4, within [PROXY_MIN_CONNS, PROXY_MAX_CONNS].
 * 1,024 fds give 96 connections; 33,024 or more give 4,096.
 */
int proxy_conns_for_fds(unsigned long long fd_limit);

#endif
