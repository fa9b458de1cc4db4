/*
 * `withruntime sandbox commands|logs|kill`: background commands (`sandbox exec --background`,
 * docs/api.md "Background commands"). `logs --follow` reads the output from the offsets the
 * daemon hands back and waits with /wait between reads, so every byte is printed once, in order,
 * stdout to stdout and stderr to stderr, until the command ends; it then exits with the
 * command's status as `sandbox exec` would. (A read-only key may not POST /wait: it reads every
 * second instead.)
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/sandbox.h"
#include "common/base64.h"
#include "common/util.h"

/* How long one /wait of `logs --follow` lasts: the longest a new byte waits to be printed. */
#define FOLLOW_WAIT_SECONDS 1

/* The ids of a sandbox and one of its commands from argv[optind..]: 0, or a usage exit code. */
static int two_ids(const char *cmd, int argc, char **argv, const char **id, const char **cid)
{
    if (argc - optind != 2)
        return cli_usage_error(cmd, "expected a sandbox ID and a command ID");
    *id = argv[optind];
    *cid = argv[optind + 1];
    if (!cli_id_ok(*id))
        return cli_usage_error(cmd, "bad sandbox id '%s'", *id);
    if (!cli_id_ok(*cid))
        return cli_usage_error(cmd, "bad command id '%s'", *cid);
    return 0;
}

int cli_write_encoded(int fd, json_t *o, const char *stream, struct wr_err *err)
{
    char key[32];
    snprintf(key, sizeof(key), "%s_encoding", stream);
    json_t *data = json_object_get(o, stream);
    const char *enc = json_string_value(json_object_get(o, key));
    if (!json_is_string(data))
        return wr_err_set(err, EPROTO, "the daemon's answer has no %s", stream);
    const char *s = json_string_value(data);
    size_t n = json_string_length(data);
    if (n == 0)
        return 0;
    cleanup_free unsigned char *bytes = NULL;
    if (enc && strcmp(enc, "base64") == 0) {
        bytes = base64_decode(s, n, &n);
        if (!bytes)
            return wr_err_set(err, EPROTO, "the daemon's %s is not base64", stream);
        s = (const char *)bytes;
    } else if (enc && strcmp(enc, "utf-8") != 0) {
        return wr_err_set(err, EPROTO, "unknown encoding '%s' of %s", enc, stream);
    }
    if (write_all(fd, s, n) < 0)
        return wr_err_sys(err, errno, "writing the command's %s", stream);
    return 0;
}

/* ---- commands ---- */

/* argv as one line, words joined by spaces. */
static void print_argv(json_t *argv)
{
    size_t i;
    json_t *a;
    json_array_foreach(argv, i, a)
        printf("%s%s", i ? " " : "", json_is_string(a) ? cli_safe(json_string_value(a)) : "?");
}

int cli_sandbox_commands(struct cli_ctx *c, int argc, char **argv)
{
    const char *cmd = "sandbox commands";
    bool as_json = false;
    int r = cli_simple_opts(cmd, argc, argv, &as_json);
    if (r != CLI_GO_ON)
        return r;
    int npos = argc - optind;
    if (npos < 1 || npos > 2)
        return cli_usage_error(cmd, "expected a sandbox ID and optionally a command ID");
    const char *id = argv[optind], *cid = npos == 2 ? argv[optind + 1] : NULL;
    if (!cli_id_ok(id))
        return cli_usage_error(cmd, "bad sandbox id '%s'", id);
    if (cid && !cli_id_ok(cid))
        return cli_usage_error(cmd, "bad command id '%s'", cid);
    char path[200];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands%s%s", id, cid ? "/" : "",
             cid ? cid : "");
    json_t *res = NULL;
    if ((r = cli_call(c, "GET", path, NULL, &res)) != CLI_EXIT_OK)
        return r;
    if (as_json) {
        cli_print_json(res);
    } else if (cid) {
        cli_print_fields(res);
    } else {
        printf("%-10s  %-8s  %-6s  %-20s  %-20s  %s\n", "ID", "STATE", "EXIT", "STARTED", "ENDED",
               "COMMAND");
        size_t i;
        json_t *o;
        json_array_foreach(json_object_get(res, "commands"), i, o)
        {
            char status[16] = "-";
            json_t *sig = json_object_get(o, "signal");
            json_t *ec = json_object_get(o, "exit_code");
            if (json_is_integer(sig))
                snprintf(status, sizeof(status), "sig%lld", (long long)json_integer_value(sig));
            else if (json_is_integer(ec))
                snprintf(status, sizeof(status), "%lld", (long long)json_integer_value(ec));
            printf("%-10s  %-8s  %-6s  %-20s  %-20s  ", cli_shown(o, "id", "?"),
                   cli_shown(o, "state", "?"), status, cli_shown(o, "started_at", "-"),
                   cli_shown(o, "ended_at", "-"));
            print_argv(json_object_get(o, "argv"));
            printf("\n");
        }
    }
    json_decref(res);
    return CLI_EXIT_OK;
}

