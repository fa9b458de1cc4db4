/*
 * `withruntime keys create|list|set|revoke` and `withruntime audit`: the admin's, through the
 * local daemon's Unix socket as root (docs/security.md). A new key is printed once; the daemon
 * keeps only its hash.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/client.h"
#include "cli/sandbox.h"
#include "common/ids.h"
#include "common/util.h"

/* "12.5" dollars as micro-dollars, without floating point; "none" is -1. -2 if malformed. */
static long long parse_usd(const char *s)
{
    if (!strcmp(s, "none"))
        return -1;
    long long whole = 0, frac = 0;
    int digits = 0, fd = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if ((whole = whole * 10 + (*p - '0')) > 1000000)
            return -2;
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, fd++) {
            if (fd < 6)
                frac = frac * 10 + (*p - '0');
            else if (*p != '0')
                return -2; /* finer than a micro-dollar */
        }
    }
    if (*p || (!digits && !fd))
        return -2;
    for (int i = fd < 6 ? fd : 6; i < 6; i++)
        frac *= 10;
    return whole * 1000000 + frac;
}

static int parse_count(const char *s)
{
    if (!strcmp(s, "none"))
        return -1;
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= 0 && v <= 100000 ? (int)v : -2;
}

static int key_call(struct cli_ctx *c, const char *method, const char *path, json_t *body,
                    json_t **res)
{
    return cli_call(c, method, path, body, res);
}

/* For tables that would otherwise show only ids (the dashboard shows names). */
json_t *cli_key_names(struct cli_ctx *c)
{
    json_t *names = json_object(), *res = NULL, *k;
    const struct cli_endpoint *ep;
    struct wr_err err = {0};
    if (cli_endpoint_get(c, &ep, &err) < 0 ||
        cli_json_call(ep, "GET", "/v1/keys", NULL, &res, &err) < 0)
        return names;
    size_t i;
    json_array_foreach(json_object_get(res, "keys"), i, k)
    {
        const char *id = json_string_value(json_object_get(k, "id"));
        json_t *name = json_object_get(k, "name");
        if (id && json_is_string(name))
            json_object_set(names, id, name);
    }
    json_decref(res);
    return names;
}

const char *cli_key_label(json_t *names, json_t *row, const char *field)
{
    const char *id = json_string_value(json_object_get(row, field));
    if (!id)
        return "(admin)";
    const char *name = json_string_value(json_object_get(names, id));
    return cli_safe(name ? name : id);
}

/* Options shared by create and set into body; returns CLI_GO_ON or an exit status. */
static int key_options(const char *cmd, int argc, char **argv, int create, json_t *body)
{
    static const struct option opts[] = {{"name", required_argument, 0, 'n'},
                                         {"of", required_argument, 0, 'o'},
                                         {"read-only", no_argument, 0, 'r'},
                                         {"read-write", no_argument, 0, 'w'},
                                         {"metrics", no_argument, 0, 'M'},
                                         {"auditor", no_argument, 0, 'A'},
                                         {"daily-limit-usd", required_argument, 0, 'd'},
                                         {"max-sandboxes", required_argument, 0, 'm'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'n':
            if (!create)
                return cli_usage_error(cmd, "a key's name cannot be changed");
            json_object_set_new(body, "name", json_string(optarg));
            break;
        case 'o':
            if (!create)
                return cli_usage_error(cmd, "a key's owner cannot be changed");
            json_object_set_new(body, "owner_id", json_string(optarg));
            break;
        case 'r':
        case 'w': json_object_set_new(body, "read_only", json_boolean(o == 'r')); break;
        case 'M':
            if (!create)
                return cli_usage_error(cmd, "a metrics key is made as one (keys create --metrics)");
            json_object_set_new(body, "metrics", json_true());
            break;
        case 'A':
            if (!create)
                return cli_usage_error(cmd,
                                       "an auditor key is made as one (keys create --auditor)");
            json_object_set_new(body, "auditor", json_true());
            break;
        case 'd': {
            long long v = parse_usd(optarg);
            if (v < -1 || (create && v < 0))
                return cli_usage_error(cmd, "--daily-limit-usd wants dollars (e.g. 5 or 0.25)%s",
                                       create ? "" : " or none");
            json_object_set_new(body, "daily_limit_micros", v < 0 ? json_null() : json_integer(v));
            break;
        }
        case 'm': {
            int v = parse_count(optarg);
            if (v < -1 || (create && v < 0))
                return cli_usage_error(cmd, "--max-sandboxes wants 0 to 100000%s",
                                       create ? "" : " or none");
            json_object_set_new(body, "max_sandboxes", v < 0 ? json_null() : json_integer(v));
            break;
        }
        case 'h': return cli_print_help();
        default: return cli_bad_option(cmd, argc, argv);
        }
    }
    return CLI_GO_ON;
}

