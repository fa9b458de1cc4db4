/*
 * THE command table: every command and subcommand of `withruntime`, with its synopsis, its
 * one-line summary, its options (for shell completion) and its --help text. The dispatcher
 * (dispatch.c), the group and top-level help, `withruntime completion` and docs/cli.md are all
 * made from these rows, so a new command is one row here plus its function in a file of its own.
 *
 * A row with no fn is a group (sandbox, image, keys, secrets): its subcommands are the rows
 * whose group is its name. `options` lists a command's options for completion, space-separated:
 * "--json" takes no value, "--image=" takes one, "--by=sandbox|key|day" takes one of those.
 * `operands` lists the words offered for its operands, if any. `help` is what --help prints
 * after the "Usage:" line (made from group, name and args); every one has an example.
 */
#include "api/api.h"
#include "cli/cli.h"
#include "cli/sandbox.h"

/* clang-format off */
const struct cli_command cli_commands[] = {
    /* ---- sandbox ---- */
    {
        .name = "sandbox",
        .args = "COMMAND [ARGS...]",
        .summary = "create, use, stop, start and delete sandboxes",
        .help =
            "Sandboxes: disposable Linux machines. Create one, run commands and move files in\n"
            "and out, run commands in the background and read their output, stop it (its files\n"
            "are kept), start it again, delete it.\n"
            "\n"
            "Examples:\n"
            "  withruntime sandbox run -- python3 -c 'print(6 * 7)'\n"
            "  ID=$(withruntime sandbox create) && withruntime sandbox exec $ID -- uname -a\n",
    },
    {
        .group = "sandbox", .name = "run", .fn = cli_sandbox_run,
        .args = "[OPTIONS] -- CMD [ARG...]",
        .summary = "create a sandbox, run CMD in it, delete it",
        .options = "--image= --timeout= --cpus= --memory= --disk= --env= --internet --allow= "
                   "--deny= --secret= --cwd= --stdin --keep --trial",
        .help =
            "Creates a sandbox, runs CMD in it with its stdout and stderr streamed here as\n"
            "they are produced, and deletes the sandbox. Exits with CMD's exit status:\n"
            "128+N if signal N killed it, 124 if it timed out, 127 if it could not start,\n"
            "130 if interrupted (the sandbox is deleted first); see 'withruntime --help'\n"
            "for the codes of errors before CMD runs.\n"
            "\n"
            "CMD and its arguments are an argv list, run without a shell even when there\n"
            "is only one word. To run a shell string, use sh -c. While the sandbox starts,\n"
            "a spinner shows on stderr if it is a terminal (nothing otherwise).\n"
            "\n"
            "Options:\n"
            "  --image NAME     image to start from (default: \"default\")\n"
            "  --timeout SECS   time limit for CMD, 1..86400 (default 3600); the sandbox's\n"
            "                   lease ends a minute later\n"
            "  --cpus N         vCPUs (default 2)\n"
            "  --memory MIB     memory in MiB (default 4096)\n"
            "  --disk MIB       disk quota of its writable layer in MiB (default 10240)\n"
            "  --env K=V        environment variable (repeatable)\n"
            "  --internet       let it reach any public host (default: no network)\n"
            "  --allow HOST     let it reach only HOST: a name, '*.name', optionally :PORT\n"
            "                   (repeatable; implies --internet), e.g.\n"
            "                   --allow pypi.org --allow '*.pythonhosted.org'\n"
            "  --deny HOST      never HOST, even if allowed (repeatable)\n"
            "  --secret NAME    give it secret NAME: CMD sees a placeholder, HTTPS requests to\n"
            "                   the secret's hosts carry the value (repeatable)\n"
            "  --cwd DIR        working directory (default /workspace)\n"
            "  --stdin          send our stdin (read to the end first, up to 512 KiB) to CMD\n"
            "  --keep           keep the sandbox and print its id on stderr\n"
            "  --trial          accepted for compatibility; changes nothing\n"
            "  -h, --help       this help\n"
            "\n"
            "Examples:\n"
            "  withruntime sandbox run -- python3 -c 'print(6 * 7)'\n"
            "  withruntime sandbox run -- sh -c 'cd /tmp && ls | wc -l'\n"
            "  withruntime sandbox run --allow pypi.org --allow '*.pythonhosted.org' -- \\\n"
            "      sh -c 'pip install requests && python3 -c \"import requests\"'\n",
    },
    {
        .group = "sandbox", .name = "create", .fn = cli_sandbox_create,
        .args = "[OPTIONS]",
        .summary = "create a sandbox and print its id",
        .options = "--image= --timeout= --cpus= --memory= --disk= --env= --metadata= --internet "
                   "--allow= --deny= --secret= --on-lease-end=stop|delete --json",
        .help =
            "Creates a sandbox and prints its id (or, with --json, the sandbox object).\n"
            "\n"
            "Options:\n"
            "  --image NAME              image to start from (default: \"default\")\n"
            "  --timeout SECS            lease length, 1..86400 (default 3600)\n"
            "  --cpus N                  vCPUs (default 2)\n"
            "  --memory MIB              memory in MiB (default 4096)\n"
            "  --disk MIB                disk quota of its writable layer in MiB (default 10240)\n"
            "  --env K=V                 environment variable for every exec (repeatable)\n"
            "  --metadata K=V            stored and returned, never interpreted (repeatable)\n"
            "  --internet                let it reach any public host (default: no network)\n"
            "  --allow HOST              let it reach only HOST: a name, '*.name', optionally :PORT\n"
            "                            (repeatable; implies --internet)\n"
            "  --deny HOST               never HOST, even if allowed (repeatable)\n"
            "  --secret NAME             give it secret NAME (see 'withruntime secrets --help'): its\n"
            "                            commands see a placeholder (repeatable)\n"
            "  --on-lease-end stop|delete  what happens when the lease ends (default stop)\n"
            "  --json                    print the sandbox object\n"
            "  -h, --help                this help\n"
            "\n"
            "Example:\n"
            "  ID=$(withruntime sandbox create --memory 1024 --timeout 600 --env MODE=test)\n",
    },
    {
        .group = "sandbox", .name = "list", .fn = cli_sandbox_list,
        .args = "[--json] [--metadata KEY=VALUE]... [--state STATE]",
        .summary = "list sandboxes",
        .options = "--json --metadata= --state=",
        .help =
            "Lists sandboxes: ID STATE IMAGE CPUS MEMORY OWNER CREATED (OWNER: the key's\n"
            "name where this caller may read keys, else its id). --json prints the API's\n"
            "answer ({\"sandboxes\": [...]}).\n"
            "\n"
            "Examples:\n"
            "  withruntime sandbox list --metadata team=blue --state running\n"
            "  withruntime sandbox list --json | jq -r '.sandboxes[].id'\n"
            "\n"
            "Options:\n"
            "  --metadata KEY=VALUE  only sandboxes with this metadata (all given must match)\n"
            "  --state STATE         only sandboxes in this state (running, stopped, ...)\n"
            "  --json                the API's answer\n"
            "  -h, --help            this help\n",
    },
    {
        .group = "sandbox", .name = "get", .fn = cli_sandbox_get,
        .args = "[--json] ID",
        .summary = "show a sandbox",
        .options = "--json",
        .help =
            "Shows a sandbox: one field a line (objects as JSON). --json prints the sandbox\n"
            "object as the API answers it.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox get --json sb-... | jq -r .lease_ends_at\n",
    },
    {
        .group = "sandbox", .name = "exec", .fn = cli_sandbox_exec,
        .args = "[OPTIONS] ID -- CMD [ARG...]",
        .summary = "run CMD in a running sandbox",
        .options = "--cwd= --env= --timeout= --stdin --interactive --background --json",
        .help =
            "Runs CMD (an argv list, no shell; use sh -c for a shell string) in a running\n"
            "sandbox with its output streamed here, and exits with its status (as for\n"
            "'sandbox run').\n"
            "\n"
            "With -i, our stdin is streamed to CMD as it comes and its output back as it\n"
            "comes (an interactive session on pipes: stdout and stderr both arrive on stdout;\n"
            "Ctrl-C is passed on as SIGINT; no --timeout).\n"
            "\n"
            "With --background, CMD is started as a background command: its id (cmd-N) is\n"
            "printed at once (the command object with --json) and it runs on; see its output\n"
            "with 'sandbox logs', list it with 'sandbox commands', end it with 'sandbox kill'.\n"
            "\n"
            "Options:\n"
            "  --cwd DIR        working directory (default /workspace)\n"
            "  --env K=V        environment variable (repeatable)\n"
            "  --timeout SECS   time limit for CMD (default: the daemon's, 300; none for a\n"
            "                   background command)\n"
            "  --stdin          send our stdin (read to the end first, up to 512 KiB) to CMD\n"
            "  -i, --interactive  stream our stdin to CMD, and its output back, as they come\n"
            "  --background     start CMD in the background and print its id\n"
            "  --json           with --background: print the command object\n"
            "  -h, --help       this help\n"
            "\n"
            "Examples:\n"
            "  withruntime sandbox exec sb-... -- sh -c 'echo hi > f.txt && cat f.txt'\n"
            "  printf 'a\\nb\\n' | withruntime sandbox exec -i sb-... -- wc -l\n"
            "  CMD=$(withruntime sandbox exec --background sb-... -- python3 -m http.server)\n",
    },
    {
        .group = "sandbox", .name = "shell", .fn = cli_sandbox_shell,
        .args = "[--cwd DIR] [--env K=V] ID [-- CMD [ARG...]]",
        .summary = "open a terminal in a running sandbox (a login shell, or CMD)",
        .options = "--cwd= --env=",
        .help =
            "Opens an interactive session in a running sandbox: a login shell (bash where there\n"
            "is one), or CMD. On a terminal you get a real one (raw mode, window size kept in\n"
            "step, the terminal restored however it ends); with stdin not a terminal the\n"
            "command gets pipes instead. Exits with the remote command's status (128+N when\n"
            "signal N ended it). A session outlives a dropped connection for the daemon's\n"
            "--session-grace (60 s) and ends with its sandbox.\n"
            "\n"
            "Options:\n"
            "  --cwd DIR        working directory (default /workspace)\n"
            "  --env K=V        environment variable (repeatable)\n"
            "  -h, --help       this help\n"
            "\n"
            "Examples:\n"
            "  withruntime sandbox shell sb-...\n"
            "  withruntime sandbox shell sb-... -- python3\n",
    },
    {
        .group = "sandbox", .name = "stop", .fn = cli_sandbox_stop,
        .args = "[--json] ID [ID...]",
        .summary = "stop sandboxes (their files are kept)",
        .options = "--json",
        .help =
            "Stops sandboxes: every process in them ends, their files stay, and they cost\n"
            "nothing until started again. Prints each id and its state (the sandbox object\n"
            "with --json, one a line). Stopping a stopped sandbox does nothing.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox stop sb-...\n",
    },
    {
        .group = "sandbox", .name = "start", .fn = cli_sandbox_start,
        .args = "[--json] ID [ID...]",
        .summary = "start stopped sandboxes again",
        .options = "--json",
        .help =
            "Starts stopped (or failed) sandboxes again: same id, every file they had, a fresh\n"
            "lease of their timeout. Prints each id and its state (the sandbox object with\n"
            "--json, one a line). Starting a running sandbox does nothing.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox start sb-...\n",
    },
    {
        .group = "sandbox", .name = "timeout", .fn = cli_sandbox_timeout,
        .args = "[--json] ID DURATION",
        .summary = "end a sandbox's lease DURATION from now",
        .options = "--json",
        .help =
            "Sets the sandbox's lease to end DURATION from now (longer or shorter; seconds, or\n"
            "with s, m, h: 90s, 10m, 2h; at most 24h); it also becomes the lease of its later\n"
            "starts. Prints the id and when the lease now ends (the sandbox object with\n"
            "--json).\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox timeout sb-... 30m\n",
    },
    {
        .group = "sandbox", .name = "stats", .fn = cli_sandbox_stats,
        .args = "[--json] ID",
        .summary = "show a sandbox's CPU, memory and process use",
        .options = "--json",
        .help =
            "Shows what the sandbox uses, measured on the host since it last started: CPU\n"
            "time, current memory, host tasks, processes the OOM killer killed. All zero when\n"
            "it is not running. --json prints the API's answer.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox stats sb-...\n",
    },
    {
        .group = "sandbox", .name = "events", .fn = cli_sandbox_events,
        .args = "[--json] ID",
        .summary = "show a sandbox's history",
        .options = "--json",
        .help =
            "Shows the sandbox's history, oldest first (its newest 1,000 events): AT TYPE\n"
            "STATE REASON and any other detail. --json prints the API's answer.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox events sb-...\n",
    },
    {
        .group = "sandbox", .name = "network", .fn = cli_sandbox_network,
        .args = "[--json] [--internet|--no-internet] [--allow HOST]... [--deny HOST]... ID",
        .summary = "show or set what a sandbox may reach",
        .options = "--internet --no-internet --allow= --deny= --json",
        .help =
            "Without options, shows the sandbox's egress policy: internet yes or no, and its\n"
            "allow and deny lists. With them, replaces it (in any state; at once, and open\n"
            "connections it no longer allows are closed) and shows the new one. --json\n"
            "prints the policy object.\n"
            "\n"
            "Options:\n"
            "  --internet       let it reach any public host\n"
            "  --allow HOST     let it reach only HOST: a name, '*.name', optionally :PORT\n"
            "                   (repeatable; implies --internet)\n"
            "  --deny HOST      never HOST, even if allowed (repeatable; implies --internet)\n"
            "  --no-internet    let it reach nothing\n"
            "  --json           print the policy object\n"
            "  -h, --help       this help\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox network --allow pypi.org --allow '*.pythonhosted.org' sb-...\n",
    },
    {
        .group = "sandbox", .name = "network-log", .fn = cli_sandbox_network_log,
        .args = "[--json] ID",
        .summary = "show the lookups and connections a sandbox was denied",
        .options = "--json",
        .help =
            "Shows the sandbox's latest denied lookups and connections (200 at most, oldest\n"
            "first): TIME VIA HOST PORT REASON, and how many there were since the daemon\n"
            "started. --json prints the API's answer.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox network-log sb-...\n",
    },
    {
        .group = "sandbox", .name = "commands", .fn = cli_sandbox_commands,
        .args = "[--json] ID [CMD_ID]",
        .summary = "list a sandbox's background commands, or show one",
        .options = "--json",
        .help =
            "Lists the sandbox's background commands, oldest first: ID STATE EXIT STARTED\n"
            "ENDED COMMAND (the 64 newest finished ones are kept). With CMD_ID, shows that\n"
            "one, a field a line. --json prints the API's answer.\n"
            "\n"
            "Examples:\n"
            "  withruntime sandbox commands sb-...\n"
            "  withruntime sandbox commands --json sb-... cmd-1\n",
    },
    {
        .group = "sandbox", .name = "logs", .fn = cli_sandbox_logs,
        .args = "[--follow] [--json] ID CMD_ID",
        .summary = "print a background command's output",
        .options = "--follow --json",
        .help =
            "Prints the output a background command has kept (the last MiB of each stream):\n"
            "its stdout to stdout, its stderr to stderr, byte for byte. With --follow, keeps\n"
            "printing as it comes until the command ends, each byte once, and then exits with\n"
            "the command's status as 'sandbox exec' does (128+N for signal N). Bytes the\n"
            "command wrote faster than they were read, beyond what it keeps, are said to be\n"
            "dropped on stderr. --json prints the API's answer (with --follow, one answer a\n"
            "line). Following waits on the command with POST .../wait, a second at a time; a\n"
            "read-only key, which may not, reads the output every second instead.\n"
            "\n"
            "Options:\n"
            "  -f, --follow     keep printing until the command ends\n"
            "  --json           print the API's answers\n"
            "  -h, --help       this help\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox logs --follow sb-... cmd-1\n",
    },
    {
        .group = "sandbox", .name = "kill", .fn = cli_sandbox_kill,
        .args = "[--signal SIG] ID CMD_ID",
        .summary = "send a signal to a background command",
        .options = "--signal=TERM|KILL|INT|HUP|QUIT|USR1|USR2|STOP|CONT",
        .help =
            "Sends a signal (default TERM) to a background command's whole process tree.\n"
            "SIG is a name (TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT, with or\n"
            "without SIG, in any case) or a number. Refused (exit 4) when the command is not\n"
            "running.\n"
            "\n"
            "Options:\n"
            "  -s, --signal SIG  the signal (default TERM)\n"
            "  -h, --help        this help\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox kill --signal KILL sb-... cmd-1\n",
    },
    {
        .group = "sandbox", .name = "cat", .fn = cli_sandbox_cat,
        .args = "ID PATH",
        .summary = "write a file's bytes to stdout",
        .help =
            "Writes the bytes of the file PATH in the sandbox to stdout.\n"
            "PATH is absolute, or relative to /workspace.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox cat sb-... results/out.csv > out.csv\n",
    },
    {
        .group = "sandbox", .name = "write", .fn = cli_sandbox_write,
        .args = "[OPTIONS] ID PATH [FILE|-]",
        .summary = "write a file from FILE or stdin",
        .options = "--mode= --json",
        .help =
            "Writes the file PATH in the sandbox (created or truncated, missing parent\n"
            "directories created) from the local FILE, or from stdin when FILE is - or absent.\n"
            "Files of any size are sent in pieces of 8 MiB; if one fails, the file in the\n"
            "sandbox holds the pieces sent before it.\n"
            "\n"
            "Options:\n"
            "  --mode MODE      octal file mode (default 0644)\n"
            "  --json           print the written file's entry\n"
            "  -h, --help       this help\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox write --mode 0755 sb-... bin/run.sh ./run.sh\n",
    },
    {
        .group = "sandbox", .name = "ls", .fn = cli_sandbox_ls,
        .args = "[--json] ID [PATH]",
        .summary = "list a directory (default /workspace)",
        .options = "--json",
        .help =
            "Lists a directory in the sandbox (default /workspace): TYPE MODE SIZE MTIME NAME.\n"
            "A PATH that is not a directory is shown as one row, as ls(1) does.\n"
            "--json prints the API's answer (the list's, or the file's stat).\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox ls sb-... /etc\n",
    },
    {
        .group = "sandbox", .name = "cp", .fn = cli_sandbox_cp,
        .args = "[--max-bytes N] [--max-entries N] SRC DEST",
        .summary = "copy a file or a directory tree in or out (one of SRC, DEST is ID:PATH)",
        .options = "--max-bytes= --max-entries=",
        .help =
            "Copies a file or a directory tree into or out of a sandbox. One of SRC and DEST\n"
            "is ID:PATH (PATH absolute, or relative to /workspace), the other a local path.\n"
            "\n"
            "A directory's contents go into DEST, which is made if missing; what DEST holds\n"
            "already stays, and an entry replaces only what has its own name. A file is\n"
            "written to DEST itself, or into it under its own name when DEST is a directory\n"
            "or ends in '/'; a symlink named as SRC is followed. Kept: directories,\n"
            "files, symlinks inside a tree (as symlinks, never followed), permission bits\n"
            "(not setuid/setgid) and mtimes. Skipped with a warning: devices, FIFOs,\n"
            "sockets. A hard-linked file is copied once per name.\n"
            "An archive entry that would land outside DEST (an absolute name, '..', a path\n"
            "through a symlink) stops the copy with an error; what was copied before stays.\n"
            "\n"
            "Examples:\n"
            "  withruntime sandbox cp ./project sb-abc...:/workspace/project\n"
            "  withruntime sandbox cp sb-abc...:/workspace/out ./out\n"
            "  withruntime sandbox cp sb-abc...:report.pdf ./report.pdf\n"
            "  withruntime sandbox cp sb-abc...:report.pdf .\n"
            "\n"
            "Options:\n"
            "  --max-bytes N     refuse a download of more than N bytes of files (default 64 GiB)\n"
            "  --max-entries N   refuse a download of more than N entries (default 1000000)\n"
            "  -h, --help        this help\n",
    },
    {
        .group = "sandbox", .name = "rm", .aliases = "delete", .fn = cli_sandbox_rm,
        .args = "ID [ID...]",
        .summary = "delete sandboxes",
        .help =
            "Deletes sandboxes and everything in them, printing each id deleted.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox rm sb-...\n",
    },
    {
        .group = "sandbox", .name = "prune", .fn = cli_sandbox_prune,
        .args = "[--older-than DURATION] [--json]",
        .summary = "delete stopped and failed sandboxes",
        .options = "--older-than= --json",
        .help =
            "Deletes every stopped or failed sandbox that has been so for at least DURATION\n"
            "(seconds, or with s, m, h, d; default 0: all of them), printing each id deleted.\n"
            "Running sandboxes are never touched. The daemon also deletes them by itself after\n"
            "`serve --stopped-retention` (default 7d). --json prints the API's answer.\n"
            "\n"
            "Example:\n"
            "  withruntime sandbox prune --older-than 1d\n",
    },

    /* ---- image ---- */
    {
        .name = "image",
        .args = "COMMAND [ARGS...]",
        .summary = "build and list images (root filesystems)",
        .help =
            "Images are the root filesystems sandboxes start from; they live in the state\n"
            "directory (see --state-dir) and are built on the host, no daemon needed.\n"
            "\n"
            "Example:\n"
            "  sudo withruntime image build\n",
    },
    {
        .group = "image", .name = "build", .fn = cli_image_build,
        .args = "[--force] [NAME]",
        .summary = "build an image (default \"default\"; root only)",
        .options = "--force",
        .help =
            "Builds image NAME (default \"default\": Debian bookworm with python3, pip, venv,\n"
            "git, curl, build tools) with mmdebstrap from this host's apt sources, into\n"
            "DIR/images/NAME (DIR: --state-dir). Does nothing if it is already built, unless\n"
            "--force. Needs root; no daemon needs to be running. Progress goes to stderr: on a\n"
            "terminal a bar with the stage and the time left (estimated from the last build),\n"
            "mmdebstrap's own output going to DIR/images/NAME.build.log; elsewhere a line per\n"
            "stage (\"withruntime: image default: 33% installing the base system\") beside it.\n"
            "\n"
            "Example:\n"
            "  sudo withruntime image build\n",
    },
    {
        .group = "image", .name = "list", .aliases = "ls", .fn = cli_image_list,
        .args = "[--json]",
        .summary = "list built images",
        .options = "--json",
        .help =
            "Lists the images built in the state directory (see --state-dir): NAME SIZE\n"
            "CREATED. --json prints {\"images\": [...]} as GET /v1/images answers.\n"
            "\n"
            "Example:\n"
            "  withruntime image list\n",
    },

    /* ---- the daemon and the host ---- */
    {
        .name = "serve", .fn = cli_cmd_serve, .print_help = api_serve_usage,
        .args = "[OPTIONS]",
        .summary = "run the daemon (see 'withruntime serve --help')",
        .long_options = api_serve_options,
    },
    {
        .name = "doctor", .fn = cli_cmd_doctor,
        .args = "",
        .summary = "say which sandbox drivers this host can run, and why not",
        .help =
            "Checks this host: which sandbox drivers it can run, and why not the others, and\n"
            "whether sandboxes can have a network. Exits 0 if at least one driver works.\n"
            "\n"
            "Example:\n"
            "  sudo withruntime doctor\n",
    },

    /* ---- secrets ---- */
    {
        .name = "secrets",
        .args = "COMMAND [ARGS...]",
        .summary = "secrets bound to hosts, never seen inside a sandbox",
        .help =
            "A secret is a value (a token, say) that code in a sandbox uses without ever seeing it.\n"
            "A sandbox created with it (--secret NAME; `secrets=[\"NAME\"]` in the SDK) has NAME set\n"
            "to a random placeholder in its commands' environment; the daemon's egress proxy puts\n"
            "the real value in place of the placeholder in the Authorization header (and the\n"
            "headers the secret declares) of HTTPS requests to the secret's hosts and ports, and\n"
            "nowhere else. Secrets are the admin's: the admin's sandboxes may use every one, a\n"
            "key's sandboxes only those granted to the key (--keys).\n"
            "\n"
            "Example:\n"
            "  printf %s \"$GITHUB_TOKEN\" | withruntime secrets set GITHUB_TOKEN --hosts api.github.com \\\n"
            "      --keys key_abc\n",
    },
    {
        .group = "secrets", .name = "set", .fn = cli_secrets_set,
        .args = "NAME --hosts HOST[,HOST...] [--keys KEY[,KEY...]] [--headers NAME[,NAME...]] "
                "[--from-file FILE]",
        .summary = "create or replace a secret",
        .options = "--hosts= --keys= --headers= --from-file=",
        .help =
            "Creates or replaces secret NAME (1 to 64 of A-Z, 0-9 and _), bound to HOST: a name\n"
            "or a wildcard (*.example.com), with :PORT if not 443 (api.example.com:8443). The\n"
            "value is read from stdin (its one line, without the newline) or from FILE, never from\n"
            "the command line; it is stored encrypted and is never shown again.\n"
            "\n"
            "  --keys KEY,...     the keys (ids, key_...) whose sandboxes may use it; a key made\n"
            "                     --of another uses its owner's grants. Without it: only the\n"
            "                     admin's sandboxes. Replacing a secret replaces its grants.\n"
            "  --headers NAME,... header fields besides Authorization the value may go into\n"
            "                     (X-Api-Key, say); never Host, Origin or the framing ones\n"
            "\n"
            "Example:\n"
            "  printf %s \"$GITHUB_TOKEN\" | withruntime secrets set GITHUB_TOKEN --hosts api.github.com\n",
    },
    {
        .group = "secrets", .name = "update", .fn = cli_secrets_update,
        .args = "NAME [--hosts HOST[,HOST...]] [--keys KEY[,KEY...]] [--headers NAME[,NAME...]]",
        .summary = "change a secret's hosts, keys or headers, keeping its value",
        .options = "--hosts= --keys= --headers=",
        .help =
            "Changes what a secret is bound to, who may use it or which headers it goes into;\n"
            "each option given replaces that list (--keys '' leaves it to the admin's sandboxes,\n"
            "--headers '' to Authorization). The value stays. A grant taken back stops the value\n"
            "going out of that key's sandboxes from their next request, running ones included.\n"
            "\n"
            "Example:\n"
            "  withruntime secrets update GITHUB_TOKEN --keys key_abc,key_def\n",
    },
    {
        .group = "secrets", .name = "list", .aliases = "ls", .fn = cli_secrets_list,
        .args = "[--json]",
        .summary = "list secrets (names and hosts, never values)",
        .options = "--json",
        .help =
            "Lists secrets: NAME UPDATED HOSTS KEYS (the keys granted; - for none: the admin's\n"
            "sandboxes only). Values are never shown. --json prints the API's answer.\n"
            "\n"
            "Example:\n"
            "  withruntime secrets list\n",
    },
    {
        .group = "secrets", .name = "rm", .fn = cli_secrets_rm,
        .args = "NAME [NAME...]",
        .summary = "delete secrets",
        .help =
            "Deletes secrets, printing each name deleted. Sandboxes made with one keep their\n"
            "placeholder, which no longer turns into anything.\n"
            "\n"
            "Example:\n"
            "  withruntime secrets rm GITHUB_TOKEN\n",
    },

    /* ---- keys, usage, audit ---- */
    {
        .name = "keys",
        .args = "COMMAND [ARGS...]",
        .summary = "API keys and their limits (the admin's)",
        .help =
            "API keys for programs that call the daemon (RUNTIME_API_KEY). Only the admin, root on\n"
            "the daemon's Unix socket, manages them: a key cannot make keys or raise its own limits.\n"
            "A key sees only the sandboxes it made; one made --of another key sees (and makes) that\n"
            "key's instead. A read-only key may list and inspect them, and nothing else. An auditor\n"
            "key may read the key list, the audit trail and everyone's usage (the dashboard's Keys\n"
            "and Audit pages), and nothing else.\n"
            "\n"
            "Example:\n"
            "  withruntime keys create --name my-agent --daily-limit-usd 5 > agent.key\n",
    },
    {
        .group = "keys", .name = "create", .fn = cli_keys_create,
        .args = "NAME [--read-only|--metrics|--auditor] [--of KEY_ID] [--daily-limit-usd X] "
                "[--max-sandboxes N]",
        .summary = "make a key and print it (once)",
        .options = "--name= --read-only --metrics --auditor --of= --daily-limit-usd= "
                   "--max-sandboxes=",
        .help =
            "Makes a key named NAME (or --name NAME) and prints it on stdout, once: the daemon\n"
            "stores only its hash.\n"
            "--daily-limit-usd caps what the key's sandboxes may cost per UTC day (dollars, up\n"
            "to six decimals); --max-sandboxes how many it may keep at once; --read-only lets it\n"
            "list and inspect, nothing else; --metrics makes a key for a Prometheus scraper, which\n"
            "may GET /metrics and nothing else; --auditor makes a key that may read the key list\n"
            "(never a key or its hash), the audit trail, everyone's usage and whoami, and nothing\n"
            "else: no sandbox, no secret, no /metrics, no change to anything (for the dashboard's\n"
            "Keys and Audit pages); --of KEY_ID makes it see (and make) that key's sandboxes\n"
            "instead of its own.\n"
            "\n"
            "Examples:\n"
            "  withruntime keys create --name my-agent --daily-limit-usd 5 > agent.key\n"
            "  withruntime keys create --name dashboard --read-only --of key_... > dash.key\n"
            "  withruntime keys create --name prometheus --metrics > metrics.key\n"
            "  withruntime keys create auditors --auditor > auditor.key\n",
    },
    {
        .group = "keys", .name = "list", .aliases = "ls", .fn = cli_keys_list,
        .args = "[--json]",
        .summary = "list keys and what they spent today",
        .options = "--json",
        .help =
            "Lists keys: ID NAME ACCESS DAILY-LIMIT SPENT-TODAY MAX-SANDBOXES STATE. Never the\n"
            "keys themselves. --json prints the API's answer.\n"
            "\n"
            "Example:\n"
            "  withruntime keys list\n",
    },
    {
        .group = "keys", .name = "set", .fn = cli_keys_set,
        .args = "ID [--daily-limit-usd X|none] [--max-sandboxes N|none] [--read-only|--read-write]",
        .summary = "change a key's limits or access",
        .options = "--daily-limit-usd= --max-sandboxes= --read-only --read-write",
        .help =
            "Changes a key's daily limit, sandbox cap or access; 'none' lifts a limit.\n"
            "\n"
            "Example:\n"
            "  withruntime keys set key_... --daily-limit-usd 20 --max-sandboxes none\n",
    },
    {
        .group = "keys", .name = "revoke", .fn = cli_keys_revoke,
        .args = "ID [ID...]",
        .summary = "revoke keys (at once; their records stay)",
        .help =
            "Revokes keys: they stop working at once; their records (and the audit trail)\n"
            "stay. The keys made --of a key are revoked with it. Prints each id revoked, those\n"
            "made --of it too (each also named on stderr).\n"
            "\n"
            "Example:\n"
            "  withruntime keys revoke key_...\n",
    },
    {
        .name = "usage", .fn = cli_cmd_usage,
        .args = "[--from DATE] [--to DATE] [--by sandbox|key|day|minute] [--sandbox ID] [--json]",
        .summary = "what sandboxes cost: by sandbox, key, day or minute",
        .options = "--from= --to= --by=sandbox|key|day|minute --sandbox= --json",
        .help =
            "What sandboxes cost, from the daemon's usage ledger: per sandbox (default), per key, per\n"
            "UTC day or per minute, in dollars with the CPU billed and the memory-time. DATE is a\n"
            "UTC date (2026-12-01) or time (2026-12-01T13:45:00Z); --from defaults to the start of\n"
            "today (UTC), --to to now. --sandbox ID counts that sandbox only. A key sees its own\n"
            "sandboxes' usage; the admin and auditor keys see everyone's. --json prints the API's\n"
            "answer.\n"
            "\n"
            "Examples:\n"
            "  withruntime usage --by day --from 2026-11-01\n"
            "  withruntime usage --by minute --sandbox sb-... --from 2026-12-01T13:00:00Z\n",
    },
    {
        .name = "audit", .fn = cli_cmd_audit,
        .args = "[--limit N] [--before SEQ] [--json]",
        .summary = "who did what (the admin's, or an auditor key's)",
        .options = "--limit= --before= --json",
        .help =
            "The newest mutating requests the daemon answered (the admin's, or an auditor key's to\n"
            "read): when, which key (- for the admin), the route, the sandbox and the HTTP status.\n"
            "Never a body or a secret.\n"
            "--limit N (1..1000, default 50) of them; --before SEQ pages back (the API's\n"
            "next_before). --json prints the API's answer.\n"
            "\n"
            "Example:\n"
            "  withruntime audit --limit 20\n",
    },

    /* ---- connecting ---- */
    {
        .name = "login", .fn = cli_cmd_login,
        .args = "URL [--key -|KEY] [--ca-file FILE]",
        .summary = "save the daemon to use and its key",
        .options = "--key= --ca-file= --url=",
        .help =
            "Saves URL (https://HOST:PORT, http://HOST:PORT or unix:/path.sock) and an API\n"
            "key as the daemon to use when RUNTIME_URL is not set, in\n"
            "~/.config/withruntime/connection.json (mode 0600); --url URL works as well as\n"
            "the operand. Without --key, the key is\n"
            "asked for on the terminal (not echoed; empty for none); '--key -' reads it from\n"
            "the first line of stdin. '--key KEY' works too, but other users of this machine\n"
            "can read it in the process list. --ca-file FILE: an https daemon's certificate\n"
            "must chain to the CAs in this PEM file (saved with the connection) instead of\n"
            "the system's. A key is refused for plain http:// to a host other than loopback:\n"
            "it would cross the network readable. The daemon is asked for its health; the\n"
            "connection is saved even if it does not answer.\n"
            "\n"
            "Example:\n"
            "  withruntime login https://sandboxes.example.com:7070 --key - < agent.key\n",
    },
    {
        .name = "logout", .fn = cli_cmd_logout,
        .args = "",
        .summary = "forget the saved daemon",
        .help =
            "Forgets the connection saved by 'withruntime login'.\n"
            "\n"
            "Example:\n"
            "  withruntime logout\n",
    },
    {
        .name = "version", .fn = cli_cmd_version,
        .args = "",
        .summary = "print the version",
        .help =
            "Prints the version of this withruntime.\n"
            "\n"
            "Example:\n"
            "  withruntime version\n",
    },
    {
        .name = "completion", .fn = cli_cmd_completion,
        .args = "bash|zsh",
        .summary = "print a shell completion script",
        .operands = "bash zsh",
        .help =
            "Prints a script that completes withruntime's commands and options in bash or zsh,\n"
            "made from the same command table the commands are run from.\n"
            "\n"
            "Examples:\n"
            "  source <(withruntime completion bash)      # in ~/.bashrc\n"
            "  source <(withruntime completion zsh)       # in ~/.zshrc, after compinit\n",
    },
    {
        .name = "help", .fn = cli_cmd_help,
        .args = "[COMMAND [SUBCOMMAND]]",
        .summary = "this help, or a command's",
        .options = "--markdown",
        .help =
            "Prints the help of withruntime, or of a command: 'help sandbox run' is\n"
            "'sandbox run --help'. --markdown prints the reference of every command, as\n"
            "docs/cli.md holds it.\n"
            "\n"
            "Example:\n"
            "  withruntime help sandbox logs\n",
    },
};
/* clang-format on */

const size_t cli_commands_count = sizeof(cli_commands) / sizeof(cli_commands[0]);
