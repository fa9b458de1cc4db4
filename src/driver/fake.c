/*
 * The fake driver (fake.h): sandboxes that are a plain process on a socketpair, so tests can
 * drive the daemon's failure paths without gVisor.
 *
 * Per sandbox, under spec->dir (nothing is ever written outside it):
 *   upper/, work/   the writable layer (kept across stop/start)
 *   root/           overlayfs mount point (lower = the image, upper/work above), mounted in
 *                   the daemon's mount namespace while the sandbox runs
 *   agent.log       the agent's stderr
 *   fake.pid        "PID STARTTIME" of the sandbox's init on the host; with the start time a
 *                   reused pid is never taken for it. stop and destroy need nothing else, so
 *                   they work after a daemon restart.
 *
 * The agent runs as PID 1 of a new pid namespace, as it does under gVisor (it then ignores
 * every signal it can, keeps /workspace as its cwd and puts commands in a nested pid
 * namespace; src/agent/pidns.c). Killing it with SIGKILL from the host ends every process in
 * the namespace. The real agent (an ELF binary) also gets a private mount namespace whose root
 * is the overlay (pivot_root, the old root detached), with /proc of its pid namespace, a small
 * /dev on tmpfs and itself bind-mounted read-only at /.withruntime/agent (pidns.c re-executes
 * /proc/self/exe, which must be reachable inside).
 *
 * An agent that is a script (a test's hostile agent, starting with "#!") lives on the host,
 * outside the image, and needs the host's interpreter: it runs in its own pid namespace but
 * not in the overlay, with spec->dir as its cwd. The overlay is mounted all the same, so every
 * start goes through the same steps and the same teardown.
 *
 * Start is an ordered list of steps, each with its undo (nsjail's shape): dir, overlay,
 * socketpair, spawn. Each step first checks its fault point (fake.start.STEP); a failure at
 * any step undoes the earlier ones in reverse. The fault point fake.agent.no_sys_admin (checked
 * at spawn) starts the agent without CAP_SYS_ADMIN, which it must refuse (agent/pidns.c). Limits
 * (cpus, memory, pids, disk) are not enforced: this is not isolation, only its shape.
 *
 * Freeze stops the init with SIGSTOP (one of the two signals an ancestor namespace can force on
 * a namespace's init) and thaw continues it: the daemon freezes only a sandbox whose agent runs
 * alone, so that is every process of it. Enough for tests of what the daemon does around a
 * freeze (daemon/idle.h, daemon/pressure.h) without gVisor's cgroups.
 */
#include "driver/fake.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "common/fault.h"
#include "common/log.h"
#include "common/util.h"
#include "driver/disk.h"
#include "driver/logcap.h"

#define KILL_WAIT_MS 5000 /* for a killed init to be gone (the kernel empties its namespace) */
#define AGENT_IN_ROOT "/.withruntime/agent"

static struct {
    bool configured;
    uint64_t agent_log_max;
} conf;

struct fk_paths {
    char dir[PATH_MAX];
    char upper[PATH_MAX];
    char work[PATH_MAX];
    char root[PATH_MAX];
    char log[PATH_MAX];
    char pidfile[PATH_MAX];
};

/* Everything a start holds while its steps run; the undo of each step reads it. */
struct fk_start {
    const struct driver_spec *spec;
    struct fk_paths p;
    bool made_root; /* root/ did not exist before this start */
    int sv[2];
    int logfd; /* the agent's stderr: a pipe into agent.log, as under gvisor */
    struct logpump *pump;
    pid_t pid;
};

/* ---- validation and paths ---- */

static int fill_paths(const struct driver_spec *spec, struct fk_paths *p, struct wr_err *err)
{
    if (!conf.configured)
        return wr_err_set(err, EINVAL, "the fake driver was not configured");
    if (driver_check_id(spec->id, err) < 0 ||
        driver_check_overlay_path("sandbox directory", spec->dir, err) < 0)
        return -1;
    snprintf(p->dir, sizeof(p->dir), "%s", spec->dir);
    size_t n = strlen(p->dir);
    while (n > 1 && p->dir[n - 1] == '/')
        p->dir[--n] = '\0';
    snprintf(p->upper, sizeof(p->upper), "%s/upper", p->dir);
    snprintf(p->work, sizeof(p->work), "%s/work", p->dir);
    snprintf(p->root, sizeof(p->root), "%s/root", p->dir);
    snprintf(p->log, sizeof(p->log), "%s/agent.log", p->dir);
    snprintf(p->pidfile, sizeof(p->pidfile), "%s/fake.pid", p->dir);
    return 0;
}

