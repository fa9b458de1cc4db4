/*
 * `withruntime sandbox create`, and the options it shares with `run` (image, limits,
 * environment, metadata) gathered into one create request body.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/sandbox.h"

void cli_create_opts_init(struct cli_create_opts *co)
{
    co->body = json_object();
    co->env = json_object();
    co->metadata = json_object();
    co->allow = json_array();
    co->deny = json_array();
    co->secrets = json_array();
    co->internet = false;
}

int cli_create_opt(const char *cmd, struct cli_create_opts *co, int opt, const char *arg)
{
    long v;
    switch (opt) {
    case OPT_IMAGE: json_object_set_new(co->body, "image", json_string(arg)); return 1;
    case OPT_CPUS:
        if (cli_parse_long(arg, 1, 1024, &v) < 0)
            return cli_usage_error(cmd, "--cpus wants a whole number from 1 to 1024, got '%s'",
                                   arg);
        json_object_set_new(co->body, "cpus", json_integer(v));
        return 1;
    case OPT_MEMORY:
        if (cli_parse_long(arg, 128, 65536, &v) < 0)
            return cli_usage_error(
                cmd, "--memory wants MiB, a whole number from 128 to 65536, got '%s'", arg);
        json_object_set_new(co->body, "memory_mib", json_integer(v));
        return 1;
    case OPT_DISK:
        if (cli_parse_long(arg, 64, 1048576, &v) < 0)
            return cli_usage_error(
                cmd, "--disk wants MiB, a whole number from 64 to 1048576, got '%s'", arg);
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
    case OPT_INTERNET: co->internet = true; return 1;
    case OPT_ALLOW:
    case OPT_DENY:
        /* checked by the daemon, which names a bad entry */
        json_array_append_new(opt == OPT_ALLOW ? co->allow : co->deny, json_string(arg));
        co->internet = true;
        return 1;
    case OPT_SECRET: json_array_append_new(co->secrets, json_string(arg)); return 1;
    default: return 0;
    }
}

json_t *cli_create_opts_body(struct cli_create_opts *co)
{
    if (json_object_size(co->env))
        json_object_set(co->body, "env", co->env);
    if (json_object_size(co->metadata))
        json_object_set(co->body, "metadata", co->metadata);
    if (json_array_size(co->secrets))
        json_object_set(co->body, "secrets", co->secrets);
    if (co->internet) {
        json_t *net = json_pack("{s:b}", "internet", 1);
        if (json_array_size(co->allow))
            json_object_set(net, "allow", co->allow);
        if (json_array_size(co->deny))
            json_object_set(net, "deny", co->deny);
        json_object_set_new(co->body, "network", net);
    }
    return co->body;
}

void cli_create_opts_free(struct cli_create_opts *co)
{
    json_decref(co->body);
    json_decref(co->env);
    json_decref(co->metadata);
    json_decref(co->allow);
    json_decref(co->deny);
    json_decref(co->secrets);
}

int cli_create_failed(const struct wr_err *err)
{
    int code = cli_fail(err);
    if (strstr(err->msg, "withruntime image build") == NULL && strstr(err->msg, "image") &&
        (strstr(err->msg, "not built") || strstr(err->msg, "not found")))
        fprintf(stderr, "withruntime: build it with 'withruntime image build' (as root)\n");
    return code;
}

int cli_sandbox_create(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"image", required_argument, 0, OPT_IMAGE},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"cpus", required_argument, 0, OPT_CPUS},
        {"memory", required_argument, 0, OPT_MEMORY},
        {"disk", required_argument, 0, OPT_DISK},
        {"env", required_argument, 0, OPT_ENV},
        {"metadata", required_argument, 0, OPT_METADATA},
        {"internet", no_argument, 0, OPT_INTERNET},
        {"allow", required_argument, 0, OPT_ALLOW},
        {"deny", required_argument, 0, OPT_DENY},
        {"secret", required_argument, 0, OPT_SECRET},
        {"on-lease-end", required_argument, 0, OPT_LEASE_END},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox create";
    struct cli_create_opts co;
    cli_create_opts_init(&co);
    bool as_json = false;
    long v;
    int code = CLI_EXIT_OK;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int r = cli_create_opt(cmd, &co, opt, optarg);
        if (r == 1)
            continue;
        if (r != 0) {
            code = r;
            goto out;
        }
        switch (opt) {
        case 'h': code = cli_print_help(); goto out;
        case OPT_TIMEOUT:
            if (cli_parse_long(optarg, 1, CLI_MAX_SECONDS, &v) < 0) {
                code = cli_usage_error(cmd, "--timeout wants seconds, 1..%d, got '%s'",
                                       CLI_MAX_SECONDS, optarg);
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
        default: code = cli_bad_option(cmd, argc, argv); goto out;
        }
    }
    if (optind < argc) {
        code = cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
        goto out;
    }
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0) {
        code = ep_rc;
        goto out;
    }
    struct wr_err err = {0};
    json_t *sb = NULL;
    if (cli_json_call(ep, "POST", "/v1/sandboxes", cli_create_opts_body(&co), &sb, &err) < 0) {
        code = cli_create_failed(&err);
        goto out;
    }
    if (as_json)
        cli_print_json(sb);
    else
        printf("%s\n", cli_str_or(sb, "id", ""));
    json_decref(sb);
out:
    cli_create_opts_free(&co);
    return code;
}
