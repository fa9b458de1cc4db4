/*
 * `withruntime sandbox ...`: what the subcommands' files share (option errors, id checks, JSON
 * printing, finding the daemon), and the small ones: list, get, rm, prune. Each subcommand is a
 * thin translation of options into one or two API calls (docs/api.md) and of the answer into
 * text for a terminal or a script; the command table (table.c) says which file runs which.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/sandbox.h"
#include "common/duration.h"
#include "common/util.h"

/* ---- helpers ---- */

int cli_bad_option(const char *cmd, int argc, char **argv)
{
    const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
    if (optopt && strchr("h", optopt) == NULL && arg[0] == '-' && arg[1] != '-')
        return cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return cli_usage_error(cmd, "unknown option, or missing value: '%s'", arg);
}

bool cli_id_ok(const char *id)
{
    if (!id[0] || strlen(id) > 64)
        return false;
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_'))
            return false;
    return true;
}

void cli_print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) {
        puts(s);
        free(s);
    }
}

int cli_endpoint(struct cli_ctx *c, const struct cli_endpoint **ep)
{
    struct wr_err err = {0};
    if (cli_endpoint_get(c, ep, &err) < 0) {
        cli_fail(&err);
        /* A malformed RUNTIME_URL (or the like) is a usage error, not an unreachable daemon. */
        return err.kind == WR_E_INVALID ? CLI_EXIT_USAGE : CLI_EXIT_DAEMON;
    }
    return 0;
}

int cli_call(struct cli_ctx *c, const char *method, const char *path, json_t *body, json_t **out)
{
    if (out)
        *out = NULL;
    const struct cli_endpoint *ep;
    int r = cli_endpoint(c, &ep);
    if (r != 0)
        return r;
    struct wr_err err = {0};
    if (cli_json_call(ep, method, path, body, out, &err) < 0)
        return cli_fail(&err);
    return CLI_EXIT_OK;
}

void cli_print_fields(json_t *o)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        printf("%-20s  ", cli_safe(k));
        if (json_is_string(v)) {
            printf("%s\n", cli_safe(json_string_value(v)));
        } else if (json_is_null(v)) {
            printf("-\n");
        } else {
            char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
            printf("%s\n", s ? cli_safe(s) : "?");
            free(s);
        }
    }
}

int cli_simple_opts(const char *cmd, int argc, char **argv, bool *as_json)
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
            return cli_print_help();
        if (opt == OPT_JSON && as_json)
            *as_json = true;
        else
            return cli_bad_option(cmd, argc, argv);
    }
    return CLI_GO_ON;
}

const char *cli_str_or(json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : dflt;
}

const char *cli_shown(json_t *o, const char *key, const char *dflt)
{
    return cli_safe(cli_str_or(o, key, dflt));
}

int cli_sandbox_delete(const struct cli_endpoint *ep, const char *id, struct wr_err *err)
{
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    return cli_json_call(ep, "DELETE", path, NULL, NULL, err);
}

/* ---- list, get, rm ---- */

/* --metadata K=V (each a pair of the API's metadata filter, itself form-encoded) and
 * --state S as the list's query string; NULL after a usage error (said). */
static char *list_query(json_t *pairs, const char *state)
{
    cleanup_free char *form = xstrdup("");
    size_t i;
    json_t *p;
    json_array_foreach(pairs, i, p)
    {
        const char *kv = json_string_value(p), *eq = strchr(kv, '=');
        if (!eq || eq == kv) {
            cli_usage_error("sandbox list", "--metadata wants KEY=VALUE, got '%s'", kv);
            return NULL;
        }
        cleanup_free char *k = xstrdup(kv);
        k[eq - kv] = '\0';
        cleanup_free char *ke = cli_query_escape(k), *ve = cli_query_escape(eq + 1);
        char *next;
        if (asprintf(&next, "%s%s%s=%s", form, i ? "&" : "", ke, ve) < 0)
            abort();
        free(form);
        form = next;
    }
    cleanup_free char *fe = cli_query_escape(form), *se = state ? cli_query_escape(state) : NULL;
    char *q;
    if (asprintf(&q, "/v1/sandboxes?%s%s%s%s%s", form[0] ? "metadata=" : "", form[0] ? fe : "",
                 form[0] && se ? "&" : "", se ? "state=" : "", se ? se : "") < 0)
        abort();
    size_t n = strlen(q);
    if (q[n - 1] == '?')
        q[n - 1] = '\0'; /* no filter */
    return q;
}

