/*
 * Confinement of the daemon's hostile-input processes: see confine.h.
 *
 * The seccomp filter is classic BPF written here, from one table of allowed system calls
 * (allowed[] below, a row per call, the profiles that get it, and for a few an argument rule),
 * so no library is needed and the whole policy reads top to bottom in one place. The program
 * checks the ABI first (a foreign one kills), then walks the table: a call without a rule
 * returns ALLOW on its number, a call with one loads that argument and returns ALLOW or EPERM;
 * anything not in the table gets EPERM. The hot calls of an event loop come first, though on
 * kernels since 5.11 the calls whose answer does not depend on arguments are cached per
 * process and never run the program at all.
 *
 * Argument rules read the low 32 bits of an argument where the kernel's parameter is an int or
 * unsigned int (the kernel itself ignores the high half there), and all 64 bits of a pointer.
 */
#include "confine.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/util.h"

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#endif
/* Elsewhere confine_seccomp fails (ENOSYS): a table is only as good as a check of it on the
 * architecture's own system call numbers. */

/* ---- dropping root ---- */

int confine_lookup_user(const char *name, struct confine_ids *out, struct wr_err *err)
{
    if (!name || !*name)
        name = CONFINE_DEFAULT_USER;
    char buf[16384];
    struct passwd pw, *found = NULL;
    int r = getpwnam_r(name, &pw, buf, sizeof(buf), &found);
    if (r != 0)
        return wr_err_sys(err, r, "confine: looking up user %s", name);
    if (!found)
        return wr_err_set(err, ENOENT, "confine: no user %s", name);
    if (pw.pw_uid == 0 || pw.pw_gid == 0)
        return wr_err_set(err, EPERM, "confine: user %s has uid %u, gid %u: refusing root", name,
                          (unsigned)pw.pw_uid, (unsigned)pw.pw_gid);
    out->uid = pw.pw_uid;
    out->gid = pw.pw_gid;
    return 0;
}

/* Empties the capability sets (what setresuid left, if a securebit kept any) and checks that
 * nothing is left in any, ambient included. */
static int caps_clear(struct wr_err *err)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct data[2] = {{0}};
    if (syscall(SYS_capset, &hdr, data) < 0)
        return wr_err_sys(err, errno, "confine: capset to empty sets");
    if (syscall(SYS_capget, &hdr, data) < 0)
        return wr_err_sys(err, errno, "confine: capget");
    for (int i = 0; i < 2; i++)
        if (data[i].effective || data[i].permitted || data[i].inheritable)
            return wr_err_set(err, EPERM, "confine: capabilities left after the drop");
    /* Probed up to the kernel's last capability (EINVAL past it). */
    for (int cap = 0; cap < 64; cap++) {
        int r = prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0);
        if (r < 0)
            break;
        if (r > 0)
            return wr_err_set(err, EPERM, "confine: ambient capability %d left", cap);
    }
    return 0;
}

/* Whether the real, effective and saved ids are all ids's, and no supplementary group is left. */
static bool ids_are(const struct confine_ids *ids)
{
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (getresuid(&ru, &eu, &su) < 0 || getresgid(&rg, &eg, &sg) < 0)
        return false;
    return ru == ids->uid && eu == ids->uid && su == ids->uid && rg == ids->gid && eg == ids->gid &&
           sg == ids->gid && getgroups(0, NULL) == 0;
}

int confine_drop(const struct confine_ids *ids, struct wr_err *err)
{
    if (ids->uid == 0 || ids->gid == 0)
        return wr_err_set(err, EINVAL, "confine: refusing to drop to uid %u gid %u",
                          (unsigned)ids->uid, (unsigned)ids->gid);
    /* So that setresuid clears the capabilities, whatever the parent left set. */
    if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0)
        return wr_err_sys(err, errno, "confine: prctl(PR_SET_KEEPCAPS, 0)");
    if (setgroups(0, NULL) < 0)
        return wr_err_sys(err, errno, "confine: setgroups(0)");
    if (setresgid(ids->gid, ids->gid, ids->gid) < 0)
        return wr_err_sys(err, errno, "confine: setresgid(%u)", (unsigned)ids->gid);
    if (setresuid(ids->uid, ids->uid, ids->uid) < 0)
        return wr_err_sys(err, errno, "confine: setresuid(%u)", (unsigned)ids->uid);
    if (!ids_are(ids))
        return wr_err_set(err, EPERM, "confine: ids are not %u:%u after the drop",
                          (unsigned)ids->uid, (unsigned)ids->gid);
    if (setuid(0) == 0 || setgid(0) == 0)
        return wr_err_set(err, EPERM, "confine: root can be regained after the drop");
    if (caps_clear(err) < 0)
        return -1;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return wr_err_sys(err, errno, "confine: prctl(PR_SET_NO_NEW_PRIVS)");
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        return wr_err_sys(err, errno, "confine: prctl(PR_SET_DUMPABLE, 0)");
    return 0;
}

