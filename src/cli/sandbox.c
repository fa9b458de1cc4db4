/*
 * `withruntime sandbox ...`: the sandbox subcommands, each a thin translation of options into
 * one or two API calls (docs/api.md) and of the answer into text for a terminal or a script.
 * `run` is the one that matters most: create, stream one command, delete, exit with its status.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/base64.h"
#include "common/util.h"

/* The most stdin `--stdin` sends: it travels base64'd inside a JSON body capped at 1 MiB. */
#define STDIN_MAX (512 * 1024)
/* Seconds the lease of a `run` sandbox outlasts its command's time limit. */
#define RUN_LEASE_SLACK 60
#define RUN_DEFAULT_TIMEOUT 3600
#define MAX_SECONDS 86400

static const char usage_sandbox[] =
    "Usage: withruntime sandbox COMMAND [ARGS...]\n"
    "\n"
    "Commands:\n"
    "  run [OPTIONS] -- CMD [ARG...]      create a sandbox, run CMD in it, delete it\n"
    "  create [OPTIONS]                   create a sandbox and print its id\n"
    "  list [--json]                      list sandboxes\n"
    "  get ID                             print a sandbox as JSON\n"
    "  exec [OPTIONS] ID -- CMD [ARG...]  run CMD in a running sandbox\n"
    "  cat ID PATH                        write a file's bytes to stdout\n"
    "  write [--mode MODE] ID PATH [FILE|-]  write a file from FILE or stdin\n"
    "  ls ID [PATH]                       list a directory (default /workspace)\n"
    "  rm ID [ID...]                      delete sandboxes\n"
    "\n"
    "Run 'withruntime sandbox COMMAND --help' for a command's options.\n";

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

static const char usage_create[] =
    "Usage: withruntime sandbox create [OPTIONS]\n"
    "\n"
    "Creates a sandbox and prints its id (or, with --json, the sandbox object).\n"
    "\n"
    "Options:\n"
    "  --image NAME              image to start from (default: \"default\")\n"
    "  --timeout SECS            lease length, 1..86400 (default 3600)\n"
    "  --cpus N                  vCPUs (default 2)\n"
    "  --memory MIB              memory in MiB (default 4096)\n"
    "  --disk MIB                disk quota of its writable layer in MiB (default 10240)\n"
    "  --env K=V                 environment variable for every exec (repeatable)\n"
    "  --metadata K=V            stored and returned, never interpreted (repeatable)\n"
    "  --on-lease-end stop|delete  what happens when the lease ends (default stop)\n"
    "  --json                    print the sandbox object\n"
    "  -h, --help                this help\n";

static const char usage_list[] = "Usage: withruntime sandbox list [--json]\n"
                                 "\n"
                                 "Lists sandboxes: ID STATE IMAGE CPUS MEMORY CREATED.\n";

static const char usage_get[] = "Usage: withruntime sandbox get ID\n"
                                "\n"
                                "Prints the sandbox object as JSON.\n";

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

static const char usage_cat[] = "Usage: withruntime sandbox cat ID PATH\n"
                                "\n"
                                "Writes the bytes of the file PATH in the sandbox to stdout.\n"
                                "PATH is absolute, or relative to /workspace.\n";

static const char usage_write[] =
    "Usage: withruntime sandbox write [OPTIONS] ID PATH [FILE|-]\n"
    "\n"
    "Writes the file PATH in the sandbox (created or truncated, missing parent\n"
    "directories created) from the local FILE, or from stdin when FILE is - or absent.\n"
    "\n"
    "Options:\n"
    "  --mode MODE      octal file mode (default 0644)\n"
    "  --json           print the written file's entry\n"
    "  -h, --help       this help\n";

static const char usage_ls[] = "Usage: withruntime sandbox ls [--json] ID [PATH]\n"
                               "\n"
                               "Lists a directory in the sandbox (default /workspace):\n"
                               "TYPE MODE SIZE MTIME NAME.\n";

