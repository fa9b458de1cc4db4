/*
 * The commands' pid namespace. gVisor does not shield the sandbox's init from
 * the sandbox's own processes the way Linux does, and SIGKILL and SIGSTOP
 * cannot be ignored: a command running `kill -9 1` would end the sandbox,
 * `kill -STOP 1` would hang every request. So, as PID 1, the agent starts
 * every command in a child pid namespace, in which the agent has no pid at
 * all and cannot be named by kill, ptrace or /proc.
 *
 * That namespace's init is the "holder": this binary exec'd afresh (so it
 * keeps none of the agent's memory or fds) with every capability dropped. It
 * only reaps the orphans the kernel hands it. Before exec it makes a private
 * mount namespace with a /proc of the pid namespace, which every command joins
 * (so `ps` and /proc inside show the commands' own pids); the agent stays in
 * the original mount namespace, so its /proc (tree.c) shows the pids fork
 * returned. A command can still kill the holder: the kernel then kills every
 * process in the namespace and refuses new ones (fork fails with ENOMEM). The
 * agent reaps its commands as usual (they end with SIGKILL) and starts a fresh
 * namespace and holder for the next EXEC. A stopped holder is continued.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

/* The holder's set-up step that failed, sent up its report pipe. */
enum holder_stage { H_SETSID = 1, H_UNSHARE, H_PRIVATE, H_PROC, H_STDIO, H_CAPS, H_EXEC };

static const char *stage_name(int stage)
{
    switch (stage) {
    case H_SETSID: return "setsid";
    case H_UNSHARE: return "unshare(CLONE_NEWNS)";
    case H_PRIVATE: return "making / private";
    case H_PROC: return "mounting /proc";
    case H_STDIO: return "opening /dev/null";
    case H_CAPS: return "dropping capabilities";
    case H_EXEC: return "exec";
    default: return "setting up";
    }
}

struct holder_report {
    int32_t stage;
    int32_t err;
};

uint64_t caps_bounding(void)
{
    uint64_t set = 0;
    for (int cap = 0; cap < 64; cap++) {
        int r = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
        if (r < 0)
            break; /* EINVAL: past the kernel's last capability */
        if (r)
            set |= 1ULL << cap;
    }
    return set;
}

int caps_limit(uint64_t keep)
{
    /* Only what is there: each prctl is a syscall, and this runs for every command. */
    uint64_t drop = ag.bounding & ~keep;
    for (int cap = 0; cap < 64; cap++)
        if ((drop & (1ULL << cap)) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
            return -1;
    /* A kernel without ambient capabilities has none to clear. */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return -1;
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) < 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        uint32_t k = (uint32_t)(keep >> (32 * i));
        data[i].effective &= k;
        data[i].permitted &= k;
        data[i].inheritable &= k;
    }
    return syscall(SYS_capset, &hdr, data) < 0 ? -1 : 0;
}

static __attribute__((noreturn)) void holder_fail(int fd, enum holder_stage stage)
{
    struct holder_report rep = {.stage = stage, .err = errno};
    (void)!write(fd, &rep, sizeof(rep));
    _exit(127);
}

/* The vfork child, PID 1 of the new namespace: only syscalls until it execs. */
static __attribute__((noreturn)) void holder_setup(int report_w)
{
    static char *const argv[] = {AGENT_HOLDER_NAME, NULL};
    static char *const envp[] = {NULL};
    /* Out of the agent's session and process group: nothing aimed at those may reach it. */
    if (setsid() < 0)
        holder_fail(report_w, H_SETSID);
    if (unshare(CLONE_NEWNS) < 0)
        holder_fail(report_w, H_UNSHARE);
    /* Private, so the /proc below stays in this namespace instead of propagating back. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        holder_fail(report_w, H_PRIVATE);
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        holder_fail(report_w, H_PROC);
    /* The channel and the commands' pipes must not be held open by the holder: exec closes
     * everything else (all of it is close-on-exec), these three are replaced. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
        holder_fail(report_w, H_STDIO);
    /* It needs none, and any it kept a command could borrow by ptracing it (same uid). */
    if (caps_limit(0) < 0)
        holder_fail(report_w, H_CAPS);
    execve(ag.exe, argv, envp);
    holder_fail(report_w, H_EXEC);
}

/* vfork, as for commands (exec.c): a fork would copy the agent's mappings. */
static __attribute__((noinline)) pid_t start_holder(int report_w)
{
    pid_t pid = vfork();
    if (pid == 0)
        holder_setup(report_w);
    return pid;
}

/* Creates a fresh pid namespace for the commands and its holder. Returns 0 or -1 with err. */
static int pidns_start(struct wr_err *err)
{
    /* gVisor lets us unshare again while our children's namespace is another one; Linux does
     * not (EINVAL) until we are back in our own, which it lets us do with setns (gVisor has no
     * setns for pid namespaces). */
    if (unshare(CLONE_NEWPID) < 0) {
        if (errno != EINVAL || ag.self_pidns < 0 || setns(ag.self_pidns, CLONE_NEWPID) < 0 ||
            unshare(CLONE_NEWPID) < 0)
            return wr_err_sys(err, errno, "unshare(CLONE_NEWPID)");
    }
    int rep[2];
    if (pipe2(rep, O_CLOEXEC) < 0)
        return wr_err_sys(err, errno, "pipe");
    pid_t pid = start_holder(rep[1]);
    int fork_err = errno;
    close(rep[1]);
    if (pid < 0) {
        close(rep[0]);
        return wr_err_sys(err, fork_err, "fork");
    }
    /* Blocks until the holder execs (the pipe closes) or reports a failure; a failed holder
     * exits and is reaped by the loop like any other child. */
    struct holder_report report;
    ssize_t n = read_full(rep[0], &report, sizeof(report));
    close(rep[0]);
    if (n == (ssize_t)sizeof(report))
        return wr_err_sys(err, report.err, "commands' namespace: %s", stage_name(report.stage));

    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/mnt", (int)pid);
    int mnt = open(path, O_RDONLY | O_CLOEXEC);
    if (mnt < 0) {
        int e = errno;
        kill(pid, SIGKILL);
        return wr_err_sys(err, e, "opening %s", path);
    }
    /* The commands' view of the filesystem (their /proc), for file operations (files.c). */
    snprintf(path, sizeof(path), "/proc/%d/root", (int)pid);
    int root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        int e = errno;
        close(mnt);
        kill(pid, SIGKILL);
        return wr_err_sys(err, e, "opening %s", path);
    }
    ag.holder = pid;
    ag.holder_mnt = mnt;
    ag.holder_root = root;
    log_info(NULL, "agent.pidns_start", "holder=%d", (int)pid);
    return 0;
}