/* ---- the seccomp table ---- */

#ifdef NATIVE_ARCH

#define P_NET (1u << CONFINE_NET)
#define P_SIGNER (1u << CONFINE_SIGNER)
#define P_BOTH (P_NET | P_SIGNER)

enum rule {
    ANY,     /* allowed, whatever its arguments */
    IN,      /* argument arg (an int) is one of vals */
    NONE_OF, /* argument arg (an int) has none of the bits in vals[0] */
    NULLPTR, /* argument arg (a pointer, 64 bits) is NULL */
    SELF,    /* argument arg (a pid) is this process's own */
};

struct allowed {
    long nr;
    unsigned profiles; /* P_ bits */
    enum rule rule;
    unsigned arg;
    uint32_t vals[4];
    unsigned nvals;
};

/* A row of allowed[]: a call without a rule, or with a rule on argument argi. */
/* clang-format off */
#define NVALS(...) (sizeof((uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))
#define ALLOW(name, prof) {__NR_##name, prof, ANY, 0, {0}, 0}
#define ALLOW_IF(name, prof, how, argi, ...) \
    {__NR_##name, prof, how, argi, {__VA_ARGS__}, NVALS(__VA_ARGS__)}
/* clang-format on */

/* Any open that could write, create, truncate or append is refused: reads only (OpenSSL's
 * configuration and trust store, which it loads lazily; ASan's /proc/self/maps). O_TMPFILE
 * carries O_DIRECTORY, which a read-only opendir uses, so only its own bit is tested. */
#define OPEN_WRITING (O_ACCMODE | O_CREAT | O_TRUNC | O_APPEND | (O_TMPFILE & ~O_DIRECTORY))

/*
 * Never allowed (the default, EPERM), among others: execve, execveat, fork, vfork, clone,
 * clone3 (single-threaded, no child), ptrace, process_vm_readv/writev, kill or tgkill aimed
 * elsewhere, mount, umount2, setns, unshare, pivot_root, chroot, kexec_*, *_module, bpf,
 * keyctl, add_key, request_key, perf_event_open, userfaultfd, io_uring_*, the setuid/setgid
 * family, capset, personality, prctl (nothing in glibc, libevent, OpenSSL or the sanitizers'
 * running paths needs one), memfd_create (nothing needs an anonymous file, and it is how code
 * gets executed without a file on disk), seccomp (no further filter), and every call that
 * writes the file system (openat with OPEN_WRITING, unlink, rename, mkdir, chmod, ...).
 */
static const struct allowed allowed[] = {
    /* The event loop's own, first. */
    ALLOW(epoll_pwait, P_NET),
#ifdef __NR_epoll_wait
    ALLOW(epoll_wait, P_NET),
#endif
#ifdef __NR_epoll_pwait2
    ALLOW(epoll_pwait2, P_NET),
#endif
    ALLOW(read, P_BOTH),
    ALLOW(write, P_BOTH),
    ALLOW(readv, P_BOTH),
    ALLOW(writev, P_BOTH),
    ALLOW(recvfrom, P_BOTH),
    ALLOW(sendto, P_BOTH),
    ALLOW(recvmsg, P_BOTH),
    ALLOW(sendmsg, P_BOTH),
    ALLOW(clock_gettime, P_BOTH),
    ALLOW(epoll_ctl, P_NET),
    ALLOW(accept4, P_NET),
    ALLOW(accept, P_NET),
    ALLOW(connect, P_NET),
    ALLOW(close, P_BOTH),
    ALLOW(setsockopt, P_NET),
    ALLOW(getsockopt, P_NET),
    /* the signer checks that its one socket keeps message boundaries */
    ALLOW_IF(getsockopt, P_SIGNER, IN, 2, SO_TYPE),
    ALLOW(getsockname, P_NET),
    ALLOW(getpeername, P_NET),
    ALLOW(shutdown, P_BOTH),
    ALLOW_IF(socket, P_NET, IN, 0, AF_INET, AF_INET6, AF_UNIX),
    ALLOW_IF(socketpair, P_NET, IN, 0, AF_UNIX),
    ALLOW(bind, P_NET),
    ALLOW(listen, P_NET),
    /* libevent's non-blocking and close-on-exec flags; F_SETOWN and F_SETSIG, which would aim
     * SIGIO at another process, are left out. */
    ALLOW_IF(fcntl, P_BOTH, IN, 1, F_GETFD, F_SETFD, F_GETFL, F_SETFL),
    ALLOW_IF(ioctl, P_BOTH, IN, 1, FIONREAD, FIONBIO),
    ALLOW(getrandom, P_BOTH),

    /* Memory: malloc, ASan's shadow and quarantine. */
    ALLOW(mmap, P_BOTH),
    ALLOW(munmap, P_BOTH),
    ALLOW(mprotect, P_BOTH),
    ALLOW(mremap, P_BOTH),
    ALLOW(brk, P_BOTH),
    ALLOW(madvise, P_BOTH),
    ALLOW(futex, P_BOTH),

    /* Files, read only. */
    ALLOW_IF(openat, P_BOTH, NONE_OF, 2, OPEN_WRITING),
#ifdef __NR_open
    ALLOW_IF(open, P_BOTH, NONE_OF, 1, OPEN_WRITING),
#endif
    ALLOW(pread64, P_BOTH),
    ALLOW(lseek, P_BOTH),
    ALLOW(fstat, P_BOTH),
    ALLOW(newfstatat, P_BOTH),
    ALLOW(statx, P_BOTH),
#ifdef __NR_stat
    ALLOW(stat, P_BOTH), /* the sanitizers' runtime makes the old calls on x86-64 */
    ALLOW(lstat, P_BOTH),
#endif
    ALLOW(readlinkat, P_BOTH),
#ifdef __NR_readlink
    ALLOW(readlink, P_BOTH),
#endif
    ALLOW(getdents64, P_BOTH),

    /* Descriptors the loop makes. */
    ALLOW(epoll_create1, P_NET),
    ALLOW(eventfd2, P_NET),
    ALLOW(pipe2, P_NET),
    ALLOW(timerfd_create, P_NET),
    ALLOW(timerfd_settime, P_NET),
    ALLOW(timerfd_gettime, P_NET),
    ALLOW(dup, P_NET),
#ifdef __NR_dup2
    ALLOW(dup2, P_NET),
#endif
    ALLOW(dup3, P_NET),
    ALLOW(ppoll, P_BOTH),
#ifdef __NR_poll
    ALLOW(poll, P_BOTH),
#endif

    /* Time. */
    ALLOW(clock_getres, P_BOTH),
    ALLOW(gettimeofday, P_BOTH),
#ifdef __NR_time
    ALLOW(time, P_BOTH),
#endif
    ALLOW(nanosleep, P_BOTH),
    ALLOW(clock_nanosleep, P_BOTH),

    /* Signals: handlers, masks, and raise/abort at this process only. */
    ALLOW(rt_sigaction, P_BOTH),
    ALLOW(rt_sigprocmask, P_BOTH),
    ALLOW(rt_sigreturn, P_BOTH),
    ALLOW(sigaltstack, P_BOTH),
    ALLOW(restart_syscall, P_BOTH),
    ALLOW_IF(tgkill, P_BOTH, SELF, 0, 0),
    ALLOW_IF(kill, P_BOTH, SELF, 0, 0),

    /* The process's own facts. */
    ALLOW(getpid, P_BOTH),
    ALLOW(gettid, P_BOTH),
    ALLOW(getuid, P_BOTH),
    ALLOW(geteuid, P_BOTH),
    ALLOW(getgid, P_BOTH),
    ALLOW(getegid, P_BOTH),
    ALLOW_IF(prlimit64, P_BOTH, NULLPTR, 2, 0), /* reading a limit, never setting one */
    ALLOW(getrusage, P_BOTH),
    ALLOW(sched_getaffinity, P_BOTH),
    ALLOW(sched_yield, P_BOTH),
    ALLOW(uname, P_BOTH),
    ALLOW(sysinfo, P_BOTH),
    ALLOW(set_robust_list, P_BOTH),
    ALLOW(rseq, P_BOTH),
    ALLOW(exit, P_BOTH),
    ALLOW(exit_group, P_BOTH),
};

#define FILTER_MAX 512

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#define ARG_HI(i) (offsetof(struct seccomp_data, args) + 8 * (i) + 4)
#else
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i) + 4)
#define ARG_HI(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#endif

