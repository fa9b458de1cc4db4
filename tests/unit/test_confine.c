/*
 * Confinement (common/confine.h), run as root. For each profile a forked child looks up nobody,
 * drops to it and installs the filter, then reports over a socket what it can and cannot do:
 * its ids and /proc/self/status (seccomp mode 2, no_new_privs, no capabilities), exec, a
 * writable open, fork, setuid, unshare, prctl, ptrace, memfd_create, a signal or F_SETOWN at
 * another process of the same user, setrlimit and a tty ioctl refused with EPERM; a read-only
 * open, opendir, a limit read, FIONREAD, a signal at itself, OpenSSL P-256 keygen, signing and a
 * certificate allowed. The NET child also refuses a netlink socket and connects to the parent's
 * loopback listener with a byte the parent reads, runs a libevent timer on epoll, verifies a
 * system root found lazily in the hash directory and completes a TLS handshake with the default
 * verify paths; the SIGNER child refuses an INET socket and epoll. On x86-64, an x32 call (and an
 * i386 one where the kernel has that ABI) kills the child. Lookups of root and of an unknown
 * user are refused.
 *
 * The children end with _exit: LeakSanitizer's exit-time check needs clone and ptrace, which
 * the filter refuses.
 */
#include <dirent.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "common/confine.h"
#include "tap.h"

extern char **environ;

/* One finding of a child, sent whole over its report socket. */
struct finding {
    int ok;
    int err; /* errno after the check */
    char what[200];
};

static int report_fd = -1;

static void report(int cond, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void report(int cond, int e, const char *fmt, ...)
{
    struct finding f = {.ok = cond, .err = e};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f.what, sizeof(f.what), fmt, ap);
    va_end(ap);
    (void)!write(report_fd, &f, sizeof(f));
}

/* errno is read after cond, so a failed call's errno is what is reported. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        errno = 0;                                                                                 \
        int c_ = (cond);                                                                           \
        report(c_, errno, __VA_ARGS__);                                                            \
    } while (0)

/* ---- what both profiles must show ---- */