/* ---- logs ---- */

/* The exit code a finished command earns, as `sandbox exec` reports it. */
static int command_status(json_t *o)
{
    const char *state = cli_str_or(o, "state", "?");
    json_t *sig = json_object_get(o, "signal");
    json_t *ec = json_object_get(o, "exit_code");
    if (strcmp(state, "failed") == 0) {
        cli_errorf("the command failed: %s", cli_str_or(o, "error", "(no reason given)"));
        return CLI_EXIT_ERR;
    }
    if (json_is_true(json_object_get(o, "timed_out"))) {
        cli_errorf("the command timed out");
        return 124;
    }
    if (json_is_integer(sig) && json_integer_value(sig) > 0)
        return 128 + (int)(json_integer_value(sig) & 127);
    if (json_is_integer(ec) && json_integer_value(ec) >= 0 && json_integer_value(ec) <= 255)
        return (int)json_integer_value(ec);
    return CLI_EXIT_ERR;
}

/*
 * Prints one /output answer's bytes (or, as_json, the answer: indented alone, one line each
 * when following) and moves off[] to the next offsets. Returns 0, or an exit code (printed).
 */
static int print_output(json_t *o, uint64_t off[2], bool as_json, bool follow)
{
    static const char *const names[2] = {"stdout", "stderr"};
    if (as_json) {
        if (follow) {
            char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (s)
                puts(s);
            free(s);
            fflush(stdout);
        } else {
            cli_print_json(o);
        }
    }
    for (int i = 0; i < 2; i++) {
        char key[32];
        snprintf(key, sizeof(key), "%s_offset", names[i]);
        json_t *start = json_object_get(o, key);
        snprintf(key, sizeof(key), "%s_next_offset", names[i]);
        json_t *next = json_object_get(o, key);
        if (!json_is_integer(start) || !json_is_integer(next) || json_integer_value(start) < 0 ||
            json_integer_value(next) < json_integer_value(start)) {
            cli_errorf("the daemon's answer has no good %s offsets", names[i]);
            return CLI_EXIT_ERR;
        }
        if (!as_json) {
            uint64_t from = (uint64_t)json_integer_value(start);
            if (from > off[i])
                cli_errorf("%" PRIu64 " bytes of %s were dropped before they were read (a "
                           "background command keeps its last MiB)",
                           from - off[i], names[i]);
            struct wr_err err = {0};
            if (cli_write_encoded(i + 1, o, names[i], &err) < 0)
                return cli_fail(&err);
        }
        off[i] = (uint64_t)json_integer_value(next);
    }
    return 0;
}

/*
 * POST .../wait: answers when the command ends, or after FOLLOW_WAIT_SECONDS with it running.
 * A read-only key is refused (403): *polling is set and that is no error. Returns 0, or -1 with
 * err set.
 */
