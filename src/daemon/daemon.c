/*
 * The daemon's life: opening the state directory and database, choosing the
 * driver, recovering sandboxes left by a previous run; and at the end
 * stopping (not deleting) running sandboxes so their files survive. Who
 * listens and runs the loop in between is the API's business (api/serve.c).
 */
#include "daemon/daemon.h"

#include <errno.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/proc.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/idle.h"
#include "daemon/keys.h"
#include "daemon/metrics.h"
#include "daemon/netlog.h"
#include "daemon/pool.h"
#include "daemon/pressure.h"
#include "daemon/sandbox.h"
#include "daemon/secrets.h"
#include "daemon/session.h"
#include "daemon/work.h"
#include "driver/driver.h"
#include "net/addr.h"
#include "net/gateway.h"
#include "net/proxy.h"
#include "net/tlsmitm.h"
#include "store/store.h"

void daemon_config_defaults(struct daemon_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    const char *sd = getenv("WITHRUNTIME_STATE_DIR");
    snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s", sd && *sd ? sd : "/var/lib/withruntime");
    snprintf(cfg->listen_host, sizeof(cfg->listen_host), "127.0.0.1");
    cfg->listen_port = 7070;
    cfg->max_json_body = 1 << 20;
    cfg->max_upload = (size_t)8 << 20; /* bigger files go in pieces (writes at an offset) */
    cfg->default_output_cap = 1 << 20;
    cfg->max_output_cap = 16 << 20;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cfg->max_cpus = n > 0 ? (int)n : 1;
    cfg->default_timeout = 3600;
    cfg->max_timeout = 86400;
    cfg->default_exec_timeout = 300;
    cfg->hello_timeout_ms = 30000;
    cfg->agent_deadline_ms = AGENTCONN_DEADLINE_MS;
    cfg->pids_max = 1024;
    cfg->default_disk_mib = 10240;
    cfg->pool_size = POOL_DEFAULT_SIZE;
    cfg->prices.vcpu_hour_micros = METER_DEFAULT_VCPU_HOUR;
    cfg->prices.gib_hour_micros = METER_DEFAULT_GIB_HOUR;
    cfg->prices.cpu_floor_permille = METER_DEFAULT_CPU_FLOOR;
    /* A quarter of the host's memory, at most 4 GiB, for output held in the daemon. */
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : (1ULL << 32);
    uint64_t budget = ram / 4 < (4ULL << 30) ? ram / 4 : (4ULL << 30);
    cfg->output_budget = (size_t)budget;
    cfg->max_running = 100;
    cfg->max_sandboxes = 1000;
    /* Bounds on limits, not on use (admission.c says why these). */
    cfg->memory_overcommit = 32.0;
    cfg->disk_overcommit = 16.0;
    cfg->disk_reserve_mib = 2048;
    cfg->max_loop_devices = 256;
    cfg->agent_log_max = 1 << 20;
    cfg->stopped_retention = 7 * 86400;
    cfg->freeze_after_ms = IDLE_DEFAULT_FREEZE_AFTER_MS;
    cfg->session_grace_s = SESSION_DEFAULT_GRACE_S;
    snprintf(cfg->egress, sizeof(cfg->egress), "auto");
}

int daemon_config_check(const struct daemon_config *cfg, struct wr_err *err)
{
    struct sockaddr_in sin;
    struct addr_ranges r;
    if (cfg->dns_upstream[0] && gateway_parse_upstream(cfg->dns_upstream, &sin, err) < 0)
        return wr_err_prefix(err, "--dns-upstream");
    if (addr_ranges_parse(cfg->public_ranges, &r, err) < 0)
        return wr_err_prefix(err, "--public-ranges");
    return 0;
}

/* ---- the gateway's questions about sandboxes ---- */

/* What sandbox id may reach: its policy, and its secrets that its owner may use now. A revoked
 * key's sandboxes get none: its grants went with it. */
static json_t *gw_slot_state(void *ctx, const char *id)
{
    struct daemon *d = ctx;
    struct sandbox *sb = sandbox_find(d, id);
    if (!sb || sb->unlinked)
        return NULL;
    json_t *o = json_pack("{s:O?}", "policy", sb->network);
    if (!json_object_size(sb->secrets))
        return o;
    if (sb->key_id[0]) {
        const struct api_key *k = keys_find(d->keys, sb->key_id);
        if (!k || k->revoked_at)
            return o;
    }
    json_object_set_new(o, "inject", secrets_injections_json(d->secrets, sb->secrets, sb->key_id));
    return o;
}

