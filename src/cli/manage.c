/*
 * `withruntime sandbox stop|start|timeout|stats|events|network|network-log`: a sandbox's life
 * after its create — stop it (files kept), start it again, move the end of its lease, see what
 * it uses and what happened to it, and show or change what it may reach (and what it was
 * denied). Each is one API call (docs/api.md, "Sandboxes").
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/sandbox.h"
#include "common/duration.h"

/* POST /v1/sandboxes/ID/<what> for each ID operand: `stop` and `start`. */
static int stop_or_start(struct cli_ctx *c, int argc, char **argv, const char *what)
{
    char cmd[32];
    snprintf(cmd, sizeof(cmd), "sandbox %s", what);
    bool as_json = false;
    int r = cli_simple_opts(cmd, argc, argv, &as_json);
    if (r != CLI_GO_ON)
        return r;
    if (optind >= argc)
        return cli_usage_error(cmd, "expected at least one sandbox ID");
    for (int i = optind; i < argc; i++)
        if (!cli_id_ok(argv[i]))
            return cli_usage_error(cmd, "bad sandbox id '%s'", argv[i]);
    int code = CLI_EXIT_OK;
    for (int i = optind; i < argc; i++) {
        char path[128];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s", argv[i], what);
        json_t *sb = NULL;
        r = cli_call(c, "POST", path, NULL, &sb);
        if (r != CLI_EXIT_OK) {
            code = r;
            continue;
        }
        if (as_json) {
            char *s = json_dumps(sb, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (s)
                puts(s);
            free(s);
        } else {
            printf("%s  %s\n", argv[i], cli_shown(sb, "state", "?"));
        }
        json_decref(sb);
    }
    return code;
}

int cli_sandbox_stop(struct cli_ctx *c, int argc, char **argv)
{
    return stop_or_start(c, argc, argv, "stop");
}

int cli_sandbox_start(struct cli_ctx *c, int argc, char **argv)
{
    return stop_or_start(c, argc, argv, "start");
}

int cli_sandbox_timeout(struct cli_ctx *c, int argc, char **argv)
{
    const char *cmd = "sandbox timeout";
    bool as_json = false;
    int r = cli_simple_opts(cmd, argc, argv, &as_json);
    if (r != CLI_GO_ON)
        return r;
    if (argc - optind != 2)
        return cli_usage_error(cmd, "expected a sandbox ID and a DURATION");
    const char *id = argv[optind];
    if (!cli_id_ok(id))
        return cli_usage_error(cmd, "bad sandbox id '%s'", id);
    int64_t secs;
    if (duration_parse(argv[optind + 1], &secs) < 0 || secs < 1 || secs > CLI_MAX_SECONDS)
        return cli_usage_error(cmd, "DURATION wants 1s to 24h (90s, 10m, 2h), got '%s'",
                               argv[optind + 1]);
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/timeout", id);
    json_t *body = json_pack("{s:I}", "timeout_seconds", (json_int_t)secs);
    json_t *sb = NULL;
    r = cli_call(c, "POST", path, body, &sb);
    json_decref(body);
    if (r != CLI_EXIT_OK)
        return r;
    if (as_json)
        cli_print_json(sb);
    else
        printf("%s  lease ends at %s\n", id, cli_shown(sb, "lease_ends_at", "?"));
    json_decref(sb);
    return CLI_EXIT_OK;
}

/* GET /v1/sandboxes/ID/<what> for `stats` and `events`: *out the answer, or an exit code. */
static int get_one(struct cli_ctx *c, int argc, char **argv, const char *what, bool *as_json,
                   json_t **out)
{
    char cmd[32];
    snprintf(cmd, sizeof(cmd), "sandbox %s", what);
    int r = cli_simple_opts(cmd, argc, argv, as_json);
    if (r != CLI_GO_ON)
        return r;
    if (argc - optind != 1)
        return cli_usage_error(cmd, "expected one sandbox ID");
    const char *id = argv[optind];
    if (!cli_id_ok(id))
        return cli_usage_error(cmd, "bad sandbox id '%s'", id);
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s", id, what);
    r = cli_call(c, "GET", path, NULL, out);
    if (r == CLI_EXIT_OK && *as_json) {
        cli_print_json(*out);
        json_decref(*out);
        *out = NULL;
    }
    return r;
}

static long long int_of(json_t *o, const char *key)
{
    return (long long)json_integer_value(json_object_get(o, key));
}

int cli_sandbox_stats(struct cli_ctx *c, int argc, char **argv)
{
    bool as_json = false;
    json_t *st = NULL;
    int r = get_one(c, argc, argv, "stats", &as_json, &st);
    if (r != CLI_EXIT_OK || !st)
        return r;
    long long cpu = int_of(st, "cpu_usec"), mem = int_of(st, "memory_bytes");
    printf("%-10s  %s\n", "ID", cli_shown(st, "id", "?"));
    printf("%-10s  %s\n", "STATE", cli_shown(st, "state", "?"));
    printf("%-10s  %lld.%03lld s\n", "CPU", cpu / 1000000, (cpu / 1000) % 1000);
    printf("%-10s  %lld.%01lld MiB\n", "MEMORY", mem >> 20, ((mem & ((1 << 20) - 1)) * 10) >> 20);
    printf("%-10s  %lld\n", "PIDS", int_of(st, "pids"));
    printf("%-10s  %lld\n", "OOM KILLS", int_of(st, "oom_kills"));
    json_decref(st);
    return CLI_EXIT_OK;
}

int cli_sandbox_events(struct cli_ctx *c, int argc, char **argv)
{
    bool as_json = false;
    json_t *res = NULL;
    int r = get_one(c, argc, argv, "events", &as_json, &res);
    if (r != CLI_EXIT_OK || !res)
        return r;
    printf("%-20s  %-10s  %-9s  %-16s  %s\n", "AT", "TYPE", "STATE", "REASON", "DETAIL");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "events"), i, e)
    {
        printf("%-20s  %-10s  %-9s  %-16s  ", cli_shown(e, "at", "-"), cli_shown(e, "type", "-"),
               cli_shown(e, "state", "-"), cli_shown(e, "reason", "-"));
        /* whatever else the event says, as k=v */
        const char *k;
        json_t *v;
        bool first = true;
        json_object_foreach(e, k, v)
        {
            if (!strcmp(k, "at") || !strcmp(k, "type") || !strcmp(k, "state") ||
                !strcmp(k, "reason"))
                continue;
            char *s = json_is_string(v)
                          ? strdup(json_string_value(v))
                          : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
            printf("%s%s=%s", first ? "" : " ", cli_safe(k), s ? cli_safe(s) : "?");
            free(s);
            first = false;
        }
        printf("%s\n", first ? "-" : "");
    }
    json_decref(res);
    return CLI_EXIT_OK;
}

