/*
 * `withruntime serve`: parses flags, opens the state directory and database,
 * recovers sandboxes left by a previous run, listens, and runs the loop until
 * SIGTERM or SIGINT. Shutdown stops accepting, answers what is in flight, and
 * stops (not deletes) running sandboxes so their files survive.
 */
#include "daemon/daemon.h"

#include <errno.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"
#include "common/log.h"
#include "common/proc.h"
#include "common/util.h"
#include "daemon/sandbox.h"
#include "daemon/work.h"
#include "http/http.h"
#include "store/store.h"

void daemon_config_defaults(struct daemon_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    const char *sd = getenv("WITHRUNTIME_STATE_DIR");
    snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s", sd && *sd ? sd : "/var/lib/withruntime");
    snprintf(cfg->listen_host, sizeof(cfg->listen_host), "127.0.0.1");
    cfg->listen_port = 7070;
    cfg->max_json_body = 1 << 20;
    cfg->max_upload = (size_t)512 << 20;
    cfg->default_output_cap = 1 << 20;
    cfg->max_output_cap = 16 << 20;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cfg->max_cpus = n > 0 ? (int)n : 1;
    cfg->default_timeout = 3600;
    cfg->max_timeout = 86400;
    cfg->default_exec_timeout = 300;
    cfg->hello_timeout_ms = 30000;
    cfg->pids_max = 1024;
    cfg->default_disk_mib = 10240;
}

/* The agent binary: --agent, else beside this binary, else in ../lib/withruntime/. */
static void find_agent(struct daemon_config *cfg)
{
    if (cfg->agent_path[0])
        return;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return;
    *slash = '\0';
    const char *candidates[] = {"%s/withruntime-agent", "%s/../lib/withruntime/withruntime-agent"};
    for (size_t i = 0; i < WR_ARRAY_LEN(candidates); i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof(p), candidates[i], self);
        char real[PATH_MAX];
        if (access(p, X_OK) == 0 && realpath(p, real)) {
            snprintf(cfg->agent_path, sizeof(cfg->agent_path), "%s", real);
            return;
        }
    }
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: withruntime serve [--state-dir DIR] [--listen HOST:PORT|none] [--socket PATH]\n"
            "                         [--agent PATH] [--driver gvisor|fake]\n"
            "                         [--platform systrap|ptrace|kvm] [--debug] [--print-enums]\n"
            "\n"
            "Runs the daemon: the HTTP API on HOST:PORT (default 127.0.0.1:7070) and on the Unix\n"
            "socket (default STATE_DIR/withruntime.sock). State lives in STATE_DIR (default\n"
            "$WITHRUNTIME_STATE_DIR or /var/lib/withruntime). SIGTERM stops it cleanly.\n"
            "--driver picks the isolation driver (default: the first this host can run, as\n"
            "`withruntime doctor` says; `fake` runs agents as plain host processes, for tests).\n"
            "--print-enums prints the sandbox states and state reasons as JSON and exits.\n");
}

