/*
 * Entry point of the single `withruntime` binary: the global options, then a table from the
 * first word to the subcommand that handles the rest (`serve` is the daemon itself). Kept out of
 * libwr.a so the library has no main().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api.h"
#include "cli/cli.h"

static int cmd_serve(struct cli_ctx *c, int argc, char **argv)
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

static const struct {
    const char *name;
    int (*fn)(struct cli_ctx *, int, char **);
} commands[] = {
    {"sandbox", cli_cmd_sandbox}, {"image", cli_cmd_image},     {"serve", cmd_serve},
    {"doctor", cli_cmd_doctor},   {"login", cli_cmd_login},     {"logout", cli_cmd_logout},
    {"version", cli_cmd_version}, {"secrets", cli_cmd_secrets}, {"keys", cli_cmd_keys},
    {"audit", cli_cmd_audit},     {"usage", cli_cmd_usage},
};

static int dispatch(struct cli_ctx *c, int argc, char **argv)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(commands[i].name, argv[0]) == 0)
            return commands[i].fn(c, argc, argv);
    return cli_usage_error("", "unknown command '%s'", argv[0]);
}

/* Sets the state directory, made absolute: an autostarted daemon runs from "/". */
static int set_state_dir(struct cli_ctx *c, const char *dir)
{
    if (!dir[0])
        return cli_usage_error("", "--state-dir wants a directory");
    char cwd[PATH_MAX];
    int n;
    if (dir[0] == '/')
        n = snprintf(c->state_dir, sizeof(c->state_dir), "%s", dir);
    else if (getcwd(cwd, sizeof(cwd)))
        n = snprintf(c->state_dir, sizeof(c->state_dir), "%s/%s", cwd, dir);
    else
        return cli_usage_error("", "cannot make '%s' absolute", dir);
    if (n < 0 || (size_t)n >= sizeof(c->state_dir))
        return cli_usage_error("", "state directory path too long");
    size_t len = strlen(c->state_dir);
    while (len > 1 && c->state_dir[len - 1] == '/')
        c->state_dir[--len] = '\0';
    return 0;
}

int main(int argc, char **argv)
{
    static struct cli_ctx c;
    const char *env = getenv("WITHRUNTIME_STATE_DIR");
    int r = set_state_dir(&c, env && env[0] ? env : CLI_DEFAULT_STATE_DIR);
    if (r != 0)
        return r;

    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--state-dir") == 0 || strncmp(a, "--state-dir=", 12) == 0) {
            const char *v = a[11] == '=' ? a + 12 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v)
                return cli_usage_error("", "--state-dir wants a directory");
            if ((r = set_state_dir(&c, v)) != 0)
                return r;
            c.state_dir_explicit = true;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(a, "--version") == 0) {
            printf("withruntime %s\n", WR_VERSION);
            return CLI_EXIT_OK;
        } else {
            return cli_usage_error("", "unknown option '%s'", a);
        }
    }
    if (i >= argc) {
        cli_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[i], "help") == 0) {
        if (i + 1 >= argc) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
        /* `help sandbox run` is `sandbox run --help`. */
        int n = argc - i;
        char **av = calloc((size_t)n + 1, sizeof(*av));
        if (!av)
            return CLI_EXIT_ERR;
        for (int j = 0; j < n - 1; j++)
            av[j] = argv[i + 1 + j];
        av[n - 1] = "--help";
        r = dispatch(&c, n, av);
        free(av);
        return r;
    }
    return dispatch(&c, argc - i, argv + i);
}