static bool status_has(const char *needle)
{
    char buf[8192];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

static bool refused(long r)
{
    return r == -1 && errno == EPERM;
}

static void check_confined(const struct confine_ids *ids, pid_t other, const char *tmpfile)
{
    char line[128];
    CHECK(getuid() == ids->uid && geteuid() == ids->uid, "getuid and geteuid are nobody's");
    snprintf(line, sizeof(line), "\nUid:\t%u\t%u\t%u\t%u\n", (unsigned)ids->uid, (unsigned)ids->uid,
             (unsigned)ids->uid, (unsigned)ids->uid);
    CHECK(status_has(line), "/proc/self/status: real, effective, saved and fs uid are nobody's");
    snprintf(line, sizeof(line), "\nGid:\t%u\t%u\t%u\t%u\n", (unsigned)ids->gid, (unsigned)ids->gid,
             (unsigned)ids->gid, (unsigned)ids->gid);
    CHECK(status_has(line), "/proc/self/status: the four gids are nobody's");
    /* The kernel ends the list with a space, even an empty one. */
    CHECK(status_has("\nGroups:\t \n"), "/proc/self/status: no supplementary groups");
    CHECK(status_has("\nSeccomp:\t2\n"), "/proc/self/status: Seccomp 2");
    CHECK(status_has("\nNoNewPrivs:\t1\n"), "/proc/self/status: NoNewPrivs 1");
    CHECK(status_has("\nCapEff:\t0000000000000000\n"), "/proc/self/status: CapEff empty");
    CHECK(status_has("\nCapPrm:\t0000000000000000\n"), "/proc/self/status: CapPrm empty");
    CHECK(status_has("\nCapInh:\t0000000000000000\n"), "/proc/self/status: CapInh empty");
    CHECK(status_has("\nCapAmb:\t0000000000000000\n"), "/proc/self/status: CapAmb empty");
    CHECK(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == -1 && errno == EPERM,
          "prctl refused (PR_GET_DUMPABLE)");

    char *argv[] = {"/bin/true", NULL};
    CHECK(refused(execve("/bin/true", argv, environ)), "execve(/bin/true) refused");
    CHECK(refused(open(tmpfile, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)),
          "open(O_WRONLY|O_CREAT) refused");
    CHECK(refused(open("/etc/hostname", O_RDONLY | O_CREAT | O_CLOEXEC, 0600)),
          "open(O_RDONLY|O_CREAT) refused");
    CHECK(refused(open("/etc/hostname", O_RDWR | O_CLOEXEC)), "open(O_RDWR) refused");
    CHECK(refused(open("/etc/hostname", O_WRONLY | O_APPEND | O_CLOEXEC)),
          "open(O_APPEND) refused");
    int fd = open("/etc/hostname", O_RDONLY | O_CLOEXEC);
    char c;
    CHECK(fd >= 0 && read(fd, &c, 1) == 1, "open(/etc/hostname, O_RDONLY) and read work");
    if (fd >= 0)
        close(fd);
    DIR *d = opendir("/etc");
    CHECK(d && readdir(d), "opendir and readdir work");
    if (d)
        closedir(d);

    pid_t p = fork();
    int e = errno;
    if (p == 0)
        _exit(0);
    CHECK(p == -1 && e == EPERM, "fork refused");
    CHECK(setuid(0) == -1, "setuid(0) fails");
    CHECK(refused(setresuid(ids->uid, ids->uid, ids->uid)), "setresuid refused, even to itself");
    CHECK(refused(unshare(CLONE_NEWNET)), "unshare(CLONE_NEWNET) refused");
    CHECK(refused(unshare(CLONE_NEWUSER)), "unshare(CLONE_NEWUSER) refused");
    CHECK(refused(ptrace(PTRACE_TRACEME, 0, NULL, NULL)), "ptrace(PTRACE_TRACEME) refused");
    CHECK(refused(memfd_create("x", MFD_CLOEXEC)), "memfd_create refused");

    CHECK(kill(getpid(), 0) == 0, "kill(self, 0) works");
    CHECK(refused(kill(other, 0)), "kill(another nobody process, 0) refused");
    CHECK(refused(syscall(SYS_tgkill, other, other, 0)), "tgkill(another process) refused");
    /* Read before it closes: unread data would reset the parent's end. */
    CHECK(read(report_fd, &c, 1) == 1 && c == 'q', "reading its socket works");
    CHECK(fcntl(report_fd, F_GETFL) >= 0, "fcntl(F_GETFL) works");
    CHECK(refused(fcntl(report_fd, F_SETOWN, other)), "fcntl(F_SETOWN) refused");
    int n = 0;
    CHECK(ioctl(report_fd, FIONREAD, &n) == 0, "ioctl(FIONREAD) works");
    struct winsize ws;
    CHECK(refused(ioctl(report_fd, TIOCGWINSZ, &ws)), "ioctl(TIOCGWINSZ) refused");
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit works");
    CHECK(refused(setrlimit(RLIMIT_NOFILE, &rl)), "setrlimit refused");
}

/* ---- OpenSSL, as the signer and the proxy use it ---- */

static bool sign_and_verify(EVP_PKEY *key)
{
    static const unsigned char msg[] = "a to-be-signed certificate";
    unsigned char sig[128];
    size_t siglen = sizeof(sig);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    bool good = md && EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, key) == 1 &&
                EVP_DigestSign(md, sig, &siglen, msg, sizeof(msg)) == 1;
    EVP_MD_CTX_free(md);
    md = EVP_MD_CTX_new();
    good = good && md && EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, key) == 1 &&
           EVP_DigestVerify(md, sig, siglen, msg, sizeof(msg)) == 1;
    EVP_MD_CTX_free(md);
    return good;
}

/* A self-signed certificate for name, valid for a day, signed with key. */
static X509 *self_signed(EVP_PKEY *key, const char *name)
{
    X509 *x = X509_new();
    X509_NAME *n = X509_NAME_new();
    bool good =
        x && n && X509_set_version(x, 2) && ASN1_INTEGER_set(X509_get_serialNumber(x), 1) &&
        X509_gmtime_adj(X509_getm_notBefore(x), -3600) &&
        X509_gmtime_adj(X509_getm_notAfter(x), 86400) &&
        X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)name, -1, -1, 0) &&
        X509_set_subject_name(x, n) && X509_set_issuer_name(x, n) && X509_set_pubkey(x, key) &&
        X509_sign(x, key, EVP_sha256()) > 0;
    X509_NAME_free(n);
    if (!good) {
        X509_free(x);
        return NULL;
    }
    return x;
}

