/*
 * The service: every operation the API offers on sandboxes, commands and
 * files, as the daemon carries it out. Callers (src/api/) parse and validate
 * requests into the structs below and get their answer through a sink
 * (sink.h); they never see sandboxes, agent frames or drivers. Everything
 * here runs on the event-loop thread and answers each sink exactly once,
 * possibly later (after a driver job or the agent's reply).
 *
 * Ids come from the caller unchecked: an id that is not a sandbox's is
 * answered WR_E_NOT_FOUND.
 */
#ifndef WR_DAEMON_SERVICE_H
#define WR_DAEMON_SERVICE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/sink.h"

struct daemon;

/* ---- sandboxes ---- */

/** A new sandbox's options, checked for shape and range by the caller. */
struct sandbox_opts {
    const char *image; /* image name */
    int cpus;
    int memory_mib;
    int disk_mib;
    int timeout_seconds;
    const char *on_lease_end; /* "stop" or "delete" */
    json_t *env;              /* object of strings, borrowed; NULL = none */
    json_t *metadata;         /* object of strings, borrowed; NULL = none */
    json_t *network;          /* normalised {"internet": bool[, "allow": [...]]}, borrowed */
    json_t *secrets;          /* array of secret names, borrowed; NULL = none */
    int64_t max_cost_micros;  /* its cost cap; -1: none */
};

/** Creates and starts a sandbox; answers SINK_CREATED with it once its agent answered. */
void svc_sandbox_create(struct daemon *d, const struct sandbox_opts *o, struct sink *s);

/** Which sandboxes a list answers: all of them when empty. */
struct sandbox_filter {
    json_t *metadata; /* borrowed: every key of it must be in a sandbox's metadata, same value */
    int state;        /* an enum sb_state, or -1 for any */
    int none;         /* no sandbox can match (a metadata filter no metadata can hold) */
};

/** Answers {"sandboxes": [...]}, oldest first: those f (NULL: every one) lets through. */
void svc_sandbox_list(struct daemon *d, const struct sandbox_filter *f, struct sink *s);

/** Answers the sandbox. */
void svc_sandbox_get(struct daemon *d, const char *id, struct sink *s);

/** Deletes a sandbox (waiting for a failed one's cleanup first); answers {"id", "deleted"}. */
void svc_sandbox_delete(struct daemon *d, const char *id, struct sink *s);

/**
 * Deletes every stopped or failed sandbox that has been so for at least older_than_seconds
 * (0 = all of them; running ones are never touched). Answers, once every delete finished,
 * {"deleted": [ids], "errors": [{"id", "message"}], "older_than_seconds"}.
 */
void svc_sandbox_prune(struct daemon *d, int64_t older_than_seconds, struct sink *s);

/** Stops a running sandbox, files kept; answers it stopped (at once if it already is). */
void svc_sandbox_stop(struct daemon *d, const char *id, struct sink *s);

/** Starts a stopped or failed sandbox with a fresh lease; answers it running. */
void svc_sandbox_start(struct daemon *d, const char *id, struct sink *s);

/** Moves the lease to end timeout_seconds from now; answers the sandbox. */
void svc_sandbox_set_timeout(struct daemon *d, const char *id, int timeout_seconds, struct sink *s);

/** Replaces the sandbox's egress policy (normalised, see net/netpolicy.h); answers with the
 * sandbox. New connections from the sandbox follow it at once. */
void svc_sandbox_set_network(struct daemon *d, const char *id, json_t *policy, struct sink *s);

/** Answers {"id", "events": [...]}: the sandbox's history, oldest first. */
/** The secrets (daemon/secrets.h): list, get, set (create or replace), update (the fields f
 * gives, keeping the value), delete. f->keys must name keys in use that are their own owners. */
struct secret_fields;
void svc_secrets_list(struct daemon *d, struct sink *s);
void svc_secret_get(struct daemon *d, const char *name, struct sink *s);
void svc_secret_set(struct daemon *d, const char *name, const char *value, size_t len,
                    const struct secret_fields *f, struct sink *s);
void svc_secret_update(struct daemon *d, const char *name, const struct secret_fields *f,
                       struct sink *s);
void svc_secret_delete(struct daemon *d, const char *name, struct sink *s);

/** GET /v1/sandboxes/{id}/network/log: its recent denied lookups and connections. */
/* ---- the admin's: API keys and the audit trail (daemon/admin.c; anyone else: forbidden) ---- */

struct key_opts;
struct principal;
void svc_key_create(struct daemon *d, const struct key_opts *o, struct sink *s);
void svc_key_list(struct daemon *d, struct sink *s);
/** Who is asking: {"admin": bool, "key": the caller's key record, or null for the admin}. */
void svc_whoami(struct daemon *d, struct sink *s);
void svc_key_get(struct daemon *d, const char *id, struct sink *s);
void svc_key_update(struct daemon *d, const char *id, const struct key_opts *o, struct sink *s);
void svc_key_revoke(struct daemon *d, const char *id, struct sink *s);

/** Records a mutating request in the audit trail: who, which route, which sandbox, the status.
 * Written within AUDIT_FLUSH_MS (admin.c), after the answer; reads of the trail see it. */
void svc_audit_record(struct daemon *d, const struct principal *who, const char *method,
                      const char *route, const char *sandbox_id, int status);

