/*
 * Finding the daemon, in the order DESIGN.md gives: RUNTIME_URL, else the connection saved by
 * `withruntime login`, else the local Unix socket, starting a daemon there when none answers
 * and we are root. Starting one is what makes `withruntime sandbox run -- CMD` work on a fresh
 * host with no setup step; a lock on the daemon log keeps two CLIs from starting two daemons.
 */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/ids.h"
#include "common/util.h"

#define AUTOSTART_WAIT_MS 15000
#define LOG_TAIL_BYTES 2048

/* ---- the saved connection ---- */

int cli_connection_path(char *buf, size_t len, struct wr_err *err)
{
    const char *xdg = getenv("XDG_CONFIG_HOME");
    if (xdg && xdg[0] == '/') {
        snprintf(buf, len, "%s/withruntime/connection.json", xdg);
        return 0;
    }
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') {
        struct passwd *pw = getpwuid(getuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home || !home[0])
        return wr_err_set(err, ENOENT, "cannot tell the home directory (set HOME)");
    if ((size_t)snprintf(buf, len, "%s/.config/withruntime/connection.json", home) >= len)
        return wr_err_set(err, ENAMETOOLONG, "home directory path too long");
    return 0;
}

static int mkdir_p(const char *path, mode_t mode, struct wr_err *err)
{
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s", path) >= sizeof(tmp))
        return wr_err_set(err, ENAMETOOLONG, "path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
            return wr_err_sys(err, errno, "mkdir %s", tmp);
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return wr_err_sys(err, errno, "mkdir %s", tmp);
    return 0;
}

int cli_connection_save(const char *url, const char *key, const char *ca_file, struct wr_err *err)
{
    char path[PATH_MAX];
    if (cli_connection_path(path, sizeof(path), err) < 0)
        return -1;
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    *strrchr(dir, '/') = '\0';
    if (mkdir_p(dir, 0700, err) < 0)
        return -1;

    json_t *o = json_pack("{ss}", "url", url);
    if (key && key[0])
        json_object_set_new(o, "key", json_string(key));
    if (ca_file && ca_file[0])
        json_object_set_new(o, "ca_file", json_string(ca_file));
    cleanup_free char *text = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    if (!text)
        return wr_err_set(err, ENOMEM, "cannot encode the connection");

    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return wr_err_sys(err, errno, "cannot write %s", tmp);
    if (write_all(fd, text, strlen(text)) < 0 || write_all(fd, "\n", 1) < 0 || fsync(fd) < 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return wr_err_sys(err, e, "cannot write %s", tmp);
    }
    close(fd);
    if (rename(tmp, path) < 0) {
        int e = errno;
        unlink(tmp);
        return wr_err_sys(err, e, "cannot write %s", path);
    }
    return 0;
}

/* Returns 1 with ep filled when a saved connection exists, 0 when none, -1 on a bad file. */
static int connection_load(struct cli_endpoint *ep, struct wr_err *err)
{
    char path[PATH_MAX];
    if (cli_connection_path(path, sizeof(path), NULL) < 0)
        return 0;
    if (access(path, F_OK) < 0)
        return 0;
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o)
        return wr_err_set(err, EINVAL, "%s: %s (run `withruntime login URL` again)", path, je.text);
    const char *url = json_string_value(json_object_get(o, "url"));
    const char *key = json_string_value(json_object_get(o, "key"));
    const char *ca = json_string_value(json_object_get(o, "ca_file"));
    int r = 1;
    if (!url) {
        r = wr_err_set(err, EINVAL, "%s: no \"url\" (run `withruntime login URL` again)", path);
    } else if (cli_url_parse(url, &ep->url, err) < 0) {
        r = wr_err_prefix(err, "%s", path);
    } else {
        snprintf(ep->desc, sizeof(ep->desc), "%s", url);
        snprintf(ep->key, sizeof(ep->key), "%s", key ? key : "");
        snprintf(ep->ca_file, sizeof(ep->ca_file), "%s", ca ? ca : "");
    }
    json_decref(o);
    return r;
}

/* ---- the local daemon ---- */