/* Returns 1 if path starts with "#!" (an interpreter script), 0 if not, -1 with err. */
static int is_script(const char *path, struct wr_err *err)
{
    cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wr_err_sys(err, errno, "opening the agent %s", path);
    char magic[2];
    return read(fd, magic, 2) == 2 && magic[0] == '#' && magic[1] == '!';
}

/* ---- the init process on the host ---- */

/* Reads fields from /proc/PID/stat: state, ppid and start time. Returns 0, or -1 if gone. */
static int proc_stat(pid_t pid, char *state, pid_t *ppid, unsigned long long *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    if (!rp)
        return -1;
    char st = '?';
    int pp = 0;
    unsigned long long t = 0;
    /* fields 3 (state), 4 (ppid), then 22 (starttime) */
    if (sscanf(rp + 2, "%c %d %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
               &st, &pp, &t) != 3)
        return -1;
    if (state)
        *state = st;
    if (ppid)
        *ppid = pp;
    if (start)
        *start = t;
    return 0;
}

/* Reads the pid file. Returns 1 with *pid set if that process still runs (same start time,
 * not a zombie), 0 if not (or no file), -1 with err. */
static int init_alive(const struct fk_paths *p, pid_t *pid, struct wr_err *err)
{
    *pid = 0;
    FILE *f = fopen(p->pidfile, "re");
    if (!f) {
        if (errno == ENOENT)
            return 0;
        return wr_err_sys(err, errno, "opening %s", p->pidfile);
    }
    int v = 0;
    unsigned long long start = 0;
    int got = fscanf(f, "%d %llu", &v, &start);
    fclose(f);
    if (got != 2 || v <= 1)
        return 0;
    char state;
    unsigned long long now_start;
    if (proc_stat(v, &state, NULL, &now_start) < 0 || now_start != start || state == 'Z' ||
        state == 'X')
        return 0;
    *pid = v;
    return 1;
}