static void gw_denied(void *ctx, const char *id, const char *via, const char *host, int port,
                      const char *reason)
{
    struct sandbox *sb = id && id[0] ? sandbox_find(ctx, id) : NULL;
    int to_log = sb ? netlog_add(&sb->netlog, via, host, port, reason, now_ms_wall()) : 1;
    metrics_denied(via, reason);
    if (to_log)
        log_info(sb ? sb->id : NULL, "network.denied", "via=%s host=\"%.256s\" port=%d reason=%s",
                 via, host ? host : "", port, reason ? reason : "");
}

#define PEM_MAX (1024 * 1024)

/* Reads a file of PEM certificates (at most PEM_MAX bytes) into a new string; what names it in
 * errors. Returns NULL with err set. */
static char *read_pem(const char *path, const char *what, struct wr_err *err)
{
    cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        wr_err_sys(err, errno, "%s %s", what, path);
        return NULL;
    }
    char *buf = xmalloc(PEM_MAX + 1);
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, PEM_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len > PEM_MAX)
            break;
    }
    buf[len > PEM_MAX ? PEM_MAX : len] = '\0';
    if (len > PEM_MAX || !strstr(buf, "-----BEGIN CERTIFICATE-----") || memchr(buf, 0, len)) {
        free(buf);
        wr_err_set(err, EINVAL, "%s %s: want PEM certificates, at most 1 MiB", what, path);
        return NULL;
    }
    return buf;
}

/* What sandboxes trust besides their image's bundle: the daemon's CA (ca, its PEM text, taken;
 * NULL if networking made none) and --extra-ca-file's certificates. */
static int read_trust(struct daemon *d, char *ca, struct wr_err *err)
{
    char *extra = NULL;
    if (d->cfg.extra_ca_file[0] &&
        !(extra = read_pem(d->cfg.extra_ca_file, "--extra-ca-file", err))) {
        free(ca);
        return -1;
    }
    if (!ca && !extra)
        return 0;
    size_t a = ca ? strlen(ca) : 0, b = extra ? strlen(extra) : 0;
    d->extra_ca_pem = xmalloc(a + b + 2);
    snprintf(d->extra_ca_pem, a + b + 2, "%s%s%s", ca ? ca : "", a && b ? "\n" : "",
             extra ? extra : "");
    free(ca);
    free(extra);
    return 0;
}

/* The daemon's own CA (STATE_DIR/ca/ca.pem and ca.key, made on first use), with which the
 * proxy signs the certificates it shows sandboxes. */
static int ensure_ca(struct daemon *d, char *cert, char *key, size_t cap, struct wr_err *err)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/ca", d->cfg.state_dir);
    snprintf(cert, cap, "%s/ca.pem", dir);
    snprintf(key, cap, "%s/ca.key", dir);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return wr_err_sys(err, errno, "creating %s", dir);
    if (access(cert, F_OK) == 0 && access(key, F_OK) == 0)
        return 0;
    char host[128] = "";
    gethostname(host, sizeof(host) - 1);
    char cn[200];
    snprintf(cn, sizeof(cn), "withruntime sandbox CA (%.120s)", host[0] ? host : "localhost");
    if (tlsmitm_ca_create(cert, key, cn, err) < 0)
        return wr_err_prefix(err, "making the daemon's CA");
    log_info(NULL, "gateway.ca_created", "cert=\"%s\"", cert);
    return 0;
}

static void gw_allowed(void *ctx, const char *id, const char *host, int port)
{
    struct sandbox *sb = id && id[0] ? sandbox_find(ctx, id) : NULL;
    if (sb && netlog_note_allowed(&sb->netlog, now_ms_wall()))
        log_info(sb->id, "network.allowed", "host=\"%.256s\" port=%d", host ? host : "", port);
}