static const char usage_rm[] = "Usage: withruntime sandbox rm ID [ID...]\n"
                               "\n"
                               "Deletes sandboxes, printing each id deleted.\n";

/* ---- helpers ---- */

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
};

/* Reports an unknown option or a missing argument from getopt. */
static int bad_option(const char *cmd, int argc, char **argv)
{
    const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
    if (optopt && strchr("h", optopt) == NULL && arg[0] == '-' && arg[1] != '-')
        return cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return cli_usage_error(cmd, "unknown option, or missing value: '%s'", arg);
}

static int print_usage(const char *text)
{
    fputs(text, stdout);
    return CLI_EXIT_OK;
}

/* Sandbox ids go into URL paths: refuse anything but the characters ids are made of. */
static bool id_ok(const char *id)
{
    if (!id[0] || strlen(id) > 64)
        return false;
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_'))
            return false;
    return true;
}

static void print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) {
        puts(s);
        free(s);
    }
}

static int get_ep(struct cli_ctx *c, const struct cli_endpoint **ep)
{
    struct wr_err err = {0};
    if (cli_endpoint_get(c, ep, &err) < 0)
        return cli_fail(&err);
    return 0;
}

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

static int delete_sandbox(const struct cli_endpoint *ep, const char *id, struct wr_err *err)
{
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    return cli_json_call(ep, "DELETE", path, NULL, NULL, err);
}

/* Options shared by create and run, collected into a create body. */
struct create_opts {
    json_t *body;
    json_t *env;
    json_t *metadata;
};

/* Handles one create option; returns 1 if it was one, 0 if not, a usage exit code on error. */
static int create_opt(const char *cmd, struct create_opts *co, int opt, const char *arg)
{
    long v;
    switch (opt) {
    case OPT_IMAGE: json_object_set_new(co->body, "image", json_string(arg)); return 1;
    case OPT_CPUS:
        if (cli_parse_long(arg, 1, 1024, &v) < 0)
            return cli_usage_error(cmd, "--cpus wants a whole number, got '%s'", arg);
        json_object_set_new(co->body, "cpus", json_integer(v));
        return 1;
    case OPT_MEMORY:
        if (cli_parse_long(arg, 1, 1L << 30, &v) < 0)
            return cli_usage_error(cmd, "--memory wants MiB as a whole number, got '%s'", arg);
        json_object_set_new(co->body, "memory_mib", json_integer(v));
        return 1;
    case OPT_DISK:
        if (cli_parse_long(arg, 1, 1L << 30, &v) < 0)
            return cli_usage_error(cmd, "--disk wants MiB as a whole number, got '%s'", arg);
        json_object_set_new(co->body, "disk_mib", json_integer(v));
        return 1;
    case OPT_ENV:
        if (cli_parse_kv(arg, co->env) < 0)
            return cli_usage_error(cmd, "--env wants K=V, got '%s'", arg);
        return 1;
    case OPT_METADATA:
        if (cli_parse_kv(arg, co->metadata) < 0)
            return cli_usage_error(cmd, "--metadata wants K=V, got '%s'", arg);
        return 1;
    default: return 0;
    }
}

static void create_opts_init(struct create_opts *co)
{
    co->body = json_object();
    co->env = json_object();
    co->metadata = json_object();
}

/* Moves env and metadata into the body (when not empty) and returns the body. */
static json_t *create_opts_body(struct create_opts *co)
{
    if (json_object_size(co->env))
        json_object_set(co->body, "env", co->env);
    if (json_object_size(co->metadata))
        json_object_set(co->body, "metadata", co->metadata);
    return co->body;
}

static void create_opts_free(struct create_opts *co)
{
    json_decref(co->body);
    json_decref(co->env);
    json_decref(co->metadata);
}

/* Prints the daemon's message for a failed create; a missing image gets a hint. */
static int create_failed(const struct wr_err *err)
{
    cli_fail(err);
    if (strstr(err->msg, "withruntime image build") == NULL && strstr(err->msg, "image") &&
        (strstr(err->msg, "not built") || strstr(err->msg, "not found")))
        fprintf(stderr, "withruntime: build it with 'withruntime image build' (as root)\n");
    return CLI_EXIT_ERR;
}

