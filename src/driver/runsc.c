/*
 * runsc, the gVisor runtime, as the driver uses it: the command lines (every one with the
 * same global flags: our --root, the platform, no network, --overlay2=none so writes land
 * in the host-side root), the platform chosen once per daemon, and what `doctor` asks of it
 * (version, platform checks).
 *
 * Global state: the platform chosen by the first start (under platform_lock).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/proc.h"
#include "common/util.h"
#include "driver/gvisor.h"
#include "driver/gvisor_internal.h"

#define RUNSC_RUN_TIMEOUT_MS 60000
#define RUNSC_DELETE_TIMEOUT_MS 30000
#define RUNSC_STATE_TIMEOUT_MS 10000
#define RUNSC_PROBE_TIMEOUT_MS 15000
#define RUNSC_MIN_DATE 20240101 /* Debian 12's own 0.0~20221219 breaks ls/stat inside */

static pthread_mutex_t platform_lock = PTHREAD_MUTEX_INITIALIZER;
static char platform_chosen[16]; /* under platform_lock; "" until chosen */

bool runsc_platform_valid(const char *p)
{
    return !strcmp(p, "systrap") || !strcmp(p, "ptrace") || !strcmp(p, "kvm");
}

/* ---- runsc command lines ---- */

struct runsc_cmd {
    char *argv[24];
    int argc;
    char root[PATH_MAX + 16];
    char platform[32];
    char debug_log[PATH_MAX + 32];
};

/* Starts a runsc command line with the global flags. dir (may be NULL) receives debug logs. */
static void runsc_init(struct runsc_cmd *c, const char *platform, const char *dir, bool network)
{
    c->argc = 0;
    c->argv[c->argc++] = "runsc";
    snprintf(c->root, sizeof(c->root), "--root=%s", gvisor_conf.runsc_root);
    c->argv[c->argc++] = c->root;
    snprintf(c->platform, sizeof(c->platform), "--platform=%s", platform ? platform : "systrap");
    c->argv[c->argc++] = c->platform;
    if (network) {
        /* gVisor's own stack over the namespace's veth. GSO on costs 1-14 MiB/s here, off
         * ~100 MiB/s. */
        c->argv[c->argc++] = "--network=sandbox";
        c->argv[c->argc++] = "--gso=false";
    } else {
        c->argv[c->argc++] = "--network=none";
    }
    c->argv[c->argc++] = "--overlay2=none";
    if (gvisor_conf.debug) {
        snprintf(c->debug_log, sizeof(c->debug_log), "--debug-log=%s/runsc-debug/",
                 dir ? dir : gvisor_conf.runsc_root);
        c->argv[c->argc++] = "--debug";
        c->argv[c->argc++] = c->debug_log;
    }
}

static void runsc_add(struct runsc_cmd *c, const char *arg)
{
    if (c->argc < (int)WR_ARRAY_LEN(c->argv) - 1)
        c->argv[c->argc++] = (char *)arg;
    c->argv[c->argc] = NULL;
}

static bool is_not_found(const char *msg)
{
    return strstr(msg, "does not exist") || strstr(msg, "not found") || strstr(msg, "no such file");
}

/* ---- platform ---- */

/* Runs a throwaway `runsc do true` on platform p (the host's root read-only under an
 * in-memory overlay, no network). Returns 0 or -1 with err set. */
int runsc_platform_try(const char *p, struct wr_err *err)
{
    char root[PATH_MAX + 16], platform[32];
    snprintf(root, sizeof(root), "--root=%s", gvisor_conf.runsc_root);
    snprintf(platform, sizeof(platform), "--platform=%s", p);
    char *argv[] = {"runsc",  root,   platform, "--network=none", "do",
                    "-quiet", "-cwd", "/",      "true",           NULL};
    char out[2048];
    /* doctor may run before any daemon made the state directory */
    if ((mkdir(gvisor_conf.state_dir, 0755) < 0 && errno != EEXIST) ||
        (mkdir(gvisor_conf.runsc_root, 0700) < 0 && errno != EEXIST))
        return wr_err_sys(err, errno, "creating %s", gvisor_conf.runsc_root);
    if (proc_run(argv, RUNSC_PROBE_TIMEOUT_MS, out, sizeof(out), err) < 0)
        return wr_err_prefix(err, "platform %s", p);
    return 0;
}