/** The newest `limit` audit entries before seq before_seq, newest first. */
void svc_audit_list(struct daemon *d, int64_t before_seq, int limit, struct sink *s);

void svc_sandbox_network_log(struct daemon *d, const char *id, struct sink *s);

void svc_sandbox_events(struct daemon *d, const char *id, struct sink *s);

/** Answers the sandbox's resource use as measured on the host (read on a worker thread). */
void svc_sandbox_stats(struct daemon *d, const char *id, struct sink *s);

/** Answers the daemon's health: status, version, driver, number of sandboxes. */
void svc_health(struct daemon *d, struct sink *s);

/** {"states": [...], "reasons": [...]}: every sandbox state and state_reason (new reference). */
json_t *svc_enums(void);

/** Answers {"images": [...]}. */
void svc_images(struct daemon *d, struct sink *s);

/* ---- commands ---- */

/** A command to run, checked for shape by the caller. */
struct exec_request {
    const char *command; /* run by /bin/sh -c; or NULL and argv */
    json_t *argv;        /* array of strings, borrowed; or NULL and command */
    const char *cwd;     /* NULL = /workspace */
    json_t *env;         /* object of strings added to the sandbox's, borrowed; may be NULL */
    const unsigned char *stdin_data; /* NULL = no stdin (EOF at once) */
    size_t stdin_len;
    double timeout_seconds; /* <= 0: none (background only) */
    size_t max_output;      /* bytes kept per stream */
    int stream;             /* answer as a record stream: stdout/stderr chunks, then exit */
    int background;         /* answer SINK_CREATED with a command handle at once */
};

/**
 * Runs a command in a running sandbox. Whole: answers the result (exit code, output,
 * truncation, timed_out, oom_killed). Stream: records {"type": "stdout"|"stderr", ...} then
 * {"type": "exit", ...}. If the caller goes away, the command's process tree is killed.
 */
void svc_exec(struct daemon *d, const char *id, const struct exec_request *r, struct sink *s);

/** Answers {"commands": [...]}: the sandbox's background commands, oldest first. */
void svc_command_list(struct daemon *d, const char *id, struct sink *s);

/** Answers one background command. */
void svc_command_get(struct daemon *d, const char *id, const char *cid, struct sink *s);

/** Answers a command with its output from the given offsets. */
void svc_command_output(struct daemon *d, const char *id, const char *cid, uint64_t stdout_offset,
                        uint64_t stderr_offset, struct sink *s);

/** Answers the command once it has ended, or after timeout_seconds (then still running). */
void svc_command_wait(struct daemon *d, const char *id, const char *cid, double timeout_seconds,
                      struct sink *s);

/** Sends signum (1..64) to the command's process tree; answers the command. */
void svc_command_signal(struct daemon *d, const char *id, const char *cid, int signum,
                        struct sink *s);

/* ---- interactive sessions (daemon/session.c) ---- */

struct session;
struct principal;
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

/* ---- files (paths are resolved inside the sandbox; relative ones from /workspace) ---- */

/** Streams a file's bytes from offset (length UINT64_MAX = to the end). */
void svc_file_read(struct daemon *d, const char *id, const char *path, uint64_t offset,
                   uint64_t length, struct sink *s);

/** svc_file_write's mode when the caller gave none. */
#define SVC_MODE_UNSET (~0u)
/** svc_file_write's offset for "replace the whole file". */
#define SVC_OFFSET_NONE UINT64_MAX

/**
 * Writes the sink's input to path; answers the new file's entry. With offset SVC_OFFSET_NONE the
 * file is created or replaced (mode SVC_MODE_UNSET: 0644). With an offset the input is written
 * at that byte, the file is created if missing (offset 0) and never truncated, and an offset past
 * its end is refused; its mode changes only when a mode is given.
 */
void svc_file_write(struct daemon *d, const char *id, const char *path, unsigned mode, int parents,
                    uint64_t offset, struct sink *s);

/** Answers {"path", "entries": [...]}, sorted by name. */
void svc_file_list(struct daemon *d, const char *id, const char *path, struct sink *s);

/**
 * Streams a tar archive of path (application/x-tar): a directory's contents, names relative
 * to it, or a single file or symlink under its own name. Flow-controlled like a read.
 */
void svc_file_archive(struct daemon *d, const char *id, const char *path, struct sink *s);

/**
 * Extracts the tar file `archive` (in the sandbox) under the directory path (made if missing),
 * refusing entries that would land outside it; removes the archive after when remove_archive.
 * Answers {path, entries, bytes, skipped[, skipped_note]}.
 */
void svc_file_extract(struct daemon *d, const char *id, const char *archive, const char *path,
                      int remove_archive, struct sink *s);

/** Answers the entry of path. */
void svc_file_stat(struct daemon *d, const char *id, const char *path, struct sink *s);

/** Makes a directory; answers its entry. */
void svc_file_mkdir(struct daemon *d, const char *id, const char *path, unsigned mode, int parents,
                    struct sink *s);

/** Removes path (a directory's contents too if recursive); answers {"path", "removed"}. */
void svc_file_remove(struct daemon *d, const char *id, const char *path, int recursive,
                     struct sink *s);

#endif