/* ---- run ---- */

static int cmd_run(struct cli_ctx *c, int argc, char **argv)
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
    struct create_opts co;
    create_opts_init(&co);
    long timeout = RUN_DEFAULT_TIMEOUT;
    const char *cwd = NULL;
    bool keep = false, use_stdin = false;
    int code = CLI_EXIT_OK;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        int r = create_opt(cmd, &co, opt, optarg);
        if (r == 1)
            continue;
        if (r != 0) {
            code = r;
            goto out;
        }
        switch (opt) {
        case 'h': code = print_usage(usage_run); goto out;
        case OPT_TIMEOUT:
            if (cli_parse_long(optarg, 1, MAX_SECONDS, &timeout) < 0) {
                code = cli_usage_error(cmd, "--timeout wants seconds, 1..%d, got '%s'", MAX_SECONDS,
                                       optarg);
                goto out;
            }
            break;
        case OPT_CWD: cwd = optarg; break;
        case OPT_KEEP: keep = true; break;
        case OPT_STDIN: use_stdin = true; break;
        case OPT_TRIAL: break;
        default: code = bad_option(cmd, argc, argv); goto out;
        }
    }
    if (optind >= argc) {
        code = cli_usage_error(cmd, "no command given (put it after --)");
        goto out;
    }

    json_t *exec = json_object();
    json_t *av = argv_json(argc - optind, argv + optind);
    if (!av) {
        json_decref(exec);
        code = cli_usage_error(cmd, "the command is not valid UTF-8");
        goto out;
    }
    json_object_set_new(exec, "argv", av);
    if (cwd)
        json_object_set_new(exec, "cwd", json_string(cwd));
    json_object_set_new(exec, "timeout_seconds", json_integer(timeout));
    if (use_stdin) {
        char *b64 = read_stdin_b64();
        if (!b64) {
            json_decref(exec);
            code = CLI_EXIT_ERR;
            goto out;
        }
        json_object_set_new(exec, "stdin_base64", json_string(b64));
        free(b64);
    }

    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0) {
        json_decref(exec);
        code = CLI_EXIT_ERR;
        goto out;
    }

    /* A kept sandbox stops at the end of its lease; a throwaway one is deleted then, so one
     * whose CLI was killed outright does not linger. */
    long lease = timeout + RUN_LEASE_SLACK;
    if (keep && lease < RUN_DEFAULT_TIMEOUT)
        lease = RUN_DEFAULT_TIMEOUT;
    if (lease > MAX_SECONDS)
        lease = MAX_SECONDS;
    json_t *body = create_opts_body(&co);
    json_object_set_new(body, "timeout_seconds", json_integer(lease));
    json_object_set_new(body, "on_lease_end", json_string(keep ? "stop" : "delete"));

    /* From here a stop signal must not leave a sandbox behind: it is only acted on while we
     * wait for output, and the create itself is not interrupted (we would lose the id). */
    cli_signals_setup();
    struct wr_err err = {0};
    json_t *sb = NULL;
    if (cli_json_call(ep, "POST", "/v1/sandboxes", body, &sb, &err) < 0) {
        json_decref(exec);
        code = create_failed(&err);
        goto out;
    }
    const char *id_s = json_string_value(json_object_get(sb, "id"));
    char id[80];
    snprintf(id, sizeof(id), "%s", id_s ? id_s : "");
    json_decref(sb);
    if (!id_ok(id)) {
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
    } else if (delete_sandbox(ep, id, &err) < 0) {
        cli_errorf("could not delete sandbox %s: %s", id, err.msg);
        if (code == 0)
            code = CLI_EXIT_ERR;
    }
out:
    create_opts_free(&co);
    return code;
}

/* ---- create, list, get ---- */

static const char *str_or(json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : dflt;
}