int gvisor_platform_check(const char *platform, struct wr_err *err)
{
    if (!gvisor_conf.configured)
        return wr_err_set(err, EINVAL, "the gvisor driver was not configured");
    if (!platform || !runsc_platform_valid(platform))
        return wr_err_set(err, EINVAL, "unknown gVisor platform \"%s\"", platform ? platform : "");
    return runsc_platform_try(platform, err);
}

/* Copies the platform to use into out: the configured one, else systrap if it works here,
 * else ptrace. The choice is made once. */
int runsc_platform_get(char *out, size_t outlen, struct wr_err *err)
{
    if (gvisor_conf.platform_override[0]) {
        snprintf(out, outlen, "%s", gvisor_conf.platform_override);
        return 0;
    }
    pthread_mutex_lock(&platform_lock);
    int ret = 0;
    if (!platform_chosen[0]) {
        struct wr_err e1, e2;
        if (runsc_platform_try("systrap", &e1) == 0) {
            snprintf(platform_chosen, sizeof(platform_chosen), "systrap");
        } else if (runsc_platform_try("ptrace", &e2) == 0) {
            log_warn(NULL, "gvisor.platform", "platform=ptrace reason=\"%s\"", e1.msg);
            snprintf(platform_chosen, sizeof(platform_chosen), "ptrace");
        } else {
            ret = wr_err_set(err, e1.code ? e1.code : EIO, "no gVisor platform works here: %s; %s",
                             e1.msg, e2.msg);
        }
    }
    snprintf(out, outlen, "%s", platform_chosen);
    pthread_mutex_unlock(&platform_lock);
    return ret;
}

/* ---- runsc state ---- */

/* Returns 1 if runsc has any state for id (fixed-width ids: a prefix match is exact). */
int runsc_has_state(const char *id)
{
    DIR *d = opendir(gvisor_conf.runsc_root);
    if (!d)
        return 0;
    size_t n = strlen(id);
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        const char *name = de->d_name;
        if (!strncmp(name, "runsc-", 6))
            name += 6;
        found = !strncmp(name, id, n);
    }
    closedir(d);
    return found;
}

/* Copies the last non-empty line written to the log at path after offset `from` into out. */
static void log_tail_line(const char *path, off_t from, char *out, size_t outlen)
{
    out[0] = '\0';
    cleanup_close int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || st.st_size <= from)
        return;
    off_t start = st.st_size - from > 1024 ? st.st_size - 1024 : from;
    char buf[1025];
    ssize_t n = pread(fd, buf, 1024, start);
    if (n <= 0)
        return;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        n--;
    buf[n] = '\0';
    char *line = strrchr(buf, '\n');
    snprintf(out, outlen, "%s", line ? line + 1 : buf);
}

/* ---- the container's life ---- */

/*
 * With a network, runsc is started from a thread of its own that has its own mount namespace,
 * because this runsc (0.0~20240729) refuses --network=sandbox when it believes the namespace is
 * the host's: it reads /proc/sys/net/core/rmem_default, which kernel 6.18 shows in every
 * namespace. The thread makes its mounts private, enters the sandbox's network namespace, hides
 * /proc/sys/net/core there under an empty tmpfs, returns to the daemon's namespace (runsc's
 * control socket is an abstract socket, bound to the namespace it starts in) and spawns runsc,
 * which inherits that mount namespace. Nothing of this is seen by the rest of the daemon: the
 * thread ends right after the spawn, and the mount namespace lives on with runsc's processes.
 */
struct net_spawn {
    char *const *argv;
    int netns_fd, chan_fd, logfd;
    pid_t pid;
    struct wr_err err;
};

static void *net_spawn_thread(void *p)
{
    struct net_spawn *ns = p;
    ns->pid = -1;
    cleanup_close int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0) {
        wr_err_sys(&ns->err, errno, "opening this thread's network namespace");
        return NULL;
    }
    if (unshare(CLONE_FS | CLONE_NEWNS) < 0) {
        wr_err_sys(&ns->err, errno, "unshare(CLONE_NEWNS) for runsc");
        return NULL;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        wr_err_sys(&ns->err, errno, "making mounts private for runsc");
        return NULL;
    }
    if (setns(ns->netns_fd, CLONE_NEWNET) < 0) {
        wr_err_sys(&ns->err, errno, "entering the sandbox's network namespace");
        return NULL;
    }
    int mounted = mount("none", "/proc/sys/net/core", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                        "size=4k,mode=0555");
    int e = errno;
    if (setns(home, CLONE_NEWNET) < 0)
        abort(); /* a thread left in a sandbox's namespace must not go on */
    if (mounted < 0) {
        wr_err_sys(&ns->err, e, "hiding /proc/sys/net/core from runsc");
        return NULL;
    }
    ns->pid = proc_spawn(ns->argv, NULL, ns->chan_fd, ns->chan_fd, ns->logfd, &ns->err);
    return NULL;
}

