/*
 * `withruntime sandbox exec`: one command in a running sandbox, its output streamed (stream.c).
 * Also the parts of an exec request that `run` builds the same way: the argv list and stdin.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/sandbox.h"
#include "common/base64.h"
#include "common/util.h"

/* The most stdin `--stdin` sends: it travels base64'd inside a JSON body capped at 1 MiB. */
#define STDIN_MAX (512 * 1024)

static const char usage_exec[] =
    "Usage: withruntime sandbox exec [OPTIONS] ID -- CMD [ARG...]\n"
    "\n"
    "Runs CMD (an argv list, no shell; use sh -c for a shell string) in a running\n"
    "sandbox with its output streamed here, and exits with its status (as for\n"
    "'sandbox run').\n"
    "\n"
    "Options:\n"
    "  --cwd DIR        working directory (default /workspace)\n"
    "  --env K=V        environment variable (repeatable)\n"
    "  --timeout SECS   time limit for CMD (default: the daemon's, 300)\n"
    "  --stdin          send our stdin (read to the end first, up to 512 KiB) to CMD\n"
    "  -h, --help       this help\n";

/* Reads all of stdin, at most STDIN_MAX bytes, into a base64 string. NULL on error (printed). */
static char *read_stdin_b64(void)
{
    size_t cap = 64 * 1024, len = 0;
    cleanup_free unsigned char *buf = xmalloc(cap);
    for (;;) {
        if (len == cap) {
            if (cap >= STDIN_MAX + 1)
                break;
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        ssize_t n = read(0, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            cli_errorf("reading stdin: %s", strerror(errno));
            return NULL;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (len > STDIN_MAX) {
        cli_errorf("stdin is larger than %d KiB; copy it in with 'sandbox write' instead",
                   STDIN_MAX / 1024);
        return NULL;
    }
    return base64_encode(buf, len);
}

static json_t *argv_json(int argc, char **argv)
{
    json_t *a = json_array();
    for (int i = 0; i < argc; i++) {
        json_t *s = json_string(argv[i]);
        if (!s) {
            json_decref(a);
            return NULL;
        }
        json_array_append_new(a, s);
    }
    return a;
}

int cli_exec_set_argv(const char *cmd, json_t *exec, int argc, char **argv)
{
    json_t *a = argv_json(argc, argv);
    if (!a)
        return cli_usage_error(cmd, "the command is not valid UTF-8");
    json_object_set_new(exec, "argv", a);
    return CLI_GO_ON;
}

int cli_exec_set_stdin(json_t *exec)
{
    char *b64 = read_stdin_b64();
    if (!b64)
        return CLI_EXIT_ERR;
    json_object_set_new(exec, "stdin_base64", json_string(b64));
    free(b64);
    return CLI_GO_ON;
}

int cli_sandbox_exec(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"cwd", required_argument, 0, OPT_CWD},
        {"env", required_argument, 0, OPT_ENV},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"stdin", no_argument, 0, OPT_STDIN},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox exec";
    json_t *exec = json_object();
    json_t *env = json_object();
    const char *id = NULL;
    bool use_stdin = false;
    int code = CLI_EXIT_OK;
    int opt;
    /* Options may come before and after ID; the first word after ID (or after --) starts CMD.
     * getopt is restarted on the words after ID, with ID standing in as their argv[0]. */
    char **av = argv;
    int ac = argc;
    optind = 0;
    opterr = 0;
    for (;;) {
        opt = getopt_long(ac, av, "+h", opts, NULL);
        if (opt == -1) {
            if (id || optind >= ac)
                break;
            bool dashdash = optind > 1 && strcmp(av[optind - 1], "--") == 0;
            id = av[optind];
            if (dashdash) {
                optind++; /* `exec [OPTIONS] -- ID CMD...`: no options after ID */
                break;
            }
            av += optind;
            ac -= optind;
            optind = 0;
            continue;
        }
        switch (opt) {
        case 'h': code = cli_print_usage(usage_exec); goto out;
        case OPT_CWD: json_object_set_new(exec, "cwd", json_string(optarg)); break;
        case OPT_ENV:
            if (cli_parse_kv(optarg, env) < 0) {
                code = cli_usage_error(cmd, "--env wants K=V, got '%s'", optarg);
                goto out;
            }
            break;
        case OPT_TIMEOUT: {
            char *end;
            errno = 0;
            double t = strtod(optarg, &end);
            if (errno || *end || !(t > 0 && t <= CLI_MAX_SECONDS)) {
                code = cli_usage_error(cmd, "--timeout wants seconds, 0 < t <= %d, got '%s'",
                                       CLI_MAX_SECONDS, optarg);
                goto out;
            }
            json_object_set_new(exec, "timeout_seconds", json_real(t));
            break;
        }
        case OPT_STDIN: use_stdin = true; break;
        default: code = cli_bad_option(cmd, ac, av); goto out;
        }
    }
    if (!id) {
        code = cli_usage_error(cmd, "expected a sandbox ID and a command");
        goto out;
    }
    if (!cli_id_ok(id)) {
        code = cli_usage_error(cmd, "bad sandbox id '%s'", id);
        goto out;
    }
    if (optind >= ac) {
        code = cli_usage_error(cmd, "no command given (put it after --)");
        goto out;
    }
    if ((code = cli_exec_set_argv(cmd, exec, ac - optind, av + optind)) != CLI_GO_ON)
        goto out;
    if (json_object_size(env))
        json_object_set(exec, "env", env);
    if (use_stdin && (code = cli_exec_set_stdin(exec)) != CLI_GO_ON)
        goto out;
    const struct cli_endpoint *ep;
    if (cli_endpoint(c, &ep) != 0) {
        code = CLI_EXIT_ERR;
        goto out;
    }
    cli_signals_setup();
    code = cli_exec_stream(ep, id, exec);
out:
    json_decref(exec);
    json_decref(env);
    return code;
}