/* Opens sandbox networking as cfg->egress says. Returns 0, or -1 with err set ("on" only). */
static int open_gateway(struct daemon *d, struct wr_err *err)
{
    struct daemon_config *cfg = &d->cfg;
    if (!strcmp(cfg->egress, "off")) {
        snprintf(d->gw_error, sizeof(d->gw_error),
                 "sandbox networking is off (serve --egress off)");
        return 0;
    }
    struct gateway_config gc = {0};
    snprintf(gc.dns_upstream, sizeof(gc.dns_upstream), "%s", cfg->dns_upstream);
    /* Sized like the API's cap (serve's listen_all), so the two together cannot use up the fds:
     * 250 proxy connections from each of 5 sandboxes did, at 1,024. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        gc.proxy_max_conns = proxy_conns_for_fds((unsigned long long)rl.rlim_cur);
    snprintf(gc.public_ranges, sizeof(gc.public_ranges), "%s", cfg->public_ranges);
    struct gateway_hooks hooks = {
        .slot_state = gw_slot_state, .denied = gw_denied, .allowed = gw_allowed};
    struct wr_err e = {0};
    char cert[PATH_MAX], key[PATH_MAX];
    char *ca = NULL; /* the CA's text: for the egress process, and for sandboxes to trust */
    if (ensure_ca(d, cert, key, sizeof(cert), &e) == 0) {
        if (!(ca = read_pem(cert, "the daemon's CA", err)))
            return -1;
        gc.ca_cert = cert;
        gc.ca_key = key;
        gc.ca_cert_pem = ca;
        gc.upstream_extra_ca = cfg->extra_ca_file[0] ? cfg->extra_ca_file : NULL;
        d->gw = gateway_open(d->base, &gc, &hooks, d, &e);
    }
    if (d->gw) {
        d->gw_error[0] = '\0';
        return read_trust(d, ca, err);
    }
    free(ca);
    snprintf(d->gw_error, sizeof(d->gw_error), "this host cannot run sandbox networking: %s",
             e.msg);
    if (!strcmp(cfg->egress, "on")) {
        *err = e;
        return wr_err_prefix(err, "sandbox networking (serve --egress on)");
    }
    log_warn(NULL, "gateway.unavailable", "error=\"%s\"", e.msg);
    return read_trust(d, NULL, err);
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

/*
 * Every client connection, agent channel and sandbox costs fds; services often start with a
 * soft limit of 1024 (systemd's default), which 1,000 idle clients would use up. The hard limit
 * is the host's word; the soft one is raised to it (epoll has no FD_SETSIZE).
 */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        log_warn(NULL, "daemon.fd_limit", "error=\"%s\" soft=%llu", strerror(errno),
                 (unsigned long long)was);
    else
        log_info(NULL, "daemon.fd_limit", "soft=%llu was=%llu", (unsigned long long)rl.rlim_cur,
                 (unsigned long long)was);
}

/* Makes the database and its WAL files 0600 (SQLite gives new WAL files the database's mode,
 * and the database would otherwise be made with the umask's 0644). */
static int private_db_files(const char *db, struct wr_err *err)
{
    int fd = open(db, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || fchmod(fd, 0600) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return wr_err_sys(err, e, "open %s", db);
    }
    close(fd);
    static const char *const suffixes[] = {"-wal", "-shm"};
    for (size_t i = 0; i < WR_ARRAY_LEN(suffixes); i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s%s", db, suffixes[i]);
        if (chmod(p, 0600) < 0 && errno != ENOENT)
            return wr_err_sys(err, errno, "chmod %s", p);
    }
    return 0;
}

/*
 * Writes "PID SOCKET" into the held lock file: a CLI given --state-dir finds the daemon that
 * serves the directory there, on whatever socket it listens (serve --socket), rather than
 * starting a second one (cli/discover.c). A relative socket path is made absolute.
 */
static void lock_record(int fd, const char *socket_path)
{
    char cwd[PATH_MAX] = "", rec[2 * PATH_MAX + 32];
    if (socket_path[0] && socket_path[0] != '/' && !getcwd(cwd, sizeof(cwd)))
        cwd[0] = '\0';
    int n = snprintf(rec, sizeof(rec), "%ld %s%s%s\n", (long)getpid(), cwd, cwd[0] ? "/" : "",
                     socket_path);
    if (n < 0 || (size_t)n >= sizeof(rec) || ftruncate(fd, 0) < 0 ||
        pwrite(fd, rec, (size_t)n, 0) != n)
        log_warn(NULL, "daemon.lock_record_failed", "error=\"%s\"", strerror(errno));
}

