/*
 * `withruntime sandbox run`: the command that matters most. Creates a sandbox, streams one
 * command's output from it, deletes it, and exits with the command's status, so that
 * `withruntime sandbox run -- CMD` reads like running CMD locally. A stop signal must never
 * leave a sandbox behind.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/sandbox.h"

/* Seconds the lease of a `run` sandbox outlasts its command's time limit. */
#define RUN_LEASE_SLACK 60
#define RUN_DEFAULT_TIMEOUT 3600

static const char usage_run[] =
    "Usage: withruntime sandbox run [OPTIONS] -- CMD [ARG...]\n"
    "\n"
    "Creates a sandbox, runs CMD in it with its stdout and stderr streamed here as\n"
    "they are produced, and deletes the sandbox. Exits with CMD's exit status:\n"
    "128+N if signal N killed it, 124 if it timed out, 127 if it could not start,\n"
    "130 if interrupted (the sandbox is deleted first), 1 on other errors.\n"
    "\n"
    "CMD and its arguments are an argv list, run without a shell even when there\n"
    "is only one word. To run a shell string, use sh -c:\n"
    "  withruntime sandbox run -- sh -c 'cd /tmp && ls | wc -l'\n"
    "\n"
    "Options:\n"
    "  --image NAME     image to start from (default: \"default\")\n"
    "  --timeout SECS   time limit for CMD, 1..86400 (default 3600); the sandbox's\n"
    "                   lease ends a minute later\n"
    "  --cpus N         vCPUs (default 2)\n"
    "  --memory MIB     memory in MiB (default 4096)\n"
    "  --disk MIB       disk quota of its writable layer in MiB (default 10240)\n"
    "  --env K=V        environment variable (repeatable)\n"
    "  --cwd DIR        working directory (default /workspace)\n"
    "  --stdin          send our stdin (read to the end first, up to 512 KiB) to CMD\n"
    "  --keep           keep the sandbox and print its id on stderr\n"
    "  --trial          accepted for compatibility; changes nothing\n"
    "  -h, --help       this help\n";

int cli_sandbox_run(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"image", required_argument, 0, OPT_IMAGE},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"cpus", required_argument, 0, OPT_CPUS},
        {"memory", required_argument, 0, OPT_MEMORY},
        {"disk", required_argument, 0, OPT_DISK},
        {"env", required_argument, 0, OPT_ENV},
        {"cwd", required_argument, 0, OPT_CWD},
        {"stdin", no_argument, 0, OPT_STDIN},
        {"keep", no_argument, 0, OPT_KEEP},
        {"trial", no_argument, 0, OPT_TRIAL},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox run";
    struct cli_create_opts co;
    cli_create_opts_init(&co);
    long timeout = RUN_DEFAULT_TIMEOUT;
    const char *cwd = NULL;
    bool keep = false, use_stdin = false;
    int code = CLI_EXIT_OK;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        int r = cli_create_opt(cmd, &co, opt, optarg);
        if (r == 1)
            continue;
        if (r != 0) {
            code = r;
            goto out;
        }
        switch (opt) {
        case 'h': code = cli_print_usage(usage_run); goto out;
        case OPT_TIMEOUT:
            if (cli_parse_long(optarg, 1, CLI_MAX_SECONDS, &timeout) < 0) {
                code = cli_usage_error(cmd, "--timeout wants seconds, 1..%d, got '%s'",
                                       CLI_MAX_SECONDS, optarg);
                goto out;
            }
            break;
        case OPT_CWD: cwd = optarg; break;
        case OPT_KEEP: keep = true; break;
        case OPT_STDIN: use_stdin = true; break;
        case OPT_TRIAL: break;
        default: code = cli_bad_option(cmd, argc, argv); goto out;
        }
    }
    if (optind >= argc) {
        code = cli_usage_error(cmd, "no command given (put it after --)");
        goto out;
    }

    json_t *exec = json_object();
    if ((code = cli_exec_set_argv(cmd, exec, argc - optind, argv + optind)) != CLI_GO_ON) {
        json_decref(exec);
        goto out;
    }
    if (cwd)
        json_object_set_new(exec, "cwd", json_string(cwd));
    json_object_set_new(exec, "timeout_seconds", json_integer(timeout));
    if (use_stdin && (code = cli_exec_set_stdin(exec)) != CLI_GO_ON) {
        json_decref(exec);
        goto out;
    }

    const struct cli_endpoint *ep;
    if (cli_endpoint(c, &ep) != 0) {
        json_decref(exec);
        code = CLI_EXIT_ERR;
        goto out;
    }

    /* A kept sandbox stops at the end of its lease; a throwaway one is deleted then, so one
     * whose CLI was killed outright does not linger. */
    long lease = timeout + RUN_LEASE_SLACK;
    if (keep && lease < RUN_DEFAULT_TIMEOUT)
        lease = RUN_DEFAULT_TIMEOUT;
    if (lease > CLI_MAX_SECONDS)
        lease = CLI_MAX_SECONDS;
    json_t *body = cli_create_opts_body(&co);
    json_object_set_new(body, "timeout_seconds", json_integer(lease));
    json_object_set_new(body, "on_lease_end", json_string(keep ? "stop" : "delete"));

    /* From here a stop signal must not leave a sandbox behind: it is only acted on while we
     * wait for output, and the create itself is not interrupted (we would lose the id). */
    cli_signals_setup();
    struct wr_err err = {0};
    json_t *sb = NULL;
    if (cli_json_call(ep, "POST", "/v1/sandboxes", body, &sb, &err) < 0) {
        json_decref(exec);
        code = cli_create_failed(&err);
        goto out;
    }
    const char *id_s = json_string_value(json_object_get(sb, "id"));
    char id[80];
    snprintf(id, sizeof(id), "%s", id_s ? id_s : "");
    json_decref(sb);
    if (!cli_id_ok(id)) {
        json_decref(exec);
        cli_errorf("the daemon answered the create without a valid sandbox id");
        code = CLI_EXIT_ERR;
        goto out;
    }

    if (cli_signals_poll())
        code = 128 + cli_stop_signal;
    else
        code = cli_exec_stream(ep, id, exec);
    json_decref(exec);

    if (keep) {
        fprintf(stderr, "withruntime: kept sandbox %s\n", id);
    } else if (cli_sandbox_delete(ep, id, &err) < 0) {
        cli_errorf("could not delete sandbox %s: %s", id, err.msg);
        if (code == 0)
            code = CLI_EXIT_ERR;
    }
out:
    cli_create_opts_free(&co);
    return code;
}
