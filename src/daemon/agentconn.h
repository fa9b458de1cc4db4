/*
 * The daemon's end of the control channel to one sandbox's agent: frames in
 * and out over a bufferevent, requests multiplexed by id. Everything here
 * runs on the event-loop thread. The agent is untrusted: a malformed frame,
 * a frame type it may not send, or silence at start-up kills the connection,
 * never the daemon.
 */
#ifndef WR_DAEMON_AGENTCONN_H
#define WR_DAEMON_AGENTCONN_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

struct agentconn;
struct evbuffer;

/*
 * How long a request may wait on the agent without a sign of progress (a frame for it either
 * way) before the agent is taken to be stuck and the connection dies, failing every request.
 * Execs (bounded by their own timeout) and windowed requests out of credit (waiting on the
 * caller, not the agent) do not count.
 */
#define AGENTCONN_DEADLINE_MS 60000

/**
 * Called for each frame of a request. A terminal frame (EXIT, OK, ERROR) is the last call; the
 * request is already forgotten then. If the connection dies first, it is called once with
 * h == NULL and payload pointing to a NUL-terminated reason.
 */
typedef void (*agentconn_frame_cb)(void *arg, const struct proto_header *h, const uint8_t *payload);

/**
 * Called instead of the frame callback for each DATA frame of a request that takes its data as
 * buffers (agentconn_on_data), with the frame's header and its payload in a libevent buffer.
 * The callee moves or drains what it wants; what it leaves is dropped after the call.
 */
typedef void (*agentconn_data_cb)(void *arg, const struct proto_header *h,
                                  struct evbuffer *payload);

/** Called once when the agent said HELLO (ok = 1) or the connection died (ok = 0, reason set). */
typedef void (*agentconn_state_cb)(void *arg, int ok, const char *reason);

/**
 * Takes ownership of fd (the channel) and starts reading. `on_state` reports readiness and
 * death; hello_timeout_ms bounds the wait for HELLO.
 */
struct agentconn *agentconn_new(struct event_base *base, int fd, int hello_timeout_ms,
                                agentconn_state_cb on_state, void *arg);

/**
 * Starts a request: sends one frame with a fresh id and registers cb for its answers.
 * Returns the id, or 0 if the connection is dead (cb is not called then).
 */
uint32_t agentconn_request(struct agentconn *c, uint16_t type, const void *payload, size_t len,
                           agentconn_frame_cb cb, void *arg);

/**
 * Like agentconn_request for a request whose output is flow-controlled (EXEC, FILE_READ):
 * appends PT_WINDOW to fields and sends them. The agent may send `window` bytes of output;
 * agentconn_credit lets it send more. An agent that sends more than it was allowed is lying:
 * the connection dies.
 */
uint32_t agentconn_request_windowed(struct agentconn *c, uint16_t type, struct proto_buf *fields,
                                    uint64_t window, agentconn_frame_cb cb, void *arg);

/**
 * Lets a windowed request's agent send up to `window` bytes beyond what it has sent so far
 * (one CREDIT frame; nothing if that adds less than a quarter window).
 */
void agentconn_credit(struct agentconn *c, uint32_t id, uint64_t window);

/** Like agentconn_credit, sending nothing if that adds less than step (at least 1). */
void agentconn_credit_step(struct agentconn *c, uint32_t id, uint64_t window, uint64_t step);

/**
 * The open request id's DATA frames go to cb (with the request's arg) as buffers instead of to
 * its frame callback. A big frame's payload is then read from the channel straight into the
 * buffer's own memory, which the callee can move on (evbuffer_add_buffer) without a copy.
 */
void agentconn_on_data(struct agentconn *c, uint32_t id, agentconn_data_cb cb);

/** Bytes queued towards the agent and not yet written. */
size_t agentconn_backlog(struct agentconn *c);

/**
 * Calls cb once, when the bytes queued towards the agent have fallen low again (for an upload
 * that stopped sending while the agent was slow). Forgotten when the request ends, is
 * cancelled or the connection dies.
 */
void agentconn_on_writable(struct agentconn *c, uint32_t id, void (*cb)(void *arg), void *arg);

/** Sends a further frame for an open request (STDIN, DATA, SIGNAL). Returns 0 or -1 if dead. */
int agentconn_send(struct agentconn *c, uint32_t id, uint16_t type, uint16_t flags,
                   const void *payload, size_t len);

struct evbuffer;

/**
 * Like agentconn_send with all of payload (at most PROTO_MAX_PAYLOAD bytes) as the frame's
 * payload, moved onto the channel without copying; payload is left empty. Returns 0 or -1 if
 * dead (payload then keeps its bytes).
 */
int agentconn_send_buffer(struct agentconn *c, uint32_t id, uint16_t type, uint16_t flags,
                          struct evbuffer *payload);

/**
 * Sends len bytes as a request's whole stdin: STDIN frames of PROTO_CHUNK, then FIN.
 * Returns 0, or -1 if the connection is dead.
 */
int agentconn_send_stdin(struct agentconn *c, uint32_t id, const void *data, size_t len);

/**
 * Returns 1 if a frame of this type ends its request (EXIT, OK, ERROR, PONG): the request's
 * callback is not called again. A callback that gets one it does not expect for its
 * operation must still finish, or its caller waits forever.
 */
int agentconn_frame_ends(uint16_t type);

/** Forgets a request: its callback is not called again; late frames for it are dropped. */
void agentconn_cancel(struct agentconn *c, uint32_t id);

/** Forgets a request and tells the agent to stop it (CANCEL). */
void agentconn_abort(struct agentconn *c, uint32_t id);

/**
 * Returns 1 if the connection died because the agent left a request unanswered for longer
 * than AGENTCONN_DEADLINE_MS (it is stuck, not gone).
 */
int agentconn_gave_up(struct agentconn *c);

/**
 * Reads an EXIT frame's payload: *code is the exit status, or -1 with *sig set when a signal
 * ended the process (a signal number the agent made up, over 64, counts as none).
 */
void agentconn_exit_status(const uint8_t *payload, size_t len, int *code, int *sig);

/** Sets the connection's deadline (AGENTCONN_DEADLINE_MS by default), in ms. */
void agentconn_set_deadline(struct agentconn *c, int ms);

/**
 * Calls cb(arg, type) before every frame goes to the agent, the request's first and every
 * later one (STDIN, DATA, CREDIT, SIGNAL, CANCEL): the sandbox's owner wakes a sandbox it has
 * frozen there (the frame waits in the channel meanwhile) and notes that it is in use. cb must
 * not send on or close the connection.
 */
void agentconn_on_send(struct agentconn *c, void (*cb)(void *arg, uint16_t type), void *arg);

/** Open requests other than PING (execs, transfers, streams): 0 when the agent has nothing
 * to do for anyone. 0 on a dead connection. */
unsigned agentconn_active(struct agentconn *c);

/** Returns 1 while the connection is alive. */
int agentconn_alive(struct agentconn *c);

/**
 * Closes the channel (the agent sees EOF and exits) and frees the connection. Open requests
 * get their death callback first, with reason. Safe to call from inside a callback of this
 * connection: the memory is released after the callback returns.
 */
void agentconn_close(struct agentconn *c, const char *reason);

#endif
