/*
 * The in-sandbox agent's internal interface. The agent is one process with one
 * poll() loop (main.c); this header is what its parts share: the outbound
 * frame queue (chan.c), the table of live requests keyed by id (main.c),
 * commands (exec.c), file operations (files.c) and process-tree signalling
 * (tree.c). Nothing outside src/agent includes it.
 */
#ifndef WR_AGENT_AGENT_H
#define WR_AGENT_AGENT_H

#include <limits.h>
#include <linux/capability.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "proto/proto.h"

#define AGENT_WORKSPACE "/workspace"
/* Live requests (EXEC, FILE_READ, FILE_WRITE, FILE_LIST) at once; more get ERROR EAGAIN. */
#define AGENT_MAX_REQUESTS 1024
/* Above this much unsent output, stop reading command pipes and producing file data. */
#define AGENT_OUT_SOFT (4u << 20)
/* Above this, stop reading the channel too: the daemon is not reading what it asked for. */
#define AGENT_OUT_HARD (16u << 20)
/* Unconsumed STDIN bytes buffered for one command before its stdin is cut off. */
#define AGENT_STDIN_MAX (16u << 20)
/* How long EXIT may wait for the pipes to close after the command itself has exited. */
#define AGENT_EXIT_GRACE_MS 100
/* Entries a FILE_LIST may return before it ends with ERROR E2BIG. */
#define AGENT_LIST_MAX 100000
/* Deepest directory tree FILE_REMOVE with PROTO_W_RECURSIVE descends into. */
#define AGENT_REMOVE_DEPTH 256
/* argv[0] (and name) of the commands' pid namespace init, this binary run again. */
#define AGENT_HOLDER_NAME "wr-ns-init"
/* How long a fork refused with ENOMEM waits for a dying holder to be reaped. */
#define AGENT_HOLDER_DEATH_MS 100
/* The capabilities a command may keep: Docker's default set. Anything else the agent holds
 * (CAP_SYS_ADMIN, for the namespaces) is the agent's alone. What the driver did not grant
 * (it drops NET_RAW) stays absent. */
#define AGENT_COMMAND_CAPS                                                                         \
    ((1ULL << CAP_CHOWN) | (1ULL << CAP_DAC_OVERRIDE) | (1ULL << CAP_FSETID) |                     \
     (1ULL << CAP_FOWNER) | (1ULL << CAP_MKNOD) | (1ULL << CAP_NET_RAW) | (1ULL << CAP_SETGID) |   \
     (1ULL << CAP_SETUID) | (1ULL << CAP_SETFCAP) | (1ULL << CAP_SETPCAP) |                        \
     (1ULL << CAP_NET_BIND_SERVICE) | (1ULL << CAP_SYS_CHROOT) | (1ULL << CAP_KILL) |              \
     (1ULL << CAP_AUDIT_WRITE))
/* PATH searched when the command's environment has none. */
#define AGENT_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* A byte queue: bytes [off, len) are pending. */
struct obuf {
    uint8_t *data;
    size_t off, len, cap;
};

/** Returns the number of bytes still queued. */
size_t obuf_pending(const struct obuf *b);
/** Returns room for n more bytes at the end (not yet queued; see obuf_commit). */
uint8_t *obuf_reserve(struct obuf *b, size_t n);
/** Queues n bytes written into the space obuf_reserve returned. */
void obuf_commit(struct obuf *b, size_t n);
/** Queues a copy of data[n]. */
void obuf_append(struct obuf *b, const void *data, size_t n);
/** Drops n bytes from the front (they were written out). */
void obuf_consume(struct obuf *b, size_t n);
/** Frees the memory; the buffer is empty and usable again. */
void obuf_free(struct obuf *b);

enum req_kind { REQ_EXEC, REQ_READ, REQ_WRITE, REQ_LIST, REQ_ARCHIVE, REQ_EXTRACT };