static EVP_PKEY *check_signing(void)
{
    EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    CHECK(key != NULL, "OpenSSL: EC P-256 keygen works");
    CHECK(key && sign_and_verify(key), "OpenSSL: ECDSA sign and verify work");
    X509 *x = key ? self_signed(key, "confine.test") : NULL;
    CHECK(x != NULL, "OpenSSL: making and signing a certificate works");
    X509_free(x);
    return key;
}

/* ---- NET ---- */

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

static void check_libevent(void)
{
    struct event_base *base = event_base_new();
    CHECK(base != NULL, "libevent: event_base_new works");
    if (!base)
        return;
    CHECK(strcmp(event_base_get_method(base), "epoll") == 0, "libevent: the backend is epoll");
    bool fired = false;
    struct event *t = evtimer_new(base, on_timer, &fired);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 1000};
    CHECK(t && evtimer_add(t, &tv) == 0 && event_base_dispatch(base) >= 0 && fired,
          "libevent: a timer fires on the loop");
    if (t)
        event_free(t);
    event_base_free(base);
}

/* Some root certificate of the system's hash directory (its "<hash>.0" file), or NULL. */
static X509 *some_system_root(void)
{
    const char *dir = X509_get_default_cert_dir();
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    X509 *x = NULL;
    struct dirent *e;
    while (!x && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len != 10 || strcmp(e->d_name + 8, ".0") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "re");
        if (f) {
            x = PEM_read_X509(f, NULL, NULL, NULL);
            fclose(f);
        }
    }
    closedir(d);
    return x;
}

/* Verifies a system root with a store that has only the hash directory: the root is found by
 * OpenSSL's lazy lookup (stat and open of "<hash>.0" as it builds the chain). */
static void check_lazy_trust_store(void)
{
    X509 *root = some_system_root();
    CHECK(root != NULL, "OpenSSL: a root certificate read from %s", X509_get_default_cert_dir());
    if (!root)
        return;
    X509_STORE *store = X509_STORE_new();
    X509_LOOKUP *dir = store ? X509_STORE_add_lookup(store, X509_LOOKUP_hash_dir()) : NULL;
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    bool good = dir && ctx &&
                X509_LOOKUP_add_dir(dir, X509_get_default_cert_dir(), X509_FILETYPE_PEM) &&
                X509_STORE_CTX_init(ctx, store, root, NULL);
    if (good) {
        /* Whether the root is in date is beside the point. */
        X509_STORE_CTX_set_flags(ctx, X509_V_FLAG_NO_CHECK_TIME);
        good = X509_verify_cert(ctx) == 1;
    }
    CHECK(good, "OpenSSL: the root verifies against the hash directory, looked up lazily");
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    X509_free(root);
}

/* Drives both ends of a TLS handshake over a socketpair, one step each in turn. */
static bool handshake(SSL *cl, SSL *sv)
{
    bool cl_done = false, sv_done = false;
    for (int i = 0; i < 100 && !(cl_done && sv_done); i++) {
        SSL *s = i % 2 ? sv : cl;
        bool *done = i % 2 ? &sv_done : &cl_done;
        if (*done)
            continue;
        int r = SSL_do_handshake(s);
        if (r == 1)
            *done = true;
        else if (SSL_get_error(s, r) != SSL_ERROR_WANT_READ &&
                 SSL_get_error(s, r) != SSL_ERROR_WANT_WRITE)
            return false;
    }
    return cl_done && sv_done;
}

/* A TLS 1.3 handshake between two SSLs of this process: the client with the default verify
 * paths (the system's CA file, read now) and the server's self-signed certificate trusted. */
static void check_tls(EVP_PKEY *key)
{
    X509 *cert = key ? self_signed(key, "confine.test") : NULL;
    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method());
    int sv[2] = {-1, -1};
    SSL *cl = NULL, *srv = NULL;
    bool good = cert && cctx && sctx && SSL_CTX_set_default_verify_paths(cctx) == 1 &&
                X509_STORE_add_cert(SSL_CTX_get_cert_store(cctx), cert) == 1 &&
                SSL_CTX_use_certificate(sctx, cert) == 1 &&
                SSL_CTX_use_PrivateKey(sctx, key) == 1 &&
                socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0;
    CHECK(good, "OpenSSL: contexts with the default verify paths, socketpair(AF_UNIX)");
    if (good) {
        SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, NULL);
        cl = SSL_new(cctx);
        srv = SSL_new(sctx);
        good = cl && srv && SSL_set_fd(cl, sv[0]) == 1 && SSL_set_fd(srv, sv[1]) == 1 &&
               SSL_set_tlsext_host_name(cl, "confine.test") == 1 &&
               SSL_set1_host(cl, "confine.test") == 1;
        SSL_set_connect_state(cl);
        SSL_set_accept_state(srv);
        CHECK(good && handshake(cl, srv) && SSL_get_verify_result(cl) == X509_V_OK,
              "OpenSSL: a verified TLS handshake completes");
    }
    SSL_free(cl);
    SSL_free(srv);
    SSL_CTX_free(cctx);
    SSL_CTX_free(sctx);
    X509_free(cert);
    for (int i = 0; i < 2; i++)
        if (sv[i] >= 0)
            close(sv[i]);
}