static int cmd_create(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"image", required_argument, 0, OPT_IMAGE},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"cpus", required_argument, 0, OPT_CPUS},
        {"memory", required_argument, 0, OPT_MEMORY},
        {"disk", required_argument, 0, OPT_DISK},
        {"env", required_argument, 0, OPT_ENV},
        {"metadata", required_argument, 0, OPT_METADATA},
        {"on-lease-end", required_argument, 0, OPT_LEASE_END},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox create";
    struct create_opts co;
    create_opts_init(&co);
    bool as_json = false;
    long v;
    int code = CLI_EXIT_OK;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int r = create_opt(cmd, &co, opt, optarg);
        if (r == 1)
            continue;
        if (r != 0) {
            code = r;
            goto out;
        }
        switch (opt) {
        case 'h': code = print_usage(usage_create); goto out;
        case OPT_TIMEOUT:
            if (cli_parse_long(optarg, 1, MAX_SECONDS, &v) < 0) {
                code = cli_usage_error(cmd, "--timeout wants seconds, 1..%d, got '%s'", MAX_SECONDS,
                                       optarg);
                goto out;
            }
            json_object_set_new(co.body, "timeout_seconds", json_integer(v));
            break;
        case OPT_LEASE_END:
            if (strcmp(optarg, "stop") != 0 && strcmp(optarg, "delete") != 0) {
                code =
                    cli_usage_error(cmd, "--on-lease-end wants stop or delete, got '%s'", optarg);
                goto out;
            }
            json_object_set_new(co.body, "on_lease_end", json_string(optarg));
            break;
        case OPT_JSON: as_json = true; break;
        default: code = bad_option(cmd, argc, argv); goto out;
        }
    }
    if (optind < argc) {
        code = cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
        goto out;
    }
    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0) {
        code = CLI_EXIT_ERR;
        goto out;
    }
    struct wr_err err = {0};
    json_t *sb = NULL;
    if (cli_json_call(ep, "POST", "/v1/sandboxes", create_opts_body(&co), &sb, &err) < 0) {
        code = create_failed(&err);
        goto out;
    }
    if (as_json)
        print_json(sb);
    else
        printf("%s\n", str_or(sb, "id", ""));
    json_decref(sb);
out:
    create_opts_free(&co);
    return code;
}

/* Parses options that are only --json and --help. Returns -1 to go on, else an exit code. */
static int simple_opts(const char *cmd, const char *usage, int argc, char **argv, bool *as_json)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h')
            return print_usage(usage);
        if (opt == OPT_JSON && as_json)
            *as_json = true;
        else
            return bad_option(cmd, argc, argv);
    }
    return -1;
}

static int cmd_list(struct cli_ctx *c, int argc, char **argv)
{
    bool as_json = false;
    int r = simple_opts("sandbox list", usage_list, argc, argv, &as_json);
    if (r >= 0)
        return r;
    if (optind < argc)
        return cli_usage_error("sandbox list", "unexpected argument '%s'", argv[optind]);
    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0)
        return CLI_EXIT_ERR;
    struct wr_err err = {0};
    json_t *res = NULL;
    if (cli_json_call(ep, "GET", "/v1/sandboxes", NULL, &res, &err) < 0)
        return cli_fail(&err);
    if (as_json) {
        print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    json_t *list = json_object_get(res, "sandboxes");
    printf("%-24s  %-8s  %-12s  %4s  %8s  %s\n", "ID", "STATE", "IMAGE", "CPUS", "MEMORY",
           "CREATED");
    size_t i;
    json_t *sb;
    json_array_foreach(list, i, sb)
    {
        char mem[32];
        json_t *m = json_object_get(sb, "memory_mib");
        if (json_is_integer(m))
            snprintf(mem, sizeof(mem), "%lldMiB", (long long)json_integer_value(m));
        else
            snprintf(mem, sizeof(mem), "-");
        json_t *cpus = json_object_get(sb, "cpus");
        printf("%-24s  %-8s  %-12s  %4lld  %8s  %s\n", str_or(sb, "id", "?"),
               str_or(sb, "state", "?"), str_or(sb, "image", "-"),
               (long long)json_integer_value(cpus), mem, str_or(sb, "created_at", "-"));
    }
    json_decref(res);
    return CLI_EXIT_OK;
}

