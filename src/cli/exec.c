/*
 * `withruntime sandbox exec`: one command in a running sandbox, its output streamed (stream.c),
 * or with --background started as a background command whose id is printed. Also the parts of an
 * exec request that `run` builds the same way: the argv list and stdin.
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

/* One `sandbox exec` as its words are read. Owns exec and env. */
struct exec_args {
    json_t *exec;     /* the request, as options fill it in */
    json_t *env;      /* --env K=V */
    const char *id;   /* the sandbox */
    bool use_stdin;   /* --stdin */
    bool interactive; /* -i */
    bool background;  /* --background */
    bool as_json;     /* --json */
    int argc;         /* CMD: argv[0..argc-1] */
    char **argv;
};

/* Handles one option. Returns CLI_GO_ON, or an exit code (usage printed). */
static int exec_opt(struct exec_args *ea, int opt, int argc, char **argv)
{
    const char *cmd = "sandbox exec";
    switch (opt) {
    case 'h': return cli_print_help();
    case OPT_CWD: json_object_set_new(ea->exec, "cwd", json_string(optarg)); break;
    case OPT_ENV:
        if (cli_parse_kv(optarg, ea->env) < 0)
            return cli_usage_error(cmd, "--env wants K=V, got '%s'", optarg);
        break;
    case OPT_TIMEOUT: {
        char *end;
        errno = 0;
        double t = strtod(optarg, &end);
        if (errno || *end || !(t > 0 && t <= CLI_MAX_SECONDS))
            return cli_usage_error(cmd, "--timeout wants seconds, 0 < t <= %d, got '%s'",
                                   CLI_MAX_SECONDS, optarg);
        json_object_set_new(ea->exec, "timeout_seconds", json_real(t));
        break;
    }
    case OPT_STDIN: ea->use_stdin = true; break;
    case OPT_BACKGROUND: ea->background = true; break;
    case OPT_JSON: ea->as_json = true; break;
    case 'i': ea->interactive = true; break;
    default: return cli_bad_option(cmd, argc, argv);
    }
    return CLI_GO_ON;
}

/*
 * Reads options, ID and CMD. Options may come before and after ID; the first word after ID (or
 * after --) starts CMD. getopt is restarted on the words after ID, with ID standing in as their
 * argv[0]. Returns CLI_GO_ON, or an exit code (usage printed).
 */
static int exec_parse(struct exec_args *ea, int argc, char **argv)
{
    static const struct option opts[] = {
        {"cwd", required_argument, 0, OPT_CWD},
        {"env", required_argument, 0, OPT_ENV},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"stdin", no_argument, 0, OPT_STDIN},
        {"background", no_argument, 0, OPT_BACKGROUND},
        {"json", no_argument, 0, OPT_JSON},
        {"interactive", no_argument, 0, 'i'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox exec";
    char **av = argv;
    int ac = argc;
    optind = 0;
    opterr = 0;
    for (;;) {
        int opt = getopt_long(ac, av, "+hi", opts, NULL);
        if (opt != -1) {
            int r = exec_opt(ea, opt, ac, av);
            if (r != CLI_GO_ON)
                return r;
            continue;
        }
        if (ea->id || optind >= ac)
            break;
        bool dashdash = optind > 1 && strcmp(av[optind - 1], "--") == 0;
        ea->id = av[optind];
        if (dashdash) {
            optind++; /* `exec [OPTIONS] -- ID CMD...`: no options after ID */
            break;
        }
        av += optind;
        ac -= optind;
        optind = 0;
    }
    if (!ea->id)
        return cli_usage_error(cmd, "expected a sandbox ID and a command");
    if (!cli_id_ok(ea->id))
        return cli_usage_error(cmd, "bad sandbox id '%s'", ea->id);
    if (optind >= ac)
        return cli_usage_error(cmd, "no command given (put it after --)");
    if (ea->as_json && !ea->background)
        return cli_usage_error(cmd, "--json goes with --background (a command's output is "
                                    "streamed as it is)");
    ea->argc = ac - optind;
    ea->argv = av + optind;
    return CLI_GO_ON;
}

/* Starts the command in the background and prints its id (or its object). */
static int exec_background(const struct cli_endpoint *ep, const char *id, json_t *exec,
                           bool as_json)
{
    json_object_set_new(exec, "background", json_true());
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
    struct wr_err err = {0};
    json_t *cmd = NULL;
    if (cli_json_call(ep, "POST", path, exec, &cmd, &err) < 0)
        return cli_fail(&err);
    if (as_json)
        cli_print_json(cmd);
    else
        printf("%s\n", cli_str_or(cmd, "id", "?"));
    json_decref(cmd);
    return CLI_EXIT_OK;
}

int cli_sandbox_exec(struct cli_ctx *c, int argc, char **argv)
{
    struct exec_args ea = {.exec = json_object(), .env = json_object()};
    const struct cli_endpoint *ep;
    int code = exec_parse(&ea, argc, argv);
    if (code != CLI_GO_ON)
        goto out;
    if ((code = cli_exec_set_argv("sandbox exec", ea.exec, ea.argc, ea.argv)) != CLI_GO_ON)
        goto out;
    if (json_object_size(ea.env))
        json_object_set(ea.exec, "env", ea.env);
    if (ea.interactive) {
        if (ea.use_stdin || ea.background || json_object_get(ea.exec, "timeout_seconds")) {
            code = cli_usage_error("sandbox exec", "-i streams stdin itself and has no timeout: "
                                                   "drop --stdin, --background and --timeout");
            goto out;
        }
        code = cli_session_run(c, ea.id, json_object_get(ea.exec, "argv"), ea.env,
                               json_string_value(json_object_get(ea.exec, "cwd")), 0);
        goto out;
    }
    if (ea.use_stdin && (code = cli_exec_set_stdin(ea.exec)) != CLI_GO_ON)
        goto out;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0) {
        code = ep_rc;
        goto out;
    }
    if (ea.background) {
        code = exec_background(ep, ea.id, ea.exec, ea.as_json);
        goto out;
    }
    cli_signals_setup();
    code = cli_exec_stream(ep, ea.id, ea.exec);
out:
    json_decref(ea.exec);
    json_decref(ea.env);
    return code;
}