/* Kills the sandbox's init (and so its whole pid namespace) and waits for it to be gone. */
static int kill_init(const struct driver_spec *spec, const struct fk_paths *p, struct wr_err *err)
{
    pid_t pid;
    int alive = init_alive(p, &pid, err);
    if (alive < 0)
        return -1;
    if (alive) {
        unsigned long long start;
        proc_stat(pid, NULL, NULL, &start);
        if (kill(pid, SIGKILL) < 0 && errno != ESRCH)
            return wr_err_sys(err, errno, "killing the agent (pid %d)", (int)pid);
        uint64_t deadline = now_ms_monotonic() + KILL_WAIT_MS;
        for (;;) {
            char state;
            unsigned long long s;
            if (proc_stat(pid, &state, NULL, &s) < 0 || s != start || state == 'Z' || state == 'X')
                break;
            if (now_ms_monotonic() > deadline)
                return wr_err_set(err, EBUSY, "the agent (pid %d) did not die after SIGKILL",
                                  (int)pid);
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        log_debug(spec->id, "fake.killed", "pid=%d", (int)pid);
    }
    if (unlink(p->pidfile) < 0 && errno != ENOENT)
        return wr_err_sys(err, errno, "removing %s", p->pidfile);
    return 0;
}

/* Unmounts the overlay (lazily if busy) and removes its mount point. */
static int unmount_root(const struct driver_spec *spec, const struct fk_paths *p,
                        struct wr_err *err)
{
    if (disk_unmount_all(spec->id, p->root, err) < 0)
        return -1;
    if (rmdir(p->root) < 0 && errno != ENOENT)
        return wr_err_sys(err, errno, "removing %s", p->root);
    return 0;
}

/* Stops what runs and unmounts; keeps the writable layer. */
static int teardown(const struct driver_spec *spec, const struct fk_paths *p, struct wr_err *err)
{
    if (kill_init(spec, p, err) < 0)
        return -1;
    logpump_settle(p->dir, LOGPUMP_SETTLE_MS); /* the agent's last words are in agent.log */
    return unmount_root(spec, p, err);
}

/* ---- start: the steps and their undo ---- */

/* dir: the writable layer and the overlay's mount point. */
static int step_dir(struct fk_start *s, struct wr_err *err)
{
    struct stat st;
    if (stat(s->p.dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return wr_err_set(err, ENOENT, "sandbox directory %s does not exist", s->p.dir);
    s->made_root = lstat(s->p.root, &st) < 0;
    if ((mkdir(s->p.upper, 0755) < 0 && errno != EEXIST) ||
        (mkdir(s->p.work, 0700) < 0 && errno != EEXIST) ||
        (mkdir(s->p.root, 0755) < 0 && errno != EEXIST))
        return wr_err_sys(err, errno, "creating the writable layer in %s", s->p.dir);
    return 0;
}

static void undo_dir(struct fk_start *s)
{
    /* The writable layer stays (driver.h): only the mount point goes. */
    if (s->made_root)
        rmdir(s->p.root);
}

/* Creates what the agent needs in the overlay (in upper/, so once). */
static int prepare_root(const struct fk_paths *p, struct wr_err *err)
{
    cleanup_close int root = open(p->root, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (root < 0)
        return wr_err_sys(err, errno, "opening %s", p->root);
    static const struct {
        const char *name;
        mode_t mode;
    } dirs[] = {
        {"proc", 0555}, {"dev", 0755}, {"workspace", 0755}, {"tmp", 01777}, {".withruntime", 0755}};
    for (size_t i = 0; i < WR_ARRAY_LEN(dirs); i++)
        if (mkdirat(root, dirs[i].name, dirs[i].mode) < 0 && errno != EEXIST)
            return wr_err_sys(err, errno, "creating /%s in the overlay", dirs[i].name);
    int fd = openat(root, ".withruntime/agent", O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0755);
    if (fd < 0)
        return wr_err_sys(err, errno, "creating %s in the overlay", AGENT_IN_ROOT);
    close(fd);
    return 0;
}

static int step_overlay(struct fk_start *s, struct wr_err *err)
{
    char opts[3 * PATH_MAX + 64];
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s,index=off",
             s->spec->image_rootfs, s->p.upper, s->p.work);
    if (mount("overlay", s->p.root, "overlay", MS_NODEV | MS_NOSUID, opts) < 0)
        return wr_err_sys(err, errno, "mounting the overlay at %s", s->p.root);
    if (prepare_root(&s->p, err) < 0) {
        umount2(s->p.root, MNT_DETACH);
        return -1;
    }
    return 0;
}

static void undo_overlay(struct fk_start *s)
{
    if (umount2(s->p.root, MNT_DETACH) < 0)
        log_warn(s->spec->id, "fake.umount_failed", "path=\"%s\" error=\"%s\"", s->p.root,
                 strerror(errno));
}

static int step_socketpair(struct fk_start *s, struct wr_err *err)
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s->sv) < 0)
        return wr_err_sys(err, errno, "socketpair");
    s->pump = logpump_open(s->p.dir, s->spec->id, conf.agent_log_max, &s->logfd, NULL, err);
    if (!s->pump) {
        close(s->sv[0]);
        close(s->sv[1]);
        s->sv[0] = s->sv[1] = -1;
        return -1;
    }
    return 0;
}

static void undo_socketpair(struct fk_start *s)
{
    for (int i = 0; i < 2; i++)
        if (s->sv[i] >= 0)
            close(s->sv[i]);
    if (s->logfd >= 0)
        close(s->logfd);
    s->sv[0] = s->sv[1] = s->logfd = -1;
}

/* What the child must do, with every path built before it exists (it only makes syscalls). */
struct child_plan {
    int chan, logfd, report;
    bool contain;
    bool no_sys_admin;      /* the agent starts without CAP_SYS_ADMIN (fault point) */
    const char *dir;        /* cwd of a script agent */
    const char *agent_host; /* spec->agent_path */
    char root[PATH_MAX];
    char agent_bind[PATH_MAX + 32];
    char proc[PATH_MAX + 8];
    char dev[PATH_MAX + 8];
};