static int follow_wait(const struct cli_endpoint *ep, const char *path, bool *polling,
                       struct wr_err *err)
{
    char body[64];
    snprintf(body, sizeof(body), "{\"timeout_seconds\":%d}", FOLLOW_WAIT_SECONDS);
    struct cli_request req;
    cli_request_init(&req, "POST", path);
    req.content_type = "application/json";
    req.body = body;
    req.body_len = strlen(body);
    struct cli_response resp;
    int r = cli_request_do(ep, &req, &resp, err);
    if (r < 0 && resp.status == 403) {
        *polling = true;
        r = 0;
    }
    cli_response_free(&resp);
    return r;
}

int cli_sandbox_logs(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"follow", no_argument, 0, 'f'},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox logs";
    bool follow = false, as_json = false;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "fh", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': return cli_print_help();
        case 'f': follow = true; break;
        case OPT_JSON: as_json = true; break;
        default: return cli_bad_option(cmd, argc, argv);
        }
    }
    const char *id, *cid;
    int r = two_ids(cmd, argc, argv, &id, &cid);
    if (r != 0)
        return r;
    const struct cli_endpoint *ep;
    if ((r = cli_endpoint(c, &ep)) != 0)
        return r;
    signal(SIGPIPE, SIG_IGN); /* a closed stdout is a write error, said once */
    uint64_t off[2] = {0, 0};
    char wait_path[200];
    snprintf(wait_path, sizeof(wait_path), "/v1/sandboxes/%s/commands/%s/wait", id, cid);
    bool polling = false; /* a read-only key may not POST /wait: read every second instead */
    int code = CLI_EXIT_OK;
    for (;;) {
        char path[256];
        snprintf(path, sizeof(path),
                 "/v1/sandboxes/%s/commands/%s/output?stdout_offset=%" PRIu64
                 "&stderr_offset=%" PRIu64,
                 id, cid, off[0], off[1]);
        struct wr_err err = {0};
        json_t *o = NULL;
        if (cli_json_call(ep, "GET", path, NULL, &o, &err) < 0) {
            code = cli_fail(&err);
            break;
        }
        code = print_output(o, off, as_json, follow);
        bool running = strcmp(cli_str_or(o, "state", "?"), "running") == 0;
        if (code == 0 && follow && !running && !as_json)
            code = command_status(o);
        json_decref(o);
        if (code != 0 || !follow || !running)
            break;
        if (polling) {
            struct timespec ts = {.tv_sec = FOLLOW_WAIT_SECONDS};
            nanosleep(&ts, NULL);
        } else if (follow_wait(ep, wait_path, &polling, &err) < 0) {
            code = cli_fail(&err);
            break;
        }
    }
    return code;
}

/* ---- kill ---- */

int cli_sandbox_kill(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"signal", required_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox kill";
    const char *sig = "TERM";
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "s:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': return cli_print_help();
        case 's': sig = optarg; break;
        default: return cli_bad_option(cmd, argc, argv);
        }
    }
    long num = 0;
    bool numeric = cli_parse_long(sig, 1, 64, &num) == 0;
    char name[17]; /* the name in capitals: `-s kill` is KILL */
    size_t len = strlen(sig);
    if (!numeric && (len == 0 || len >= sizeof(name) ||
                     strspn(sig, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz12") != len))
        return cli_usage_error(cmd, "--signal wants a name like TERM or a number, got '%s'", sig);
    for (size_t i = 0; !numeric && i <= len; i++)
        name[i] = (char)toupper((unsigned char)sig[i]);
    const char *id, *cid;
    int r = two_ids(cmd, argc, argv, &id, &cid);
    if (r != 0)
        return r;
    char path[200];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands/%s/signal", id, cid);
    json_t *body =
        numeric ? json_pack("{s:i}", "signal", (int)num) : json_pack("{s:s}", "signal", name);
    r = cli_call(c, "POST", path, body, NULL);
    json_decref(body);
    if (r == CLI_EXIT_OK)
        printf("%s\n", cid);
    return r;
}
