/*
 * The messages between the daemon and its egress process (net/netproc.h): one AF_UNIX
 * SOCK_SEQPACKET socket pair, so that each message is one datagram, read whole or not at all.
 * A message is a type byte and a JSON object (or nothing); up to NETIPC_FDS_MAX descriptors ride
 * along with it (SCM_RIGHTS). Each side accepts only the types meant for it, at most its own
 * size bound: NETIPC_DOWN_MAX from the daemon (a sandbox's policy and secrets), NETIPC_UP_MAX
 * from the egress process, whose messages the daemon treats as it treats a sandbox's bytes.
 *
 * Sends never block: a peer that stops reading fills its socket's buffer, and the sender then
 * sees EAGAIN (the daemon takes that as a wedged egress process and restarts it; the egress
 * process drops the event and counts it).
 */
#ifndef WR_NET_NETIPC_H
#define WR_NET_NETIPC_H

#include <jansson.h>
#include <stddef.h>

#include "common/err.h"

#define NETIPC_DOWN_MAX (4 * 1024 * 1024)
#define NETIPC_UP_MAX 4096
#define NETIPC_FDS_MAX 2
/* Socket buffers, set on both ends by the daemon (which may exceed the system's default). */
#define NETIPC_SNDBUF (8 * 1024 * 1024)

enum netipc_type {
    /* daemon -> egress process */
    NETIPC_INIT = 1,       /* the configuration; fds: the proxy's listener, the signer's socket */
    NETIPC_SLOT_OPEN = 2,  /* {"slot"}; fd: the slot's DNS socket (its resolver starts) */
    NETIPC_SLOT_STATE = 3, /* {"slot", "id", "policy", "inject"}: what a sandbox may reach */
    NETIPC_SLOT_CLOSE = 4, /* {"slot"}: its resolver stops, its connections close */
    /* egress process -> daemon */
    NETIPC_READY = 16, /* {}: serving */
    NETIPC_EVENT = 17, /* {"id", "via", "host", "port", "reason"?}: denied (a reason) or allowed */
    NETIPC_STATS = 18, /* {"up", "down", "conns", "resolvers"}: counters since it started */
};

/**
 * Sends one message: type, obj serialised (NULL: an empty body), fds (nfds of them, borrowed).
 * 0, or -1 with errno (EAGAIN: the peer's buffer is full; EMSGSIZE: over max). What is
 * serialised is wiped before it is freed (a slot's state carries secrets).
 */
int netipc_send(int sock, int type, json_t *obj, const int *fds, int nfds, size_t max);

/**
 * Reads one message without blocking: its type into *type, its body parsed into *obj (NULL if
 * empty; the caller owns it), fds into fds (*nfds of them, at most NETIPC_FDS_MAX; the caller
 * owns them). Returns 1 for a message, 0 at end of stream (the peer closed), -1 with errno
 * (EAGAIN: nothing to read) or -1 with err set and errno EPROTO for a message that breaks the
 * rules (over max, truncated, more descriptors than allowed, a body that is not a JSON object):
 * what it carried is closed and freed, and the caller should treat the peer as broken. buf is
 * scratch space of max + 1 bytes.
 */
int netipc_recv(int sock, int *type, json_t **obj, int *fds, int *nfds, char *buf, size_t max,
                struct wr_err *err);

/** The type of the next message without reading it, or -1 (EAGAIN: none yet; 0 at EOF too). */
int netipc_peek(int sock);

#endif