int daemon_open(struct daemon *d, struct wr_err *err)
{
    struct daemon_config *cfg = &d->cfg;
    d->lock_fd = -1;
    /* Big buffers (a transfer's chunks) are mapped and unmapped on their own, never left in
     * the heap; and at most two arenas, whatever the number of worker threads. Free memory at
     * the heap's top is not handed back at every free (each upload would fault its pages in
     * afresh) but by the periodic malloc_trim (TRIM_EVERY_MS). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    mallopt(M_ARENA_MAX, 2);
    if (geteuid() != 0)
        return wr_err_set(err, EPERM, "must run as root (it runs runsc and mounts)");
    signal(SIGPIPE, SIG_IGN);
    umask(022);
    raise_fd_limit();
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    d->host_memory_mib = pages > 0 && page > 0 ? (long long)pages * page / (1 << 20) : 0;
    find_agent(cfg);
    if (!cfg->agent_path[0] || access(cfg->agent_path, X_OK) != 0)
        return wr_err_set(err, ENOENT, "cannot find withruntime-agent (give --agent PATH)");

    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/sandboxes", cfg->state_dir);
    if (mkdir_p(cfg->state_dir, 0700) < 0 || mkdir_p(path, 0700) < 0)
        return wr_err_sys(err, errno, "cannot create %s", path);
    /* The database holds every sandbox's env and the keys' hashes: root's only. (A directory
     * made by an older daemon was 0755.) */
    if (chmod(cfg->state_dir, 0700) < 0)
        return wr_err_sys(err, errno, "chmod %s", cfg->state_dir);
    /* One daemon per state directory. */
    snprintf(path, sizeof(path), "%s/daemon.lock", cfg->state_dir);
    d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d->lock_fd < 0 || flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0)
        return wr_err_set(err, EBUSY, "another daemon is using %s", cfg->state_dir);
    lock_record(d->lock_fd, cfg->socket_path);

    if (proc_reaper_start(err) < 0)
        return -1;
    d->reaper_started = 1;
    struct driver_config dc = {.state_dir = cfg->state_dir,
                               .platform = cfg->platform[0] ? cfg->platform : NULL,
                               .debug = cfg->debug,
                               .agent_log_max = cfg->agent_log_max};
    /* Probe now (runsc there, which platform works) so the first create does not pay for it
     * and a host that cannot run sandboxes says so at once. */
    char detail[256] = "";
    d->driver = driver_select(cfg->driver, &dc, detail, sizeof(detail), err);
    if (!d->driver)
        return wr_err_prefix(err, "see `withruntime doctor`");
    log_info(NULL, "driver.ready", "driver=%s detail=\"%s\"", d->driver->name, detail);
    snprintf(cfg->driver, sizeof(cfg->driver), "%s", d->driver->name);
    snprintf(path, sizeof(path), "%s/withruntime.db", cfg->state_dir);
    if (private_db_files(path, err) < 0)
        return -1;
    d->store = store_open(path, err);
    if (!d->store)
        return -1;
    d->keys = keys_open(d->store, err);
    if (!d->keys)
        return wr_err_prefix(err, "API keys");

    evthread_use_pthreads();
    d->base = event_base_new();
    d->wq = d->base ? work_queue_new(d->base, 8) : NULL;
    d->wq_fast = d->base ? work_queue_new(d->base, 1) : NULL;
    d->wq_freeze = d->base ? work_queue_new(d->base, 1) : NULL;
    if (!d->base || !d->wq || !d->wq_fast || !d->wq_freeze)
        return wr_err_set(err, ENOMEM, "cannot set up the event loop");
    /* From here on this thread runs the loop, and never a driver operation. */
    driver_forbid_this_thread();
    d->secrets = secrets_open(cfg->state_dir, d->store, err);
    if (!d->secrets)
        return wr_err_prefix(err, "secrets");
    if (open_gateway(d, err) < 0)
        return -1;
    if (sandbox_load_all(d, err) < 0)
        return -1;
    /* Sandboxes left by a previous run are settled (stopped or deleted) before anyone asks. */
    while (work_pending(d->wq) > 0)
        event_base_loop(d->base, EVLOOP_ONCE);
    return meter_open(d, err);
}

