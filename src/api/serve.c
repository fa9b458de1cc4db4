/*
 * `withruntime serve`: parses the daemon's flags, opens the daemon, serves
 * the API on its listeners (TCP and the Unix socket) and runs the event loop
 * until SIGTERM or SIGINT. Shutdown stops accepting, answers what is in
 * flight, and lets the daemon stop (not delete) running sandboxes.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include "api/api.h"
#include "common/duration.h"
#include "common/log.h"
#include "daemon/daemon.h"
#include "daemon/pool.h"
#include "daemon/service.h"

struct server {
    struct daemon d;
    struct http_server *http;
    int idle_s;          /* --idle-timeout */
    int max_conns;       /* --max-connections (0: from the fd limit) */
    int header_s;        /* --header-timeout */
    int body_memory_mib; /* --body-memory-mib */
    char tls_cert[4096]; /* --tls-cert ("": plain HTTP on TCP) */
    char tls_key[4096];  /* --tls-key */
};

#define IDLE_TIMEOUT_S 60
#define HEADER_TIMEOUT_S 10
#define MAX_CONNS 4096
#define BODY_MEMORY_MIB 256

void api_serve_usage(FILE *out)
{
    fprintf(out,
            "usage: withruntime serve [--state-dir DIR] [--listen HOST:PORT|none] [--socket PATH]\n"
            "                         [--agent PATH] [--driver gvisor|fake]\n"
            "                         [--platform systrap|ptrace|kvm] [--debug] [--print-enums]\n"
            "                         [--output-memory-mib N]\n"
            "                         [--idle-timeout SECONDS] [--agent-deadline SECONDS]\n"
            "                         [--max-connections N] [--header-timeout SECONDS]\n"
            "                         [--body-memory-mib N]\n"
            "                         [--max-running N] [--max-sandboxes N]\n"
            "                         [--memory-overcommit F] [--disk-overcommit F]\n"
            "                         [--disk-reserve-mib N] [--max-loop-devices N]\n"
            "                         [--max-agent-log-kib N] [--stopped-retention DURATION]\n"
            "                         [--freeze-after SECONDS] [--session-grace SECONDS]\n"
            "                         [--egress auto|on|off] [--dns-upstream ADDR[:PORT]]\n"
            "                         [--public-ranges CIDR,...] [--extra-ca-file PEM]\n"
            "                         [--host-name NAME]... [--tls-cert PEM --tls-key PEM]\n"
            "\n"
            "Runs the daemon: the HTTP API on HOST:PORT (default 127.0.0.1:7070) and on the Unix\n"
            "socket (default STATE_DIR/withruntime.sock). State lives in STATE_DIR (default\n"
            "$WITHRUNTIME_STATE_DIR or /var/lib/withruntime); one daemon per STATE_DIR, held by\n"
            "STATE_DIR/daemon.lock, which records its pid and socket (the CLI given --state-dir\n"
            "finds it there). SIGTERM stops it cleanly.\n"
            "--driver picks the isolation driver (default: the first this host can run, as\n"
            "`withruntime doctor` says; `fake` runs agents as plain host processes, for tests).\n"
            "--print-enums prints the sandbox states and state reasons as JSON and exits.\n"
            "--output-memory-mib N bounds the command output and transfers the daemon holds at\n"
            "once (default: a quarter of the host's memory, at most 4096); past it, new execs\n"
            "and downloads are answered 503.\n"
            "--idle-timeout closes an API connection with nothing to read between requests, or\n"
            "whose client takes no bytes of an answer, for that long (default 60); a request\n"
            "being answered (a long exec) is not idle, nor is a streamed answer until it ends.\n"
            "--max-connections N: API connections open at once (default 4096, fewer if the fd\n"
            "limit is low); at the cap the connection idle the longest is closed for a new one,\n"
            "and with none idle new ones wait in the listen backlog.\n"
            "--header-timeout: a request's headers must all arrive within this many seconds of\n"
            "its first byte (default 10), or its connection is closed.\n"
            "--body-memory-mib N: request bodies being read or answered hold at most this much\n"
            "(default 256; a body counts its Content-Length, a chunked one the largest body); a\n"
            "body that does not fit waits unread until it does, for the idle timeout at most.\n"
            "Bodies are limited per route: 8 MiB for a file upload, 1 MiB for JSON (413).\n"
            "--agent-deadline: a file operation that waits this long (default 60) on a sandbox's\n"
            "agent without a sign of progress means the agent is stuck: the sandbox is failed\n"
            "(agent_unresponsive) and everything waiting on it is answered.\n"
            "\n"
            "Admission: a create (or a start of a stopped sandbox) is admitted by what the\n"
            "host has and what sandboxes use, not by their limits: the host's available\n"
            "memory (less 1/16 of it) must hold 32 MiB for it and for each running sandbox\n"
            "not yet measured above that, with no memory stall (/proc/pressure/memory), and\n"
            "the state directory's free space (less --disk-reserve-mib) 128 MiB for it and\n"
            "each running one to write; stopped sandboxes count what their files hold. Past\n"
            "that, or one of these limits, it is refused with 503 `capacity` and Retry-After,\n"
            "naming what is short and what frees it:\n"
            "  --max-running N        sandboxes creating, starting or running (default 100)\n"
            "  --max-sandboxes N      sandboxes kept, stopped and failed ones too (default 1000)\n"
            "  --memory-overcommit F  running sandboxes' memory_mib in total up to the host's\n"
            "                         memory x F (default 32: 100 sandboxes of 4096 MiB on a\n"
            "                         host of 12.5 GiB); one alone never more than it\n"
            "  --disk-overcommit F    running sandboxes' disk_mib in total up to the state\n"
            "                         directory's free space, less the reserve, x F (default\n"
            "                         16); one alone never more than that free space\n"
            "  --disk-reserve-mib N   free space never promised to sandboxes (default 2048)\n"
            "  --max-loop-devices N   loop devices bound on the host (each running gvisor\n"
            "                         sandbox holds one for its disk) (default 256)\n"
            "\n"
            "--max-agent-log-kib N caps each sandbox's agent.log (the agent's stderr, a host\n"
            "file the daemon writes from a pipe): before a write would pass the cap, the file is\n"
            "cut to its newest quarter behind a log.truncated line (default 1024; the agent also\n"
            "logs at most 5 lines a second).\n"
            "\n"
            "--stopped-retention DURATION: a sandbox stopped or failed for this long is deleted\n"
            "by the daemon (seconds, or with s, m, h, d: 90s, 15m, 12h, 7d; default 7d; 0 keeps\n"
            "them for ever). `withruntime sandbox prune` removes them sooner.\n"
            "\n"
            "--freeze-after SECONDS: a running sandbox with nothing in flight (no exec, transfer,\n"
            "stream or background command) and no process besides its agent's is frozen after\n"
            "it has been idle this long (default 3; decimals allowed; 0 never freezes): it then\n"
            "uses no CPU (gVisor's systrap otherwise polls, ~2 %% of a core each) and is thawed\n"
            "by its next request in a few ms. Its lease runs on; frozen time is billed memory\n"
            "and no CPU floor. GET /v1/sandboxes/{id} says \"frozen\": true meanwhile.\n"
            "While the host is short of memory, idle sandboxes are frozen at once instead\n"
            "(event reason memory_pressure); 0 turns that off too.\n"
            "\n"
            "--session-grace SECONDS: an interactive session (POST /v1/sandboxes/{id}/sessions)\n"
            "whose client went away is killed after this long (default 60; 1..86400); a client\n"
            "that connects again within it gets the output it missed (the last 64 KiB).\n"
            "\n"
            "Sandbox networking (a sandbox's `network` policy, enforced on the host):\n"
            "  --egress auto|on|off   auto (default): on if this host can (see `withruntime\n"
            "                         doctor`), else sandboxes get no network and a policy with\n"
            "                         \"internet\": true is refused; on: refuse to start without\n"
            "  --dns-upstream A[:P]   the resolver the daemon asks for sandboxes' lookups and the\n"
            "                         proxy's own (default: the first IPv4 nameserver in\n"
            "                         /etc/resolv.conf)\n"
            "  --public-ranges LIST   address ranges to treat as public besides the internet's\n"
            "                         (comma-separated CIDRs; for tests with a fake internet;\n"
            "                         default none)\n"
            "  --extra-ca-file PEM    certificates sandboxes trust besides their image's (added\n"
            "                         to /etc/ssl/certs/ca-certificates.crt inside; e.g. a\n"
            "                         TLS-inspecting proxy's, or a test internet's CA)\n"
            "\n"
            "Who may call (see docs/security.md):\n"
            "  --host-name NAME       a name clients use to reach the TCP listener (repeatable).\n"
            "                         A request on TCP whose Host (or Origin) is not the address\n"
            "                         it reached, localhost on a loopback listener, or such a\n"
            "                         name is refused. Every request on TCP needs an API key;\n"
            "                         root on the Unix socket is the admin.\n"
            "  --tls-cert PEM         the TCP listener speaks TLS (1.2 or later) with this\n"
            "  --tls-key PEM          certificate (chain, server's first) and its private key;\n"
            "                         both or neither. Clients then use https://HOST:PORT (and\n"
            "                         trust the certificate's CA: RUNTIME_CA_FILE). The Unix\n"
            "                         socket stays plain. Without them, TCP is plain HTTP and a\n"
            "                         key sent to it crosses the network readable.\n"
            "\n"
            "Warm starts:\n"
            "  --pool N               keep N sandboxes of the default image and size (2 vCPU,\n"
            "                         4096 MiB, the default disk) started ahead; a create with\n"
            "                         those settings claims one at once (default 2; 0: off)\n"
            "\n"
            "Money (see docs/api.md, \"Usage and costs\"), in micro-dollars:\n"
            "  --price-vcpu-hour N    a vCPU busy for an hour (default 25000: $0.025)\n"
            "  --price-gib-hour N     a GiB of memory for an hour (default 7500: $0.0075)\n"
            "  --cpu-floor-permille N CPU is billed at no less than this share of each vCPU\n"
            "                         (default 25: 2.5 %%, gVisor's own idle work)\n"
            "  --meter-clock FILE     for tests: the meter's clock is the unix time in ms\n"
            "                         written in FILE, and moves only when it does\n"
            "\n"
            "Example:\n"
            "  withruntime serve --listen 127.0.0.1:7070 --max-running 20 --pool 4\n");
}

