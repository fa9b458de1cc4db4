/*
 * Entry point of the single `withruntime` binary: the global options, then the command table
 * (table.c, run by dispatch.c) from the first word to the subcommand that handles the rest
 * (`serve` is the daemon itself). Kept out of libwr.a so the library has no main().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "net/netproc.h"

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
    /* The daemon's own helper processes (net/netproc.h), started by it alone: not commands. */
    if (argc >= 2 && strcmp(argv[1], "__net") == 0)
        return netproc_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "__signer") == 0)
        return signerproc_main(argc - 1, argv + 1);
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
    return cli_dispatch(&c, argc - i, argv + i);
}