int daemon_reserve_output(struct daemon *d, size_t n, const char *what, struct wr_err *err)
{
    if (n > d->cfg.output_budget - d->output_reserved) {
        log_warn(NULL, "daemon.output_budget", "what=%s want=%zu reserved=%zu budget=%zu", what, n,
                 d->output_reserved, d->cfg.output_budget);
        return wr_err_kind(err, WR_E_UNAVAILABLE, 0,
                           "the daemon is holding %zu MiB of output for running commands and "
                           "transfers (its limit is %zu MiB); this %s needs %zu MiB more: retry "
                           "later, or ask for a smaller max_output_bytes",
                           d->output_reserved >> 20, d->cfg.output_budget >> 20, what,
                           (n + (1 << 20) - 1) >> 20);
    }
    d->output_reserved += n;
    return 0;
}

void daemon_release_output(struct daemon *d, size_t n)
{
    d->output_reserved = n > d->output_reserved ? 0 : d->output_reserved - n;
}

/* How often the heap's free memory goes back to the system (see daemon_tick). */
#define TRIM_EVERY_MS 5000

void daemon_tick(struct daemon *d)
{
    if (!d->shutting_down) {
        sandbox_check_leases(d);
        sandbox_check_retention(d);
        meter_tick(d);
        pressure_tick(d);
        if (d->cfg.pool_size > 0)
            pool_tick(d);
    }
    /* Bursts (big transfers, many connections) leave freed memory in malloc's arenas; hand it
     * back so the daemon returns close to its idle size when the load ends. */
    uint64_t now = now_ms_monotonic();
    if (now - d->trimmed_ms >= TRIM_EVERY_MS) {
        d->trimmed_ms = now;
        malloc_trim(0);
    }
}

/* How long a shutdown waits for creates and starts in flight (a pool refill, most often) to
 * settle, so what they made is stopped or destroyed like the rest, not left mounted. */
#define SHUTDOWN_SETTLE_MS 60000

static int any_starting(const struct daemon *d)
{
    for (const struct sandbox *sb = d->sandboxes; sb; sb = sb->next)
        if (sb->state == SB_CREATING || sb->state == SB_STARTING)
            return 1;
    return 0;
}

void daemon_shutdown(struct daemon *d)
{
    d->shutting_down = 1;
    if (!d->base || !d->wq)
        return; /* never opened that far, or already shut down (the queues are gone) */
    uint64_t until = now_ms_monotonic() + SHUTDOWN_SETTLE_MS;
    while (any_starting(d) && now_ms_monotonic() < until)
        event_base_loop(d->base, EVLOOP_ONCE);
    /* Close channels (answering in-flight requests), flush, stop sandboxes. */
    sandbox_stop_all(d);
    event_base_loop(d->base, EVLOOP_NONBLOCK);
    /* First: a freeze or thaw's completion queues the stop that waited for it on d->wq. */
    if (d->wq_freeze)
        work_queue_free(d->wq_freeze);
    d->wq_freeze = NULL;
    if (d->wq_fast)
        work_queue_free(d->wq_fast);
    if (d->wq)
        work_queue_free(d->wq); /* waits for driver jobs in flight (the stops); their
                                   completions run */
    d->wq = d->wq_fast = NULL;
    event_base_loop(d->base, EVLOOP_NONBLOCK);
}

void daemon_close(struct daemon *d)
{
    daemon_shutdown(d);
    sandbox_free_all(d);
    gateway_close(d->gw);
    d->gw = NULL;
    free(d->extra_ca_pem);
    d->extra_ca_pem = NULL;
    secrets_free(d->secrets);
    d->secrets = NULL;
    meter_close(d);
    audit_close(d);
    keys_free(d->keys);
    d->keys = NULL;
    if (d->store)
        store_close(d->store);
    if (d->base)
        event_base_free(d->base);
    if (d->reaper_started)
        proc_reaper_stop();
    if (d->lock_fd >= 0)
        close(d->lock_fd);
    d->store = NULL;
    d->base = NULL;
    d->lock_fd = -1;
}