static int cmd_get(struct cli_ctx *c, int argc, char **argv)
{
    int r = simple_opts("sandbox get", usage_get, argc, argv, NULL);
    if (r >= 0)
        return r;
    if (argc - optind != 1)
        return cli_usage_error("sandbox get", "expected one sandbox ID");
    const char *id = argv[optind];
    if (!id_ok(id))
        return cli_usage_error("sandbox get", "bad sandbox id '%s'", id);
    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0)
        return CLI_EXIT_ERR;
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    struct wr_err err = {0};
    json_t *sb = NULL;
    if (cli_json_call(ep, "GET", path, NULL, &sb, &err) < 0)
        return cli_fail(&err);
    print_json(sb);
    json_decref(sb);
    return CLI_EXIT_OK;
}

/* ---- exec ---- */

static int cmd_exec(struct cli_ctx *c, int argc, char **argv)
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
        case 'h': code = print_usage(usage_exec); goto out;
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
            if (errno || *end || !(t > 0 && t <= MAX_SECONDS)) {
                code = cli_usage_error(cmd, "--timeout wants seconds, 0 < t <= %d, got '%s'",
                                       MAX_SECONDS, optarg);
                goto out;
            }
            json_object_set_new(exec, "timeout_seconds", json_real(t));
            break;
        }
        case OPT_STDIN: use_stdin = true; break;
        default: code = bad_option(cmd, ac, av); goto out;
        }
    }
    if (!id) {
        code = cli_usage_error(cmd, "expected a sandbox ID and a command");
        goto out;
    }
    if (!id_ok(id)) {
        code = cli_usage_error(cmd, "bad sandbox id '%s'", id);
        goto out;
    }
    if (optind >= ac) {
        code = cli_usage_error(cmd, "no command given (put it after --)");
        goto out;
    }
    json_t *cmdv = argv_json(ac - optind, av + optind);
    if (!cmdv) {
        code = cli_usage_error(cmd, "the command is not valid UTF-8");
        goto out;
    }
    json_object_set_new(exec, "argv", cmdv);
    if (json_object_size(env))
        json_object_set(exec, "env", env);
    if (use_stdin) {
        char *b64 = read_stdin_b64();
        if (!b64) {
            code = CLI_EXIT_ERR;
            goto out;
        }
        json_object_set_new(exec, "stdin_base64", json_string(b64));
        free(b64);
    }
    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0) {
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

/* ---- files ---- */

static int to_stdout(void *ctx, const char *data, size_t len, struct wr_err *err)
{
    if (write_all(1, data, len) < 0)
        return wr_err_sys(err, errno, "writing to stdout");
    return 0;
}

static char *file_path(const char *id, const char *what, const char *path, const char *extra)
{
    cleanup_free char *q = cli_query_escape(path);
    char *out = NULL;
    if (asprintf(&out, "/v1/sandboxes/%s/files/%s?path=%s%s", id, what, q, extra ? extra : "") < 0)
        abort();
    return out;
}

static int cmd_cat(struct cli_ctx *c, int argc, char **argv)
{
    int r = simple_opts("sandbox cat", usage_cat, argc, argv, NULL);
    if (r >= 0)
        return r;
    if (argc - optind != 2)
        return cli_usage_error("sandbox cat", "expected a sandbox ID and a PATH");
    const char *id = argv[optind];
    if (!id_ok(id))
        return cli_usage_error("sandbox cat", "bad sandbox id '%s'", id);
    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0)
        return CLI_EXIT_ERR;
    cleanup_free char *path = file_path(id, "content", argv[optind + 1], NULL);
    struct cli_request req;
    cli_request_init(&req, "GET", path);
    req.on_data = to_stdout;
    struct cli_response resp;
    struct wr_err err = {0};
    signal(SIGPIPE, SIG_IGN);
    r = cli_request_do(ep, &req, &resp, &err);
    cli_response_free(&resp);
    if (r < 0 && err.code == EPIPE)
        return 128 + SIGPIPE;
    return r < 0 ? cli_fail(&err) : CLI_EXIT_OK;
}