/* Can we connect to the Unix socket? Returns 0, or -1 with errno set. */
static int socket_probe(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

static int health_ok(const struct cli_endpoint *ep)
{
    struct cli_request req;
    cli_request_init(&req, "GET", "/v1/health");
    req.timeout_ms = 2000;
    struct cli_response resp;
    struct wr_err err;
    int r = cli_request_do(ep, &req, &resp, &err);
    cli_response_free(&resp);
    return r == 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Prints what the daemon wrote to its log since offset start (its last LOG_TAIL_BYTES). */
static void print_log_tail(const char *log, off_t start)
{
    int fd = open(log, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    off_t end = lseek(fd, 0, SEEK_END);
    if (end > start) {
        off_t from = end - start > LOG_TAIL_BYTES ? end - LOG_TAIL_BYTES : start;
        char buf[LOG_TAIL_BYTES + 1];
        ssize_t n = pread(fd, buf, (size_t)(end - from), from);
        if (n > 0) {
            buf[n] = '\0';
            fprintf(stderr, "--- %s ---\n%s%s", log, buf, buf[n - 1] == '\n' ? "" : "\n");
        }
    }
    close(fd);
}

/*
 * Starts `/proc/self/exe serve --state-dir DIR` detached from us: a double fork with setsid in
 * between, so it is in no session or process group of ours and is reparented away from us;
 * stdin /dev/null, stdout and stderr appended to DIR/daemon.log. Returns its pid or -1.
 */
static pid_t spawn_daemon(const char *state_dir, int logfd, struct wr_err *err)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return wr_err_sys(err, errno, "pipe");
    fflush(NULL);
    pid_t child = fork();
    if (child < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        return wr_err_sys(err, e, "fork");
    }
    if (child == 0) {
        close(p[0]);
        setsid();
        pid_t gc = fork();
        if (gc != 0) {
            (void)!write(p[1], &gc, sizeof(gc));
            _exit(gc < 0 ? 1 : 0);
        }
        cli_signals_child_reset();
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null < 0 || dup2(null, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
            _exit(127);
        if (chdir("/") < 0)
            _exit(127);
        /* Only 0-2: an fd inherited from whoever ran us (a test harness's pipe) must not be
         * held open for the daemon's lifetime. */
        close_range(3, ~0U, 0);
        umask(022);
        char *argv[] = {"withruntime", "serve", "--state-dir", (char *)state_dir, NULL};
        execv("/proc/self/exe", argv);
        dprintf(2, "withruntime: cannot exec /proc/self/exe: %s\n", strerror(errno));
        _exit(127);
    }
    close(p[1]);
    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    pid_t gc = -1;
    ssize_t n = read_full(p[0], &gc, sizeof(gc));
    close(p[0]);
    if (n != (ssize_t)sizeof(gc) || gc <= 0)
        return wr_err_set(err, ECHILD, "could not start the daemon (fork failed)");
    return gc;
}

/* Is pid gone? Also true for a zombie nobody has reaped yet (its parent is not us). */
static bool process_gone(pid_t pid)
{
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return true;
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* the state follows the command name in parentheses */
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

/*
 * The daemon that holds DIR/daemon.lock wrote "PID SOCKET" there (daemon/daemon.c). Returns its
 * pid with its socket in sock[cap] when that process is alive and is a withruntime (a stale
 * record, the pid reused, says no), else 0.
 */
static pid_t recorded_daemon(const char *state_dir, char *sock, size_t cap)
{
    char path[PATH_MAX + 16], rec[PATH_MAX + 32], comm[32] = "";
    snprintf(path, sizeof(path), "%s/daemon.lock", state_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, rec, sizeof(rec) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    rec[n] = '\0';
    char *end, *nl = strchr(rec, '\n');
    long pid = strtol(rec, &end, 10);
    if (!nl || pid <= 1 || *end != ' ' || end[1] != '/' || (size_t)(nl - end - 1) >= cap)
        return 0;
    *nl = '\0';
    snprintf(sock, cap, "%s", end + 1);
    snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    n = read(fd, comm, sizeof(comm) - 1);
    close(fd);
    if (n <= 0 || process_gone((pid_t)pid))
        return 0;
    comm[n] = '\0';
    return strcmp(comm, "withruntime\n") == 0 ? (pid_t)pid : 0;
}

/*
 * A daemon serves state_dir already (it recorded itself): ep is pointed at its socket, and we
 * wait for it to answer there (it may be starting). Returns 1 when it answers, 0 when there is
 * none (or it went away), -1 with err when it is there but does not answer.
 */
static int use_recorded(const char *state_dir, struct cli_endpoint *ep, struct wr_err *err)
{
    char sock[sizeof(ep->url.path)];
    pid_t pid = recorded_daemon(state_dir, sock, sizeof(sock));
    if (!pid)
        return 0;
    char was[sizeof(ep->url.path)];
    snprintf(was, sizeof(was), "%s", ep->url.path);
    snprintf(ep->url.path, sizeof(ep->url.path), "%s", sock);
    snprintf(ep->desc, sizeof(ep->desc), "unix:%s", sock);
    uint64_t deadline = now_ms_monotonic() + AUTOSTART_WAIT_MS;
    for (;;) {
        if (socket_probe(sock) == 0 && health_ok(ep))
            return 1;
        if (process_gone(pid)) { /* gone: the directory's own socket, as before */
            snprintf(ep->url.path, sizeof(ep->url.path), "%s", was);
            snprintf(ep->desc, sizeof(ep->desc), "unix:%s", was);
            return 0;
        }
        if (now_ms_monotonic() >= deadline)
            return wr_err_set(err, ETIMEDOUT,
                              "the daemon serving %s (pid %ld) does not answer on its socket %s; "
                              "no second daemon is started for the same state directory",
                              state_dir, (long)pid, sock);
        sleep_ms(50);
    }
}

static int autostart(const char *state_dir, struct cli_endpoint *ep, struct wr_err *err)
{
    if (mkdir_p(state_dir, 0755, err) < 0)
        return -1;
    char log[PATH_MAX + 16];
    snprintf(log, sizeof(log), "%s/daemon.log", state_dir);
    /* Two opens: the lock is on this CLI's own open file, never on the one the daemon gets. */
    cleanup_close int lockfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (lockfd < 0)
        return wr_err_sys(err, errno, "cannot open %s", log);
    while (flock(lockfd, LOCK_EX) < 0)
        if (errno != EINTR)
            return wr_err_sys(err, errno, "cannot lock %s", log);
    /* Another CLI may have started it while we waited for the lock, or a daemon serves the
     * directory on a socket of its own (serve --socket): that one is used, never a second. */
    if (socket_probe(ep->url.path) == 0)
        return 0;
    int found = use_recorded(state_dir, ep, err);
    if (found != 0)
        return found < 0 ? -1 : 0;
    cleanup_close int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (logfd < 0)
        return wr_err_sys(err, errno, "cannot open %s", log);
    off_t start = lseek(logfd, 0, SEEK_END);

    pid_t pid = spawn_daemon(state_dir, logfd, err);
    if (pid < 0)
        return -1;
    fprintf(stderr, "withruntime: started the daemon (pid %ld, log %s)\n", (long)pid, log);

    uint64_t deadline = now_ms_monotonic() + AUTOSTART_WAIT_MS;
    while (now_ms_monotonic() < deadline) {
        if (socket_probe(ep->url.path) == 0 && health_ok(ep))
            return 0;
        if (process_gone(pid)) {
            print_log_tail(log, start);
            return wr_err_set(err, ECHILD, "the daemon exited while starting; see %s", log);
        }
        sleep_ms(50);
    }
    print_log_tail(log, start);
    return wr_err_set(err, ETIMEDOUT, "the daemon (pid %ld) did not answer within %d s; see %s",
                      (long)pid, AUTOSTART_WAIT_MS / 1000, log);
}

static int local_endpoint(const char *state_dir, struct cli_endpoint *ep, struct wr_err *err)
{
    if ((size_t)snprintf(ep->url.path, sizeof(ep->url.path), "%s/withruntime.sock", state_dir) >=
        sizeof(ep->url.path))
        return wr_err_set(err, ENAMETOOLONG, "state directory path too long for a socket: %s",
                          state_dir);
    ep->url.is_unix = true;
    snprintf(ep->desc, sizeof(ep->desc), "unix:%s", ep->url.path);
    if (socket_probe(ep->url.path) == 0)
        return 0;
    int e = errno;
    if (e == EACCES || e == EPERM)
        return wr_err_set(err, e,
                          "permission denied on %s: run as root, or reach the daemon over TCP "
                          "with RUNTIME_URL and RUNTIME_API_KEY (or `withruntime login`)",
                          ep->url.path);
    if (e != ENOENT && e != ECONNREFUSED)
        return wr_err_sys(err, e, "cannot connect to the daemon at %s", ep->desc);
    /* The directory's daemon may listen elsewhere (serve --socket): it says where in its lock
     * file, which only root may read. */
    int found = use_recorded(state_dir, ep, err);
    if (found != 0)
        return found < 0 ? -1 : 0;
    if (geteuid() != 0)
        return wr_err_set(err, e,
                          "no daemon is running at %s; start one as root with `sudo withruntime "
                          "serve` (any root `withruntime sandbox` command also starts it), or "
                          "point RUNTIME_URL at a running daemon",
                          ep->url.path);
    return autostart(state_dir, ep, err);
}

int cli_endpoint_get(struct cli_ctx *c, const struct cli_endpoint **out, struct wr_err *err)
{
    if (c->have_ep) {
        *out = &c->ep;
        return 0;
    }
    struct cli_endpoint *ep = &c->ep;
    memset(ep, 0, sizeof(*ep));
    const char *url = getenv("RUNTIME_URL");
    const char *key = getenv("RUNTIME_API_KEY");
    int r = 0;
    if (!c->state_dir_explicit && url && url[0]) {
        if (cli_url_parse(url, &ep->url, err) < 0) {
            err->kind = WR_E_INVALID; /* the caller's setting, not the daemon, is wrong */
            return wr_err_prefix(err, "RUNTIME_URL");
        }
        snprintf(ep->desc, sizeof(ep->desc), "%s", url);
    } else {
        if (!c->state_dir_explicit)
            r = connection_load(ep, err);
        if (r < 0)
            return -1;
        if (r == 0 && local_endpoint(c->state_dir, ep, err) < 0)
            return -1;
    }
    if (key && key[0]) {
        if ((size_t)snprintf(ep->key, sizeof(ep->key), "%s", key) >= sizeof(ep->key))
            return wr_err_kind(err, WR_E_INVALID, EINVAL, "RUNTIME_API_KEY is too long");
    }
    const char *ca = getenv("RUNTIME_CA_FILE");
    if (ca && ca[0]) {
        if ((size_t)snprintf(ep->ca_file, sizeof(ep->ca_file), "%s", ca) >= sizeof(ep->ca_file))
            return wr_err_kind(err, WR_E_INVALID, EINVAL, "RUNTIME_CA_FILE is too long");
    }
    c->have_ep = true;
    *out = ep;
    return 0;
}

/* ---- shared helpers ---- */

void cli_errorf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    va_end(ap);
    fprintf(stderr, "withruntime: %s\n", msg ? cli_safe(msg) : "(out of memory)");
    free(msg);
}

/* The daemon's "sandbox ID is stopped (...)" and "has failed (...)" speak to every client;
 * a CLI user is told the command that starts it. */
static void hint_start(const char *msg)
{
    char id[SB_ID_LEN + 1];
    if (strncmp(msg, "sandbox ", 8) != 0 || strlen(msg) < 8 + SB_ID_LEN)
        return;
    memcpy(id, msg + 8, SB_ID_LEN);
    id[SB_ID_LEN] = '\0';
    const char *rest = msg + 8 + SB_ID_LEN;
    if (sb_id_valid(id) &&
        (strncmp(rest, " is stopped (", 13) == 0 || strncmp(rest, " has failed (", 13) == 0))
        fprintf(stderr, "withruntime: start it with 'withruntime sandbox start %s'\n", id);
}

int cli_fail(const struct wr_err *err)
{
    cli_errorf("%s", err->msg[0] ? err->msg : "failed");
    hint_start(err->msg);
    return cli_exit_code(err);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "withruntime: %s%s", cmd ? cmd : "", cmd && *cmd ? ": " : "");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'withruntime %s%s--help'.\n", cmd ? cmd : "", cmd && *cmd ? " " : "");
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_parse_long(const char *s, long min, long max, long *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_kv(const char *s, json_t *obj)
{
    const char *eq = strchr(s, '=');
    if (!eq || eq == s)
        return -1;
    char *k = strndup(s, (size_t)(eq - s));
    if (!k)
        return -1;
    int r = json_object_set_new(obj, k, json_string(eq + 1));
    free(k);
    return r;
}
