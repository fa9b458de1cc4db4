/*
 * Background commands: an exec that returns a handle at once and runs until
 * it exits, is killed, or the sandbox stops. The daemon keeps its output up
 * to a cap so later calls can read it from an offset, wait for it, or
 * signal it. A sandbox owns its commands; they live on the loop thread.
 */
#ifndef WR_DAEMON_COMMAND_H
#define WR_DAEMON_COMMAND_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define COMMAND_MAX_PER_SANDBOX 64 /* finished ones beyond this are forgotten, oldest first */
#define COMMAND_ID_LEN 16
/* A background command keeps the last this-many bytes of each stream (at most). */
#define COMMAND_TAIL_MAX (1024 * 1024)
/* Output kept by a sandbox's finished commands: above it, the oldest finished ones lose
 * theirs (their records stay). */
#define COMMAND_FINISHED_OUTPUT_MAX (16 * 1024 * 1024)

struct sandbox;
struct sink;
struct wr_err;

enum command_state { CMD_RUNNING, CMD_EXITED, CMD_FAILED };

/* The tail of one output stream: a ring of up to `ring` bytes, grown as output comes. */
struct command_out {
    unsigned char *data;
    size_t size;    /* allocated */
    size_t len;     /* bytes kept: the last `len` of `total` */
    size_t head;    /* index in data of the oldest kept byte (once the ring is full) */
    uint64_t total; /* bytes the command wrote */
    int truncated;  /* some of them are no longer kept */
};

struct command_waiter;

struct command {
    struct sandbox *sb;
    char id[COMMAND_ID_LEN];
    uint32_t req_id; /* the agent request, 0 once finished */
    json_t *argv;    /* array of strings, for display */
    enum command_state state;
    int exit_code;
    int signal;
    int timed_out;
    char error[256];    /* CMD_FAILED: why */
    int64_t started_ms; /* wall clock */
    int64_t ended_ms;
    size_t cap;      /* ring size, per stream */
    size_t reserved; /* of the daemon's output budget, while running */
    struct command_out out[2];
    struct event *timer; /* optional timeout */
    struct command_waiter *waiters;
    struct command *next;
};

/**
 * Starts a background command in sb from a built EXEC payload (and optional stdin, copied).
 * timeout_s <= 0 means none. Returns the command (owned by sb), or NULL with err set
 * (WR_E_CONFLICT: too many running, or the agent is not reachable).
 */
struct command *command_start(struct sandbox *sb, const struct proto_buf *exec, json_t *argv,
                              const unsigned char *stdin_data, size_t stdin_len, double timeout_s,
                              size_t cap, struct wr_err *err);

/** Finds a command of sb by id. */
struct command *command_find(struct sandbox *sb, const char *id);

/** The API object for a command (new reference). */
json_t *command_to_json(const struct command *c);

/** Sends signum to the command's process tree. Returns 0, or -1 if it is not running. */
int command_signal(struct command *c, int signum);

/**
 * Answers s with the command's object once it has ended, or after timeout_s seconds (then
 * it is still running), whichever is first.
 */
void command_wait(struct command *c, struct sink *s, double timeout_s);

/**
 * Command output as a JSON string: itself if it is UTF-8, else base64 (*enc says which:
 * "utf-8" or "base64"). New reference.
 */
json_t *exec_encode_bytes(const unsigned char *b, size_t n, const char **enc);

struct exec_request;
/**
 * Builds an EXEC payload (ARG, ENV with the sandbox's defaults, its secrets' placeholders, its
 * env and r's, CWD, STDIN_PIPE) into b, leaving room for a few more fields (a SESSION's).
 * Returns 0, or -1 with err set (too large).
 */
int exec_build(struct sandbox *sb, const struct exec_request *r, struct proto_buf *b,
               struct wr_err *err);

/** Frees every command of sb (the channel must already be closed). */
void command_free_all(struct sandbox *sb);

#endif