int cli_keys_create(struct cli_ctx *c, int argc, char **argv)
{
    json_t *body = json_object();
    int r = key_options("keys create", argc, argv, 1, body);
    /* The name may come as --name NAME or as the one argument (keys create NAME). */
    if (r == CLI_GO_ON && optind == argc - 1 && !json_object_get(body, "name"))
        json_object_set_new(body, "name", json_string(argv[optind++]));
    if (r == CLI_GO_ON && optind < argc)
        r = cli_usage_error("keys create", "unexpected argument '%s'", argv[optind]);
    if (r == CLI_GO_ON && !json_object_get(body, "name"))
        r = cli_usage_error("keys create", "a NAME (or --name NAME) is required");
    json_t *res = NULL;
    if (r == CLI_GO_ON)
        r = key_call(c, "POST", "/v1/keys", body, &res);
    json_decref(body);
    if (r != CLI_EXIT_OK)
        return r;
    /* The key alone on stdout (so it can go straight to a file); what it is on stderr. */
    printf("%s\n", cli_str_or(res, "key", "?"));
    fprintf(stderr, "key %s (%s) made; it is shown this once\n", cli_str_or(res, "id", "?"),
            cli_str_or(res, "name", "?"));
    json_decref(res);
    return CLI_EXIT_OK;
}

int cli_keys_set(struct cli_ctx *c, int argc, char **argv)
{
    json_t *body = json_object();
    int r = key_options("keys set", argc, argv, 0, body);
    if (r == CLI_GO_ON && optind != argc - 1)
        r = cli_usage_error("keys set", "want one key ID");
    if (r == CLI_GO_ON && json_object_size(body) == 0)
        r = cli_usage_error("keys set", "nothing to change (see --help)");
    json_t *res = NULL;
    if (r == CLI_GO_ON) {
        char path[128];
        snprintf(path, sizeof(path), "/v1/keys/%.64s", argv[optind]);
        r = key_call(c, "PATCH", path, body, &res);
    }
    json_decref(body);
    if (r == CLI_EXIT_OK)
        printf("%s\n", cli_str_or(res, "id", "?"));
    json_decref(res);
    return r;
}

int cli_keys_list(struct cli_ctx *c, int argc, char **argv)
{
    bool as_json = false;
    int r = cli_simple_opts("keys list", argc, argv, &as_json);
    if (r != CLI_GO_ON)
        return r;
    if (optind < argc)
        return cli_usage_error("keys list", "unexpected argument '%s'", argv[optind]);
    json_t *res = NULL;
    if ((r = key_call(c, "GET", "/v1/keys", NULL, &res)) != CLI_EXIT_OK)
        return r;
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    printf("%-22s  %-20s  %-10s  %-14s  %-14s  %-8s  %s\n", "ID", "NAME", "ACCESS", "DAILY LIMIT",
           "SPENT TODAY", "MAX SB", "STATE");
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(res, "keys"), i, k)
    {
        json_t *limit = json_object_get(k, "daily_limit_micros");
        json_t *maxsb = json_object_get(k, "max_sandboxes");
        printf("%-22s  %-20.20s  %-10s  ", cli_str_or(k, "id", "?"), cli_str_or(k, "name", "?"),
               json_is_true(json_object_get(k, "metrics"))     ? "metrics"
               : json_is_true(json_object_get(k, "auditor"))   ? "auditor"
               : json_is_true(json_object_get(k, "read_only")) ? "read-only"
                                                               : "read-write");
        char lim[32] = "-", spent[32], msb[16] = "-";
        if (json_is_integer(limit))
            usd_format(json_integer_value(limit), lim, sizeof(lim));
        usd_format(json_integer_value(json_object_get(k, "spent_today_micros")), spent,
                   sizeof(spent));
        if (json_is_integer(maxsb))
            snprintf(msb, sizeof(msb), "%lld", (long long)json_integer_value(maxsb));
        printf("%-14s  %-14s  %-8s  %s\n", lim, spent, msb,
               json_is_string(json_object_get(k, "revoked_at")) ? "revoked" : "in use");
    }
    json_decref(res);
    return CLI_EXIT_OK;
}