static void check_net(uint16_t port)
{
    CHECK(refused(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, 0)), "socket(AF_NETLINK) refused");
    CHECK(refused(socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, 0)), "socket(AF_PACKET) refused");
    CHECK(refused(socketpair(AF_INET, SOCK_STREAM, 0, (int[2]){0})), "socketpair(AF_INET) refused");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0, "socket(AF_INET, SOCK_STREAM) works");
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0,
          "connect to the parent's loopback listener works");
    CHECK(fd >= 0 && write(fd, "x", 1) == 1, "writing a byte to it works");
    if (fd >= 0)
        close(fd);
    int fd6 = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(fd6 >= 0, "socket(AF_INET6, SOCK_DGRAM) works");
    if (fd6 >= 0)
        close(fd6);

    check_libevent();
    EVP_PKEY *key = check_signing();
    check_lazy_trust_store();
    check_tls(key);
    EVP_PKEY_free(key);
}

/* ---- SIGNER ---- */

static void check_signer(void)
{
    CHECK(refused(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)), "socket(AF_INET) refused");
    CHECK(refused(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)), "socket(AF_UNIX) refused");
    CHECK(refused(epoll_create1(EPOLL_CLOEXEC)), "epoll_create1 refused");
    EVP_PKEY_free(check_signing());
}

/* ---- the parent's side ---- */

/* Confines the calling child to profile p, reporting a failed step. */
static bool confine(enum confine_profile p, struct confine_ids *ids)
{
    struct wr_err err = {0};
    bool good = confine_lookup_user(NULL, ids, &err) == 0 && confine_drop(ids, &err) == 0 &&
                confine_seccomp(p, &err) == 0;
    report(good, err.code, "confined (%s)", good ? "lookup, drop, seccomp" : err.msg);
    return good;
}

/* Reads the child's findings until it closes its end, then reaps it. */
static void collect(const char *profile, int fd, pid_t pid)
{
    struct finding f;
    ssize_t n;
    while ((n = read(fd, &f, sizeof(f))) == (ssize_t)sizeof(f)) {
        f.what[sizeof(f.what) - 1] = 0;
        ok(f.ok, "%s: %s", profile, f.what);
        if (!f.ok)
            printf("#   errno %d (%s)\n", f.err, strerror(f.err));
    }
    ok(n == 0, "%s: the child's report ends cleanly", profile);
    int status = 0;
    ok(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "%s: the child exits 0 (status %#x)", profile, status);
}

/* A process of nobody's that is not confined: the target of the signals that must fail. It
 * exits when the write end of hold (held by the parent) closes. */
