/*
 * The egress process and the CA's signer: the two processes the daemon starts so that the code
 * that parses sandboxes' network bytes (DNS queries, ClientHellos, HTTP heads) never runs in the
 * root process that holds the API, the sandboxes and the secrets' sealing key, as OpenBSD's
 * relayd splits its relays from its CA.
 *
 * `withruntime __net` (the egress process) is started by the gateway (net/gateway.h) with its
 * control socket as fd 3 (net/netipc.h). It reads NETIPC_INIT as root (the configuration, the
 * proxy's listening socket in the gateway namespace, its signer's socket; it opens the trust
 * store and the extra upstream CA file then), drops to an unprivileged user (confine_drop), puts
 * on its seccomp filter (CONFINE_NET) and serves: the egress proxy (net/proxy.h), every
 * sandbox's resolver (net/resolver.h), their DNS client and cache, and the TLS interception
 * (net/tlsmitm.h) without the CA key. What a sandbox may reach (its policy, and the secrets it
 * may use now) comes from the daemon in NETIPC_SLOT_STATE; what was denied or let through goes
 * back as NETIPC_EVENT. Before each decision it reads the daemon's pending state messages, so a
 * policy the daemon sent before it answered an API call is the one the next connection meets.
 * It exits when the daemon closes the control socket or its signer goes away.
 *
 * `withruntime __signer` holds the CA key: fd 3 its socket to the egress process, fd 4 the key
 * (PEM), fd 5 the CA certificate (PEM). It reads both, closes them, drops to the same user under
 * CONFINE_SIGNER (no sockets of its own, no files) and signs leaf certificates (net/signer.h)
 * until the egress process goes.
 */
#ifndef WR_NET_NETPROC_H
#define WR_NET_NETPROC_H

#define NETPROC_CTL_FD 3
#define NETPROC_SIGNER_SOCK_FD 3
#define NETPROC_SIGNER_KEY_FD 4
#define NETPROC_SIGNER_CERT_FD 5
/* The user both run as when the daemon names none. */
#define NETPROC_USER "nobody"
/* Counters go to the daemon at most this often. */
#define NETPROC_STATS_MS 1000

/** main() of `withruntime __net`. Returns the process's exit status. */
int netproc_main(int argc, char **argv);

/** main() of `withruntime __signer`. */
int signerproc_main(int argc, char **argv);

#endif
