/*
 * What the CLI's subcommands share: the global options, finding the daemon, exit codes and
 * the way errors are printed. main.c parses the global options and dispatches to the
 * cli_cmd_* entry points, one file per group of subcommands.
 */
#ifndef WR_CLI_CLI_H
#define WR_CLI_CLI_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>

#include "cli/client.h"
#include "common/err.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_ERR 1
#define CLI_EXIT_USAGE 2

#define CLI_DEFAULT_STATE_DIR "/var/lib/withruntime"

/** Global options and the daemon once found. */
struct cli_ctx {
    char state_dir[PATH_MAX];
    bool state_dir_explicit; /* --state-dir given: use that daemon, not RUNTIME_URL or login */
    bool have_ep;
    struct cli_endpoint ep;
};

/** Prints "withruntime: <message>" and a newline to stderr. */
void cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/** Prints err's message as cli_errorf does; returns CLI_EXIT_ERR. */
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

/** `withruntime sandbox ...`; argv[0] is "sandbox". Returns the exit code. */
int cli_cmd_sandbox(struct cli_ctx *c, int argc, char **argv);

/** `withruntime image ...`; argv[0] is "image". Returns the exit code. */
int cli_cmd_image(struct cli_ctx *c, int argc, char **argv);

/** `withruntime doctor`. Returns the exit code. */
int cli_cmd_doctor(struct cli_ctx *c, int argc, char **argv);

/** `withruntime keys create|list|set|revoke` and `withruntime audit` (cli/keys.c). */
int cli_cmd_keys(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_usage(struct cli_ctx *c, int argc, char **argv);
int cli_cmd_audit(struct cli_ctx *c, int argc, char **argv);

/** `withruntime secrets set|list|rm` (cli/secrets.c). */
int cli_cmd_secrets(struct cli_ctx *c, int argc, char **argv);

/** `withruntime login URL [--key KEY]`. Returns the exit code. */
int cli_cmd_login(struct cli_ctx *c, int argc, char **argv);

/** `withruntime logout`. Returns the exit code. */
int cli_cmd_logout(struct cli_ctx *c, int argc, char **argv);

/** `withruntime version`. Returns the exit code. */
int cli_cmd_version(struct cli_ctx *c, int argc, char **argv);

/**
 * Runs a command in a sandbox with its output streamed: stdout and stderr chunks are written to
 * fds 1 and 2 as they arrive. exec is the request object (argv, cwd, env, timeout_seconds...;
 * "stream" is set here). Returns the exit code to leave with: the command's own, 128+signal when
 * it was killed, 124 when it timed out, 127 when it could not start, 130 (or 128+signal) when
 * we were stopped, 1 on an error (printed).
 */
int cli_exec_stream(const struct cli_endpoint *ep, const char *id, json_t *exec);

#endif
