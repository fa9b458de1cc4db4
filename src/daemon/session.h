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

#define SESSION_MAX_PER_SANDBOX 16 /* running at once; more: 409 */
#define SESSION_KEEP_ENDED 16      /* ended ones kept for GET, oldest forgotten first */
#define SESSION_TAIL (64 * 1024)
#define SESSION_WINDOW (256 * 1024)
#define SESSION_CLIENT_MAX (256 * 1024)
#define SESSION_INPUT_MAX (1024 * 1024)
#define SESSION_DEFAULT_GRACE_S 60
#define SESSION_ID_LEN 24

struct daemon;
struct sandbox;
struct sink;
struct session;
struct wr_err;

/** What a session runs; checked for shape by the caller. */
struct session_request {
    const char *command; /* run by /bin/sh -c; or NULL and argv; both NULL: a login shell */
    json_t *argv;        /* array of strings, borrowed */
    const char *cwd;     /* NULL: /workspace */
    json_t *env;         /* object of strings added to the sandbox's, borrowed; may be NULL */
    int tty;             /* a pseudo-terminal (else pipes) */
    int rows, cols;      /* its size, 1..10000 */
};

/** The attached client, as the session sees it (api/sessions.c implements it). */
struct session_client_ops {
    /** Output bytes for the client. */
    void (*output)(void *arg, const void *data, size_t len);
    /** Bytes queued towards the client, not yet taken. */
    size_t (*backlog)(void *arg);
    /** Asks to be told (session_client_drained) once the queue is empty. */
    void (*want_drain)(void *arg);
    /** Stops (1) or resumes (0) reading the client's input. */
    void (*pause)(void *arg, int on);
    /**
     * The client is detached: msg (taken; NULL when another client took its place) is the
     * session's end, {"type": "exit", ...}, to pass on before closing.
     */
    void (*detached)(void *arg, json_t *msg);
};

void svc_session_create(struct daemon *d, const char *id, const struct session_request *r,
                        struct sink *s);
void svc_session_list(struct daemon *d, const char *id, struct sink *s);
void svc_session_get(struct daemon *d, const char *id, const char *sid, struct sink *s);
/** Kills the session (if running) and forgets it; answers {"id", "deleted": true}. */
void svc_session_delete(struct daemon *d, const char *id, const char *sid, struct sink *s);

struct principal;

/** Finds a session as who sees it (a foreign sandbox's: WR_E_NOT_FOUND). */
struct session *session_lookup(struct daemon *d, const char *id, const char *sid,
                               const struct principal *who, struct wr_err *err);

/**
 * Attaches a client (a client already attached is detached first, with msg NULL): it gets the
 * output kept meanwhile, then everything new; an ended session's client gets its end at once.
 */
void session_attach(struct session *ss, const struct session_client_ops *ops, void *arg);

/** The client went away: the grace period starts. */
void session_detach(struct session *ss);

/** The client's input, resize, signal (1..64), end of input (FIN; ^D on a terminal). */
void session_input(struct session *ss, const void *data, size_t len);
void session_resize(struct session *ss, int rows, int cols);
void session_signal(struct session *ss, int signum);
void session_eof(struct session *ss);

/** The client's queue emptied (after want_drain). */
void session_client_drained(struct session *ss);

/** The API object (new reference). */
json_t *session_to_json(const struct session *ss);

/** Frees every session of sb (its channel is closed); attached clients are detached. */
void session_free_all(struct sandbox *sb);

#endif