int cli_sandbox_list(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, 0, OPT_JSON},
                                         {"metadata", required_argument, 0, OPT_METADATA},
                                         {"state", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool as_json = false;
    const char *state = NULL;
    json_t *pairs = json_array();
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': json_decref(pairs); return cli_print_help();
        case OPT_JSON: as_json = true; break;
        case OPT_METADATA: json_array_append_new(pairs, json_string_nocheck(optarg)); break;
        case 's': state = optarg; break;
        default: json_decref(pairs); return cli_bad_option("sandbox list", argc, argv);
        }
    }
    if (optind < argc) {
        json_decref(pairs);
        return cli_usage_error("sandbox list", "unexpected argument '%s'", argv[optind]);
    }
    cleanup_free char *path = list_query(pairs, state);
    json_decref(pairs);
    if (!path)
        return CLI_EXIT_USAGE;
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    struct wr_err err = {0};
    json_t *res = NULL;
    if (cli_json_call(ep, "GET", path, NULL, &res, &err) < 0)
        return cli_fail(&err);
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    json_t *list = json_object_get(res, "sandboxes");
    /* The owner's name is worth a call only when someone else's could be listed. */
    json_t *names = json_array_size(list) ? cli_key_names(c) : json_object();
    printf("%-24s  %-8s  %-12s  %4s  %8s  %-20s  %s\n", "ID", "STATE", "IMAGE", "CPUS", "MEMORY",
           "OWNER", "CREATED");
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
        printf("%-24s  %-8s  %-12s  %4lld  %8s  %-20.20s  %s\n", cli_shown(sb, "id", "?"),
               cli_shown(sb, "state", "?"), cli_shown(sb, "image", "-"),
               (long long)json_integer_value(cpus), mem, cli_key_label(names, sb, "key_id"),
               cli_shown(sb, "created_at", "-"));
    }
    json_decref(names);
    json_decref(res);
    return CLI_EXIT_OK;
}

int cli_sandbox_get(struct cli_ctx *c, int argc, char **argv)
{
    bool as_json = false;
    int r = cli_simple_opts("sandbox get", argc, argv, &as_json);
    if (r != CLI_GO_ON)
        return r;
    if (argc - optind != 1)
        return cli_usage_error("sandbox get", "expected one sandbox ID");
    const char *id = argv[optind];
    if (!cli_id_ok(id))
        return cli_usage_error("sandbox get", "bad sandbox id '%s'", id);
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    json_t *sb = NULL;
    if ((r = cli_call(c, "GET", path, NULL, &sb)) != CLI_EXIT_OK)
        return r;
    if (as_json)
        cli_print_json(sb);
    else
        cli_print_fields(sb);
    json_decref(sb);
    return CLI_EXIT_OK;
}

int cli_sandbox_rm(struct cli_ctx *c, int argc, char **argv)
{
    int r = cli_simple_opts("sandbox rm", argc, argv, NULL);
    if (r != CLI_GO_ON)
        return r;
    if (optind >= argc)
        return cli_usage_error("sandbox rm", "expected at least one sandbox ID");
    for (int i = optind; i < argc; i++)
        if (!cli_id_ok(argv[i]))
            return cli_usage_error("sandbox rm", "bad sandbox id '%s'", argv[i]);
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    int code = CLI_EXIT_OK;
    for (int i = optind; i < argc; i++) {
        struct wr_err err = {0};
        if (cli_sandbox_delete(ep, argv[i], &err) < 0) {
            cli_errorf("%s: %s", argv[i], err.msg);
            code = cli_exit_code(&err);
        } else {
            printf("%s\n", argv[i]);
        }
    }
    return code;
}

int cli_sandbox_prune(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"older-than", required_argument, 0, 'o'},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int64_t age = 0;
    bool as_json = false;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h')
            return cli_print_help();
        if (opt == OPT_JSON)
            as_json = true;
        else if (opt == 'o' && duration_parse(optarg, &age) < 0)
            return cli_usage_error("sandbox prune",
                                   "--older-than wants a duration (90s, 15m, 12h, 7d), got '%s'",
                                   optarg);
        else if (opt != 'o')
            return cli_bad_option("sandbox prune", argc, argv);
    }
    if (optind < argc)
        return cli_usage_error("sandbox prune", "unexpected argument '%s'", argv[optind]);
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    struct wr_err err = {0};
    json_t *res = NULL;
    json_t *body = json_pack("{s:I}", "older_than_seconds", (json_int_t)age);
    int rc = cli_json_call(ep, "POST", "/v1/sandboxes/prune", body, &res, &err);
    json_decref(body);
    if (rc < 0)
        return cli_fail(&err);
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(res, "deleted"), i, v) printf("%s\n", json_string_value(v));
    int code = CLI_EXIT_OK;
    json_array_foreach(json_object_get(res, "errors"), i, v)
    {
        cli_errorf("%s: %s", cli_str_or(v, "id", "?"), cli_str_or(v, "message", "?"));
        code = CLI_EXIT_DAEMON; /* the daemon failed to delete it */
    }
    json_decref(res);
    return code;
}
