/*
 * The small subcommands: `login` and `logout` (the saved connection that lets a user reach a
 * daemon on another host without exporting RUNTIME_URL in every shell), `version`, and `serve`
 * (the daemon itself, in api/serve.c).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "api/api.h"
#include "cli/cli.h"
#include "common/util.h"

int cli_cmd_serve(struct cli_ctx *c, int argc, char **argv)
{
    if (!c->state_dir_explicit)
        return api_serve_main(argc, argv);
    /* `withruntime --state-dir D serve ...`: D goes first, so a --state-dir after serve wins. */
    char **av = calloc((size_t)argc + 3, sizeof(*av));
    if (!av) {
        cli_errorf("out of memory");
        return CLI_EXIT_ERR;
    }
    av[0] = argv[0];
    av[1] = "--state-dir";
    av[2] = c->state_dir;
    for (int i = 1; i < argc; i++)
        av[i + 2] = argv[i];
    int r = api_serve_main(argc + 2, av);
    free(av);
    return r;
}

bool cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return false;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return true;
    }
    return false;
}

static int read_key_stdin(char *buf, size_t len)
{
    if (!fgets(buf, (int)len, stdin))
        return -1;
    buf[strcspn(buf, "\r\n")] = '\0';
    return buf[0] ? 0 : -1;
}

/* Asks for the key on the terminal (stdin), not echoed. Returns 0 (buf "" for none), or -1. */
static int read_key_prompt(const char *url, char *buf, size_t len)
{
    struct termios old, quiet;
    if (tcgetattr(0, &old) < 0)
        return -1;
    quiet = old;
    quiet.c_lflag &= ~(tcflag_t)ECHO;
    quiet.c_lflag |= ECHONL;
    /* Echo off before the prompt is out: whatever is typed after it is never shown. */
    tcsetattr(0, TCSAFLUSH, &quiet);
    fprintf(stderr, "API key for %s (not shown; empty for none): ", url);
    fflush(stderr);
    char *got = fgets(buf, (int)len, stdin);
    tcsetattr(0, TCSAFLUSH, &old);
    if (!got)
        return -1;
    buf[strcspn(buf, "\r\n")] = '\0';
    return 0;
}

int cli_cmd_login(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"key", required_argument, 0, 'k'},
        {"ca-file", required_argument, 0, 'c'},
        {"url", required_argument, 0, 'u'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *key = NULL, *url_opt = NULL;
    const char *ca_arg = NULL;
    char keybuf[512];
    char ca_file[PATH_MAX] = "";
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "hk:", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': return cli_print_help();
        case 'k': key = optarg; break;
        case 'c': ca_arg = optarg; break;
        case 'u': url_opt = optarg; break;
        default:
            return cli_usage_error("login", "unknown option, or missing value: '%s'",
                                   argv[optind - 1]);
        }
    }
    if (argc - optind != (url_opt ? 0 : 1))
        return cli_usage_error("login", "expected one URL (as an argument or --url)");
    const char *url = url_opt ? url_opt : argv[optind];
    struct cli_endpoint ep = {0};
    struct wr_err err = {0};
    if (cli_url_parse(url, &ep.url, &err) < 0)
        return cli_usage_error("login", "%s", err.msg);
    snprintf(ep.desc, sizeof(ep.desc), "%s", url);
    if (ca_arg) {
        if (!ep.url.tls)
            return cli_usage_error("login", "--ca-file is for https:// URLs");
        /* saved absolute: later commands run from anywhere */
        if (!realpath(ca_arg, ca_file) || access(ca_file, R_OK) < 0) {
            cli_errorf("login: cannot read the CA file %s: %s", ca_arg, strerror(errno));
            return CLI_EXIT_ERR;
        }
        snprintf(ep.ca_file, sizeof(ep.ca_file), "%s", ca_file);
    } else if (getenv("RUNTIME_CA_FILE")) {
        snprintf(ep.ca_file, sizeof(ep.ca_file), "%s", getenv("RUNTIME_CA_FILE"));
    }
    if (key && strcmp(key, "-") == 0) {
        if (read_key_stdin(keybuf, sizeof(keybuf)) < 0)
            return cli_usage_error("login", "no key on stdin");
        key = keybuf;
    } else if (key) {
        cli_errorf("warning: a key given as '--key KEY' is visible to other users of this "
                   "machine in the process list; use '--key -' (stdin) or the prompt instead");
    } else if (!ep.url.is_unix && isatty(0)) {
        if (read_key_prompt(url, keybuf, sizeof(keybuf)) < 0)
            return cli_usage_error("login", "no key read from the terminal");
        key = keybuf[0] ? keybuf : NULL;
    }
    if (key) {
        for (const char *p = key; *p; p++)
            if ((unsigned char)*p <= ' ' || *p == 0x7f)
                return cli_usage_error("login", "the key has spaces or control characters");
        snprintf(ep.key, sizeof(ep.key), "%s", key);
    }
    if (ep.key[0] && !cli_url_key_safe(&ep.url)) {
        cli_errorf("login: refusing to send or save a key for %s: over plain http:// to a host "
                   "that is not loopback it would cross the network readable; use https:// (the "
                   "daemon's serve --tls-cert) or an SSH tunnel to a loopback address",
                   url);
        return CLI_EXIT_ERR;
    }

    struct cli_request req;
    cli_request_init(&req, "GET", "/v1/health");
    req.timeout_ms = 5000;
    struct cli_response resp;
    struct wr_err herr = {0};
    if (cli_request_do(&ep, &req, &resp, &herr) < 0) {
        cli_errorf("warning: %s (saving the connection anyway)", herr.msg);
    } else {
        json_t *h = json_loadb(resp.body, resp.body_len, 0, NULL);
        const char *v = json_string_value(json_object_get(h, "version"));
        fprintf(stderr, "withruntime: the daemon at %s answers (version %s)\n", url,
                v ? v : "unknown");
        json_decref(h);
    }
    cli_response_free(&resp);

    if (cli_connection_save(url, key, ca_file, &err) < 0)
        return cli_fail(&err);
    char path[PATH_MAX];
    if (cli_connection_path(path, sizeof(path), &err) == 0)
        printf("Saved the connection to %s in %s\n", url, path);
    if (getenv("RUNTIME_URL") && getenv("RUNTIME_URL")[0])
        cli_errorf("note: RUNTIME_URL is set and takes precedence over the saved connection");
    (void)c;
    return CLI_EXIT_OK;
}

int cli_cmd_logout(struct cli_ctx *c, int argc, char **argv)
{
    if (cli_wants_help(argc, argv))
        return cli_print_help();
    if (argc > 1)
        return cli_usage_error("logout", "unexpected argument '%s'", argv[1]);
    char path[PATH_MAX];
    struct wr_err err = {0};
    if (cli_connection_path(path, sizeof(path), &err) < 0)
        return cli_fail(&err);
    if (unlink(path) < 0 && errno != ENOENT) {
        cli_errorf("cannot remove %s: %s", path, strerror(errno));
        return CLI_EXIT_ERR;
    }
    (void)c;
    return CLI_EXIT_OK;
}

int cli_cmd_version(struct cli_ctx *c, int argc, char **argv)
{
    if (cli_wants_help(argc, argv))
        return cli_print_help();
    if (argc > 1)
        return cli_usage_error("version", "unexpected argument '%s'", argv[1]);
    printf("withruntime %s\n", WR_VERSION);
    (void)c;
    return CLI_EXIT_OK;
}
