/*
 * Running the command table (table.c): finding a command's row from the words typed, its
 * --help, the group and top-level help made from the rows, `withruntime help` (with
 * --markdown, the reference docs/cli.md holds), and the exit codes every command shares.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* The row being run, for cli_print_help. */
static const struct cli_command *g_current;

static const char usage_head[] = "Usage: withruntime [--state-dir DIR] COMMAND [ARGS...]\n"
                                 "\n"
                                 "Disposable Linux sandboxes for AI agents.\n"
                                 "\n"
                                 "Commands:\n";

static const char usage_tail[] =
    "\n"
    "Run 'withruntime COMMAND --help' (or 'withruntime help COMMAND') for a command's\n"
    "options; 'withruntime sandbox --help' lists the sandbox commands.\n"
    "\n"
    "Global options:\n"
    "  --state-dir DIR   the local daemon's state directory (default\n"
    "                    $WITHRUNTIME_STATE_DIR, else /var/lib/withruntime); given\n"
    "                    explicitly, it also means: use that daemon's socket, not\n"
    "                    RUNTIME_URL or a saved login\n"
    "  -h, --help        this help\n"
    "  --version         print the version\n"
    "\n"
    "Finding the daemon: RUNTIME_URL (https://HOST:PORT, http://HOST:PORT or\n"
    "unix:/path.sock) with RUNTIME_API_KEY; else the connection saved by\n"
    "'withruntime login'; else the Unix socket DIR/withruntime.sock, where a root\n"
    "user's command starts a daemon (log in DIR/daemon.log) when none is running.\n"
    "A daemon serving DIR on another socket (serve --socket) is found from the\n"
    "record it keeps in DIR/daemon.lock: no second daemon is started for DIR.\n"
    "RUNTIME_API_KEY, when set, is sent as the bearer key in every case. An https\n"
    "daemon's certificate must chain to the system's CAs, or to RUNTIME_CA_FILE (a\n"
    "PEM file) when set, and name the URL's host. A key is never sent over plain\n"
    "http:// to a host other than loopback (127.0.0.0/8, ::1, localhost).\n"
    "\n"
    "Output: read commands print a table or a field a line; --json prints the API's\n"
    "answer as it is (list, get, stats, events, commands, logs, ls, usage, audit,\n"
    "keys list, secrets list, image list). In tables and messages, text from a\n"
    "sandbox or the daemon (file names, paths, command lines) shows control\n"
    "characters as \\n, \\r, \\t, \\xNN (ESC is \\x1b), C1 controls as \\u0080..\\u009f\n"
    "and bytes that are not UTF-8 as \\xNN: a planted name cannot drive the\n"
    "terminal. What a command prints (exec, run, cat, logs) is passed as it is.\n"
    "\n"
    "Exit status, the same for every command:\n"
    "  0    success\n"
    "  1    an error on this side: a local file, our stdout, an answer that makes\n"
    "       no sense, an interrupted request\n"
    "  2    usage: an unknown command or option, a bad value, a malformed\n"
    "       RUNTIME_URL (nothing was sent)\n"
    "  3    not found: no such sandbox, command, file, key or secret (HTTP 404)\n"
    "  4    refused by the daemon: a bad request, no or a wrong key, a read-only\n"
    "       key, the sandbox not running, a cost limit (any other HTTP 4xx)\n"
    "  5    the daemon could not be reached, or failed (HTTP 5xx)\n"
    "  6    no room for a sandbox now: the host's memory or disk, or a limit of\n"
    "       `serve` (HTTP 503 capacity); the message says what frees it\n"
    "'sandbox run' and 'sandbox exec' exit with the command's own status once it\n"
    "ran: 128+N if signal N ended it, 124 if it timed out, 127 if it could not\n"
    "start, 5 if the sandbox failed under it, 130 (128+N) if we were interrupted.\n"
    "'sandbox logs --follow' exits with a background command's status the same way\n"
    "(1 if it failed: it could not start, or its sandbox stopped under it).\n"
    "\n"
    "Example:\n"
    "  withruntime sandbox run -- python3 -c 'print(6 * 7)'\n";

static bool is_help_word(const char *s)
{
    return strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0;
}

static bool is_group(const struct cli_command *cmd)
{
    return cmd->fn == NULL;
}

/* True if name is cmd's name or one of its aliases. */
static bool name_matches(const struct cli_command *cmd, const char *name)
{
    if (strcmp(cmd->name, name) == 0)
        return true;
    const char *a = cmd->aliases;
    size_t n = strlen(name);
    while (a && *a) {
        size_t len = strcspn(a, " ");
        if (len == n && strncmp(a, name, n) == 0)
            return true;
        a += len;
        a += strspn(a, " ");
    }
    return false;
}

const struct cli_command *cli_command_find(const char *group, const char *name)
{
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *cmd = &cli_commands[i];
        if ((group == NULL) != (cmd->group == NULL))
            continue;
        if (group && strcmp(group, cmd->group) != 0)
            continue;
        if (name_matches(cmd, name))
            return cmd;
    }
    return NULL;
}

