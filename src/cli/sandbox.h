/*
 * What the `withruntime sandbox ...` subcommands share: the option codes, the limits on what
 * they accept, parsing and printing helpers, and the entry point of each subcommand. The
 * command table (table.c) says which runs which; each lives in a file of its own (run.c,
 * create.c, exec.c, files.c, manage.c, background.c) or, for the small ones, in sandbox.c.
 */
#ifndef WR_CLI_SANDBOX_H
#define WR_CLI_SANDBOX_H

#include <jansson.h>
#include <stdbool.h>

#include "cli/cli.h"

/* The longest time limit or lease accepted, in seconds: a day. */
#define CLI_MAX_SECONDS 86400

/* Returned by the option parsers below when the command goes on (any other value is an exit
 * code to leave with). */
#define CLI_GO_ON (-1)

/* getopt_long codes of the long options; above any short option character. */
enum {
    OPT_IMAGE = 1000,
    OPT_TIMEOUT,
    OPT_CPUS,
    OPT_MEMORY,
    OPT_DISK,
    OPT_ENV,
    OPT_CWD,
    OPT_KEEP,
    OPT_TRIAL,
    OPT_METADATA,
    OPT_LEASE_END,
    OPT_JSON,
    OPT_MODE,
    OPT_STDIN,
    OPT_INTERNET,
    OPT_ALLOW,
    OPT_DENY,
    OPT_SECRET,
    OPT_BACKGROUND,
    OPT_FOLLOW,
    OPT_SIGNAL,
};

/* ---- helpers (sandbox.c) ---- */

/**
 * Reports an unknown option or a missing argument after getopt_long returned '?' or ':' for
 * command cmd ("sandbox run"). Returns CLI_EXIT_USAGE.
 */
int cli_bad_option(const char *cmd, int argc, char **argv);

/**
 * Runs an interactive session (cli/shell.c) of argv (NULL: a login shell) in sandbox id, on a
 * terminal when want_tty and stdin and stdout are one, else on pipes. Returns the exit code:
 * the remote command's, 128+N for signal N, CLI_EXIT_ERR on errors (printed).
 */
int cli_session_run(struct cli_ctx *ctx, const char *id, json_t *argv, json_t *env, const char *cwd,
                    int want_tty);

/** "/v1/sandboxes/ID/files/WHAT?path=PATH" with PATH escaped, and extra ("&k=v...", may be
 * NULL) after it (malloc'd; aborts when out of memory). */
char *cli_files_url(const char *id, const char *what, const char *path, const char *extra);

/** `sandbox shell` (cli/shell.c). */
int cli_sandbox_shell(struct cli_ctx *c, int argc, char **argv);

/**
 * Parses the options of a command that has only --json and --help (as_json NULL: only --help).
 * Leaves optind at the first operand. Returns CLI_GO_ON, or the exit code to leave with.
 */
int cli_simple_opts(const char *cmd, int argc, char **argv, bool *as_json /* OUT, may be NULL */);

/** True if id is made only of the characters sandbox ids are made of (it goes into URL paths). */
bool cli_id_ok(const char *id);

/**
 * Finds the daemon (cli_endpoint_get). Returns 0 with *ep set (owned by c), or the exit code
 * to leave with (CLI_EXIT_DAEMON, printed).
 */
int cli_endpoint(struct cli_ctx *c, const struct cli_endpoint **ep /* OUT */);

/** Prints v as indented JSON and a newline to stdout. v is not stolen. */
void cli_print_json(json_t *v);

/**
 * Prints an object a field a line ("name    value"): strings as they are, null as "-", objects
 * and arrays as compact JSON.
 */
void cli_print_fields(json_t *o);

/**
 * One JSON call for a command: finds the daemon, calls it, and prints a failure. Returns 0 with
 * *out set (may be NULL to ignore the answer), or the exit code to leave with.
 */
int cli_call(struct cli_ctx *c, const char *method, const char *path, json_t *body,
             json_t **out /* OUT */);

/** The string o[key], or dflt when it is absent or not a string. Borrowed from o. */
const char *cli_str_or(json_t *o, const char *key, const char *dflt);

/**
 * Key names by id, from GET /v1/keys where the caller may read it (the admin, an auditor key),
 * else an empty object (keys.c). The caller owns it.
 */
json_t *cli_key_names(struct cli_ctx *c);

/** The name (from cli_key_names) of the key in row's field, else its id; none: "(admin)". */
const char *cli_key_label(json_t *names, json_t *row, const char *field);

/** cli_str_or made safe to show (cli_safe): for tables and messages. */
const char *cli_shown(json_t *o, const char *key, const char *dflt);

/** DELETE /v1/sandboxes/ID. Returns 0, or -1 with err set. */
int cli_sandbox_delete(const struct cli_endpoint *ep, const char *id, struct wr_err *err);