/* The states and reasons the API can report, for the tests that check the spec against them. */
static void print_enums(void)
{
    json_t *o = svc_enums();
    char *text = json_dumps(o, JSON_COMPACT);
    printf("%s\n", text);
    free(text);
    json_decref(o);
}

/* A whole number in [lo, hi] for flag, or -1 with a message. */
static int flag_int(const char *flag, const char *arg, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (!*arg || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "withruntime serve: %s wants a whole number from %ld to %ld, got %s\n",
                flag, lo, hi, arg);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* A number in (0, hi] for flag, or -1 with a message. */
static int flag_factor(const char *flag, const char *arg, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (!*arg || *end || errno || !(v > 0) || v > hi) {
        fprintf(stderr, "withruntime serve: %s wants a number above 0 and up to %g, got %s\n", flag,
                hi, arg);
        return -1;
    }
    *out = v;
    return 0;
}

/* --host-name: a DNS name (letters, digits, '-' and '.'), added to the list. */
static int host_name_add(struct daemon_config *cfg, const char *name)
{
    size_t n = strlen(name), have = strlen(cfg->host_names);
    int ok = n > 0 && n <= 253;
    for (const char *p = name; ok && *p; p++)
        ok = isalnum((unsigned char)*p) || *p == '-' || *p == '.';
    if (!ok) {
        fprintf(stderr, "withruntime serve: --host-name wants a DNS name, got %s\n", name);
        return -1;
    }
    if (have + n + 2 > sizeof(cfg->host_names)) {
        fprintf(stderr, "withruntime serve: --host-name: too many names\n");
        return -1;
    }
    snprintf(cfg->host_names + have, sizeof(cfg->host_names) - have, "%s%s", have ? "," : "", name);
    return 0;
}

/* serve's options: also what `withruntime completion` offers after `serve`. */
const struct option api_serve_options[] = {{"state-dir", required_argument, NULL, 's'},
                                           {"listen", required_argument, NULL, 'l'},
                                           {"socket", required_argument, NULL, 'u'},
                                           {"agent", required_argument, NULL, 'a'},
                                           {"platform", required_argument, NULL, 'p'},
                                           {"driver", required_argument, NULL, 'D'},
                                           {"debug", no_argument, NULL, 'd'},
                                           {"print-enums", no_argument, NULL, 'E'},
                                           {"output-memory-mib", required_argument, NULL, 'O'},
                                           {"idle-timeout", required_argument, NULL, 'I'},
                                           {"agent-deadline", required_argument, NULL, 'X'},
                                           {"max-connections", required_argument, NULL, 'C'},
                                           {"header-timeout", required_argument, NULL, 'H'},
                                           {"body-memory-mib", required_argument, NULL, 'B'},
                                           {"max-running", required_argument, NULL, 'R'},
                                           {"max-sandboxes", required_argument, NULL, 'S'},
                                           {"memory-overcommit", required_argument, NULL, 'M'},
                                           {"disk-overcommit", required_argument, NULL, 'K'},
                                           {"disk-reserve-mib", required_argument, NULL, 'V'},
                                           {"max-loop-devices", required_argument, NULL, 'L'},
                                           {"max-agent-log-kib", required_argument, NULL, 'G'},
                                           {"stopped-retention", required_argument, NULL, 'T'},
                                           {"egress", required_argument, NULL, 'N'},
                                           {"dns-upstream", required_argument, NULL, 'U'},
                                           {"public-ranges", required_argument, NULL, 'P'},
                                           {"extra-ca-file", required_argument, NULL, 'A'},
                                           {"host-name", required_argument, NULL, 'W'},
                                           {"price-vcpu-hour", required_argument, NULL, 1001},
                                           {"price-gib-hour", required_argument, NULL, 1002},
                                           {"cpu-floor-permille", required_argument, NULL, 1003},
                                           {"meter-clock", required_argument, NULL, 1004},
                                           {"pool", required_argument, NULL, 1005},
                                           {"freeze-after", required_argument, NULL, 1006},
                                           {"session-grace", required_argument, NULL, 1007},
                                           {"tls-cert", required_argument, NULL, 'c'},
                                           {"tls-key", required_argument, NULL, 'k'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};

static int parse_args(int argc, char **argv, struct server *srv)
{
    struct daemon_config *cfg = &srv->d.cfg;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", api_serve_options, NULL)) != -1) {
        switch (c) {
        case 's': snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s", optarg); break;
        case 'l': {
            if (strcmp(optarg, "none") == 0) {
                cfg->listen_port = 0;
                break;
            }
            const char *colon = strrchr(optarg, ':');
            char *end;
            long port = colon ? strtol(colon + 1, &end, 10) : -1;
            if (!colon || colon == optarg || *end || port <= 0 || port > 65535 ||
                (size_t)(colon - optarg) >= sizeof(cfg->listen_host)) {
                fprintf(stderr, "withruntime serve: --listen wants HOST:PORT, got %s\n", optarg);
                return -1;
            }
            snprintf(cfg->listen_host, sizeof(cfg->listen_host), "%.*s", (int)(colon - optarg),
                     optarg);
            cfg->listen_port = (int)port;
            break;
        }
        case 'u': snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s", optarg); break;
        case 'a': snprintf(cfg->agent_path, sizeof(cfg->agent_path), "%s", optarg); break;
        case 'p': snprintf(cfg->platform, sizeof(cfg->platform), "%s", optarg); break;
        case 'D': snprintf(cfg->driver, sizeof(cfg->driver), "%s", optarg); break;
        case 'd': cfg->debug = 1; break;
        case 'I': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || optarg[0] < '0' || optarg[0] > '9' || v < 1 || v > 86400) {
                fprintf(stderr,
                        "withruntime serve: --idle-timeout wants seconds from 1 to 86400, "
                        "got %s\n",
                        optarg);
                return -1;
            }
            srv->idle_s = (int)v;
            break;
        }
        case 'E': print_enums(); exit(0);
        case 1006: {
            char *end;
            errno = 0;
            double v = strtod(optarg, &end);
            if (errno || *end || end == optarg || !(v >= 0 && v <= 86400)) {
                fprintf(stderr,
                        "withruntime serve: --freeze-after wants 0..86400 seconds, got %s\n",
                        optarg);
                return -1;
            }
            cfg->freeze_after_ms = (uint64_t)(v * 1000 + 0.5);
            break;
        }
        case 1007: {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 86400) {
                fprintf(stderr,
                        "withruntime serve: --session-grace wants 1..86400 seconds, got %s\n",
                        optarg);
                return -1;
            }
            cfg->session_grace_s = (int)v;
            break;
        }
        case 'X': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 86400) {
                fprintf(stderr,
                        "withruntime serve: --agent-deadline wants 1..86400 seconds, got %s\n",
                        optarg);
                return -1;
            }
            cfg->agent_deadline_ms = (int)v * 1000;
            break;
        }
        case 'O': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 1048576) {
                fprintf(stderr, "withruntime serve: --output-memory-mib wants 1..1048576, got %s\n",
                        optarg);
                return -1;
            }
            cfg->output_budget = (size_t)v << 20;
            break;
        }
        case 1001:
        case 1002:
        case 1003: {
            static const char *const names[] = {"--price-vcpu-hour", "--price-gib-hour",
                                                "--cpu-floor-permille"};
            long long most = c == 1003 ? 1000 : 1000000000LL;
            char *end;
            errno = 0;
            long long v = strtoll(optarg, &end, 10);
            if (errno || *end || end == optarg || v < 0 || v > most) {
                fprintf(stderr, "withruntime serve: %s wants an integer from 0 to %lld, got %s\n",
                        names[c - 1001], most, optarg);
                return -1;
            }
            if (c == 1001)
                cfg->prices.vcpu_hour_micros = v;
            else if (c == 1002)
                cfg->prices.gib_hour_micros = v;
            else
                cfg->prices.cpu_floor_permille = (int)v;
            break;
        }
        case 1005: {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 0 || v > POOL_MAX_SIZE) {
                fprintf(stderr, "withruntime serve: --pool wants 0..%d, got %s\n", POOL_MAX_SIZE,
                        optarg);
                return -1;
            }
            cfg->pool_size = (int)v;
            break;
        }
        case 1004:
            if (!optarg[0] || strlen(optarg) >= sizeof(cfg->meter_clock_file)) {
                fprintf(stderr, "withruntime serve: --meter-clock wants a file name\n");
                return -1;
            }
            snprintf(cfg->meter_clock_file, sizeof(cfg->meter_clock_file), "%s", optarg);
            break;
        case 'N':
            if (strcmp(optarg, "auto") && strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "withruntime serve: --egress wants auto, on or off, got %s\n",
                        optarg);
                return -1;
            }
            snprintf(cfg->egress, sizeof(cfg->egress), "%s", optarg);
            break;
        case 'U':
            if (!optarg[0] || strlen(optarg) >= sizeof(cfg->dns_upstream)) {
                fprintf(stderr, "withruntime serve: --dns-upstream wants an IPv4 address[:port]\n");
                return -1;
            }
            snprintf(cfg->dns_upstream, sizeof(cfg->dns_upstream), "%s", optarg);
            break;
        case 'P':
            if (strlen(optarg) >= sizeof(cfg->public_ranges)) {
                fprintf(stderr, "withruntime serve: --public-ranges: too long\n");
                return -1;
            }
            snprintf(cfg->public_ranges, sizeof(cfg->public_ranges), "%s", optarg);
            break;
        case 'A':
            if (strlen(optarg) >= sizeof(cfg->extra_ca_file)) {
                fprintf(stderr, "withruntime serve: --extra-ca-file: path too long\n");
                return -1;
            }
            snprintf(cfg->extra_ca_file, sizeof(cfg->extra_ca_file), "%s", optarg);
            break;
        case 'W':
            if (host_name_add(cfg, optarg) < 0)
                return -1;
            break;
        case 'c':
        case 'k': {
            char *dst = c == 'c' ? srv->tls_cert : srv->tls_key;
            if (!optarg[0] || strlen(optarg) >= sizeof(srv->tls_cert)) {
                fprintf(stderr, "withruntime serve: --tls-%s wants a file name\n",
                        c == 'c' ? "cert" : "key");
                return -1;
            }
            snprintf(dst, sizeof(srv->tls_cert), "%s", optarg);
            break;
        }
        case 'C':
            if (flag_int("--max-connections", optarg, 8, 1000000, &srv->max_conns) < 0)
                return -1;
            break;
        case 'H':
            if (flag_int("--header-timeout", optarg, 1, 3600, &srv->header_s) < 0)
                return -1;
            break;
        case 'B':
            if (flag_int("--body-memory-mib", optarg, 1, 1048576, &srv->body_memory_mib) < 0)
                return -1;
            break;
        case 'R':
            if (flag_int("--max-running", optarg, 1, 100000, &cfg->max_running) < 0)
                return -1;
            break;
        case 'S':
            if (flag_int("--max-sandboxes", optarg, 1, 1000000, &cfg->max_sandboxes) < 0)
                return -1;
            break;
        case 'M':
            if (flag_factor("--memory-overcommit", optarg, 100, &cfg->memory_overcommit) < 0)
                return -1;
            break;
        case 'K':
            if (flag_factor("--disk-overcommit", optarg, 1000, &cfg->disk_overcommit) < 0)
                return -1;
            break;
        case 'V':
            if (flag_int("--disk-reserve-mib", optarg, 0, 1 << 30, &cfg->disk_reserve_mib) < 0)
                return -1;
            break;
        case 'L':
            if (flag_int("--max-loop-devices", optarg, 1, 1 << 20, &cfg->max_loop_devices) < 0)
                return -1;
            break;
        case 'G': {
            int kib;
            if (flag_int("--max-agent-log-kib", optarg, 1, 1 << 22, &kib) < 0)
                return -1;
            cfg->agent_log_max = (uint64_t)kib << 10;
            break;
        }
        case 'T':
            if (duration_parse(optarg, &cfg->stopped_retention) < 0) {
                fprintf(stderr,
                        "withruntime serve: --stopped-retention wants a duration (90s, 15m, 12h, "
                        "7d, or seconds; 0 = for ever), got %s\n",
                        optarg);
                return -1;
            }
            break;
        case 'h': api_serve_usage(stdout); exit(0);
        default: api_serve_usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "withruntime serve: unexpected argument %s\n", argv[optind]);
        return -1;
    }
    if (!srv->tls_cert[0] != !srv->tls_key[0]) {
        fprintf(stderr, "withruntime serve: --tls-cert and --tls-key go together\n");
        return -1;
    }
    if (srv->tls_cert[0] && !cfg->listen_port) {
        fprintf(stderr, "withruntime serve: --tls-cert is for the TCP listener, and --listen is "
                        "none\n");
        return -1;
    }
    if (!cfg->socket_path[0])
        snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s/withruntime.sock", cfg->state_dir);
    return 0;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    daemon_tick(arg);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct server *s = arg;
    if (s->d.shutting_down)
        return;
    log_info(NULL, "daemon.stopping", "signal=%d", (int)sig);
    s->d.shutting_down = 1;
    http_server_stop_accepting(s->http);
    /* In-flight requests get their answers as the channels close in daemon_shutdown; let the
     * loop flush what it can, then leave. */
    struct timeval tv = {0, 200000};
    event_base_loopexit(s->d.base, &tv);
}

