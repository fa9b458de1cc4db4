/*
 * `withruntime completion bash|zsh`: a completion script made from the command table
 * (table.c), the one the dispatcher runs: commands, subcommands (aliases too), their options,
 * the values of options that take one of a few words, and operands such as bash|zsh. Nothing
 * is asked of the daemon while completing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static bool is_group(const struct cli_command *cmd)
{
    return cmd->fn == NULL;
}

/* Prints s single-quoted for a shell; with colons escaped for zsh's _describe if zsh_desc. */
static void put_quoted(FILE *f, const char *s, bool zsh_desc)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", f);
        else if (zsh_desc && *s == ':')
            fputs("\\:", f);
        else
            fputc(*s, f);
    }
    fputc('\'', f);
}

/* Calls fn for each option of cmd: its name ("--image"), whether it takes a value, and the
 * words it takes ("stop delete") or NULL. --help is always one. */
typedef void (*opt_fn)(FILE *f, const char *name, bool value, const char *choices, void *arg);

static void each_option(const struct cli_command *cmd, FILE *f, opt_fn fn, void *arg)
{
    const char *p = cmd->options ? cmd->options : "";
    while (*p) {
        p += strspn(p, " ");
        size_t len = strcspn(p, " ");
        if (len == 0)
            break;
        char word[160];
        snprintf(word, sizeof(word), "%.*s", (int)len, p);
        p += len;
        char *eq = strchr(word, '=');
        char choices[160] = "";
        if (eq) {
            *eq = '\0';
            snprintf(choices, sizeof(choices), "%s", eq + 1);
            for (char *c = choices; *c; c++)
                if (*c == '|')
                    *c = ' ';
        }
        fn(f, word, eq != NULL, choices[0] ? choices : NULL, arg);
    }
    for (const struct option *o = cmd->long_options; o && o->name; o++) {
        if (strcmp(o->name, "help") == 0)
            continue;
        char word[160];
        snprintf(word, sizeof(word), "--%s", o->name);
        fn(f, word, o->has_arg != no_argument, NULL, arg);
    }
    fn(f, "--help", false, NULL, arg);
}

/* The case pattern of a row: 'group name' and its aliases, or 'name'. */
static void put_pattern(FILE *f, const struct cli_command *cmd)
{
    char names[200];
    snprintf(names, sizeof(names), "%s%s%s", cmd->name, cmd->aliases ? " " : "",
             cmd->aliases ? cmd->aliases : "");
    bool first = true;
    for (const char *p = names; *p;) {
        size_t len = strcspn(p, " ");
        char one[200];
        snprintf(one, sizeof(one), "%s%s%.*s", cmd->group ? cmd->group : "", cmd->group ? " " : "",
                 (int)len, p);
        if (!first)
            fputc('|', f);
        put_quoted(f, one, false);
        first = false;
        p += len;
        p += strspn(p, " ");
    }
}

/* The names (and aliases) of the rows in group (NULL: top level), space-separated. */
static void put_names(FILE *f, const char *group)
{
    bool first = true;
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *cmd = &cli_commands[i];
        if ((group == NULL) != (cmd->group == NULL) || (group && strcmp(group, cmd->group)))
            continue;
        fprintf(f, "%s%s%s%s", first ? "" : " ", cmd->name, cmd->aliases ? " " : "",
                cmd->aliases ? cmd->aliases : "");
        first = false;
    }
}

static void put_groups(FILE *f)
{
    fputs(" ", f);
    for (size_t i = 0; i < cli_commands_count; i++)
        if (is_group(&cli_commands[i]))
            fprintf(f, "%s ", cli_commands[i].name);
}

/* ---- bash ---- */

static void bash_value_case(FILE *f, const char *name, bool value, const char *choices, void *arg)
{
    if (!value)
        return;
    if (choices)
        fprintf(f, "                %s) COMPREPLY=($(compgen -W '%s' -- \"$cur\")); return 0 ;;\n",
                name, choices);
    else
        fprintf(f, "                %s) return 0 ;;\n", name);
}

static void bash_word(FILE *f, const char *name, bool value, const char *choices, void *arg)
{
    bool *first = arg;
    fprintf(f, "%s%s", *first ? "" : " ", name);
    *first = false;
}

static void print_bash(FILE *f)
{
    fputs("# bash completion for withruntime, made by `withruntime completion bash`\n"
          "# from the command table. Use: source <(withruntime completion bash)\n"
          "_withruntime() {\n"
          "    local cur prev w i top='' sub='' words=''\n"
          "    local groups='",
          f);
    put_groups(f);
    fputs("'\n"
          "    cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
          "    prev=''\n"
          "    (( COMP_CWORD > 0 )) && prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
          "    COMPREPLY=()\n"
          "    for (( i = 1; i < COMP_CWORD; i++ )); do\n"
          "        w=\"${COMP_WORDS[i]}\"\n"
          "        case \"$w\" in\n"
          "            --) return 0 ;;\n"
          "            --state-dir) [[ -z $top ]] && (( i++ )) ;;\n"
          "            -*) ;;\n"
          "            *)\n"
          "                if [[ -z $top ]]; then top=\"$w\"\n"
          "                elif [[ -z $sub && $groups == *\" $top \"* ]]; then sub=\"$w\"\n"
          "                fi ;;\n"
          "        esac\n"
          "    done\n"
          "    if [[ -z $top ]]; then\n"
          "        [[ $prev == --state-dir ]] && return 0\n"
          "        words='",
          f);
    put_names(f, NULL);
    fputs(" --state-dir --help --version'\n"
          "    elif [[ -z $sub && $groups == *\" $top \"* ]]; then\n"
          "        case \"$top\" in\n",
          f);
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *g = &cli_commands[i];
        if (!is_group(g))
            continue;
        fprintf(f, "            %s) words='", g->name);
        put_names(f, g->name);
        fputs(" --help' ;;\n", f);
    }
    fputs("        esac\n"
          "    else\n"
          "        local key=\"$top\"\n"
          "        [[ -n $sub ]] && key=\"$top $sub\"\n"
          "        case \"$key\" in\n",
          f);
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *cmd = &cli_commands[i];
        if (is_group(cmd))
            continue;
        fputs("            ", f);
        put_pattern(f, cmd);
        fputs(")\n            case \"$prev\" in\n", f);
        each_option(cmd, f, bash_value_case, NULL);
        fputs("            esac\n            words='", f);
        bool first = true;
        each_option(cmd, f, bash_word, &first);
        if (cmd->operands)
            fprintf(f, " %s", cmd->operands);
        fputs("' ;;\n", f);
    }
    fputs("        esac\n"
          "    fi\n"
          "    COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
          "}\n"
          "complete -o default -F _withruntime withruntime\n",
          f);
}