/* ---- the options `create` and `run` share (create.c) ---- */

/** A create request as options fill it in. Owns its three objects. */
struct cli_create_opts {
    json_t *body;
    json_t *env;
    json_t *metadata;
    json_t *allow;   /* --allow HOST: the network policy's allow list */
    json_t *deny;    /* --deny HOST */
    json_t *secrets; /* --secret NAME */
    bool internet;   /* --internet, or implied by --allow / --deny */
};

/** Makes co's three objects, empty. Free with cli_create_opts_free. */
void cli_create_opts_init(struct cli_create_opts *co);

/**
 * Handles one option of those create and run share (--image, --cpus, --memory, --disk, --env,
 * --metadata) for command cmd. Returns 1 if opt was one of them, 0 if not, or a usage exit
 * code when its value is bad (printed).
 */
int cli_create_opt(const char *cmd, struct cli_create_opts *co, int opt, const char *arg);

/** Puts env and metadata into the body (when not empty) and returns the body, owned by co. */
json_t *cli_create_opts_body(struct cli_create_opts *co);

/** Frees what co owns. */
void cli_create_opts_free(struct cli_create_opts *co);

/**
 * Prints the daemon's message for a failed create, with a hint to build the image when it is
 * missing. Returns cli_exit_code(err).
 */
int cli_create_failed(const struct wr_err *err);

/* ---- building an exec request (exec.c) ---- */

/**
 * Sets exec["argv"] to argv[0..argc-1] for command cmd. Returns CLI_GO_ON, or a usage exit code
 * when an argument is not valid UTF-8 (printed).
 */
int cli_exec_set_argv(const char *cmd, json_t *exec, int argc, char **argv);

/**
 * Reads all of stdin (at most 512 KiB: it travels base64'd in a JSON body) into
 * exec["stdin_base64"]. Returns CLI_GO_ON, or CLI_EXIT_ERR (printed).
 */
int cli_exec_set_stdin(json_t *exec);

/* ---- the subcommands: argv[0] is the subcommand's name; each returns the exit code ---- */

/** `sandbox run` (run.c): create, stream one command, delete, exit with its status. */
int cli_sandbox_run(struct cli_ctx *c, int argc, char **argv);

/** `sandbox create` (create.c). */
int cli_sandbox_create(struct cli_ctx *c, int argc, char **argv);

/** `sandbox list` (sandbox.c). */
int cli_sandbox_list(struct cli_ctx *c, int argc, char **argv);

/** `sandbox get` (sandbox.c). */
int cli_sandbox_get(struct cli_ctx *c, int argc, char **argv);

/** `sandbox rm` and `sandbox delete` (sandbox.c). */
int cli_sandbox_rm(struct cli_ctx *c, int argc, char **argv);

/** `sandbox prune`: deletes stopped and failed sandboxes older than an age. */
int cli_sandbox_prune(struct cli_ctx *c, int argc, char **argv);

/** `sandbox exec` (exec.c). */
int cli_sandbox_exec(struct cli_ctx *c, int argc, char **argv);

/** `sandbox cat` (files.c). */
int cli_sandbox_cat(struct cli_ctx *c, int argc, char **argv);

/** `sandbox write` (files.c). */
int cli_sandbox_write(struct cli_ctx *c, int argc, char **argv);

/** `sandbox cp` (cp.c). */
int cli_sandbox_cp(struct cli_ctx *c, int argc, char **argv);

/** `sandbox ls` (files.c). */
int cli_sandbox_ls(struct cli_ctx *c, int argc, char **argv);

/** `sandbox stop`, `start`, `timeout`, `stats`, `events` (manage.c). */
int cli_sandbox_stop(struct cli_ctx *c, int argc, char **argv);
int cli_sandbox_start(struct cli_ctx *c, int argc, char **argv);
int cli_sandbox_timeout(struct cli_ctx *c, int argc, char **argv);
int cli_sandbox_stats(struct cli_ctx *c, int argc, char **argv);
int cli_sandbox_events(struct cli_ctx *c, int argc, char **argv);

/** `sandbox network` (show or set the egress policy) and `sandbox network-log` (manage.c). */
int cli_sandbox_network(struct cli_ctx *c, int argc, char **argv);
int cli_sandbox_network_log(struct cli_ctx *c, int argc, char **argv);

/** `sandbox commands`, `logs`, `kill`: background commands (background.c). */
int cli_sandbox_commands(struct cli_ctx *c, int argc, char **argv);
int cli_sandbox_logs(struct cli_ctx *c, int argc, char **argv);
int cli_sandbox_kill(struct cli_ctx *c, int argc, char **argv);

/**
 * Writes a background command's output chunk (o[stream] decoded by o[stream_encoding]) to fd.
 * Returns 0, or -1 with err set.
 */
int cli_write_encoded(int fd, json_t *o, const char *stream, struct wr_err *err);

#endif