/* Common head of every live request; the kind's own struct embeds it first. */
struct req {
    uint32_t id;
    enum req_kind kind;
    struct req *prev, *next; /* ag.reqs, oldest first */
    struct req *hnext;       /* hash chain */
    int windowed;            /* the daemon grants credit for this request's output */
    uint64_t credit;         /* bytes of output it may still send, when windowed */
};

#define AGENT_HASH_SIZE 2048

struct agent {
    int in_fd, out_fd;
    int is_init; /* PID 1 of the sandbox, not a process on the host */
    pid_t pid;
    struct obuf out;
    struct req *head, *tail;
    struct req *hash[AGENT_HASH_SIZE];
    unsigned nreqs;
    struct rlimit nofile; /* as inherited; restored in commands */
    /* Commands run in a child pid namespace (pidns.c); 0 only when not PID 1 (the agent run
     * on a host, in tests): as PID 1 without one the agent refuses to start. */
    int pidns;
    pid_t holder;       /* the namespace's init, in our pid view; 0: none (yet, or it died) */
    int holder_mnt;     /* its mount namespace (with the namespace's own /proc), or -1 */
    int holder_root;    /* its root directory (O_PATH), where file operations start, or -1 */
    int self_pidns;     /* our own pid namespace, or -1 */
    char exe[PATH_MAX]; /* this binary, run again as the holder */
    uint64_t bounding;  /* our capability bounding set (as PID 1), which caps_limit trims */
    sigset_t ignored;   /* signals set to SIG_IGN, which a command must put back (exec.c) */
};

/** The agent's single state: there is one channel and one loop per process. */
extern struct agent ag;

/* ---- requests (main.c) ---- */

/** Returns the live request with this id, or NULL. */
struct req *req_find(uint32_t id);
/**
 * Checks that a new request may take this id: answers ERROR (EEXIST for an id in use, EAGAIN
 * over AGENT_MAX_REQUESTS) and returns -1 if not.
 */
int req_admit(uint32_t id);
/** Registers r (its id and kind set) as live. */
void req_add(struct req *r);
/** Unregisters r; later frames with its id are for no request. Does not free it. */
void req_remove(struct req *r);
/**
 * Takes the request's flow-control window (PT_WINDOW) from its payload: r then sends no more
 * output than its credit. No field: no limit. Returns 0, or -1 if the field is malformed.
 */
int req_window(struct req *r, const uint8_t *payload, size_t len);
/** Returns how many of want bytes of output r may send now (want itself when not windowed). */
size_t req_room(const struct req *r, size_t want);
/** Records n bytes of output sent for r. */
void req_spend(struct req *r, size_t n);

/* ---- outbound frames (chan.c) ---- */