/*
 * Commands beside the agent could signal, stop or ptrace it and read its memory: rather than
 * run them so, the agent tells the daemon why (an ERROR on id 0 in place of HELLO, which makes
 * the start fail with that message) and exits.
 */
static __attribute__((noreturn)) void refuse(int e, const char *what)
{
    log_error(NULL, "agent.no_isolation", "error=\"%s: %s\"", what, strerror(e));
    chan_error(0, e,
               "the agent cannot isolate commands from itself (%s: %s) and refuses to run them; "
               "the sandbox must give it CAP_SYS_ADMIN",
               what, strerror(e));
    for (int i = 0; i < 10 && chan_pending(); i++) {
        struct pollfd p = {.fd = ag.out_fd, .events = POLLOUT};
        if (chan_flush() < 0 || (chan_pending() && poll(&p, 1, 100) < 0))
            break;
    }
    exit(3);
}

void pidns_init(void)
{
    struct wr_err err = {0};
    ssize_t n = readlink("/proc/self/exe", ag.exe, sizeof(ag.exe) - 1);
    if (n <= 0 || (size_t)n >= sizeof(ag.exe) - 1)
        refuse(n < 0 ? errno : ENAMETOOLONG, "readlink /proc/self/exe");
    ag.exe[n] = '\0';
    ag.self_pidns = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
    /* Without CAP_SYS_ADMIN the first unshare fails: commands would run beside the agent. */
    if (unshare(CLONE_NEWPID) < 0)
        refuse(errno, "unshare(CLONE_NEWPID)");
    /* Once, here, and inherited by everything the agent starts: no user namespaces, inside
     * which this gVisor does not hold commands to the process cap (exec.c). */
    if (deny_user_namespaces() < 0)
        refuse(errno, "installing the seccomp filter against user namespaces");
    /* From here on our children are born in another namespace: there is no going back (gVisor
     * has no setns for pid namespaces), so a holder that fails to start is retried at EXEC. */
    ag.pidns = 1;
    if (pidns_start(&err) < 0)
        log_error(NULL, "agent.pidns_start", "error=\"%s\"", err.msg);
}

int pidns_ready(struct wr_err *err)
{
    if (!ag.pidns || ag.holder > 0)
        return 0;
    return pidns_start(err);
}

int pidns_reaped(pid_t pid, int status)
{
    if (!ag.pidns || pid != ag.holder)
        return 0;
    if (WIFSTOPPED(status)) {
        /* kill -STOP 1 from a command: while stopped it reaps no orphans. */
        log_info(NULL, "agent.pidns_continue", "holder=%d signal=%d", (int)pid, WSTOPSIG(status));
        kill(pid, SIGCONT);
        return 1;
    }
    if (WIFCONTINUED(status))
        return 1;
    /* Every command in the namespace died with it and is reaped (and answered) as usual. */
    log_info(NULL, "agent.pidns_lost", "holder=%d signal=%d code=%d", (int)pid,
             WIFSIGNALED(status) ? WTERMSIG(status) : 0,
             WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ag.holder = 0;
    if (ag.holder_mnt >= 0) {
        close(ag.holder_mnt);
        ag.holder_mnt = -1;
    }
    if (ag.holder_root >= 0) {
        close(ag.holder_root);
        ag.holder_root = -1;
    }
    return 1;
}

int pidns_lost(void)
{
    if (!ag.pidns)
        return 0;
    /* A killed init becomes reapable only once every process of its namespace is gone. */
    for (int waited = 0; ag.holder > 0 && waited < AGENT_HOLDER_DEATH_MS; waited++) {
        int status;
        pid_t pid = waitpid(ag.holder, &status, WNOHANG | WUNTRACED);
        if (pid == ag.holder) {
            pidns_reaped(pid, status);
            continue;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000000L};
        nanosleep(&ts, NULL);
    }
    return ag.holder == 0;
}

void holder_main(void)
{
    /* Anything in the namespace can signal us, as it could the agent: what can be ignored is,
     * and SIGKILL ends the namespace, which the agent then replaces. */
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD)
            signal(sig, SIG_IGN);
    signal(SIGCHLD, SIG_DFL); /* SIG_IGN would make the kernel reap them; we want to wait */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    prctl(PR_SET_NAME, AGENT_HOLDER_NAME, 0, 0, 0);
    /* Blocked, SIGCHLD stays pending between the last waitpid and sigwaitinfo: no lost
     * wake-ups. With no children waitpid fails with ECHILD; orphans may come later. */
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        sigwaitinfo(&chld, NULL);
    }
}