/* "  name args      summary" lines for the rows of group (NULL: the top level). */
static void print_list(FILE *f, const char *group)
{
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *cmd = &cli_commands[i];
        if ((group == NULL) != (cmd->group == NULL) || (group && strcmp(group, cmd->group)))
            continue;
        char left[160];
        snprintf(left, sizeof(left), "%s%s%s", cmd->name, cmd->args && *cmd->args ? " " : "",
                 cmd->args ? cmd->args : "");
        if (strlen(left) <= 34)
            fprintf(f, "  %-34s  %s\n", left, cmd->summary);
        else
            fprintf(f, "  %s\n  %-34s  %s\n", left, "", cmd->summary);
    }
}

void cli_usage(FILE *f)
{
    fputs(usage_head, f);
    print_list(f, NULL);
    fputs(usage_tail, f);
}

void cli_command_help(const struct cli_command *cmd, FILE *f)
{
    if (cmd->print_help) {
        cmd->print_help(f);
        return;
    }
    fprintf(f, "Usage: withruntime %s%s%s%s%s\n", cmd->group ? cmd->group : "",
            cmd->group ? " " : "", cmd->name, cmd->args && *cmd->args ? " " : "",
            cmd->args ? cmd->args : "");
    if (cmd->aliases)
        fprintf(f, "Also: %s\n", cmd->aliases);
    fputs("\n", f);
    if (is_group(cmd)) {
        fprintf(f, "%c%s.\n\nCommands:\n", toupper((unsigned char)cmd->summary[0]),
                cmd->summary + 1);
        print_list(f, cmd->name);
        fputs("\n", f);
    }
    fputs(cmd->help, f);
    if (is_group(cmd))
        fprintf(f, "\nRun 'withruntime %s COMMAND --help' for a command's options.\n", cmd->name);
}

int cli_print_help(void)
{
    if (g_current)
        cli_command_help(g_current, stdout);
    else
        cli_usage(stdout);
    return CLI_EXIT_OK;
}

static int run(const struct cli_command *cmd, struct cli_ctx *c, int argc, char **argv)
{
    g_current = cmd;
    if (!cmd->print_help && argc > 1 && is_help_word(argv[1]))
        return cli_print_help();
    return cmd->fn(c, argc, argv);
}

int cli_dispatch(struct cli_ctx *c, int argc, char **argv)
{
    const struct cli_command *top = cli_command_find(NULL, argv[0]);
    if (!top)
        return cli_usage_error("", "unknown command '%s'", argv[0]);
    if (!is_group(top))
        return run(top, c, argc, argv);
    g_current = top;
    if (argc < 2)
        return cli_usage_error(top->name, "missing command");
    if (is_help_word(argv[1]) || strcmp(argv[1], "help") == 0)
        return cli_print_help();
    const struct cli_command *sub = cli_command_find(top->name, argv[1]);
    if (!sub)
        return cli_usage_error(top->name, "unknown command '%s'", argv[1]);
    return run(sub, c, argc - 1, argv + 1);
}

/* The reference of every command, as docs/cli.md holds it. */
static void print_markdown(void)
{
    printf("# The `withruntime` command line\n"
           "\n"
           "<!-- Made by `withruntime help --markdown` from the command table (src/cli/table.c);\n"
           "     tests/e2e/test_cli_cover.py checks that it matches. Edit the table, then run\n"
           "     `make docs`. -->\n"
           "\n"
           "Every command below answers `--help` with the same text. Shell completion:\n"
           "`source <(withruntime completion bash)` (or `zsh`).\n"
           "\n"
           "```\n");
    cli_usage(stdout);
    printf("```\n");
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *cmd = &cli_commands[i];
        printf("\n## withruntime %s%s%s\n\n```\n", cmd->group ? cmd->group : "",
               cmd->group ? " " : "", cmd->name);
        cli_command_help(cmd, stdout);
        printf("```\n");
    }
}

int cli_cmd_help(struct cli_ctx *c, int argc, char **argv)
{
    if (argc == 1) {
        cli_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (argv[1][0] == '-' && cli_wants_help(argc, argv))
        return cli_print_help();
    if (argc == 2 && strcmp(argv[1], "--markdown") == 0) {
        print_markdown();
        return CLI_EXIT_OK;
    }
    if (argv[1][0] == '-')
        return cli_usage_error("help", "unknown option '%s'", argv[1]);
    /* `help sandbox run` is `sandbox run --help`. */
    int n = argc - 1;
    char **av = calloc((size_t)n + 2, sizeof(*av));
    if (!av)
        return CLI_EXIT_ERR;
    for (int j = 0; j < n; j++)
        av[j] = argv[1 + j];
    av[n] = "--help";
    int r = cli_dispatch(c, n + 1, av);
    free(av);
    return r;
}

int cli_exit_code(const struct wr_err *err)
{
    if (err->code == CLI_EAPI) {
        if (err->kind == WR_E_NOT_FOUND)
            return CLI_EXIT_NOT_FOUND;
        if (err->kind == WR_E_UNAVAILABLE)
            return CLI_EXIT_DAEMON;
        if (err->kind == WR_E_CAPACITY)
            return CLI_EXIT_CAPACITY;
        return CLI_EXIT_REFUSED;
    }
    return err->kind == WR_E_UNAVAILABLE ? CLI_EXIT_DAEMON : CLI_EXIT_ERR;
}