#define STMT(code, k) ((struct sock_filter)BPF_STMT(code, k))
#define JUMP(code, k, jt, jf) ((struct sock_filter)BPF_JUMP(code, k, jt, jf))
#define LOAD(off) STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)(off))
#define JEQ(k, jt, jf) JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(k), jt, jf)
#define RET(action) STMT(BPF_RET | BPF_K, (action))
#define RET_ALLOW RET(SECCOMP_RET_ALLOW)
#define RET_EPERM RET(SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA))
#define RET_KILL RET(SECCOMP_RET_KILL_PROCESS)

struct prog {
    struct sock_filter ins[FILTER_MAX];
    size_t n;
    bool overflow;
};

static void emit(struct prog *p, struct sock_filter ins)
{
    if (p->n == FILTER_MAX) {
        p->overflow = true;
        return;
    }
    p->ins[p->n++] = ins;
}

/* The test of a row with a rule, entered with its syscall matched; every path returns. */
static void emit_rule(struct prog *p, const struct allowed *a, uint32_t self)
{
    switch (a->rule) {
    case ANY: break;
    case IN:
    case SELF: {
        const uint32_t *vals = a->rule == SELF ? &self : a->vals;
        unsigned n = a->rule == SELF ? 1 : a->nvals;
        emit(p, LOAD(ARG_LO(a->arg)));
        /* The i-th test jumps over the rest and the EPERM, to the ALLOW. */
        for (unsigned i = 0; i < n; i++)
            emit(p, JEQ(vals[i], (uint8_t)(n - i), 0));
        break;
    }
    case NONE_OF:
        emit(p, LOAD(ARG_LO(a->arg)));
        emit(p, JUMP(BPF_JMP | BPF_JSET | BPF_K, a->vals[0], 0, 1));
        break;
    case NULLPTR:
        emit(p, LOAD(ARG_LO(a->arg)));
        emit(p, JEQ(0, 0, 2));
        emit(p, LOAD(ARG_HI(a->arg)));
        emit(p, JEQ(0, 1, 0));
        break;
    }
    emit(p, RET_EPERM);
    emit(p, RET_ALLOW);
}