/* ---- network ---- */

/* Prints a network policy: internet, then allow and deny lists, one field a line. */
static void print_policy(json_t *net)
{
    printf("%-9s %s\n", "internet", json_is_true(json_object_get(net, "internet")) ? "yes" : "no");
    static const char *const lists[] = {"allow", "deny"};
    for (size_t k = 0; k < 2; k++) {
        json_t *a = json_object_get(net, lists[k]);
        if (!json_is_array(a))
            continue;
        printf("%-9s ", lists[k]);
        size_t i;
        json_t *h;
        json_array_foreach(a, i, h)
            printf("%s%s", i ? " " : "", json_is_string(h) ? cli_safe(json_string_value(h)) : "?");
        printf("%s\n", json_array_size(a) ? "" : "(nothing)");
    }
}

int cli_sandbox_network(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"internet", no_argument, 0, OPT_INTERNET},
        {"no-internet", no_argument, 0, 'n'},
        {"allow", required_argument, 0, OPT_ALLOW},
        {"deny", required_argument, 0, OPT_DENY},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox network";
    bool as_json = false, set = false, internet = false, none = false;
    json_t *allow = json_array(), *deny = json_array();
    int code = CLI_GO_ON;
    int opt;
    optind = 0;
    opterr = 0;
    while (code == CLI_GO_ON && (opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': code = cli_print_help(); break;
        case OPT_JSON: as_json = true; break;
        case OPT_INTERNET: set = internet = true; break;
        case 'n': set = none = true; break;
        case OPT_ALLOW:
        case OPT_DENY:
            /* checked by the daemon, which names a bad entry */
            json_array_append_new(opt == OPT_ALLOW ? allow : deny, json_string(optarg));
            set = internet = true;
            break;
        default: code = cli_bad_option(cmd, argc, argv);
        }
    }
    if (code == CLI_GO_ON && argc - optind != 1)
        code = cli_usage_error(cmd, "expected one sandbox ID");
    if (code == CLI_GO_ON && !cli_id_ok(argv[optind]))
        code = cli_usage_error(cmd, "bad sandbox id '%s'", argv[optind]);
    if (code == CLI_GO_ON && none && internet)
        code = cli_usage_error(cmd, "--no-internet goes alone, without --internet, --allow or "
                                    "--deny");
    if (code != CLI_GO_ON)
        goto out;
    char path[128];
    json_t *res = NULL;
    if (set) {
        json_t *body = json_pack("{s:b}", "internet", internet);
        if (json_array_size(allow))
            json_object_set(body, "allow", allow);
        if (json_array_size(deny))
            json_object_set(body, "deny", deny);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/network", argv[optind]);
        code = cli_call(c, "PUT", path, body, &res);
        json_decref(body);
    } else {
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", argv[optind]);
        code = cli_call(c, "GET", path, NULL, &res);
    }
    if (code == CLI_EXIT_OK) {
        json_t *net = json_object_get(res, "network");
        if (as_json)
            cli_print_json(net ? net : json_object());
        else
            print_policy(net);
    }
    json_decref(res);
out:
    json_decref(allow);
    json_decref(deny);
    return code;
}

int cli_sandbox_network_log(struct cli_ctx *c, int argc, char **argv)
{
    const char *cmd = "sandbox network-log";
    bool as_json = false;
    int r = cli_simple_opts(cmd, argc, argv, &as_json);
    if (r != CLI_GO_ON)
        return r;
    if (argc - optind != 1)
        return cli_usage_error(cmd, "expected one sandbox ID");
    const char *id = argv[optind];
    if (!cli_id_ok(id))
        return cli_usage_error(cmd, "bad sandbox id '%s'", id);
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/network/log", id);
    json_t *res = NULL;
    if ((r = cli_call(c, "GET", path, NULL, &res)) != CLI_EXIT_OK)
        return r;
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    printf("%-20s  %-5s  %-40s  %5s  %s\n", "TIME", "VIA", "HOST", "PORT", "REASON");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "entries"), i, e)
    {
        printf("%-20s  %-5s  %-40s  %5lld  %s\n", cli_shown(e, "time", "-"),
               cli_shown(e, "via", "-"), cli_shown(e, "host", "-"), int_of(e, "port"),
               cli_shown(e, "reason", "-"));
    }
    printf("(%lld denied since the daemon started)\n", int_of(res, "total"));
    json_decref(res);
    return CLI_EXIT_OK;
}
