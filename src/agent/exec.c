/*
 * Commands: EXEC starts one in its own session with its own pipes; the loop
 * forwards its output, feeds its stdin and sends EXIT once it has exited and
 * its output is drained. fork() and our own child code are used rather than
 * posix_spawn so the child can say exactly which step failed (cwd or exec)
 * through a close-on-exec pipe before the daemon is answered. That pipe is
 * read by the loop, not waited on: under a fork bomb a child can take many
 * seconds to reach exec, and the agent must go on answering (pings, the
 * signal that ends the bomb) meanwhile.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

/* Chunks read from one pipe per wakeup, so one chatty command cannot starve the others. */
#define PIPE_BUDGET 4
/* At the grace deadline the pipes are drained regardless of backpressure, up to this. */
#define FINAL_DRAIN (1u << 20)

struct exec_req {
    struct req r;
    pid_t pid;
    int out_fd, err_fd, in_fd; /* -1 once closed */
    struct obuf in;            /* STDIN bytes the command has not taken yet */
    int in_fin;                /* close stdin once `in` is drained */
    int exited, status;
    uint64_t exit_ms;
    uint64_t exit_us; /* when it was reaped, for PT_EXIT_WAIT */
    int cancelled;    /* CANCEL came: output is read and dropped */
    int tty_fd;       /* a session's terminal (its master side), for RESIZE; -1: none */
    /* Until the child has exec'd (the pipe closes) or reported a failure: */
    int report_fd;           /* -1 once the start is settled */
    int start_failed;        /* the child reported a failure: answer ERROR, not EXIT */
    struct wr_err start_err; /* what it reported */
    char *name, *cwd;        /* for that message */
    uint64_t spawn_ms;       /* when the child was forked */
};

/* Which step failed in the child, sent up the error pipe. */
enum child_stage { STAGE_SETUP = 1, STAGE_CWD, STAGE_EXEC, STAGE_NS, STAGE_CAPS };

struct child_report {
    int32_t stage;
    int32_t err;
};

/* What the child needs; everything is prepared before fork so the child only makes syscalls. */
struct spawn {
    char **argv_all; /* argv_all[0] spare (for the /bin/sh fallback), argv at argv_all + 1 */
    char **env;
    const char *search; /* PATH to search when argv[0] has no '/'; NULL: found nowhere */
    char cwd[AGENT_PATH_BUF];
    int in_r, out_w, err_w, report_w;
    int tty;           /* a session on a terminal: in_r is its slave side, made the
                          child's controlling terminal */
    struct winsize ws; /* its size */
};

static struct exec_req *as_exec(struct req *r)
{
    return (struct exec_req *)r;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* Frees a NULL-terminated array of strings and the array. */
static void free_strv(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

static __attribute__((noreturn)) void child_fail(int fd, enum child_stage stage, int err)
{
    struct child_report rep = {.stage = stage, .err = err};
    (void)!write(fd, &rep, sizeof(rep));
    _exit(127);
}

/* Like execvp's fallback: a file without a #! line is a shell script. */
static void exec_sh(const struct spawn *s, const char *path)
{
    s->argv_all[0] = "/bin/sh";
    s->argv_all[1] = (char *)path;
    execve("/bin/sh", s->argv_all, s->env);
}

static __attribute__((noreturn)) void child_exec(const struct spawn *s)
{
    char **argv = s->argv_all + 1;
    const char *name = argv[0];
    if (strchr(name, '/')) {
        execve(name, argv, s->env);
        int err = errno;
        if (err == ENOEXEC)
            exec_sh(s, name);
        child_fail(s->report_w, STAGE_EXEC, err);
    }
    /* The search follows execvp: keep looking past names that are missing, remember that a
     * match was not executable, stop at any other error. */
    size_t nlen = strlen(name);
    int eacces = 0;
    char buf[PATH_MAX];
    const char *p = s->search;
    if (!p)
        child_fail(s->report_w, STAGE_EXEC, ENOENT);
    for (;;) {
        const char *end = strchrnul(p, ':');
        size_t dlen = (size_t)(end - p);
        if (nlen > 0 && dlen + 1 + nlen < sizeof(buf)) {
            memcpy(buf, p, dlen);
            buf[dlen] = '/';
            memcpy(buf + dlen + 1, name, nlen + 1);
            execve(dlen ? buf : name, argv, s->env);
            switch (errno) {
            case EACCES: eacces = 1; break;
            case ENOENT:
            case ENOTDIR:
            case ELOOP:
            case ENAMETOOLONG:
            case ESTALE:
            case ENODEV:
            case ETIMEDOUT: break;
            case ENOEXEC:
                exec_sh(s, dlen ? buf : name);
                child_fail(s->report_w, STAGE_EXEC, ENOEXEC);
            default: child_fail(s->report_w, STAGE_EXEC, errno);
            }
        }
        if (!*end)
            break;
        p = end + 1;
    }
    child_fail(s->report_w, STAGE_EXEC, eacces ? EACCES : ENOENT);
}

/*
 * No new user namespaces for commands (unshare or clone with CLONE_NEWUSER fail with EPERM,
 * clone3 with ENOSYS so libc falls back to clone), as under Docker's default seccomp profile
 * for a process without CAP_SYS_ADMIN. The gVisor this runs on treats CAP_SYS_ADMIN in a
 * process's own user namespace as exempting it from RLIMIT_NPROC: a fork bomb inside
 * `unshare -Ur` would grow past the sandbox's process cap until the host's limits took the
 * whole sandbox down (measured: 512 MiB gone in 5 s). Installed while we still hold
 * CAP_SYS_ADMIN, so no_new_privs (which would disable setuid programs) is not needed. Only
 * x86-64 system calls are filtered: gVisor runs no other ABI.
 */
int deny_user_namespaces(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unshare, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 0, 3),
        /* flags: the first argument of both (low 32 bits) */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_NEWUSER, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = (unsigned short)(sizeof(f) / sizeof(f[0])), .filter = f};
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
}