/* Builds profile's program into p. Returns false if it did not fit (a table too long). */
static bool build(struct prog *p, unsigned profile)
{
    p->n = 0;
    p->overflow = false;
    emit(p, LOAD(offsetof(struct seccomp_data, arch)));
    emit(p, JEQ(NATIVE_ARCH, 1, 0));
    emit(p, RET_KILL);
    emit(p, LOAD(offsetof(struct seccomp_data, nr)));
#ifdef __X32_SYSCALL_BIT
    /* x32 calls arrive with the x86-64 arch and this bit in the number. */
    emit(p, JUMP(BPF_JMP | BPF_JGE | BPF_K, __X32_SYSCALL_BIT, 0, 1));
    emit(p, RET_KILL);
#endif
    uint32_t self = (uint32_t)getpid();
    for (size_t i = 0; i < WR_ARRAY_LEN(allowed); i++) {
        const struct allowed *a = &allowed[i];
        if (!(a->profiles & profile))
            continue;
        if (a->rule == ANY) {
            emit(p, JEQ(a->nr, 0, 1));
            emit(p, RET_ALLOW);
            continue;
        }
        /* Not this call: skip its rule, the accumulator still holding the number. */
        size_t at = p->n;
        emit(p, JEQ(a->nr, 0, 0));
        emit_rule(p, a, self);
        if (p->overflow || p->n - at - 1 > UINT8_MAX)
            return false;
        p->ins[at].jf = (uint8_t)(p->n - at - 1);
    }
    emit(p, RET_EPERM);
    return !p->overflow;
}

int confine_seccomp(enum confine_profile profile, struct wr_err *err)
{
    if (profile != CONFINE_NET && profile != CONFINE_SIGNER)
        return wr_err_set(err, EINVAL, "confine: unknown profile %d", (int)profile);
    int nnp = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0);
    if (nnp < 0)
        return wr_err_sys(err, errno, "confine: prctl(PR_GET_NO_NEW_PRIVS)");
    if (!nnp && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return wr_err_sys(err, errno, "confine: prctl(PR_SET_NO_NEW_PRIVS)");
    static struct prog p; /* 4 KiB: off the stack; built and loaded once per process */
    if (!build(&p, 1u << profile))
        return wr_err_set(err, E2BIG, "confine: the seccomp program does not fit");
    struct sock_fprog fprog = {.len = (unsigned short)p.n, .filter = p.ins};
    /* TSYNC: should a thread exist after all, it gets the filter too (or this fails). */
    long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fprog);
    if (r < 0)
        return wr_err_sys(err, errno, "confine: installing the seccomp filter");
    if (r > 0)
        return wr_err_set(err, EBUSY, "confine: thread %ld could not take the seccomp filter", r);
    return 0;
}

#else

int confine_seccomp(enum confine_profile profile, struct wr_err *err)
{
    return wr_err_set(err, ENOSYS, "confine: no seccomp filter for this architecture");
}

#endif