/* Copies stdin into an unlinked temporary file, so an upload of unknown size gets a length. */
static int spool_stdin(struct wr_err *err)
{
    const char *tmpdir = getenv("TMPDIR");
    if (!tmpdir || !*tmpdir)
        tmpdir = "/tmp";
    int fd = open(tmpdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        char tmpl[PATH_MAX];
        snprintf(tmpl, sizeof(tmpl), "%s/withruntime-upload-XXXXXX", tmpdir);
        fd = mkostemp(tmpl, O_CLOEXEC);
        if (fd < 0)
            return wr_err_sys(err, errno, "cannot create a temporary file in %s", tmpdir);
        unlink(tmpl);
    }
    cleanup_free char *buf = xmalloc(64 * 1024);
    for (;;) {
        ssize_t n = read(0, buf, 64 * 1024);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            return wr_err_sys(err, e, "reading stdin");
        }
        if (n == 0)
            break;
        if (write_all(fd, buf, (size_t)n) < 0) {
            int e = errno;
            close(fd);
            return wr_err_sys(err, e, "writing a temporary file in %s", tmpdir);
        }
    }
    if (lseek(fd, 0, SEEK_SET) < 0) {
        int e = errno;
        close(fd);
        return wr_err_sys(err, e, "lseek");
    }
    return fd;
}

static bool mode_ok(const char *m)
{
    size_t n = strlen(m);
    if (n < 3 || n > 4)
        return false;
    for (size_t i = 0; i < n; i++)
        if (m[i] < '0' || m[i] > '7')
            return false;
    return true;
}

static int cmd_write(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"mode", required_argument, 0, OPT_MODE},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox write";
    const char *mode = NULL;
    bool as_json = false;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': return print_usage(usage_write);
        case OPT_MODE:
            if (!mode_ok(optarg))
                return cli_usage_error(cmd, "--mode wants an octal mode like 0644, got '%s'",
                                       optarg);
            mode = optarg;
            break;
        case OPT_JSON: as_json = true; break;
        default: return bad_option(cmd, argc, argv);
        }
    }
    int npos = argc - optind;
    if (npos < 2 || npos > 3)
        return cli_usage_error(cmd, "expected a sandbox ID, a PATH and optionally a FILE");
    const char *id = argv[optind];
    const char *dst = argv[optind + 1];
    const char *src = npos == 3 ? argv[optind + 2] : "-";
    if (!id_ok(id))
        return cli_usage_error(cmd, "bad sandbox id '%s'", id);

    struct wr_err err = {0};
    cleanup_close int fd = -1;
    if (strcmp(src, "-") == 0) {
        struct stat st;
        if (fstat(0, &st) == 0 && S_ISREG(st.st_mode))
            fd = dup(0); /* `< file`: send it as it is, no copy */
        else
            fd = spool_stdin(&err);
        if (fd < 0)
            return err.msg[0] ? cli_fail(&err) : (cli_errorf("stdin: %s", strerror(errno)), 1);
    } else {
        fd = open(src, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            cli_errorf("%s: %s", src, strerror(errno));
            return CLI_EXIT_ERR;
        }
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        cli_errorf("%s: not a regular file", src);
        return CLI_EXIT_ERR;
    }
    off_t pos = lseek(fd, 0, SEEK_CUR);
    if (pos < 0 || pos > st.st_size)
        pos = 0;

    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0)
        return CLI_EXIT_ERR;
    char extra[32] = "";
    if (mode)
        snprintf(extra, sizeof(extra), "&mode=%s", mode);
    cleanup_free char *path = file_path(id, "content", dst, extra);
    struct cli_request req;
    cli_request_init(&req, "PUT", path);
    req.content_type = "application/octet-stream";
    req.body_fd = fd;
    req.body_len = (size_t)(st.st_size - pos);
    struct cli_response resp;
    int r = cli_request_do(ep, &req, &resp, &err);
    if (r == 0 && as_json) {
        json_t *o = json_loadb(resp.body, resp.body_len, 0, NULL);
        if (o)
            print_json(o);
        json_decref(o);
    }
    cli_response_free(&resp);
    return r < 0 ? cli_fail(&err) : CLI_EXIT_OK;
}