/* The states and reasons the API can report, for the tests that check the spec against them. */
static void print_enums(void)
{
    json_t *states = json_array(), *reasons = json_array();
    for (const char *const *p = sandbox_state_names; *p; p++)
        json_array_append_new(states, json_string(*p));
    for (const char *const *p = sandbox_reason_names; *p; p++)
        json_array_append_new(reasons, json_string(*p));
    json_t *o = json_pack("{s:o, s:o}", "states", states, "reasons", reasons);
    char *s = json_dumps(o, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(o);
}

static int parse_args(int argc, char **argv, struct daemon_config *cfg)
{
    static const struct option opts[] = {{"state-dir", required_argument, NULL, 's'},
                                         {"listen", required_argument, NULL, 'l'},
                                         {"socket", required_argument, NULL, 'u'},
                                         {"agent", required_argument, NULL, 'a'},
                                         {"platform", required_argument, NULL, 'p'},
                                         {"driver", required_argument, NULL, 'D'},
                                         {"debug", no_argument, NULL, 'd'},
                                         {"print-enums", no_argument, NULL, 'E'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
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
        case 'E': print_enums(); exit(0);
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "withruntime serve: unexpected argument %s\n", argv[optind]);
        return -1;
    }
    if (!cfg->socket_path[0])
        snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s/withruntime.sock", cfg->state_dir);
    return 0;
}

static int mkdir_p(const char *path, mode_t mode)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

static void on_lease_tick(evutil_socket_t fd, short what, void *arg)
{
    struct daemon *d = arg;
    if (!d->shutting_down)
        sandbox_check_leases(d);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct daemon *d = arg;
    if (d->shutting_down)
        return;
    log_info(NULL, "daemon.stopping", "signal=%d", (int)sig);
    d->shutting_down = 1;
    http_server_stop_accepting(d->http);
    /* In-flight requests get their answers as the channels close in sandbox_stop_all; let the
     * loop flush what it can, then leave. */
    struct timeval tv = {0, 200000};
    event_base_loopexit(d->base, &tv);
}

int daemon_main(int argc, char **argv)
{
    struct daemon d;
    memset(&d, 0, sizeof(d));
    daemon_config_defaults(&d.cfg);
    if (parse_args(argc, argv, &d.cfg) < 0)
        return 2;
    if (getenv("WITHRUNTIME_DEBUG"))
        log_set_level(WR_LOG_DEBUG);
    if (geteuid() != 0) {
        fprintf(stderr, "withruntime serve: must run as root (it runs runsc and mounts)\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    umask(022);
    find_agent(&d.cfg);
    if (!d.cfg.agent_path[0] || access(d.cfg.agent_path, X_OK) != 0) {
        fprintf(stderr, "withruntime serve: cannot find withruntime-agent (give --agent PATH)\n");
        return 1;
    }

    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/sandboxes", d.cfg.state_dir);
    if (mkdir_p(d.cfg.state_dir, 0755) < 0 || mkdir_p(path, 0700) < 0) {
        fprintf(stderr, "withruntime serve: cannot create %s: %s\n", path, strerror(errno));
        return 1;
    }
    /* One daemon per state directory. */
    snprintf(path, sizeof(path), "%s/daemon.lock", d.cfg.state_dir);
    int lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) < 0) {
        fprintf(stderr, "withruntime serve: another daemon is using %s\n", d.cfg.state_dir);
        return 1;
    }

    struct wr_err err = {0};
    if (proc_reaper_start(&err) < 0) {
        fprintf(stderr, "withruntime serve: %s\n", err.msg);
        return 1;
    }
    struct driver_config dc = {.state_dir = d.cfg.state_dir,
                               .platform = d.cfg.platform[0] ? d.cfg.platform : NULL,
                               .debug = d.cfg.debug};
    /* Probe now (runsc there, which platform works) so the first create does not pay for it
     * and a host that cannot run sandboxes says so at once. */
    char detail[256] = "";
    d.driver = driver_select(d.cfg.driver, &dc, detail, sizeof(detail), &err);
    if (!d.driver) {
        fprintf(stderr, "withruntime serve: %s (see `withruntime doctor`)\n", err.msg);
        return 1;
    }
    log_info(NULL, "driver.ready", "driver=%s detail=\"%s\"", d.driver->name, detail);
    snprintf(path, sizeof(path), "%s/withruntime.db", d.cfg.state_dir);
    d.store = store_open(path, &err);
    if (!d.store) {
        fprintf(stderr, "withruntime serve: %s\n", err.msg);
        return 1;
    }

    evthread_use_pthreads();
    d.base = event_base_new();
    d.wq = work_queue_new(d.base, 8);
    if (!d.base || !d.wq) {
        fprintf(stderr, "withruntime serve: cannot set up the event loop\n");
        return 1;
    }
    if (sandbox_load_all(&d, &err) < 0) {
        fprintf(stderr, "withruntime serve: %s\n", err.msg);
        return 1;
    }
    size_t max_body =
        d.cfg.max_upload > d.cfg.max_json_body ? d.cfg.max_upload : d.cfg.max_json_body;
    d.http = http_server_new(d.base, api_handle, &d, max_body, &err);
    if (!d.http ||
        (d.cfg.listen_port &&
         http_server_listen_tcp(d.http, d.cfg.listen_host, d.cfg.listen_port, &err) < 0) ||
        http_server_listen_unix(d.http, d.cfg.socket_path, &err) < 0) {
        fprintf(stderr, "withruntime serve: %s\n", err.msg);
        return 1;
    }
    d.sigterm = evsignal_new(d.base, SIGTERM, on_signal, &d);
    d.sigint = evsignal_new(d.base, SIGINT, on_signal, &d);
    event_add(d.sigterm, NULL);
    event_add(d.sigint, NULL);
    /* Leases end within a second of their time: look four times a second. */
    struct event *lease_tick = event_new(d.base, -1, EV_PERSIST, on_lease_tick, &d);
    struct timeval tick = {0, 250000};
    event_add(lease_tick, &tick);
    log_info(NULL, "daemon.started",
             "state_dir=%s listen=%s:%d socket=%s agent=%s driver=%s sandboxes=%d", d.cfg.state_dir,
             d.cfg.listen_port ? d.cfg.listen_host : "none", d.cfg.listen_port, d.cfg.socket_path,
             d.cfg.agent_path, d.driver->name, d.nsandboxes);

    event_base_dispatch(d.base);

    /* Shutdown: close channels (answering in-flight requests), flush, stop sandboxes. */
    d.shutting_down = 1;
    sandbox_stop_all(&d);
    event_base_loop(d.base, EVLOOP_NONBLOCK);
    work_queue_free(d.wq); /* waits for driver jobs in flight; their completions run */
    event_base_loop(d.base, EVLOOP_NONBLOCK);
    http_server_free(d.http);
    event_free(d.sigterm);
    event_free(d.sigint);
    event_free(lease_tick);
    log_info(NULL, "daemon.stopped", NULL);
    store_close(d.store);
    proc_reaper_stop();
    close(lock_fd);
    return 0;
}