static pid_t start_other(const struct confine_ids *ids, int hold[2])
{
    if (pipe2(hold, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(hold[1]);
        if (setgroups(0, NULL) < 0 || setresgid(ids->gid, ids->gid, ids->gid) < 0 ||
            setresuid(ids->uid, ids->uid, ids->uid) < 0)
            _exit(1);
        char c;
        (void)!read(hold[0], &c, 1);
        _exit(0);
    }
    close(hold[0]);
    return pid;
}

static char tmpfile_path[64];

static void run_profile(enum confine_profile p, const char *name, const struct confine_ids *ids)
{
    int hold[2];
    pid_t other = start_other(ids, hold);
    ok(other > 0, "%s: a second nobody process started", name);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    ok(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(lfd, 4) == 0 &&
           getsockname(lfd, (struct sockaddr *)&a, &alen) == 0,
       "%s: a loopback listener", name);

    int sp[2];
    ok(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0 && write(sp[0], "q", 1) == 1,
       "%s: the report socket", name);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sp[0]);
        close(lfd);
        report_fd = sp[1];
        struct confine_ids got;
        if (confine(p, &got)) {
            check_confined(&got, other, tmpfile_path);
            if (p == CONFINE_NET)
                check_net(ntohs(a.sin_port));
            else
                check_signer();
        }
        _exit(0);
    }
    close(sp[1]);
    ok(pid > 0, "%s: child started", name);
    if (pid > 0)
        collect(name, sp[0], pid);
    close(sp[0]);

    struct stat st;
    ok(stat(tmpfile_path, &st) < 0 && errno == ENOENT, "%s: the refused open created nothing",
       name);
    unlink(tmpfile_path);

    if (p == CONFINE_NET) {
        /* The child has exited: had it connected, the connection waits in the queue. */
        int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        char b = 0;
        ok(c >= 0 && read(c, &b, 1) == 1 && b == 'x', "%s: the parent read the child's byte", name);
        if (c >= 0)
            close(c);
    }
    close(lfd);

    close(hold[1]);
    int status = 0;
    ok(other > 0 && waitpid(other, &status, 0) == other && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "%s: the second nobody process was alive throughout", name);
}

/* ---- a foreign ABI kills ---- */

#ifdef __x86_64__
/* getpid through the i386 entry; only on a kernel that has that ABI. */
static long i386_getpid(void)
{
    long r = 20; /* __NR_getpid on i386 */
    __asm__ volatile("int $0x80" : "+a"(r) : : "r8", "r9", "r10", "r11", "memory");
    return r;
}

/* Runs fn in a child (confined first if confined) and returns its wait status. */
static int in_child(bool confined, void (*fn)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        struct wr_err err = {0};
        struct confine_ids ids;
        if (confined && (confine_lookup_user(NULL, &ids, &err) < 0 ||
                         confine_drop(&ids, &err) < 0 || confine_seccomp(CONFINE_NET, &err) < 0))
            _exit(2);
        fn();
        _exit(0);
    }
    int status = -1;
    if (pid > 0)
        waitpid(pid, &status, 0);
    return status;
}

static void call_i386(void)
{
    if (i386_getpid() != getpid())
        _exit(1);
}

static void call_x32(void)
{
    syscall(__X32_SYSCALL_BIT | __NR_getpid);
}

static void test_foreign_abi(void)
{
    int st = in_child(true, call_x32);
    ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS, "an x32 call kills with SIGSYS (status %#x)", st);
    st = in_child(false, call_i386);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        ok(1, "an i386 call kills # skip: this kernel has no i386 ABI (status %#x)", st);
        return;
    }
    st = in_child(true, call_i386);
    ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS, "an i386 call kills with SIGSYS (status %#x)",
       st);
}
#endif

static void test_lookup(struct confine_ids *nobody)
{
    struct passwd *pw = getpwnam("nobody");
    ok(pw != NULL, "the system has a nobody user");
    struct wr_err err = {0};
    ok(confine_lookup_user(NULL, nobody, &err) == 0 && pw && nobody->uid == pw->pw_uid &&
           nobody->gid == pw->pw_gid,
       "lookup(NULL) is nobody's uid and gid");
    struct confine_ids ids = {0};
    ok(confine_lookup_user("", &ids, &err) == 0 && ids.uid == nobody->uid, "lookup(\"\") too");
    ok(confine_lookup_user("root", &ids, &err) < 0 && err.code == EPERM, "lookup(root) refused: %s",
       err.msg);
    ok(confine_lookup_user("wr-no-such-user", &ids, &err) < 0 && err.code == ENOENT,
       "lookup of an unknown user refused: %s", err.msg);
    struct confine_ids root = {0, 0};
    ok(confine_drop(&root, &err) < 0 && err.code == EINVAL && getuid() == 0,
       "drop to uid 0 refused, nothing changed: %s", err.msg);
}

int main(void)
{
    if (getuid() != 0) {
        printf("1..0 # skip: needs root\n");
        return 0;
    }
    snprintf(tmpfile_path, sizeof(tmpfile_path), "/tmp/wr-test-confine-%d", (int)getpid());
    struct confine_ids nobody = {0};
    test_lookup(&nobody);
    run_profile(CONFINE_NET, "net", &nobody);
    run_profile(CONFINE_SIGNER, "signer", &nobody);
#ifdef __x86_64__
    test_foreign_abi();
#endif
    return tap_done();
}