int runsc_run_spawn(const char *id, const char *platform, const char *dir, int netns_fd,
                    int chan_fd, int logfd, pid_t *pid, struct wr_err *err)
{
    /* `run --detach` is create + start in one runsc process: ~30 ms faster here. */
    struct runsc_cmd c;
    runsc_init(&c, platform, dir, netns_fd > 0);
    runsc_add(&c, "run");
    runsc_add(&c, "--detach");
    runsc_add(&c, "--bundle");
    runsc_add(&c, dir);
    runsc_add(&c, id);
    if (netns_fd <= 0) {
        *pid = proc_spawn(c.argv, NULL, chan_fd, chan_fd, logfd, err);
        return *pid < 0 ? -1 : 0;
    }
    struct net_spawn ns = {
        .argv = c.argv, .netns_fd = netns_fd, .chan_fd = chan_fd, .logfd = logfd, .pid = -1};
    pthread_t t;
    int r = pthread_create(&t, NULL, net_spawn_thread, &ns);
    if (r != 0)
        return wr_err_sys(err, r, "starting the runsc spawn thread");
    pthread_join(t, NULL);
    *pid = ns.pid;
    if (ns.pid < 0) {
        *err = ns.err;
        return -1;
    }
    return 0;
}

int runsc_run_wait(pid_t pid, const char *log_path, off_t log_start, struct logpump *pump,
                   struct wr_err *err)
{
    int status = 0;
    if (proc_wait(pid, &status, RUNSC_RUN_TIMEOUT_MS, err) < 0)
        return -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    logpump_drain(pump); /* what runsc wrote before it exited, into the file */
    char line[400];
    log_tail_line(log_path, log_start, line, sizeof(line));
    return wr_err_set(err, EIO, "runsc run failed (%s %d): %s",
                      WIFEXITED(status) ? "status" : "signal",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                      line[0] ? line : "see agent.log");
}

int runsc_delete(const char *id, const char *dir, struct wr_err *err)
{
    struct runsc_cmd c;
    runsc_init(&c, NULL, dir, false);
    runsc_add(&c, "delete");
    runsc_add(&c, "--force");
    runsc_add(&c, id);
    char out[2048];
    struct wr_err e;
    if (proc_run(c.argv, RUNSC_DELETE_TIMEOUT_MS, out, sizeof(out), &e) < 0 && !is_not_found(e.msg))
        return wr_err_set(err, e.code, "runsc delete: %s", e.msg);
    return 0;
}

int runsc_is_running(const char *id, struct wr_err *err)
{
    if (!runsc_has_state(id))
        return 0;
    struct runsc_cmd c;
    runsc_init(&c, NULL, NULL, false);
    runsc_add(&c, "state");
    runsc_add(&c, id);
    char out[8192];
    struct wr_err e;
    if (proc_run(c.argv, RUNSC_STATE_TIMEOUT_MS, out, sizeof(out), &e) < 0) {
        if (is_not_found(e.msg))
            return 0;
        return wr_err_set(err, e.code, "runsc state %s: %s", id, e.msg);
    }
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    const char *status = NULL;
    if (!j || json_unpack(j, "{s:s}", "status", &status) < 0) {
        json_decref(j);
        return wr_err_set(err, EIO, "runsc state %s: unexpected output", id);
    }
    int running = !strcmp(status, "running");
    json_decref(j);
    return running;
}

/* ---- what doctor asks ---- */

int gvisor_runsc_version(char *out, size_t outlen, struct wr_err *err)
{
    char *argv[] = {"runsc", "--version", NULL};
    char buf[512];
    if (proc_run(argv, 5000, buf, sizeof(buf), err) < 0)
        return wr_err_prefix(err, "runsc is not usable (install it from bookworm-backports)");
    const char *v = strstr(buf, "version ");
    if (!v)
        return wr_err_set(err, EIO, "runsc --version printed no version");
    v += 8;
    size_t n = strcspn(v, " \n");
    snprintf(out, outlen, "%.*s", (int)n, v);
    return 0;
}

int gvisor_runsc_too_old(const char *version)
{
    const char *tilde = strchr(version, '~');
    long date = tilde ? strtol(tilde + 1, NULL, 10) : 0;
    return date > 0 && date < RUNSC_MIN_DATE;
}