/* The step of the child's set-up that failed, sent up the report pipe. */
enum child_stage { C_PRIVATE = 1, C_BIND, C_PROC, C_DEV, C_PIVOT, C_STDIO, C_CAPS, C_EXEC };

static const char *child_stage_name(int stage)
{
    switch (stage) {
    case C_PRIVATE: return "making mounts private";
    case C_BIND: return "bind-mounting the agent";
    case C_PROC: return "mounting /proc";
    case C_DEV: return "making /dev";
    case C_PIVOT: return "pivot_root into the overlay";
    case C_STDIO: return "setting up stdio";
    case C_CAPS: return "dropping CAP_SYS_ADMIN";
    case C_EXEC: return "exec";
    default: return "setting up";
    }
}

struct child_report {
    int32_t stage;
    int32_t err;
};

static __attribute__((noreturn)) void child_fail(const struct child_plan *c, enum child_stage st)
{
    struct child_report rep = {.stage = st, .err = errno};
    (void)!write(c->report, &rep, sizeof(rep));
    _exit(127);
}

static int make_dev(const char *dev)
{
    static const struct {
        const char *name;
        unsigned maj, min;
    } nodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
                 {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
    static const struct {
        const char *name, *target;
    } links[] = {{"fd", "/proc/self/fd"},
                 {"stdin", "/proc/self/fd/0"},
                 {"stdout", "/proc/self/fd/1"},
                 {"stderr", "/proc/self/fd/2"}};
    if (mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=755,size=1m") < 0)
        return -1;
    int dfd = open(dev, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -1;
    for (size_t i = 0; i < WR_ARRAY_LEN(nodes); i++)
        if (mknodat(dfd, nodes[i].name, S_IFCHR | 0666, makedev(nodes[i].maj, nodes[i].min)) < 0)
            return -1;
    for (size_t i = 0; i < WR_ARRAY_LEN(links); i++)
        if (symlinkat(links[i].target, dfd, links[i].name) < 0)
            return -1;
    close(dfd);
    return 0;
}

/* The child: PID 1 of a new pid namespace (and mount namespace when contained). */
static __attribute__((noreturn)) void child_main(const struct child_plan *c)
{
    static char *const env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                "HOME=/root", "LANG=C.UTF-8", NULL};
    umask(0);
    if (c->contain) {
        /* Private first: nothing below may propagate back to the host's mount table. */
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            child_fail(c, C_PRIVATE);
        if (mount(c->agent_host, c->agent_bind, NULL, MS_BIND, NULL) < 0 ||
            mount(NULL, c->agent_bind, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) < 0)
            child_fail(c, C_BIND);
        if (mount("proc", c->proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
            child_fail(c, C_PROC);
        if (make_dev(c->dev) < 0)
            child_fail(c, C_DEV);
        /* pivot_root rather than chroot: with the old root detached there is no way back to
         * the host's files, even for a root command that knows the chroot escapes. */
        if (chdir(c->root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
            umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
            child_fail(c, C_PIVOT);
    } else if (chdir(c->dir) < 0) {
        child_fail(c, C_PIVOT);
    }
    umask(022);
    if (dup2(c->chan, 0) < 0 || dup2(c->chan, 1) < 0 || dup2(c->logfd, 2) < 0)
        child_fail(c, C_STDIO);
    /* A sandbox that cannot give its agent CAP_SYS_ADMIN: the agent cannot make its commands'
     * pid namespace and must refuse to run (src/agent/pidns.c). */
    if (c->no_sys_admin && prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) < 0)
        child_fail(c, C_CAPS);
    const char *path = c->contain ? AGENT_IN_ROOT : c->agent_host;
    char *const argv[] = {(char *)path, NULL};
    execve(path, argv, env);
    child_fail(c, C_EXEC);
}

/* Writes "PID STARTTIME" for stop and destroy, via a temporary file and rename. */
static int write_pidfile(const struct fk_paths *p, pid_t pid, struct wr_err *err)
{
    unsigned long long start;
    if (proc_stat(pid, NULL, NULL, &start) < 0)
        return wr_err_set(err, ESRCH, "the agent (pid %d) is already gone", (int)pid);
    char tmp[PATH_MAX + 8], text[64];
    snprintf(tmp, sizeof(tmp), "%s.tmp", p->pidfile);
    int n = snprintf(text, sizeof(text), "%d %llu\n", (int)pid, start);
    cleanup_close int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 || write_all(fd, text, (size_t)n) < 0 || rename(tmp, p->pidfile) < 0) {
        int e = errno;
        unlink(tmp);
        return wr_err_sys(err, e, "writing %s", p->pidfile);
    }
    return 0;
}

static int step_spawn(struct fk_start *s, struct wr_err *err)
{
    const struct driver_spec *spec = s->spec;
    int script = is_script(spec->agent_path, err);
    if (script < 0)
        return -1;
    struct child_plan c = {
        .chan = s->sv[1],
        .logfd = s->logfd,
        .contain = !script,
        .dir = s->p.dir,
        .agent_host = spec->agent_path,
        .no_sys_admin = fault_hit("fake.agent.no_sys_admin", NULL) < 0,
    };
    snprintf(c.root, sizeof(c.root), "%s", s->p.root);
    snprintf(c.agent_bind, sizeof(c.agent_bind), "%s%s", s->p.root, AGENT_IN_ROOT);
    snprintf(c.proc, sizeof(c.proc), "%s/proc", s->p.root);
    snprintf(c.dev, sizeof(c.dev), "%s/dev", s->p.root);
    int rep[2];
    if (pipe2(rep, O_CLOEXEC) < 0)
        return wr_err_sys(err, errno, "pipe");
    c.report = rep[1];
    /* A raw clone: glibc's fork has no flags, and the child only makes syscalls until exec.
     * Its exit is collected by the daemon's reaper (proc.c) like any orphan's. */
    unsigned long flags = CLONE_NEWPID | SIGCHLD | (c.contain ? CLONE_NEWNS : 0);
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (pid == 0)
        child_main(&c);
    int clone_err = errno;
    close(rep[1]);
    if (pid < 0) {
        close(rep[0]);
        return wr_err_sys(err, clone_err, "clone");
    }
    /* Blocks until the child execs (the pipe closes) or reports a failed step. */
    struct child_report report;
    ssize_t n = read_full(rep[0], &report, sizeof(report));
    close(rep[0]);
    if (n == (ssize_t)sizeof(report))
        return wr_err_sys(err, report.err, "starting the agent: %s",
                          child_stage_name(report.stage));
    s->pid = pid;
    if (write_pidfile(&s->p, pid, err) < 0) {
        kill(pid, SIGKILL);
        s->pid = 0;
        return -1;
    }
    return 0;
}

static void undo_spawn(struct fk_start *s)
{
    struct wr_err e = {0};
    if (kill_init(s->spec, &s->p, &e) < 0)
        log_warn(s->spec->id, "fake.kill_failed", "error=\"%s\"", e.msg);
}

static const struct {
    const char *name;
    const char *fault; /* the fault point checked before the step runs */
    int (*run)(struct fk_start *s, struct wr_err *err);
    void (*undo)(struct fk_start *s);
} start_steps[] = {
    {"dir", "fake.start.dir", step_dir, undo_dir},
    {"overlay", "fake.start.overlay", step_overlay, undo_overlay},
    {"socketpair", "fake.start.socketpair", step_socketpair, undo_socketpair},
    {"spawn", "fake.start.spawn", step_spawn, undo_spawn},
};

/* ---- the operations ---- */

static int fk_configure(const struct driver_config *cfg, struct wr_err *err)
{
    if (!cfg || !cfg->state_dir || cfg->state_dir[0] != '/')
        return wr_err_set(err, EINVAL, "driver: state_dir must be an absolute path");
    conf.configured = true;
    conf.agent_log_max = cfg->agent_log_max ? cfg->agent_log_max : LOGCAP_DEFAULT_MAX;
    return 0;
}

static int fk_probe(char *detail, size_t detail_len, struct wr_err *err)
{
    if (detail && detail_len)
        detail[0] = '\0';
    if (geteuid() != 0)
        return wr_err_set(err, EPERM, "the fake driver needs root (mounts and namespaces)");
    FILE *f = fopen("/proc/filesystems", "re");
    if (!f)
        return wr_err_sys(err, errno, "reading /proc/filesystems");
    char line[128];
    bool overlay = false;
    while (!overlay && fgets(line, sizeof(line), f))
        overlay = strstr(line, "\toverlay\n") != NULL;
    fclose(f);
    if (!overlay)
        return wr_err_set(err, ENOTSUP, "the kernel has no overlayfs");
    if (detail && detail_len)
        snprintf(detail, detail_len, "host processes in pid and mount namespaces, for tests only");
    return 0;
}

static int fk_start(const struct driver_spec *spec, int *chan_fd, struct wr_err *err)
{
    *chan_fd = -1;
    struct fk_start s = {.spec = spec, .sv = {-1, -1}, .logfd = -1, .pump = NULL};
    if (fill_paths(spec, &s.p, err) < 0 ||
        driver_check_overlay_path("image root filesystem", spec->image_rootfs, err) < 0)
        return -1;
    struct stat st;
    if (!spec->agent_path || spec->agent_path[0] != '/' || stat(spec->agent_path, &st) < 0 ||
        !S_ISREG(st.st_mode))
        return wr_err_set(err, ENOENT, "agent %s is missing",
                          spec->agent_path ? spec->agent_path : "(none)");
    if (stat(spec->image_rootfs, &st) < 0 || !S_ISDIR(st.st_mode))
        return wr_err_set(err, ENOENT, "image root filesystem %s is missing", spec->image_rootfs);

    /* Leftovers of an earlier run that was not stopped (e.g. the daemon died). */
    pid_t old;
    if (init_alive(&s.p, &old, NULL) > 0 || disk_mount_count(s.p.root, NULL, 0) > 0) {
        log_info(spec->id, "fake.cleanup_leftovers", NULL);
        if (teardown(spec, &s.p, err) < 0)
            return wr_err_prefix(err, "starting %s: cleaning up an earlier run", spec->id);
    }

    size_t done = 0;
    for (; done < WR_ARRAY_LEN(start_steps); done++) {
        if (fault_hit(start_steps[done].fault, err) < 0 || start_steps[done].run(&s, err) < 0)
            break;
    }
    logpump_release(s.pump); /* it runs on while the agent holds the pipe */
    if (done < WR_ARRAY_LEN(start_steps)) {
        const char *failed = start_steps[done].name;
        log_debug(spec->id, "fake.start_failed", "step=%s", failed);
        while (done-- > 0)
            start_steps[done].undo(&s);
        return wr_err_prefix(err, "starting %s (step %s)", spec->id, failed);
    }
    close(s.sv[1]);
    close(s.logfd);
    *chan_fd = s.sv[0];
    log_debug(spec->id, "fake.started", "pid=%d", (int)s.pid);
    return 0;
}

static int fk_stop(const struct driver_spec *spec, struct wr_err *err)
{
    struct fk_paths p;
    if (fill_paths(spec, &p, err) < 0)
        return -1;
    if (fault_hit("fake.stop", err) < 0 || teardown(spec, &p, err) < 0)
        return wr_err_prefix(err, "stopping %s", spec->id);
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (type == FTW_DP ? rmdir(path) : unlink(path)) < 0 && errno != ENOENT ? -1 : 0;
}

static int fk_destroy(const struct driver_spec *spec, struct wr_err *err)
{
    struct fk_paths p;
    if (fill_paths(spec, &p, err) < 0)
        return -1;
    if (fault_hit("fake.destroy", err) < 0 || teardown(spec, &p, err) < 0)
        return wr_err_prefix(err, "destroying %s", spec->id);
    char first[PATH_MAX];
    int n = disk_mount_count(p.dir, first, sizeof(first));
    if (n < 0)
        return wr_err_sys(err, errno, "reading /proc/self/mountinfo");
    if (n > 0)
        return wr_err_set(err, EBUSY, "destroying %s: %s is still mounted; not removing %s",
                          spec->id, first, p.dir);
    /* Depth first, not following symlinks, not crossing into another filesystem. */
    if (nftw(p.dir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) < 0 && errno != ENOENT)
        return wr_err_sys(err, errno, "destroying %s: removing %s", spec->id, p.dir);
    return 0;
}

static int fk_is_running(const struct driver_spec *spec, struct wr_err *err)
{
    struct fk_paths p;
    pid_t pid;
    if (fill_paths(spec, &p, err) < 0)
        return -1;
    return init_alive(&p, &pid, err);
}

/* Adds one process's CPU time (its own and its reaped children's), threads and RSS. */
static void add_usage(pid_t pid, struct driver_stats *out, long tick, long page)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return;
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    unsigned long long ut, stime, cut, cst, threads, rss;
    /* fields 14-17 (utime stime cutime cstime), 20 (num_threads), 24 (rss) */
    if (!rp || sscanf(rp + 2,
                      "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu %*d %*d "
                      "%llu %*d %*u %*u %llu",
                      &ut, &stime, &cut, &cst, &threads, &rss) != 6)
        return;
    out->cpu_usec += (ut + stime + cut + cst) * 1000000ULL / (unsigned long long)tick;
    out->pids += threads;
    out->memory_bytes += rss * (unsigned long long)page;
}

/* Measures the init's process tree from /proc (no cgroup): every host process whose parent
 * chain reaches the init. */
static int fk_stats(const struct driver_spec *spec, struct driver_stats *out, struct wr_err *err)
{
    memset(out, 0, sizeof(*out));
    struct fk_paths p;
    pid_t init;
    if (fill_paths(spec, &p, err) < 0)
        return -1;
    int alive = init_alive(&p, &init, err);
    if (alive <= 0)
        return alive;
    DIR *d = opendir("/proc");
    if (!d)
        return wr_err_sys(err, errno, "opening /proc");
    size_t n = 0, cap = 256;
    struct {
        pid_t pid, ppid;
    } *all = xmalloc(cap * sizeof(*all));
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        long v = strtol(de->d_name, &end, 10);
        pid_t pp;
        if (*end || v <= 0 || proc_stat((pid_t)v, NULL, &pp, NULL) < 0)
            continue;
        if (n == cap) {
            cap *= 2;
            all = xrealloc(all, cap * sizeof(*all));
        }
        all[n].pid = (pid_t)v;
        all[n++].ppid = pp;
    }
    closedir(d);
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    pid_t *tree = xmalloc((n + 1) * sizeof(*tree));
    size_t nt = 0;
    tree[nt++] = init;
    for (size_t i = 0; i < nt; i++) {
        add_usage(tree[i], out, tick > 0 ? tick : 100, page > 0 ? page : 4096);
        for (size_t j = 0; j < n; j++)
            if (all[j].ppid == tree[i] && nt <= n)
                tree[nt++] = all[j].pid;
    }
    free(tree);
    free(all);
    return 0;
}

/* How long a SIGSTOP may take to show in /proc (a few ms; longer on a loaded host). */
#define FREEZE_WAIT_MS 2000

static int fk_freeze(const struct driver_spec *spec, int frozen, struct wr_err *err)
{
    struct fk_paths p;
    pid_t pid;
    if (fill_paths(spec, &p, err) < 0 || fault_hit(frozen ? "fake.freeze" : "fake.thaw", err) < 0)
        return -1;
    int alive = init_alive(&p, &pid, err);
    if (alive <= 0)
        return alive < 0 ? -1 : wr_err_set(err, ESRCH, "the agent of %s is not running", spec->id);
    if (kill(pid, frozen ? SIGSTOP : SIGCONT) < 0)
        return wr_err_sys(err, errno, "signalling the agent (pid %d)", (int)pid);
    if (!frozen)
        return 0;
    uint64_t until = now_ms_monotonic() + FREEZE_WAIT_MS;
    char state = 0;
    while (proc_stat(pid, &state, NULL, NULL) == 0 && state != 'T' && now_ms_monotonic() < until) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (state == 'T')
        return 0;
    kill(pid, SIGCONT); /* a freeze that cannot complete leaves it thawed (driver.h) */
    return wr_err_set(err, EBUSY, "the agent (pid %d) did not stop in %d ms", (int)pid,
                      FREEZE_WAIT_MS);
}

const struct driver_ops driver_fake = {
    .name = "fake",
    .configure = fk_configure,
    .probe = fk_probe,
    .start = fk_start,
    .stop = fk_stop,
    .destroy = fk_destroy,
    .is_running = fk_is_running,
    .stats = fk_stats,
    .freeze = fk_freeze,
};