static int listen_all(struct server *s, struct wr_err *err)
{
    struct daemon_config *cfg = &s->d.cfg;
    size_t max_body = cfg->max_upload > cfg->max_json_body ? cfg->max_upload : cfg->max_json_body;
    s->http = http_server_new(s->d.base, api_handle, &s->d, max_body, err);
    if (!s->http)
        return -1;
    http_server_set_idle_timeout(s->http, s->idle_s);
    int max_conns = s->max_conns;
    if (!max_conns) { /* leave fds for sandboxes, images and the state database */
        struct rlimit rl;
        max_conns = MAX_CONNS;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
            (rlim_t)max_conns > rl.rlim_cur / 2)
            max_conns = rl.rlim_cur / 2 > 64 ? (int)(rl.rlim_cur / 2) : 64;
    }
    s->max_conns = max_conns;
    http_server_set_limits(s->http, max_conns, s->header_s, (size_t)s->body_memory_mib << 20);
    http_server_set_body_limit(s->http, api_body_limit, &s->d);
    http_server_set_reply_hook(s->http, api_reply_hook, &s->d);
    if (s->tls_cert[0] && http_server_set_tls(s->http, s->tls_cert, s->tls_key, err) < 0)
        return -1;
    if (cfg->listen_port &&
        http_server_listen_tcp(s->http, cfg->listen_host, cfg->listen_port, err) < 0)
        return -1;
    return http_server_listen_unix(s->http, cfg->socket_path, err);
}

