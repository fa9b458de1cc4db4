/*
 * The small subcommands: `login` and `logout` (the saved connection that lets a user reach a
 * daemon on another host without exporting RUNTIME_URL in every shell), `version`, and the
 * top-level usage text.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/util.h"

static const char usage_top[] =
    "Usage: withruntime [--state-dir DIR] COMMAND [ARGS...]\n"
    "\n"
    "Disposable Linux sandboxes for AI agents.\n"
    "\n"
    "Commands:\n"
    "  sandbox run -- CMD...   run one command in a fresh sandbox, then delete it\n"
    "  sandbox ...             create, list, get, exec, cat, write, ls, rm sandboxes\n"
    "  image build [NAME]      build an image's root filesystem (root only)\n"
    "  image list              list built images\n"
    "  serve [OPTIONS]         run the daemon (see 'withruntime serve --help')\n"
    "  secrets set|list|rm     secrets bound to hosts, never seen inside a sandbox\n"
    "  keys create|list|set|revoke  API keys and their limits (the admin's)\n"
    "  usage                   what sandboxes cost: by sandbox, key or day\n"
    "  audit                   who did what (the admin's)\n"
    "  doctor                  say which sandbox drivers this host can run, and why not\n"
    "  login URL [--key KEY]   save the daemon to use (~/.config/withruntime/connection.json)\n"
    "  logout                  forget the saved daemon\n"
    "  version                 print the version\n"
    "  help [COMMAND]          this help, or a command's\n"
    "\n"
    "Global options:\n"
    "  --state-dir DIR   the local daemon's state directory (default\n"
    "                    $WITHRUNTIME_STATE_DIR, else /var/lib/withruntime); given\n"
    "                    explicitly, it also means: use that daemon's socket, not\n"
    "                    RUNTIME_URL or a saved login\n"
    "\n"
    "Finding the daemon: RUNTIME_URL (http://HOST:PORT or unix:/path.sock) with\n"
    "RUNTIME_API_KEY; else the connection saved by 'withruntime login'; else the\n"
    "Unix socket DIR/withruntime.sock, where a root user's command starts a daemon\n"
    "(log in DIR/daemon.log) when none is running. RUNTIME_API_KEY, when set, is\n"
    "sent as the bearer key in every case.\n"
    "\n"
    "Exit status: 0 on success, 1 on errors, 2 on usage errors; 'sandbox run' and\n"
    "'sandbox exec' exit with the command's status.\n";

static const char usage_login[] =
    "Usage: withruntime login URL [--key KEY|-]\n"
    "\n"
    "Saves URL (http://HOST:PORT or unix:/path.sock) and an API key as the daemon to\n"
    "use when RUNTIME_URL is not set, in ~/.config/withruntime/connection.json (mode\n"
    "0600). '--key -' reads the key from the first line of stdin. The daemon is\n"
    "asked for its health; the connection is saved even if it does not answer.\n";

static const char usage_logout[] = "Usage: withruntime logout\n"
                                   "\n"
                                   "Forgets the connection saved by 'withruntime login'.\n";

static const char usage_version[] = "Usage: withruntime version\n";

void cli_usage(FILE *f)
{
    fputs(usage_top, f);
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

int cli_cmd_login(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"key", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *key = NULL;
    char keybuf[512];
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "hk:", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': fputs(usage_login, stdout); return CLI_EXIT_OK;
        case 'k': key = optarg; break;
        default:
            return cli_usage_error("login", "unknown option, or missing value: '%s'",
                                   argv[optind - 1]);
        }
    }
    if (argc - optind != 1)
        return cli_usage_error("login", "expected one URL");
    const char *url = argv[optind];
    struct cli_endpoint ep = {0};
    struct wr_err err = {0};
    if (cli_url_parse(url, &ep.url, &err) < 0)
        return cli_usage_error("login", "%s", err.msg);
    snprintf(ep.desc, sizeof(ep.desc), "%s", url);
    if (key && strcmp(key, "-") == 0) {
        if (read_key_stdin(keybuf, sizeof(keybuf)) < 0)
            return cli_usage_error("login", "no key on stdin");
        key = keybuf;
    }
    if (key) {
        for (const char *p = key; *p; p++)
            if ((unsigned char)*p <= ' ' || *p == 0x7f)
                return cli_usage_error("login", "the key has spaces or control characters");
        snprintf(ep.key, sizeof(ep.key), "%s", key);
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

    if (cli_connection_save(url, key, &err) < 0)
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
    if (cli_wants_help(argc, argv)) {
        fputs(usage_logout, stdout);
        return CLI_EXIT_OK;
    }
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
    if (cli_wants_help(argc, argv)) {
        fputs(usage_version, stdout);
        return CLI_EXIT_OK;
    }
    if (argc > 1)
        return cli_usage_error("version", "unexpected argument '%s'", argv[1]);
    printf("withruntime %s\n", WR_VERSION);
    (void)c;
    return CLI_EXIT_OK;
}