/* ---- zsh ---- */

static void zsh_value_case(FILE *f, const char *name, bool value, const char *choices, void *arg)
{
    if (!value)
        return;
    if (choices)
        fprintf(f, "                %s) compadd -- %s; return ;;\n", name, choices);
    else
        fprintf(f, "                %s) _default; return ;;\n", name);
}

static void zsh_word(FILE *f, const char *name, bool value, const char *choices, void *arg)
{
    fprintf(f, " %s", name);
}

/* (name:summary ...) for _describe, for the rows of group (NULL: top level). */
static void zsh_described(FILE *f, const char *group)
{
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *cmd = &cli_commands[i];
        if ((group == NULL) != (cmd->group == NULL) || (group && strcmp(group, cmd->group)))
            continue;
        /* the name's colon separates; the summary's are escaped */
        fputs(" '", f);
        fputs(cmd->name, f);
        fputs(":'", f);
        put_quoted(f, cmd->summary, true);
        if (cmd->aliases) {
            char al[200];
            snprintf(al, sizeof(al), "%s", cmd->aliases);
            for (char *save = NULL, *a = strtok_r(al, " ", &save); a;
                 a = strtok_r(NULL, " ", &save)) {
                fprintf(f, " '%s:'", a);
                put_quoted(f, cmd->summary, true);
            }
        }
    }
}

static void print_zsh(FILE *f)
{
    fputs("#compdef withruntime\n"
          "# zsh completion for withruntime, made by `withruntime completion zsh` from the\n"
          "# command table. Use (after compinit): source <(withruntime completion zsh)\n"
          "_withruntime() {\n"
          "    local top='' sub='' w i prev\n"
          "    local -a cmds\n"
          "    local groups='",
          f);
    put_groups(f);
    fputs("'\n"
          "    for (( i = 2; i < CURRENT; i++ )); do\n"
          "        w=${words[i]}\n"
          "        case $w in\n"
          "            --) _default; return ;;\n"
          "            --state-dir) [[ -z $top ]] && (( i++ )) ;;\n"
          "            -*) ;;\n"
          "            *)\n"
          "                if [[ -z $top ]]; then top=$w\n"
          "                elif [[ -z $sub && $groups == *\" $top \"* ]]; then sub=$w\n"
          "                fi ;;\n"
          "        esac\n"
          "    done\n"
          "    prev=${words[CURRENT-1]}\n"
          "    if [[ -z $top ]]; then\n"
          "        [[ $prev == --state-dir ]] && { _files -/; return; }\n"
          "        if [[ ${words[CURRENT]} == -* ]]; then\n"
          "            compadd -- --state-dir --help --version\n"
          "        else\n"
          "            cmds=(",
          f);
    zsh_described(f, NULL);
    fputs(")\n"
          "            _describe -t commands 'withruntime command' cmds\n"
          "        fi\n"
          "        return\n"
          "    fi\n"
          "    if [[ -z $sub && $groups == *\" $top \"* ]]; then\n"
          "        case $top in\n",
          f);
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *g = &cli_commands[i];
        if (!is_group(g))
            continue;
        fprintf(f, "            %s) cmds=(", g->name);
        zsh_described(f, g->name);
        fputs(") ;;\n", f);
    }
    fputs("        esac\n"
          "        _describe -t commands \"withruntime $top command\" cmds\n"
          "        return\n"
          "    fi\n"
          "    local key=$top\n"
          "    [[ -n $sub ]] && key=\"$top $sub\"\n"
          "    case $key in\n",
          f);
    for (size_t i = 0; i < cli_commands_count; i++) {
        const struct cli_command *cmd = &cli_commands[i];
        if (is_group(cmd))
            continue;
        fputs("        ", f);
        put_pattern(f, cmd);
        fputs(")\n            case $prev in\n", f);
        each_option(cmd, f, zsh_value_case, NULL);
        fputs("            esac\n            compadd --", f);
        each_option(cmd, f, zsh_word, NULL);
        if (cmd->operands)
            fprintf(f, " %s", cmd->operands);
        fputs(" ;;\n", f);
    }
    fputs("    esac\n"
          "}\n"
          "compdef _withruntime withruntime\n",
          f);
}

int cli_cmd_completion(struct cli_ctx *c, int argc, char **argv)
{
    if (argc != 2)
        return cli_usage_error("completion", "expected a shell: bash or zsh");
    if (strcmp(argv[1], "bash") == 0)
        print_bash(stdout);
    else if (strcmp(argv[1], "zsh") == 0)
        print_zsh(stdout);
    else
        return cli_usage_error("completion", "unknown shell '%s' (bash or zsh)", argv[1]);
    (void)c;
    return CLI_EXIT_OK;
}