/** Queues a frame with a raw payload. */
void chan_send(uint32_t id, uint16_t type, uint16_t flags, const void *payload, size_t len);
/** Queues a frame whose payload is a built field list. */
void chan_send_fields(uint32_t id, uint16_t type, const struct proto_buf *fields);
/** Queues OK. */
void chan_ok(uint32_t id);
/** Queues ERROR with ERRNO err and a formatted MESSAGE. */
void chan_error(uint32_t id, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/**
 * Returns room for a data frame of up to max payload bytes, to read into directly (no copy);
 * finish with chan_commit_data. Nothing is queued until then.
 */
uint8_t *chan_reserve_data(size_t max);
/** Queues the frame whose first n payload bytes were written into chan_reserve_data's room. */
void chan_commit_data(uint32_t id, uint16_t type, size_t n);
/**
 * Like chan_reserve_data for n frames of up to `each` payload bytes back to back: frame i's
 * payload room starts at the returned pointer + i * (PROTO_HEADER_LEN + each). Each is
 * finished in order with chan_commit_data, every one but the last filled whole.
 */
uint8_t *chan_reserve_frames(size_t n, size_t each);
/** Returns the number of queued, unwritten bytes. */
size_t chan_pending(void);
/** Writes what it can without blocking. Returns 0, or -1 if the daemon is gone. */
int chan_flush(void);

/* ---- commands (exec.c) ---- */

/**
 * Starts the command an EXEC frame (session 0) or a SESSION frame (session 1: stdin always
 * fed, a pseudo-terminal when it asks for TTY) describes, or answers ERROR.
 */
void exec_start(uint32_t id, const uint8_t *payload, size_t len, int session);
/** Handles RESIZE for a session on a terminal (anything else: ignored). */
void exec_resize(struct req *r, const uint8_t *payload, size_t len);
/** Feeds STDIN bytes (and FIN) to a command. */
void exec_stdin(struct req *r, const uint8_t *data, size_t len, int fin);
/** Handles a SIGNAL frame for a command. */
void exec_signal(struct req *r, const uint8_t *payload, size_t len);
/**
 * Installs the seccomp filter that keeps commands (everything the agent starts inherits it)
 * from creating user namespaces. Returns 0, or -1 with errno set.
 */
int deny_user_namespaces(void);
/** Handles CANCEL for a command: kills its process tree; its output is dropped from now on. */
void exec_cancel(struct req *r);
/**
 * Adds the command's pipes to the poll set. may_read is 0 while output is over
 * AGENT_OUT_SOFT.
 */
void exec_pollfds(struct req *r, struct pollfd *fds, struct req **owners, size_t *n, int may_read);
/** Handles poll events on one of the command's fds. */
void exec_event(struct req *r, int fd, short revents);
/** Records the exit of pid if it is a command's main process (orphans are just reaped). */
void exec_reaped(pid_t pid, int status);
/**
 * Sends EXIT if the command is finished. Returns 1 if it was (the caller removes and frees it),
 * else 0 and lowers *timeout_ms to when it must be looked at again.
 */
int exec_check(struct req *r, uint64_t now, int *timeout_ms);
/** Frees a command's resources (its processes are left alone). */
void exec_free(struct req *r);

/* ---- files (files.c) ---- */

/* Room for a resolved path: the workspace prefix, a '/', PROTO_MAX_PATH bytes and a NUL. */
#define AGENT_PATH_BUF (sizeof(AGENT_WORKSPACE) + 1 + PROTO_MAX_PATH + 1)

struct wr_err;

/**
 * Turns a path field into a path for the syscalls: relative paths are taken from
 * AGENT_WORKSPACE. Rejects an empty path, one over PROTO_MAX_PATH and one containing NUL
 * (`what` names the field in the message). out has AGENT_PATH_BUF bytes. Returns 0 or -1.
 */
int agent_path(const struct proto_field *f, const char *what, char *out, struct wr_err *err);

#define R_FOLLOW 1  /* follow a symlink in the last component too */
#define R_PARENTS 2 /* create missing directories on the way (mode 0755), like mkdir -p */

/* Where a path ends: its last component, name, in the directory open (O_PATH) at dir. The
 * name may not exist yet; it is "." for the root and may be "." or "..". */
struct rpath {
    int dir;
    char name[NAME_MAX + 1];
    int slash; /* the path ended in '/': the last component must be a directory */
};

/**
 * Resolves path (absolute, as agent_path makes it) from the root of the commands' view, one
 * component at a time, into rp. Symlinks are followed by the agent, never by the kernel, except
 * one in /proc: those are refused with ELOOP. The last component is followed only with R_FOLLOW
 * or a trailing '/'. `what` and path make the messages. Returns 0, or -1 with err set and
 * rp->dir -1.
 */
int agent_resolve(const char *path, int flags, const char *what, struct rpath *rp,
                  struct wr_err *err);
/** Closes rp->dir if open. */
void rpath_close(struct rpath *rp);

/** Handles FILE_READ: answers STAT_RESULT and registers a job producing DATA, or ERROR. */
void file_read_start(uint32_t id, const uint8_t *payload, size_t len);
/** Handles FILE_WRITE: opens the file and registers a request awaiting DATA, or ERROR. */
void file_write_start(uint32_t id, const uint8_t *payload, size_t len);
/** Handles a DATA frame for a FILE_WRITE. */
void file_write_data(struct req *r, const uint8_t *data, size_t len, int fin);
/** Handles FILE_LIST: registers a job producing DIR_ENTRIES, or answers ERROR. */
void file_list_start(uint32_t id, const uint8_t *payload, size_t len);
/** Handles FILE_STAT. */
void file_stat(uint32_t id, const uint8_t *payload, size_t len);
/** Handles FILE_MKDIR. */
void file_mkdir(uint32_t id, const uint8_t *payload, size_t len);
/** Handles FILE_REMOVE. */
void file_remove(uint32_t id, const uint8_t *payload, size_t len);
/**
 * Runs a READ or LIST job while output stays under AGENT_OUT_SOFT. Returns 1 when it has sent
 * its last frame (the caller removes and frees it), else 0.
 */
int file_job_step(struct req *r);
/** Frees a READ, WRITE or LIST request. */
void file_free(struct req *r);

/* ---- directory archives (archive.c) ---- */

/** Handles FILE_ARCHIVE: registers a job producing the tar stream as DATA, or answers ERROR. */
void archive_start(uint32_t id, const uint8_t *payload, size_t len);
/** Handles FILE_EXTRACT: registers a job extracting the archive, or answers ERROR. */
void extract_start(uint32_t id, const uint8_t *payload, size_t len);
/** Runs an ARCHIVE or EXTRACT job for a while. Returns 1 when it has sent its last frame. */
int archive_job_step(struct req *r);
/** Frees an ARCHIVE or EXTRACT request. */
void archive_free(struct req *r);

/* ---- the commands' pid namespace (pidns.c) ---- */

/**
 * As PID 1: puts the commands in a child pid namespace with its holder. If it cannot, sends
 * ERROR (id 0, before HELLO) saying why and exits 3: commands never run beside the agent.
 * Called once, at the end of set-up.
 */
void pidns_init(void);
/**
 * Makes sure a live holder exists when commands run in a namespace, starting a fresh namespace
 * if the last one died. Returns 0, or -1 with err set.
 */
int pidns_ready(struct wr_err *err);
/**
 * Handles a waitpid result if pid is the holder (a stopped holder is continued; a dead one is
 * forgotten). Returns 1 if it was, else 0.
 */
int pidns_reaped(pid_t pid, int status);
/**
 * After a fork failed with ENOMEM: returns 1 if the cause is that the holder died (a namespace
 * without its init refuses new processes), its death now handled; waits for that at most
 * AGENT_HOLDER_DEATH_MS. Else 0.
 */
int pidns_lost(void);
/** The holder's life after exec: ignores every signal it can and reaps orphans forever. */
__attribute__((noreturn)) void holder_main(void);
/** Returns this process's capability bounding set. */
uint64_t caps_bounding(void);
/**
 * Limits this process's capabilities (bounding, ambient, inheritable, permitted, effective) to
 * the bits in keep, so that what it execs as root has exactly those. Expects ag.bounding set. Only
 * makes syscalls: safe in a vfork child. Returns 0, or -1 with errno set.
 */
int caps_limit(uint64_t keep);

/* ---- process trees (tree.c) ---- */

/**
 * Sends sig to every process in session/process group `group` (0: none), and to every
 * descendant of `root` (walking /proc parent links; root itself too unless it is this
 * process). For SIGKILL the tree is first frozen with SIGSTOP so nothing forks away while it
 * is being killed, then killed repeatedly until nothing is left (bounded).
 */
void tree_signal(pid_t root, pid_t group, int sig);

/**
 * Counts the processes that descend from this one (the commands, whatever they left running,
 * zombies too), the commands' namespace init (ag.holder) excepted: 0 means the sandbox runs
 * nothing but the agent. Returns the count, or -1 if /proc cannot be read.
 */
int tree_count_others(void);

#endif
