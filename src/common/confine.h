/*
 * Confinement for a process the daemon starts to parse bytes that come from sandboxes: the egress
 * proxy (TLS ClientHellos, HTTP heads, DNS answers) and the CA signer. A bug there must not hand
 * a sandbox the host. So such a process, once it holds what it needs (its sockets, its key),
 * gives up root for an unprivileged user (confine_drop), with no way back and no capabilities,
 * then installs a seccomp filter (confine_seccomp) that allows only the system calls its
 * profile names: no exec, no new processes or threads, no namespaces, no writable opens, no
 * signals to other processes. A call outside the list fails with EPERM, so a library probing
 * for something optional carries on; a call from another ABI (i386 or x32 on x86-64) kills the
 * process, since nothing of ours makes one.
 *
 * Order: confine_lookup_user (best in the daemon, before the child starts: it reads /etc/passwd,
 * may load NSS modules, and takes locks a fork from a threaded process may find held), then in
 * the child confine_drop and confine_seccomp, which change it for good and are for a
 * single-threaded process. Whatever needs a privilege or a refused call comes before them: the
 * listening sockets, the key, PR_SET_PDEATHSIG.
 *
 * Under LeakSanitizer (make SAN=1) the leak check at exit needs clone and ptrace, which the
 * filter refuses; LSan then reports a fatal error and the exit status is 1. A confined process
 * ends with _exit, or runs with LSAN_OPTIONS=detect_leaks=0. ASan's error reports work.
 */
#ifndef WR_COMMON_CONFINE_H
#define WR_COMMON_CONFINE_H

#include <sys/types.h>

#include "common/err.h"

/* The user confined processes run as when none is named. */
#define CONFINE_DEFAULT_USER "nobody"

struct confine_ids {
    uid_t uid;
    gid_t gid;
};

/**
 * Looks up user name (CONFINE_DEFAULT_USER when name is NULL or "") and stores its uid and
 * primary gid in *out. Returns 0, or -1 with err set: code ENOENT for an unknown user, EPERM for
 * one whose uid or gid is 0 (confining to root would confine nothing).
 */
int confine_lookup_user(const char *name, struct confine_ids *out, struct wr_err *err);

/**
 * Gives up root for ids, for good: setgroups(0, NULL), setresgid and setresuid (real, effective
 * and saved ids), then checks that setuid(0) and setgid(0) fail and that the effective,
 * permitted, inheritable and ambient capability sets are empty, and sets PR_SET_NO_NEW_PRIVS
 * and PR_SET_DUMPABLE 0 (no core dumps, no /proc/PID/mem or ptrace for other processes of the
 * same user). Call as root, before any thread is started. Returns 0, or -1 with err set, its
 * message naming the step that failed (the process is then half-dropped: it should exit).
 */
int confine_drop(const struct confine_ids *ids, struct wr_err *err);

/** What a confined process does, hence which system calls it keeps (see confine.c). */
enum confine_profile {
    CONFINE_NET,    /* the egress proxy + resolvers: libevent loop, OpenSSL, single-threaded */
    CONFINE_SIGNER, /* blocking read/write on one socket, OpenSSL signing, nothing else */
};

/**
 * Installs profile's seccomp filter on the calling process, for good (inherited by nothing: the
 * filter allows no new process). Sets PR_SET_NO_NEW_PRIVS first if confine_drop has not.
 * Disallowed calls then fail with EPERM; a call from a foreign ABI kills the process. kill and
 * tgkill are allowed at the caller's pid only, as it is now. Returns 0, or -1 with err set (code
 * ENOSYS on an architecture this module has no table for: x86-64 and aarch64 have one).
 */
int confine_seccomp(enum confine_profile p, struct wr_err *err);

#endif
