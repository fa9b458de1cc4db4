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
#include "cli/spinner.h"

/* Seconds the lease of a `run` sandbox outlasts its command's time limit. */
#define RUN_LEASE_SLACK 60
#define RUN_DEFAULT_TIMEOUT 3600

/* One `run`, from its options to the sandbox it made. */
struct run {
    struct cli_create_opts co; /* the sandbox to create (owned) */
    json_t *exec;              /* the command to run in it (owned), NULL until built */
    long timeout;              /* the command's time limit, seconds */
    const char *cwd;           /* NULL: the daemon's default */
    bool keep, use_stdin;
    char id[80]; /* the sandbox, once created */
};

/* Reads the options into run, leaving optind at CMD. Returns CLI_GO_ON or an exit code. */
static int run_parse_opts(struct run *run, int argc, char **argv)
{
    static const struct option opts[] = {
        {"image", required_argument, 0, OPT_IMAGE},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"cpus", required_argument, 0, OPT_CPUS},
        {"memory", required_argument, 0, OPT_MEMORY},
        {"disk", required_argument, 0, OPT_DISK},
        {"env", required_argument, 0, OPT_ENV},
        {"internet", no_argument, 0, OPT_INTERNET},
        {"allow", required_argument, 0, OPT_ALLOW},
        {"deny", required_argument, 0, OPT_DENY},
        {"secret", required_argument, 0, OPT_SECRET},
        {"cwd", required_argument, 0, OPT_CWD},
        {"stdin", no_argument, 0, OPT_STDIN},
        {"keep", no_argument, 0, OPT_KEEP},
        {"trial", no_argument, 0, OPT_TRIAL},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox run";
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        int r = cli_create_opt(cmd, &run->co, opt, optarg);
        if (r == 1)
            continue;
        if (r != 0)
            return r;
        switch (opt) {
        case 'h': return cli_print_help();
        case OPT_TIMEOUT:
            if (cli_parse_long(optarg, 1, CLI_MAX_SECONDS, &run->timeout) < 0)
                return cli_usage_error(cmd, "--timeout wants seconds, 1..%d, got '%s'",
                                       CLI_MAX_SECONDS, optarg);
            break;
        case OPT_CWD: run->cwd = optarg; break;
        case OPT_KEEP: run->keep = true; break;
        case OPT_STDIN: run->use_stdin = true; break;
        case OPT_TRIAL: break;
        default: return cli_bad_option(cmd, argc, argv);
        }
    }
    return CLI_GO_ON;
}

/* Builds run->exec for CMD (argv[0..argc-1]): its working directory, its time limit and, with
 * --stdin, all of our stdin. Returns CLI_GO_ON or an exit code. */
static int run_build_exec(struct run *run, int argc, char **argv)
{
    const char *cmd = "sandbox run";
    if (argc == 0)
        return cli_usage_error(cmd, "no command given (put it after --)");
    run->exec = json_object();
    int r = cli_exec_set_argv(cmd, run->exec, argc, argv);
    if (r != CLI_GO_ON)
        return r;
    if (run->cwd)
        json_object_set_new(run->exec, "cwd", json_string(run->cwd));
    json_object_set_new(run->exec, "timeout_seconds", json_integer(run->timeout));
    if (run->use_stdin)
        return cli_exec_set_stdin(run->exec);
    return CLI_GO_ON;
}

/* Creates the sandbox and puts its id in run->id. Returns CLI_GO_ON or an exit code. */
static int run_create(struct run *run, const struct cli_endpoint *ep)
{
    /* A kept sandbox stops at the end of its lease; a throwaway one is deleted then, so one
     * whose CLI was killed outright does not linger. */
    long lease = run->timeout + RUN_LEASE_SLACK;
    if (run->keep && lease < RUN_DEFAULT_TIMEOUT)
        lease = RUN_DEFAULT_TIMEOUT;
    if (lease > CLI_MAX_SECONDS)
        lease = CLI_MAX_SECONDS;
    json_t *body = cli_create_opts_body(&run->co);
    json_object_set_new(body, "timeout_seconds", json_integer(lease));
    json_object_set_new(body, "on_lease_end", json_string(run->keep ? "stop" : "delete"));

    struct wr_err err = {0};
    json_t *sb = NULL;
    struct spinner *spin = spinner_start("starting a sandbox");
    int rc = cli_json_call(ep, "POST", "/v1/sandboxes", body, &sb, &err);
    spinner_stop(spin);
    if (rc < 0)
        return cli_create_failed(&err);
    const char *id = json_string_value(json_object_get(sb, "id"));
    snprintf(run->id, sizeof(run->id), "%s", id ? id : "");
    json_decref(sb);
    if (!cli_id_ok(run->id)) {
        cli_errorf("the daemon answered the create without a valid sandbox id");
        return CLI_EXIT_ERR;
    }
    return CLI_GO_ON;
}

/* Runs the command with its output streamed, unless a stop signal came during the create.
 * Returns the exit code it earned. */
static int run_command(struct run *run, const struct cli_endpoint *ep)
{
    if (cli_signals_poll())
        return 128 + cli_stop_signal;
    return cli_exec_stream(ep, run->id, run->exec);
}

/* Deletes the sandbox, or says it is kept. Returns code, or the delete's exit code when the
 * command succeeded but the delete failed. */
static int run_finish(struct run *run, const struct cli_endpoint *ep, int code)
{
    struct wr_err err = {0};
    if (run->keep) {
        fprintf(stderr, "withruntime: kept sandbox %s\n", run->id);
    } else if (cli_sandbox_delete(ep, run->id, &err) < 0) {
        cli_errorf("could not delete sandbox %s: %s", run->id, err.msg);
        if (code == 0)
            code = cli_exit_code(&err);
    }
    return code;
}

int cli_sandbox_run(struct cli_ctx *c, int argc, char **argv)
{
    struct run run = {.timeout = RUN_DEFAULT_TIMEOUT};
    cli_create_opts_init(&run.co);
    const struct cli_endpoint *ep;
    int code = run_parse_opts(&run, argc, argv);
    if (code != CLI_GO_ON)
        goto out;
    if ((code = run_build_exec(&run, argc - optind, argv + optind)) != CLI_GO_ON)
        goto out;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0) {
        code = ep_rc;
        goto out;
    }
    /* From here a stop signal must not leave a sandbox behind: it is only acted on while we
     * wait for output, and the create itself is not interrupted (we would lose the id). */
    cli_signals_setup();
    if ((code = run_create(&run, ep)) != CLI_GO_ON)
        goto out;
    code = run_command(&run, ep);
    code = run_finish(&run, ep, code);
out:
    json_decref(run.exec);
    cli_create_opts_free(&run.co);
    return code;
}