int api_serve_main(int argc, char **argv)
{
    static struct server s; /* static: large, and reachable to the end for leak checkers */
    memset(&s, 0, sizeof(s));
    s.d.lock_fd = -1;
    daemon_config_defaults(&s.d.cfg);
    s.idle_s = IDLE_TIMEOUT_S;
    s.header_s = HEADER_TIMEOUT_S;
    s.body_memory_mib = BODY_MEMORY_MIB;
    if (parse_args(argc, argv, &s) < 0)
        return 2;
    struct wr_err cerr = {0};
    if (daemon_config_check(&s.d.cfg, &cerr) < 0) {
        fprintf(stderr, "withruntime serve: %s\n", cerr.msg);
        return 2;
    }
    if (getenv("WITHRUNTIME_DEBUG"))
        log_set_level(WR_LOG_DEBUG);
    /* A daemon the CLI started runs as /proc/self/exe, which the kernel names "exe": ps, top
     * and pgrep would not know it as ours (nor tell it from runsc's processes, named alike). */
    prctl(PR_SET_NAME, "withruntime", 0, 0, 0);
    struct wr_err err = {0};
    if (daemon_open(&s.d, &err) < 0 || listen_all(&s, &err) < 0) {
        fprintf(stderr, "withruntime serve: %s\n", err.msg);
        if (s.http)
            http_server_free(s.http);
        daemon_close(&s.d);
        return 1;
    }
    struct event *sigterm = evsignal_new(s.d.base, SIGTERM, on_signal, &s);
    struct event *sigint = evsignal_new(s.d.base, SIGINT, on_signal, &s);
    event_add(sigterm, NULL);
    event_add(sigint, NULL);
    /* Leases end within a second of their time: look four times a second. */
    struct event *tick = event_new(s.d.base, -1, EV_PERSIST, on_tick, &s.d);
    struct timeval tv = {0, 250000};
    event_add(tick, &tv);
    struct daemon_config *cfg = &s.d.cfg;
    log_info(NULL, "daemon.started",
             "state_dir=%s listen=%s:%d tls=%s socket=%s agent=%s driver=%s sandboxes=%d "
             "idle_timeout=%d max_connections=%d header_timeout=%d body_memory_mib=%d",
             cfg->state_dir, cfg->listen_port ? cfg->listen_host : "none", cfg->listen_port,
             s.tls_cert[0] ? "on" : "off", cfg->socket_path, cfg->agent_path, cfg->driver,
             s.d.nsandboxes, s.idle_s, s.max_conns, s.header_s, s.body_memory_mib);

    event_base_dispatch(s.d.base);

    daemon_shutdown(&s.d);
    http_server_free(s.http);
    event_free(sigterm);
    event_free(sigint);
    event_free(tick);
    log_info(NULL, "daemon.stopped", NULL);
    daemon_close(&s.d);
    return 0;
}
