/*
 * The CLI's command table (src/cli/table.c): every row is whole (a summary, a help text with an
 * example, options written as completion reads them), names are unique where they are looked
 * up, every subcommand's group is a group, and the dispatcher finds each row by its name and
 * its aliases.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "tap.h"

/* Options as completion reads them: space-separated --words, each maybe "=" and choices. */
static int options_ok(const char *s)
{
    if (!s)
        return 1;
    for (const char *p = s; *p;) {
        p += strspn(p, " ");
        size_t len = strcspn(p, " ");
        if (len == 0)
            break;
        if (len < 3 || strncmp(p, "--", 2) != 0)
            return 0;
        for (size_t i = 2; i < len; i++)
            if (!strchr("abcdefghijklmnopqrstuvwxyz0123456789-=|ABCDEFGHIJKLMNOPQRSTUVWXYZ", p[i]))
                return 0;
        p += len;
    }
    return 1;
}

int main(void)
{
    ok(cli_commands_count > 30, "the table has %zu rows", cli_commands_count);
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *cmd = &cli_commands[i];
        char name[80];
        snprintf(name, sizeof(name), "%s%s%s", cmd->group ? cmd->group : "", cmd->group ? " " : "",
                 cmd->name);
        ok(cmd->summary && cmd->summary[0] && !strchr(cmd->summary, '\n'), "%s: a summary", name);
        ok(cmd->print_help || (cmd->help && strstr(cmd->help, "Example")),
           "%s: --help with an example", name);
        ok(options_ok(cmd->options), "%s: options for completion are well formed", name);
        ok(cmd->args != NULL, "%s: a synopsis", name);
        if (cmd->group) {
            const struct cli_command *g = cli_command_find(NULL, cmd->group);
            ok(g && g->fn == NULL, "%s: its group is a group", name);
            ok(cmd->fn != NULL, "%s: a subcommand runs something", name);
        }
        ok(cli_command_find(cmd->group, cmd->name) == cmd, "%s: found by its name (once)", name);
        if (cmd->aliases) {
            char al[128];
            snprintf(al, sizeof(al), "%s", cmd->aliases);
            for (char *save = NULL, *a = strtok_r(al, " ", &save); a;
                 a = strtok_r(NULL, " ", &save))
                ok(cli_command_find(cmd->group, a) == cmd, "%s: found by its alias %s", name, a);
        }
        for (size_t j = 0; j < i; j++) {
            const struct cli_command *o = &cli_commands[j];
            int same_group = (!o->group && !cmd->group) ||
                             (o->group && cmd->group && !strcmp(o->group, cmd->group));
            if (same_group && !strcmp(o->name, cmd->name))
                ok(0, "%s: named twice", name);
        }
    }
    ok(cli_command_find("sandbox", "nope") == NULL && cli_command_find(NULL, "run") == NULL,
       "unknown names and subcommands out of their group are not found");

    /* exit codes of failures that are not the daemon's answers */
    struct wr_err err = {0};
    wr_err_set(&err, 2, "a local file");
    ok(cli_exit_code(&err) == CLI_EXIT_ERR, "a local failure exits 1");
    err.kind = WR_E_UNAVAILABLE;
    ok(cli_exit_code(&err) == CLI_EXIT_DAEMON, "an unreachable daemon exits 5");
    return tap_done();
}
