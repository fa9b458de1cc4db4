/*
 * Interactive sessions: a command (a login shell by default) on a pseudo-terminal, or on pipes,
 * that a client drives as a byte stream both ways (the API carries it over a WebSocket). A
 * sandbox owns its sessions; they live on the loop thread and end with the sandbox's agent
 * channel (stop, delete, lease end, failure).
 *
 * Flow control: output comes from the agent in a window (SESSION_WINDOW) that is topped up only
 * while the attached client has less than SESSION_CLIENT_MAX queued, so a client that stops
 * reading stops the command (as a slow terminal would), never the daemon's memory. With no
 * client attached the output is kept in a ring of the last SESSION_TAIL bytes (and the command
 * runs on); a client that attaches gets that first. A session without a client for the grace
 * period (serve --session-grace) is killed. Input goes to the agent as STDIN frames; the
 * client is paused while the channel has more than SESSION_INPUT_MAX queued.
 */
#ifndef WR_DAEMON_SESSION_H
#define WR_DAEMON_SESSION_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/service.h"

#define SESSION_MAX_PER_SANDBOX 16 /* running at once; more: 409 */
#define SESSION_KEEP_ENDED 16      /* ended ones kept for GET, oldest forgotten first */
#define SESSION_TAIL (64 * 1024)
#define SESSION_WINDOW (256 * 1024)
#define SESSION_CLIENT_MAX (256 * 1024)
#define SESSION_INPUT_MAX (1024 * 1024)
#define SESSION_DEFAULT_GRACE_S 60
#define SESSION_ID_LEN 24

struct sandbox;
struct session;

/** The API object (new reference). */
json_t *session_to_json(const struct session *ss);

/** Frees every session of sb (its channel is closed); attached clients are detached. */
void session_free_all(struct sandbox *sb);

#endif