static __attribute__((noreturn)) void child_run(const struct spawn *s)
{
    /* The commands' /proc lives in the holder's mount namespace (pidns.c). First: setns needs
     * CAP_SYS_ADMIN, dropped next, and resets the working directory, set further down. */
    if (ag.holder_mnt >= 0 && setns(ag.holder_mnt, CLONE_NEWNS) < 0)
        child_fail(s->report_w, STAGE_NS, errno);
    /* Whatever the agent holds beyond Docker's default set is for the agent alone; with
     * CAP_SYS_ADMIN a command could leave the namespace that keeps it away from the agent. */
    if (ag.is_init && caps_limit(AGENT_COMMAND_CAPS) < 0)
        child_fail(s->report_w, STAGE_CAPS, errno);
    /* Undo what the agent set up for itself: blocked and ignored signals and a raised fd limit
     * are inherited across exec and would surprise the command. (The signals the agent
     * catches go back to SIG_DFL at the exec.) */
    for (int sig = 1; sig < NSIG; sig++)
        if (sigismember(&ag.ignored, sig))
            signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setrlimit(RLIMIT_NOFILE, &ag.nofile);

    if (setsid() < 0)
        child_fail(s->report_w, STAGE_SETUP, errno);
    if (s->tty && ioctl(s->in_r, TIOCSCTTY, 0) < 0)
        child_fail(s->report_w, STAGE_SETUP, errno);
    /* The command is the subreaper of everything it starts (the attribute survives exec): a
     * process whose parent exits, double-forked or `setsid -f`, is handed to the command, not
     * to the namespace's init, so the tree a timeout kills (tree.c) still holds it. Once the
     * command itself has exited, what it left goes to the init and keeps running, as it would
     * after a shell. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        child_fail(s->report_w, STAGE_SETUP, errno);
    int in = s->in_r;
    if (in < 0 && (in = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
        child_fail(s->report_w, STAGE_SETUP, errno);
    if (dup2(in, 0) < 0 || dup2(s->out_w, 1) < 0 || dup2(s->err_w, 2) < 0)
        child_fail(s->report_w, STAGE_SETUP, errno);
    if (chdir(s->cwd) < 0)
        child_fail(s->report_w, STAGE_CWD, errno);
    child_exec(s);
}

/* Parses EXEC into s. Returns 0, or -1 with err set (the answer to the daemon). */
static int parse_exec(const uint8_t *payload, size_t len, struct spawn *s, int *want_stdin,
                      int session, struct wr_err *err)
{
    struct proto_iter it;
    struct proto_field f, cwd = {0};
    size_t argc = 0, envc = 0;
    int have_cwd = 0, have_stdin = 0;
    int r;

    if (proto_fields_valid(payload, len) < 0)
        return wr_err_set(err, EINVAL, "malformed EXEC payload");
    proto_iter_init(&it, payload, len);
    while ((r = proto_iter_next(&it, &f)) > 0) {
        if (f.tag == PT_ARG) {
            argc++;
        } else if (f.tag == PT_ENV) {
            if (!memchr(f.data, '=', f.len))
                return wr_err_set(err, EINVAL, "ENV entry without '='");
            envc++;
        } else if (f.tag == PT_CWD && !have_cwd) {
            cwd = f;
            have_cwd = 1;
        } else if (f.tag == PT_STDIN_PIPE && !have_stdin) {
            uint32_t v;
            if (proto_field_u32(&f, &v) < 0 || v > 1)
                return wr_err_set(err, EINVAL, "STDIN_PIPE must be a u32 0 or 1");
            *want_stdin = (int)v;
            have_stdin = 1;
        } else if (session && (f.tag == PT_TTY || f.tag == PT_ROWS || f.tag == PT_COLS)) {
            uint32_t v;
            if (proto_field_u32(&f, &v) < 0 || (f.tag == PT_TTY ? v > 1 : v < 1 || v > 10000))
                return wr_err_set(err, EINVAL, "TTY must be a u32 0 or 1, ROWS and COLS 1..10000");
            if (f.tag == PT_TTY)
                s->tty = (int)v;
            else if (f.tag == PT_ROWS)
                s->ws.ws_row = (unsigned short)v;
            else
                s->ws.ws_col = (unsigned short)v;
        }
    }
    if (session)
        *want_stdin = 1; /* a session's input always comes from the daemon */
    if (argc == 0)
        return wr_err_set(err, EINVAL, "EXEC without ARG");
    if (argc > PROTO_MAX_ARGS || envc > PROTO_MAX_ENVS)
        return wr_err_set(err, E2BIG, "more than %d ARG or ENV fields", PROTO_MAX_ARGS);

    if (have_cwd) {
        if (agent_path(&cwd, "CWD", s->cwd, err) < 0)
            return -1;
    } else {
        memcpy(s->cwd, AGENT_WORKSPACE, sizeof(AGENT_WORKSPACE));
    }

    s->argv_all = xcalloc(argc + 2, sizeof(char *));
    s->env = xcalloc(envc + 1, sizeof(char *));
    size_t ai = 1, ei = 0;
    proto_iter_init(&it, payload, len);
    while (proto_iter_next(&it, &f) > 0) {
        if (f.tag != PT_ARG && f.tag != PT_ENV)
            continue;
        char *str = proto_field_strdup(&f);
        if (!str)
            return wr_err_set(err, EINVAL, "%s contains a NUL byte",
                              f.tag == PT_ARG ? "ARG" : "ENV");
        if (f.tag == PT_ARG)
            s->argv_all[ai++] = str;
        else
            s->env[ei++] = str;
    }
    s->search = AGENT_DEFAULT_PATH;
    for (size_t i = 0; i < envc; i++) {
        if (!strncmp(s->env[i], "PATH=", 5)) {
            s->search = s->env[i] + 5;
            break;
        }
    }
    return 0;
}

static void report_message(const char *name, const char *cwd, const struct child_report *rep,
                           struct wr_err *err)
{
    switch (rep->stage) {
    case STAGE_CWD: wr_err_sys(err, rep->err, "cwd %s", cwd); break;
    case STAGE_NS: wr_err_sys(err, rep->err, "joining the commands' mount namespace"); break;
    case STAGE_CAPS: wr_err_sys(err, rep->err, "dropping capabilities"); break;
    case STAGE_EXEC:
        if (rep->err == ENOENT)
            wr_err_set(err, ENOENT, "command not found: %s", name);
        else
            wr_err_sys(err, rep->err, "exec %s", name);
        break;
    default: wr_err_sys(err, rep->err, "starting %s", name); break;
    }
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/*
 * vfork, not fork: under gVisor a fork copies the agent's address space mappings and costs
 * ~16 ms more per command (measured: exec round trip 33 ms with fork, 15-18 ms with vfork).
 * The vfork child only makes syscalls (everything it needs is prepared in s) and then execs or
 * _exits. The parent waits only until the child execs; the exec report is read by the loop.
 * Under a fork bomb that wait grows (every step of the child contends with the bomb), which
 * the sandbox's process cap, sized to its memory, keeps short.
 */
static __attribute__((noinline)) pid_t start_child(const struct spawn *s)
{
    /* The child shares our memory: exec_sh rewrites argv_all[0..1]; put them back. */
    char *slot0 = s->argv_all[0], *slot1 = s->argv_all[1];
    pid_t pid = vfork();
    if (pid == 0)
        child_run(s);
    s->argv_all[0] = slot0;
    s->argv_all[1] = slot1;
    return pid;
}

static void read_report(struct exec_req *e);

/*
 * Where the child's PATH search starts: past the leading entries where argv[0] is certainly
 * missing. Under gVisor an execve of a missing file costs ~0.5 ms (measured through the API:
 * `true` 1.7 ms slower than `/bin/true`, three misses before /usr/bin), a faccessat a few
 * microseconds. Only absolute entries whose file is missing (ENOENT, ENOTDIR: execvp moves on
 * from those too) are skipped, looked up in the commands' view; the search from the first
 * other entry on is execvp's, in the child. NULL: every entry was skipped (not found).
 */
static const char *search_start(const char *search, const char *name)
{
    size_t nlen = strlen(name);
    int root = ag.pidns ? ag.holder_root : -1;
    char buf[PATH_MAX];
    const char *p = search;
    for (;;) {
        const char *end = strchrnul(p, ':');
        size_t dlen = (size_t)(end - p);
        if (nlen == 0 || dlen == 0 || p[0] != '/' || dlen + 1 + nlen >= sizeof(buf))
            return p;
        memcpy(buf, p, dlen);
        buf[dlen] = '/';
        memcpy(buf + dlen + 1, name, nlen + 1);
        /* relative to the commands' root (its mounts), or the agent's own without a namespace */
        int rc = root >= 0 ? faccessat(root, buf + 1, F_OK, 0) : faccessat(AT_FDCWD, buf, F_OK, 0);
        if (rc == 0 || (errno != ENOENT && errno != ENOTDIR))
            return p;
        if (!*end)
            return NULL;
        p = end + 1;
    }
}

/* Forks; on success fills e's fds and pid, and settles the start (report_fd). Returns 0 or
 * -1 with err set. */
static int spawn_child(struct spawn *s, int want_stdin, struct exec_req *e, struct wr_err *err)
{
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, inp[2] = {-1, -1}, rep[2] = {-1, -1};
    int master = -1, slave = -1, tty_fd = -1;
    int ret = -1;

    if (s->tty) {
        /* A pseudo-terminal instead of the three pipes: its slave side is the child's stdin,
         * stdout and stderr (and controlling terminal); the master is read as stdout and
         * written as stdin, through two descriptors so each is closed on its own. */
        char name[64];
        if ((master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0 || grantpt(master) < 0 ||
            unlockpt(master) < 0 || ptsname_r(master, name, sizeof(name)) != 0 ||
            (slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0) {
            wr_err_sys(err, errno, "opening a pseudo-terminal");
            goto out;
        }
        if (s->ws.ws_row == 0)
            s->ws.ws_row = 24;
        if (s->ws.ws_col == 0)
            s->ws.ws_col = 80;
        ioctl(master, TIOCSWINSZ, &s->ws);
        outp[0] = master;
        master = -1;
        if ((inp[1] = fcntl(outp[0], F_DUPFD_CLOEXEC, 0)) < 0 ||
            (tty_fd = fcntl(outp[0], F_DUPFD_CLOEXEC, 0)) < 0 || pipe2(rep, O_CLOEXEC) < 0) {
            wr_err_sys(err, errno, "pipe");
            goto out;
        }
        s->in_r = s->out_w = s->err_w = slave;
    } else {
        if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 ||
            (want_stdin && pipe2(inp, O_CLOEXEC) < 0) || pipe2(rep, O_CLOEXEC) < 0) {
            wr_err_sys(err, errno, "pipe");
            goto out;
        }
        s->in_r = inp[0];
        s->out_w = outp[1];
        s->err_w = errp[1];
    }
    s->report_w = rep[1];

    if (!strchr(s->argv_all[1], '/'))
        s->search = search_start(s->search, s->argv_all[1]);
    pid_t pid = start_child(s);
    if (pid < 0 && errno == ENOMEM && pidns_lost()) {
        /* The holder was just killed and took its namespace with it: a fresh one, once. */
        if (pidns_ready(err) < 0)
            goto out;
        pid = start_child(s);
    }
    if (pid < 0) {
        wr_err_sys(err, errno, "vfork");
        goto out;
    }

    close_fd(&rep[1]);
    close_fd(&outp[1]);
    close_fd(&errp[1]);
    close_fd(&inp[0]);
    /* The report is read by the loop (exec_event): it closes when the child execs, or brings
     * the step that failed; the failed child is reaped by the loop like any other. */
    close_fd(&slave);
    if (set_nonblock(rep[0]) < 0 || set_nonblock(outp[0]) < 0 ||
        (errp[0] >= 0 && set_nonblock(errp[0]) < 0) || (inp[1] >= 0 && set_nonblock(inp[1]) < 0)) {
        /* Cannot happen on a pipe; if it did, blocking reads would stall every command. */
        wr_err_sys(err, errno, "fcntl");
        kill(pid, SIGKILL);
        goto out;
    }
    e->pid = pid;
    e->out_fd = steal_fd(&outp[0]);
    e->err_fd = steal_fd(&errp[0]);
    e->in_fd = steal_fd(&inp[1]);
    e->report_fd = steal_fd(&rep[0]);
    e->tty_fd = steal_fd(&tty_fd);
    e->name = xstrdup(s->argv_all[1]);
    e->cwd = xstrdup(s->cwd);
    e->spawn_ms = now_ms_monotonic();
    /* vfork returned: the child has exec'd (the pipe is at EOF) or failed (its report is in
     * the pipe). Either way the read does not wait, and the start is settled at once. */
    read_report(e);
    ret = 0;
out:
    close_fd(&outp[0]);
    close_fd(&outp[1]);
    close_fd(&errp[0]);
    close_fd(&errp[1]);
    close_fd(&inp[0]);
    close_fd(&inp[1]);
    close_fd(&rep[0]);
    close_fd(&rep[1]);
    close_fd(&master);
    close_fd(&slave);
    close_fd(&tty_fd);
    return ret;
}

void exec_start(uint32_t id, const uint8_t *payload, size_t len, int session)
{
    struct spawn s = {.in_r = -1, .out_w = -1, .err_w = -1, .report_w = -1};
    struct wr_err err = {0};
    int want_stdin = 0;

    if (req_admit(id) < 0)
        return;
    struct exec_req *e = xcalloc(1, sizeof(*e));
    e->out_fd = e->err_fd = e->in_fd = e->report_fd = e->tty_fd = -1;
    if (req_window(&e->r, payload, len) < 0)
        wr_err_set(&err, EINVAL, "malformed WINDOW");
    if (err.msg[0] || parse_exec(payload, len, &s, &want_stdin, session, &err) < 0 ||
        pidns_ready(&err) < 0 || spawn_child(&s, want_stdin, e, &err) < 0) {
        chan_error(id, err.code, "%s", err.msg);
        free(e);
    } else {
        e->r.id = id;
        e->r.kind = REQ_EXEC;
        req_add(&e->r);
    }
    if (s.argv_all) {
        for (char **p = s.argv_all + 1; *p; p++)
            free(*p);
        free(s.argv_all);
    }
    free_strv(s.env);
}

/* Gives up on the command's stdin: it sees EOF, pending bytes are dropped. */
static void stdin_close(struct exec_req *e)
{
    close_fd(&e->in_fd);
    obuf_free(&e->in);
}

static void stdin_pump(struct exec_req *e)
{
    while (e->in_fd >= 0 && obuf_pending(&e->in)) {
        ssize_t n = write(e->in_fd, e->in.data + e->in.off, obuf_pending(&e->in));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            stdin_close(e); /* EPIPE: the command closed its stdin */
            return;
        }
        obuf_consume(&e->in, (size_t)n);
    }
    if (e->in_fin && e->in_fd >= 0 && !obuf_pending(&e->in))
        stdin_close(e);
}

void exec_stdin(struct req *r, const uint8_t *data, size_t len, int fin)
{
    struct exec_req *e = as_exec(r);
    if (e->in_fd < 0 || e->in_fin)
        return; /* no stdin pipe, already closed, or FIN seen: nothing to feed */
    if (obuf_pending(&e->in) + len > AGENT_STDIN_MAX) {
        log_warn(NULL, "agent.stdin_overflow", "id=%u pending=%zu", e->r.id, obuf_pending(&e->in));
        stdin_close(e);
        return;
    }
    obuf_append(&e->in, data, len);
    if (fin && e->tty_fd >= 0)
        obuf_append(&e->in, "\x04", 1); /* a terminal's end of file: its VEOF character */
    else if (fin)
        e->in_fin = 1;
    stdin_pump(e);
}

void exec_signal(struct req *r, const uint8_t *payload, size_t len)
{
    struct exec_req *e = as_exec(r);
    struct proto_field f;
    uint32_t sig;
    if (proto_find(payload, len, PT_SIGNUM, &f) != 1 || proto_field_u32(&f, &sig) < 0 || sig < 1 ||
        sig >= (uint32_t)NSIG) {
        log_warn(NULL, "agent.bad_signal", "id=%u", e->r.id);
        return;
    }
    /* Once the main process is reaped its pid may be reused: only its group is still ours. */
    tree_signal(e->exited ? 0 : e->pid, e->pid, (int)sig);
}

void exec_resize(struct req *r, const uint8_t *payload, size_t len)
{
    struct exec_req *e = as_exec(r);
    struct proto_field f;
    uint32_t rows, cols;
    if (e->tty_fd < 0)
        return;
    if (proto_find(payload, len, PT_ROWS, &f) != 1 || proto_field_u32(&f, &rows) < 0 ||
        proto_find(payload, len, PT_COLS, &f) != 1 || proto_field_u32(&f, &cols) < 0 || rows < 1 ||
        rows > 10000 || cols < 1 || cols > 10000) {
        log_warn(NULL, "agent.bad_resize", "id=%u", e->r.id);
        return;
    }
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    if (ioctl(e->tty_fd, TIOCSWINSZ, &ws) < 0)
        return;
    /* The kernel tells the foreground group itself; not every kernel (gVisor's) does. */
    pid_t pg = tcgetpgrp(e->tty_fd);
    if (pg > 1)
        kill(-pg, SIGWINCH);
}

void exec_pollfds(struct req *r, struct pollfd *fds, struct req **owners, size_t *n, int may_read)
{
    struct exec_req *e = as_exec(r);
    /* Out of credit, the pipes are left unread: the command blocks on them, as it would on a
     * slow terminal. A cancelled command's output is read (and dropped) whatever the credit. */
    if (!e->cancelled && !req_room(r, 1))
        may_read = 0;
    if (may_read && e->out_fd >= 0) {
        fds[*n] = (struct pollfd){.fd = e->out_fd, .events = POLLIN};
        owners[(*n)++] = r;
    }
    if (may_read && e->err_fd >= 0) {
        fds[*n] = (struct pollfd){.fd = e->err_fd, .events = POLLIN};
        owners[(*n)++] = r;
    }
    if (e->in_fd >= 0 && obuf_pending(&e->in)) {
        fds[*n] = (struct pollfd){.fd = e->in_fd, .events = POLLOUT};
        owners[(*n)++] = r;
    }
    if (e->report_fd >= 0) {
        fds[*n] = (struct pollfd){.fd = e->report_fd, .events = POLLIN};
        owners[(*n)++] = r;
    }
}

/* The child's start is settled: it exec'd (EOF), or died before (EOF: its end is reported as
 * usual), or says which step failed. A partial report cannot happen (a pipe write this small
 * is atomic); it counts as a failure. */
static void read_report(struct exec_req *e)
{
    struct child_report report;
    ssize_t n = read(e->report_fd, &report, sizeof(report));
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (n == (ssize_t)sizeof(report)) {
        report_message(e->name, e->cwd, &report, &e->start_err);
        e->start_failed = 1;
    } else if (n != 0) {
        wr_err_sys(&e->start_err, n < 0 ? errno : EIO, "starting %s", e->name);
        e->start_failed = 1;
    }
    close_fd(&e->report_fd);
    uint64_t ms = now_ms_monotonic() - e->spawn_ms;
    if (ms >= 1000)
        log_info(NULL, "agent.slow_start", "id=%u ms=%llu", e->r.id, (unsigned long long)ms);
}

/*
 * Forwards what a pipe has, within the request's credit. force ignores the channel's
 * backpressure (bounded by limit), never the credit. A cancelled command's output is dropped.
 */
static void pump_output(struct exec_req *e, int *fd, uint16_t type, size_t limit, int force)
{
    static uint8_t sink[PROTO_CHUNK];
    size_t got = 0;
    while (*fd >= 0 && got < limit && (force || chan_pending() < AGENT_OUT_SOFT)) {
        size_t room = e->cancelled ? PROTO_CHUNK : req_room(&e->r, PROTO_CHUNK);
        if (room == 0)
            return;
        uint8_t *p = e->cancelled ? sink : chan_reserve_data(room);
        ssize_t n = read(*fd, p, room);
        if (n > 0) {
            if (!e->cancelled) {
                chan_commit_data(e->r.id, type, (size_t)n);
                req_spend(&e->r, (size_t)n);
            }
            got += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        close_fd(fd); /* EOF: every writer is gone */
    }
}

void exec_event(struct req *r, int fd, short revents)
{
    struct exec_req *e = as_exec(r);
    if (fd == e->out_fd)
        pump_output(e, &e->out_fd, PROTO_STDOUT, PIPE_BUDGET * PROTO_CHUNK, 0);
    else if (fd == e->err_fd)
        pump_output(e, &e->err_fd, PROTO_STDERR, PIPE_BUDGET * PROTO_CHUNK, 0);
    else if (fd == e->in_fd && (revents & (POLLOUT | POLLERR | POLLHUP)))
        stdin_pump(e);
    else if (fd == e->report_fd)
        read_report(e);
}

void exec_cancel(struct req *r)
{
    struct exec_req *e = as_exec(r);
    e->cancelled = 1;
    stdin_close(e);
    tree_signal(e->exited ? 0 : e->pid, e->pid, SIGKILL);
}

void exec_reaped(pid_t pid, int status)
{
    for (struct req *r = ag.head; r; r = r->next) {
        struct exec_req *e = as_exec(r);
        if (r->kind != REQ_EXEC || e->exited || e->pid != pid)
            continue;
        e->exited = 1;
        e->status = status;
        e->exit_ms = now_ms_monotonic();
        e->exit_us = now_us_monotonic();
        /* Nobody is left to read it (a background child that kept stdin gets EOF). */
        stdin_close(e);
        return;
    }
}

static void send_exit(struct exec_req *e)
{
    struct proto_buf b = {0};
    int32_t code = -1;
    uint32_t sig = 0;
    if (WIFEXITED(e->status))
        code = WEXITSTATUS(e->status);
    else if (WIFSIGNALED(e->status))
        sig = (uint32_t)WTERMSIG(e->status);
    proto_put_u32(&b, PT_EXIT_CODE, (uint32_t)code);
    proto_put_u32(&b, PT_TERM_SIGNAL, sig);
    proto_put_u64(&b, PT_EXIT_WAIT, now_us_monotonic() - e->exit_us);
    chan_send_fields(e->r.id, PROTO_EXIT, &b);
    proto_buf_free(&b);
}

int exec_check(struct req *r, uint64_t now, int *timeout_ms)
{
    struct exec_req *e = as_exec(r);
    if (e->report_fd >= 0)
        return 0;
    if (e->start_failed) {
        /* Nothing ran, nothing was sent: the request ends with the reason. */
        chan_error(e->r.id, e->start_err.code, "%s", e->start_err.msg);
        return 1;
    }
    if (!e->exited)
        return 0;
    if (e->out_fd >= 0 || e->err_fd >= 0) {
        uint64_t deadline = e->exit_ms + AGENT_EXIT_GRACE_MS;
        if (now < deadline) {
            uint64_t wait = deadline - now;
            if (*timeout_ms < 0 || (uint64_t)*timeout_ms > wait)
                *timeout_ms = (int)wait;
            return 0;
        }
        /* Out of credit: what is left waits for the daemon's CREDIT (it wakes the loop). */
        if (!e->cancelled && !req_room(r, 1))
            return 0;
        /* A background process still holds the pipes. What the command wrote before it exited
         * may still sit in them (held back by backpressure): take it, then stop listening. */
        pump_output(e, &e->out_fd, PROTO_STDOUT, FINAL_DRAIN, 1);
        pump_output(e, &e->err_fd, PROTO_STDERR, FINAL_DRAIN, 1);
        close_fd(&e->out_fd);
        close_fd(&e->err_fd);
    }
    send_exit(e);
    return 1;
}

void exec_free(struct req *r)
{
    struct exec_req *e = as_exec(r);
    close_fd(&e->out_fd);
    close_fd(&e->err_fd);
    close_fd(&e->report_fd);
    close_fd(&e->tty_fd);
    stdin_close(e);
    free(e->name);
    free(e->cwd);
    free(e);
}
