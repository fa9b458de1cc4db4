/*
 * What the CLI's subcommands share: the global options, the command table, finding the
 * daemon, exit codes and the way errors are printed. main.c parses the global options and
 * hands the rest to cli_dispatch (dispatch.c), which runs the row of the command table
 * (table.c) the words name: a new command is a row there and its function in a file.
 */
#ifndef WR_CLI_CLI_H
#define WR_CLI_CLI_H

#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>

#include "cli/client.h"
#include "common/err.h"

/* Exit codes, the same for every command (documented in `withruntime --help`, dispatch.c). */
#define CLI_EXIT_OK 0
#define CLI_EXIT_ERR 1       /* an error on this side: a local file, stdout, a bad answer */
#define CLI_EXIT_USAGE 2     /* an unknown command or option, a bad value: nothing was sent */
#define CLI_EXIT_NOT_FOUND 3 /* the daemon answered 404 */
#define CLI_EXIT_REFUSED 4   /* the daemon answered another 4xx */
#define CLI_EXIT_DAEMON 5    /* the daemon could not be reached, or answered 5xx */
#define CLI_EXIT_CAPACITY 6  /* the daemon answered 503 capacity: no room for a sandbox now */

#define CLI_DEFAULT_STATE_DIR "/var/lib/withruntime"

/** Global options and the daemon once found. */
struct cli_ctx {
    char state_dir[PATH_MAX];
    bool state_dir_explicit; /* --state-dir given: use that daemon, not RUNTIME_URL or login */
    bool have_ep;
    struct cli_endpoint ep;
};

/** A command's entry point: argv[0] is its name. Returns the exit code. */
typedef int (*cli_fn)(struct cli_ctx *c, int argc, char **argv);

/**
 * One row of the command table (table.c), which the dispatcher, the help texts, shell
 * completion and docs/cli.md are all made from. A row without fn is a group: its subcommands
 * are the rows whose group is its name.
 */
struct cli_command {
    const char *group;                 /* NULL: a top-level command */
    const char *name;                  /* the word that runs it */
    const char *aliases;               /* other words for it, space-separated; NULL: none */
    cli_fn fn;                         /* NULL: a group */
    void (*print_help)(FILE *f);       /* the command prints its own help (serve); NULL: .help */
    const char *args;                  /* what follows the name in its synopsis */
    const char *summary;               /* one line, for the lists */
    const char *options;               /* for completion: "--json --image= --by=sandbox|key|day" */
    const struct option *long_options; /* or, for a command with a getopt table elsewhere
                                          (serve), that table */
    const char *operands;              /* for completion: words offered as operands; NULL: none */
    const char *help;                  /* --help after its Usage line; has an example */
};

extern const struct cli_command cli_commands[];
extern const size_t cli_commands_count;

/** The row of command name in group (NULL: top level), aliases included; NULL if none. */
const struct cli_command *cli_command_find(const char *group, const char *name);

/** Runs the command argv[0] (and its subcommand argv[1] for a group). Returns the exit code. */
int cli_dispatch(struct cli_ctx *c, int argc, char **argv);

/** Prints the help of the command being run (the top-level usage if none) to stdout; 0. */
int cli_print_help(void);

/** Prints cmd's --help to f. */
void cli_command_help(const struct cli_command *cmd, FILE *f);

/**
 * The exit code for a failure: CLI_EXIT_NOT_FOUND, _REFUSED, _CAPACITY or _DAEMON for the
 * daemon's error answers (404, other 4xx, 503 capacity, other 5xx), CLI_EXIT_DAEMON when it could
 * not be reached, else CLI_EXIT_ERR.
 */
int cli_exit_code(const struct wr_err *err);

/**
 * s made safe to show on a terminal: control characters as \n, \r, \t, \xNN, C1 controls as
 * \u0080..\u009f, bytes that are not UTF-8 as \xNN (cli/show.c). For text that came from a
 * sandbox or the daemon, in tables and messages (never in --json output). The string is the
 * CLI's, valid until 8 more calls; NULL for NULL.
 */