static int cmd_ls(struct cli_ctx *c, int argc, char **argv)
{
    bool as_json = false;
    int r = simple_opts("sandbox ls", usage_ls, argc, argv, &as_json);
    if (r >= 0)
        return r;
    int npos = argc - optind;
    if (npos < 1 || npos > 2)
        return cli_usage_error("sandbox ls", "expected a sandbox ID and optionally a PATH");
    const char *id = argv[optind];
    if (!id_ok(id))
        return cli_usage_error("sandbox ls", "bad sandbox id '%s'", id);
    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0)
        return CLI_EXIT_ERR;
    cleanup_free char *path =
        file_path(id, "list", npos == 2 ? argv[optind + 1] : "/workspace", NULL);
    struct wr_err err = {0};
    json_t *res = NULL;
    if (cli_json_call(ep, "GET", path, NULL, &res, &err) < 0)
        return cli_fail(&err);
    if (as_json) {
        print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    printf("%-9s  %-4s  %12s  %-20s  %s\n", "TYPE", "MODE", "SIZE", "MTIME", "NAME");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "entries"), i, e)
    {
        const char *target = json_string_value(json_object_get(e, "target"));
        printf("%-9s  %-4s  %12lld  %-20s  %s%s%s\n", str_or(e, "type", "?"),
               str_or(e, "mode", "-"), (long long)json_integer_value(json_object_get(e, "size")),
               str_or(e, "mtime", "-"), str_or(e, "name", "?"), target ? " -> " : "",
               target ? target : "");
    }
    json_decref(res);
    return CLI_EXIT_OK;
}

static int cmd_rm(struct cli_ctx *c, int argc, char **argv)
{
    int r = simple_opts("sandbox rm", usage_rm, argc, argv, NULL);
    if (r >= 0)
        return r;
    if (optind >= argc)
        return cli_usage_error("sandbox rm", "expected at least one sandbox ID");
    for (int i = optind; i < argc; i++)
        if (!id_ok(argv[i]))
            return cli_usage_error("sandbox rm", "bad sandbox id '%s'", argv[i]);
    const struct cli_endpoint *ep;
    if (get_ep(c, &ep) != 0)
        return CLI_EXIT_ERR;
    int code = CLI_EXIT_OK;
    for (int i = optind; i < argc; i++) {
        struct wr_err err = {0};
        if (delete_sandbox(ep, argv[i], &err) < 0) {
            cli_errorf("%s: %s", argv[i], err.msg);
            code = CLI_EXIT_ERR;
        } else {
            printf("%s\n", argv[i]);
        }
    }
    return code;
}

/* ---- dispatch ---- */

int cli_cmd_sandbox(struct cli_ctx *c, int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*fn)(struct cli_ctx *, int, char **);
    } cmds[] = {
        {"run", cmd_run},   {"create", cmd_create}, {"list", cmd_list},   {"get", cmd_get},
        {"exec", cmd_exec}, {"cat", cmd_cat},       {"write", cmd_write}, {"ls", cmd_ls},
        {"rm", cmd_rm},     {"delete", cmd_rm},
    };
    if (argc < 2)
        return cli_usage_error("sandbox", "missing command");
    const char *sub = argv[1];
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || strcmp(sub, "help") == 0)
        return print_usage(usage_sandbox);
    for (size_t i = 0; i < WR_ARRAY_LEN(cmds); i++)
        if (strcmp(cmds[i].name, sub) == 0)
            return cmds[i].fn(c, argc - 1, argv + 1);
    return cli_usage_error("sandbox", "unknown command '%s'", sub);
}