int cli_keys_revoke(struct cli_ctx *c, int argc, char **argv)
{
    int r = cli_simple_opts("keys revoke", argc, argv, NULL);
    if (r != CLI_GO_ON)
        return r;
    if (optind >= argc)
        return cli_usage_error("keys revoke", "want a key ID");
    int ret = CLI_EXIT_OK;
    for (int i = optind; i < argc; i++) {
        char path[128];
        snprintf(path, sizeof(path), "/v1/keys/%.64s/revoke", argv[i]);
        json_t *res = NULL;
        int r1 = key_call(c, "POST", path, NULL, &res);
        if (r1 != CLI_EXIT_OK) {
            ret = r1;
            continue;
        }
        printf("%s\n", cli_str_or(res, "id", argv[i]));
        /* The keys made --of it go with it: each is printed, and said to be one of those. */
        json_t *also = json_object_get(res, "also_revoked"), *v;
        size_t j;
        json_array_foreach(also, j, v)
        {
            if (!json_is_string(v))
                continue;
            printf("%s\n", json_string_value(v));
            fprintf(stderr, "revoked %s too: it was made --of %s\n", json_string_value(v),
                    cli_str_or(res, "id", argv[i]));
        }
        json_decref(res);
    }
    return ret;
}

int cli_cmd_audit(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {{"limit", required_argument, 0, 'l'},
                                         {"before", required_argument, 0, 'b'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *limit = "50", *before = NULL;
    bool as_json = false;
    optind = 1;
    opterr = 0;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'l': limit = optarg; break;
        case 'b': before = optarg; break;
        case 'j': as_json = true; break;
        case 'h': return cli_print_help();
        default: return cli_bad_option("audit", argc, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error("audit", "unexpected argument '%s'", argv[optind]);
    int n = parse_count(limit);
    if (n < 1 || n > 1000)
        return cli_usage_error("audit", "--limit wants 1 to 1000");
    if (before &&
        (!before[0] || strlen(before) > 18 || strspn(before, "0123456789") != strlen(before)))
        return cli_usage_error("audit", "--before wants a SEQ from an earlier page");
    char path[128];
    snprintf(path, sizeof(path), "/v1/audit?limit=%.8s%s%.20s", limit, before ? "&before=" : "",
             before ? before : "");
    json_t *res = NULL;
    int r = key_call(c, "GET", path, NULL, &res);
    if (r != CLI_EXIT_OK)
        return r;
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    printf("%-8s  %-20s  %-22s  %-6s  %-44s  %-25s  %s\n", "SEQ", "AT", "KEY", "METHOD", "ROUTE",
           "SANDBOX", "STATUS");
    json_t *names = cli_key_names(c);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "entries"), i, e)
    {
        printf("%-8" PRId64 "  %-20s  %-22.22s  %-6s  %-44s  %-25s  %lld\n",
               (int64_t)json_integer_value(json_object_get(e, "seq")), cli_shown(e, "at", "?"),
               cli_key_label(names, e, "key_id"), cli_shown(e, "method", "?"),
               cli_shown(e, "route", "?"), cli_shown(e, "sandbox_id", "-"),
               (long long)json_integer_value(json_object_get(e, "status")));
    }
    json_decref(names);
    json_decref(res);
    return CLI_EXIT_OK;
}

int cli_cmd_usage(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {{"from", required_argument, 0, 'f'},
                                         {"to", required_argument, 0, 't'},
                                         {"by", required_argument, 0, 'b'},
                                         {"json", no_argument, 0, 'j'},
                                         {"sandbox", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *from = NULL, *to = NULL, *by = "sandbox", *sb = NULL;
    bool as_json = false;
    optind = 1;
    opterr = 0;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'f': from = optarg; break;
        case 't': to = optarg; break;
        case 'b': by = optarg; break;
        case 's': sb = optarg; break;
        case 'j': as_json = true; break;
        case 'h': return cli_print_help();
        default: return cli_bad_option("usage", argc, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error("usage", "unexpected argument '%s'", argv[optind]);
    if (strcmp(by, "sandbox") && strcmp(by, "key") && strcmp(by, "day") && strcmp(by, "minute"))
        return cli_usage_error("usage", "--by wants sandbox, key, day or minute");
    if (sb && !sb_id_valid(sb))
        return cli_usage_error("usage", "--sandbox wants a sandbox id (sb-...)");
    static const char when_chars[] = "0123456789-:TZ";
    if ((from && (strlen(from) > 20 || strspn(from, when_chars) != strlen(from))) ||
        (to && (strlen(to) > 20 || strspn(to, when_chars) != strlen(to))))
        return cli_usage_error("usage", "--from and --to want a UTC date (2026-12-01) or time "
                                        "(2026-12-01T13:45:00Z)");
    char path[200];
    snprintf(path, sizeof(path), "/v1/usage?group_by=%s%s%s%s%s%s%s", by, from ? "&from=" : "",
             from ? from : "", to ? "&to=" : "", to ? to : "", sb ? "&sandbox=" : "", sb ? sb : "");
    json_t *res = NULL;
    int r = key_call(c, "GET", path, NULL, &res);
    if (r != CLI_EXIT_OK)
        return r;
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    const char *col = !strcmp(by, "day")      ? "day"
                      : !strcmp(by, "minute") ? "minute"
                      : !strcmp(by, "key")    ? "key_id"
                                              : "sandbox_id";
    printf("%-25s  %14s  %12s  %14s\n",
           !strcmp(by, "day")      ? "DAY"
           : !strcmp(by, "minute") ? "MINUTE"
           : !strcmp(by, "key")    ? "KEY"
                                   : "SANDBOX",
           "COST", "CPU (s)", "MEMORY (GiB-h)");
    json_t *names = !strcmp(by, "key") ? cli_key_names(c) : json_object();
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(res, "rows"), i, row)
    {
        char cost[32];
        usd_format(json_integer_value(json_object_get(row, "cost_micros")), cost, sizeof(cost));
        long long cpu = json_integer_value(json_object_get(row, "cpu_usec"));
        long long mem = json_integer_value(json_object_get(row, "memory_mib_ms"));
        /* GiB-hours with four decimals, in integers: mib_ms / (1024 * 3.6e6) */
        long long gh4 = (long long)((__int128)mem * 10000 / (1024LL * 3600000));
        printf("%-25.25s  %14s  %8lld.%03lld  %9lld.%04lld\n",
               !strcmp(by, "key") ? cli_key_label(names, row, col) : cli_shown(row, col, "(admin)"),
               cost, cpu / 1000000, (cpu / 1000) % 1000, gh4 / 10000, gh4 % 10000);
    }
    json_decref(names);
    char total[32];
    usd_format(json_integer_value(json_object_get(res, "total_micros")), total, sizeof(total));
    printf("%-25s  %14s%s\n", "TOTAL", total,
           json_is_true(json_object_get(res, "truncated")) ? "  (the first 10000 groups only)"
                                                           : "");
    json_decref(res);
    return CLI_EXIT_OK;
}