const char *cli_safe(const char *s);

/** Writes s escaped as cli_safe does into out[cap] (NUL-terminated, cut if need be; out may be
 * NULL). Returns the escaped length. */
size_t cli_escape(const char *s, char *out, size_t cap);

/** Prints "withruntime: <message>" and a newline to stderr, the message as cli_safe shows it
 * (it quotes paths and the daemon's words). */
void cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/** Prints err's message as cli_errorf does; returns cli_exit_code(err). */
int cli_fail(const struct wr_err *err);

/**
 * Prints a usage error for command cmd ("sandbox run") and a hint to its --help;
 * returns CLI_EXIT_USAGE.
 */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Parses a decimal integer in [min, max]. Returns 0, or -1 if s is not one. */
int cli_parse_long(const char *s, long min, long max, long *out /* OUT */);

/** Parses "K=V" and sets obj[K] = V (a JSON string). Returns 0, or -1 if there is no '='. */
int cli_parse_kv(const char *s, json_t *obj);

/**
 * Finds the daemon, the first time it is asked: RUNTIME_URL (with RUNTIME_API_KEY), else the
 * connection saved by `withruntime login`, else the Unix socket in the state directory, starting
 * the daemon there when nothing answers and we are root. --state-dir skips the first two.
 * RUNTIME_API_KEY, when set, is the key in every case, and RUNTIME_CA_FILE the CA file for an
 * https URL (else the saved connection's, else the system's CAs). Returns 0 with *out set (owned
 * by c), or -1 with err set.
 */
int cli_endpoint_get(struct cli_ctx *c, const struct cli_endpoint **out /* OUT */,
                     struct wr_err *err);

/** Path of the saved connection file into buf. Returns 0, or -1 with err set. */
int cli_connection_path(char *buf, size_t len, struct wr_err *err);

/**
 * Writes the saved connection (mode 0600, atomically). key and ca_file (the CA to trust for an
 * https URL) may be "" or NULL.
 */
int cli_connection_save(const char *url, const char *key, const char *ca_file, struct wr_err *err);

/** True if argv[1..] holds -h or --help before any "--". */
bool cli_wants_help(int argc, char **argv);

/** Prints the top-level usage to f. */
void cli_usage(FILE *f);

/* The top-level commands (a file each, or misc.c for the small ones). */
int cli_cmd_serve(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_doctor(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_usage(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_audit(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_login(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_logout(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_version(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_completion(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_help(struct cli_ctx *c, int argc, char **argv);

/* `image build|list` (image.c). */
int cli_image_build(struct cli_ctx *c, int argc, char **argv);
int cli_image_list(struct cli_ctx *c, int argc, char **argv);

/* `keys create|list|set|revoke` (keys.c). */
int cli_keys_create(struct cli_ctx *c, int argc, char **argv);
int cli_keys_list(struct cli_ctx *c, int argc, char **argv);
int cli_keys_set(struct cli_ctx *c, int argc, char **argv);
int cli_keys_revoke(struct cli_ctx *c, int argc, char **argv);

/* `secrets set|list|rm` (secrets.c). */
int cli_secrets_set(struct cli_ctx *c, int argc, char **argv);
int cli_secrets_update(struct cli_ctx *c, int argc, char **argv);
int cli_secrets_list(struct cli_ctx *c, int argc, char **argv);
int cli_secrets_rm(struct cli_ctx *c, int argc, char **argv);

/**
 * Runs a command in a sandbox with its output streamed: stdout and stderr chunks are written to
 * fds 1 and 2 as they arrive. exec is the request object (argv, cwd, env, timeout_seconds...;
 * "stream" is set here). Returns the exit code to leave with: the command's own, 128+signal when
 * it was killed, 124 when it timed out, 127 when it could not start, 130 (or 128+signal) when
 * we were stopped, or cli_exit_code's for an error (printed).
 */
int cli_exec_stream(const struct cli_endpoint *ep, const char *id, json_t *exec);

#endif
