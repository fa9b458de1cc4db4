/*
 * Drives the real withruntime-agent binary on the host over a socketpair, the
 * way the daemon does inside a sandbox: commands, stdin, signals to whole
 * process trees, file operations, bad input and teardown. The agent is found
 * at argv[1], $WITHRUNTIME_AGENT, or next to this test's build directory
 * (<dir of argv[0]>/../withruntime-agent, so build/ and build-san/ both work).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/proto.h"
#include "tap.h"

#define TIMEOUT_MS 10000

static char agent_path[PATH_MAX];
static char tmpdir[PATH_MAX];
static char logpath[PATH_MAX + 32];
static uint32_t next_id = 100;

/* ---- one agent and its channel ---- */

struct frame {
    struct proto_header h;
    uint8_t *payload;
    struct frame *next;
};

struct agent {
    pid_t pid;
    int fd;
    struct proto_reader rd;
    uint8_t buf[65536];
    size_t off, len;
    struct frame *queue; /* frames read while waiting for another id */
};

static int agent_start(struct agent *a)
{
    int sv[2];
    memset(a, 0, sizeof(*a));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -1;
    int logfd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(sv[1], 0);
        dup2(sv[1], 1);
        if (logfd >= 0)
            dup2(logfd, 2);
        execl(agent_path, agent_path, (char *)NULL);
        _exit(127);
    }
    if (logfd >= 0)
        close(logfd);
    close(sv[1]);
    a->pid = pid;
    a->fd = sv[0];
    proto_reader_init(&a->rd);
    return 0;
}

static void agent_close(struct agent *a)
{
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
    proto_reader_free(&a->rd);
    while (a->queue) {
        struct frame *f = a->queue;
        a->queue = f->next;
        free(f->payload);
        free(f);
    }
}

/* Waits for the agent to exit; returns its wait status, or -1 on timeout (then kills it). */
static int agent_wait(struct agent *a, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 5) {
        int st;
        pid_t r = waitpid(a->pid, &st, WNOHANG);
        if (r == a->pid)
            return st;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    kill(a->pid, SIGKILL);
    waitpid(a->pid, NULL, 0);
    return -1;
}

static void send_frame(struct agent *a, uint32_t id, uint16_t type, uint16_t flags,
                       const void *payload, size_t len)
{
    struct proto_buf fr = {0};
    if (proto_frame_build(&fr, id, type, flags, payload, len) == 0)
        write_all(a->fd, fr.data, fr.len);
    proto_buf_free(&fr);
}

static void send_fields(struct agent *a, uint32_t id, uint16_t type, const struct proto_buf *b)
{
    send_frame(a, id, type, 0, b->data, b->len);
}

/* Reads the next frame from the channel. Returns NULL on timeout, EOF or a bad frame. */
static struct frame *read_frame(struct agent *a, int timeout_ms)
{
    for (;;) {
        while (a->off < a->len) {
            int done;
            size_t used = proto_reader_feed(&a->rd, a->buf + a->off, a->len - a->off, &done);
            if (used == (size_t)-1)
                return NULL;
            a->off += used;
            if (done) {
                struct frame *f = calloc(1, sizeof(*f));
                f->h = a->rd.h;
                f->payload = malloc(f->h.len + 1);
                memcpy(f->payload, a->rd.payload, f->h.len);
                return f;
            }
        }
        struct pollfd p = {.fd = a->fd, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) <= 0)
            return NULL;
        ssize_t n = read(a->fd, a->buf, sizeof(a->buf));
        if (n <= 0)
            return NULL;
        a->off = 0;
        a->len = (size_t)n;
    }
}

/* ---- collecting the answer to one request ---- */

struct entry {
    char name[256];
    uint32_t type, mode;
    uint64_t size;
    char target[256];
};

struct result {
    struct proto_buf out, err, data;
    int exited;
    int32_t exit_code;
    uint32_t term_signal;
    int error;
    uint32_t err_no;
    char msg[1024];
    int ok, pong;
    int nstat;
    struct entry stat;
    int nentries, entry_frames;
    struct entry entries[64];
    int other; /* frames of unexpected types */
};

static void result_free(struct result *r)
{
    proto_buf_free(&r->out);
    proto_buf_free(&r->err);
    proto_buf_free(&r->data);
    memset(r, 0, sizeof(*r));
}

static void append(struct proto_buf *b, const uint8_t *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = realloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

/* Reads a field group (TYPE, SIZE, MODE, MTIME, TARGET, NAME) into e. */
static void parse_entry_field(const struct proto_field *f, struct entry *e)
{
    switch (f->tag) {
    case PT_NAME: proto_field_str(f, e->name, sizeof(e->name)); break;
    case PT_TYPE: proto_field_u32(f, &e->type); break;
    case PT_SIZE: proto_field_u64(f, &e->size); break;
    case PT_MODE: proto_field_u32(f, &e->mode); break;
    case PT_TARGET: proto_field_str(f, e->target, sizeof(e->target)); break;
    }
}

static void absorb(struct result *r, const struct frame *f)
{
    struct proto_iter it;
    struct proto_field fl;
    switch (f->h.type) {
    case PROTO_STDOUT: append(&r->out, f->payload, f->h.len); break;
    case PROTO_STDERR: append(&r->err, f->payload, f->h.len); break;
    case PROTO_DATA: append(&r->data, f->payload, f->h.len); break;
    case PROTO_EXIT: {
        r->exited = 1;
        uint32_t code = 0;
        if (proto_find(f->payload, f->h.len, PT_EXIT_CODE, &fl) == 1)
            proto_field_u32(&fl, &code);
        r->exit_code = (int32_t)code;
        if (proto_find(f->payload, f->h.len, PT_TERM_SIGNAL, &fl) == 1)
            proto_field_u32(&fl, &r->term_signal);
        break;
    }
    case PROTO_ERROR:
        r->error = 1;
        if (proto_find(f->payload, f->h.len, PT_ERRNO, &fl) == 1)
            proto_field_u32(&fl, &r->err_no);
        if (proto_find(f->payload, f->h.len, PT_MESSAGE, &fl) == 1)
            proto_field_str(&fl, r->msg, sizeof(r->msg));
        break;
    case PROTO_OK: r->ok = 1; break;
    case PROTO_PONG: r->pong = 1; break;
    case PROTO_STAT_RESULT:
        r->nstat++;
        memset(&r->stat, 0, sizeof(r->stat));
        proto_iter_init(&it, f->payload, f->h.len);
        while (proto_iter_next(&it, &fl) > 0)
            parse_entry_field(&fl, &r->stat);
        break;
    case PROTO_DIR_ENTRIES:
        r->entry_frames++;
        proto_iter_init(&it, f->payload, f->h.len);
        while (proto_iter_next(&it, &fl) > 0) {
            if (fl.tag == PT_NAME)
                r->nentries++;
            if (r->nentries >= 1 && r->nentries <= (int)WR_ARRAY_LEN(r->entries)) {
                struct entry *e = &r->entries[r->nentries - 1];
                if (fl.tag == PT_NAME)
                    memset(e, 0, sizeof(*e));
                parse_entry_field(&fl, e);
            }
        }
        break;
    default: r->other++;
    }
}

static int terminal(uint16_t type)
{
    return type == PROTO_EXIT || type == PROTO_ERROR || type == PROTO_OK || type == PROTO_PONG;
}

/*
 * Gathers frames for id until its terminal frame (returns 0), or until stdout holds `lines`
 * newlines when lines > 0 (returns 1). Frames for other ids are queued for later. -1 on
 * timeout or a dead channel.
 */
static int collect_until(struct agent *a, uint32_t id, struct result *r, int lines)
{
    for (;;) {
        if (lines > 0) {
            int nl = 0;
            for (size_t i = 0; i < r->out.len; i++)
                nl += r->out.data[i] == '\n';
            if (nl >= lines)
                return 1;
        }
        struct frame *f = NULL;
        for (struct frame **p = &a->queue; *p; p = &(*p)->next) {
            if ((*p)->h.id == id) {
                f = *p;
                *p = f->next;
                break;
            }
        }
        if (!f) {
            f = read_frame(a, TIMEOUT_MS);
            if (!f)
                return -1;
            if (f->h.id != id) {
                struct frame **p = &a->queue;
                while (*p)
                    p = &(*p)->next;
                f->next = NULL;
                *p = f;
                continue;
            }
        }
        absorb(r, f);
        int end = terminal(f->h.type);
        free(f->payload);
        free(f);
        if (end)
            return 0;
    }
}

static int collect(struct agent *a, uint32_t id, struct result *r)
{
    return collect_until(a, id, r, 0);
}

/* ---- building requests ---- */

/* argv and env are NULL-terminated (env may be NULL: empty environment). */
static uint32_t exec_req(struct agent *a, const char *const *argv, const char *const *env,
                         const char *cwd, int stdin_pipe)
{
    struct proto_buf b = {0};
    uint32_t id = next_id++;
    for (; *argv; argv++)
        proto_put_str(&b, PT_ARG, *argv);
    for (; env && *env; env++)
        proto_put_str(&b, PT_ENV, *env);
    proto_put_str(&b, PT_CWD, cwd ? cwd : tmpdir);
    if (stdin_pipe)
        proto_put_u32(&b, PT_STDIN_PIPE, 1);
    send_fields(a, id, PROTO_EXEC, &b);
    proto_buf_free(&b);
    return id;
}

static const char *const base_env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", NULL};

static uint32_t sh_req(struct agent *a, const char *script)
{
    const char *argv[] = {"sh", "-c", script, NULL};
    return exec_req(a, argv, base_env, NULL, 0);
}

static uint32_t path_req(struct agent *a, uint16_t type, const char *path, uint32_t wflags,
                         int mode)
{
    struct proto_buf b = {0};
    uint32_t id = next_id++;
    proto_put_str(&b, PT_PATH, path);
    if (wflags)
        proto_put_u32(&b, PT_WFLAGS, wflags);
    if (mode >= 0)
        proto_put_u32(&b, PT_MODE, (uint32_t)mode);
    send_fields(a, id, type, &b);
    proto_buf_free(&b);
    return id;
}

static void tpath(char *out, size_t n, const char *rel)
{
    snprintf(out, n, "%s/%s", tmpdir, rel);
}

/* Waits until pid no longer exists: not even a zombie, so someone reaped it. */
static int pid_gone(pid_t pid, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        if (kill(pid, 0) < 0 && errno == ESRCH)
            return 1;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* ---- tests ---- */

static void test_hello(struct agent *a)
{
    struct frame *f = read_frame(a, TIMEOUT_MS);
    struct proto_field fl;
    uint32_t version = 0, pid = 0;
    ok(f && f->h.type == PROTO_HELLO && f->h.id == 0, "first frame is HELLO with id 0");
    if (f) {
        if (proto_find(f->payload, f->h.len, PT_VERSION, &fl) == 1)
            proto_field_u32(&fl, &version);
        if (proto_find(f->payload, f->h.len, PT_PID, &fl) == 1)
            proto_field_u32(&fl, &pid);
        free(f->payload);
        free(f);
    }
    ok(version == PROTO_VERSION && pid == (uint32_t)a->pid, "HELLO carries VERSION and PID");

    struct result r = {0};
    uint32_t id = next_id++;
    send_frame(a, id, PROTO_PING, 0, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.pong, "PING is answered by PONG with the same id");
    result_free(&r);
}

static void test_exec_basic(struct agent *a)
{
    struct result r = {0};
    const char *echo[] = {"echo", "hi", NULL};
    uint32_t id = exec_req(a, echo, base_env, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0 && r.term_signal == 0 &&
           r.out.len == 3 && !memcmp(r.out.data, "hi\n", 3) && r.err.len == 0,
       "echo hi: STDOUT \"hi\\n\" then EXIT 0");
    result_free(&r);

    id = sh_req(a, "exit 3");
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 3 && r.term_signal == 0,
       "exit code 3 is reported");
    result_free(&r);

    id = sh_req(a, "echo out; echo err >&2; echo out2");
    ok(collect(a, id, &r) == 0 && r.exited && r.out.len &&
           !strcmp((char *)r.out.data, "out\nout2\n") && r.err.len &&
           !strcmp((char *)r.err.data, "err\n"),
       "stdout and stderr arrive apart");
    result_free(&r);

    id = sh_req(a, "kill -TERM $$");
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == -1 && r.term_signal == SIGTERM,
       "death by signal: EXIT_CODE -1, TERM_SIGNAL 15");
    result_free(&r);

    const char *pwd[] = {"pwd", NULL};
    char real[PATH_MAX], want[PATH_MAX + 2];
    realpath(tmpdir, real);
    snprintf(want, sizeof(want), "%s\n", real);
    id = exec_req(a, pwd, base_env, real, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, want),
       "CWD is the command's working directory");
    result_free(&r);

    /* env is replaced exactly: not even PATH is added (env itself is found on the default PATH) */
    const char *env_argv[] = {"env", NULL};
    const char *env[] = {"A=1", "B=two words", NULL};
    id = exec_req(a, env_argv, env, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, "A=1\nB=two words\n"),
       "ENV replaces the environment exactly; default PATH used for the lookup");
    result_free(&r);

    /* the command's own PATH is searched; a script without #! runs under /bin/sh */
    char bin[PATH_MAX], script[PATH_MAX + 16], penv[PATH_MAX + 8];
    tpath(bin, sizeof(bin), "bin");
    mkdir(bin, 0755);
    snprintf(script, sizeof(script), "%s/hello-wr", bin);
    FILE *fp = fopen(script, "w");
    fputs("echo from script \"$1\"\n", fp);
    fclose(fp);
    chmod(script, 0755);
    snprintf(penv, sizeof(penv), "PATH=/nonexistent:%s", bin);
    const char *sargv[] = {"hello-wr", "arg1", NULL};
    const char *senv[] = {penv, NULL};
    id = exec_req(a, sargv, senv, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, "from script arg1\n"),
       "PATH from ENV is searched; a #!-less script runs under sh");
    result_free(&r);

    const char *nf[] = {"no-such-command-xyz", NULL};
    id = exec_req(a, nf, base_env, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT &&
           !strcmp(r.msg, "command not found: no-such-command-xyz") && !r.exited,
       "command not found: one ERROR ENOENT (\"%s\")", r.msg);
    result_free(&r);

    chmod(script, 0644);
    const char *nx[] = {script, NULL};
    id = exec_req(a, nx, base_env, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EACCES && strstr(r.msg, "exec "),
       "not executable: ERROR EACCES (\"%s\")", r.msg);
    result_free(&r);

    id = exec_req(a, echo, base_env, "/nonexistent-dir-xyz", 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT &&
           !strcmp(r.msg, "cwd /nonexistent-dir-xyz: No such file or directory"),
       "bad cwd: ERROR ENOENT (\"%s\")", r.msg);
    result_free(&r);
}

static void test_stdin(struct agent *a)
{
    struct result r = {0};
    const char *cat[] = {"cat", NULL};
    uint32_t id = exec_req(a, cat, base_env, NULL, 1);
    send_frame(a, id, PROTO_STDIN, 0, "hello ", 6);
    send_frame(a, id, PROTO_STDIN, PROTO_F_FIN, "world", 5);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len == 11 &&
           !memcmp(r.out.data, "hello world", 11),
       "STDIN frames feed the command; FIN closes its stdin");
    result_free(&r);

    /* More than a pipe holds, through cat and back: stdin must be buffered, not blocking. */
    size_t big = 3u << 20;
    uint8_t *data = malloc(big);
    for (size_t i = 0; i < big; i++)
        data[i] = (uint8_t)(i * 7 + (i >> 12));
    id = exec_req(a, cat, base_env, NULL, 1);
    for (size_t off = 0; off < big; off += PROTO_CHUNK)
        send_frame(a, id, PROTO_STDIN, 0, data + off,
                   big - off < PROTO_CHUNK ? big - off : PROTO_CHUNK);
    send_frame(a, id, PROTO_STDIN, PROTO_F_FIN, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len == big &&
           !memcmp(r.out.data, data, big),
       "3 MiB through cat's stdin and stdout arrive intact");
    result_free(&r);
    free(data);

    /* without STDIN_PIPE stdin is /dev/null */
    id = sh_req(a, "cat; echo done");
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, "done\n"),
       "stdin is /dev/null by default");
    result_free(&r);
}

static void test_many(struct agent *a)
{
    enum { N = 24 };
    uint32_t ids[N];
    char envs[N][32];
    for (int i = 0; i < N; i++) {
        snprintf(envs[i], sizeof(envs[i]), "N=%d", i);
        const char *argv[] = {"sh", "-c", "sleep 0.2; echo $N", NULL};
        const char *env[] = {base_env[0], envs[i], NULL};
        ids[i] = exec_req(a, argv, env, NULL, 0);
    }
    int good = 0;
    for (int i = N - 1; i >= 0; i--) {
        struct result r = {0};
        char want[16];
        snprintf(want, sizeof(want), "%d\n", i);
        if (collect(a, ids[i], &r) == 0 && r.exited && r.exit_code == 0 && r.out.len &&
            !strcmp((char *)r.out.data, want))
            good++;
        result_free(&r);
    }
    ok(good == N, "%d commands at once, each with its own output (%d right)", N, good);

    /* lots of output, read late: the agent holds back instead of dropping or blocking */
    struct result r = {0};
    uint32_t id = sh_req(a, "head -c 12000000 /dev/zero; echo tail >&2");
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
    int zeros = 1;
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len == 12000000 && r.err.len == 5,
       "12 MB of output arrives whole (%zu bytes)", r.out.len);
    for (size_t i = 0; i < r.out.len && zeros; i++)
        zeros = r.out.data[i] == 0;
    ok(zeros, "and unaltered");
    result_free(&r);
}

static void test_signal(struct agent *a)
{
    struct result r = {0};
    /* a background child, one that setsid'd away, one orphaned into our process group */
    uint32_t id = sh_req(a, "sleep 1000 & echo $!; setsid sleep 1000 & echo $!; "
                            "(sleep 1000 & echo $!); echo $$; wait");
    int got = collect_until(a, id, &r, 4);
    pid_t pids[4] = {0};
    if (got == 1)
        sscanf((char *)r.out.data, "%d %d %d %d", &pids[0], &pids[1], &pids[2], &pids[3]);
    ok(got == 1 && pids[0] > 0 && pids[1] > 0 && pids[2] > 0 && pids[3] > 0,
       "process tree started (%d %d %d %d)", pids[0], pids[1], pids[2], pids[3]);

    struct proto_buf b = {0};
    proto_put_u32(&b, PT_SIGNUM, SIGKILL);
    send_fields(a, id, PROTO_SIGNAL, &b);
    proto_buf_free(&b);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == -1 && r.term_signal == SIGKILL,
       "SIGNAL SIGKILL ends the command: EXIT with TERM_SIGNAL 9");
    int gone = 0;
    for (int i = 0; i < 4; i++)
        gone += pids[i] > 0 && pid_gone(pids[i], 5000);
    ok(gone == 4, "every process of the tree is gone and reaped (%d of 4)", gone);
    result_free(&r);

    /* SIGTERM reaches a setsid'd descendant too */
    /* The outer shell traps TERM so it waits for the inner one instead of dying first. */
    id = sh_req(a, "trap 'echo outer-term' TERM; "
                   "setsid sh -c 'trap \"echo got-term; exit 0\" TERM; echo ready; "
                   "while :; do sleep 0.05; done'; echo parent-done");
    got = collect_until(a, id, &r, 1);
    b = (struct proto_buf){0};
    proto_put_u32(&b, PT_SIGNUM, SIGTERM);
    send_fields(a, id, PROTO_SIGNAL, &b);
    proto_buf_free(&b);
    ok(got == 1 && collect(a, id, &r) == 0 && r.exited && strstr((char *)r.out.data, "got-term"),
       "SIGNAL SIGTERM reaches a descendant in another session");
    result_free(&r);

    /* A background child holding the pipes does not hold EXIT back (it would wait forever);
     * once it dies, the agent reaps it as an orphan. */
    id = sh_req(a, "sleep 1000 & echo $!");
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0 && r.out.len,
       "EXIT arrives while a background child still holds stdout");
    pid_t bg = r.out.len ? atoi((char *)r.out.data) : 0;
    if (bg > 0)
        kill(bg, SIGKILL);
    ok(bg > 0 && pid_gone(bg, 5000), "the orphan is reaped when it dies (pid %d)", bg);
    result_free(&r);

    /* frames for unknown ids are ignored silently */
    send_frame(a, 999999, PROTO_STDIN, 0, "x", 1);
    send_frame(a, 999998, PROTO_DATA, PROTO_F_FIN, "x", 1);
    b = (struct proto_buf){0};
    proto_put_u32(&b, PT_SIGNUM, SIGKILL);
    send_fields(a, 999997, PROTO_SIGNAL, &b);
    proto_buf_free(&b);
    uint32_t pid = next_id++;
    send_frame(a, pid, PROTO_PING, 0, NULL, 0);
    ok(collect(a, pid, &r) == 0 && r.pong && a->queue == NULL,
       "STDIN/DATA/SIGNAL for unknown ids get no answer");
    result_free(&r);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint8_t rng_byte(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint8_t)rng_state;
}

static uint32_t read_req(struct agent *a, const char *path, int64_t off, int64_t len)
{
    struct proto_buf b = {0};
    uint32_t id = next_id++;
    proto_put_str(&b, PT_PATH, path);
    if (off >= 0)
        proto_put_u64(&b, PT_OFFSET, (uint64_t)off);
    if (len >= 0)
        proto_put_u64(&b, PT_LENGTH, (uint64_t)len);
    send_fields(a, id, PROTO_FILE_READ, &b);
    proto_buf_free(&b);
    return id;
}

static void test_files_rw(struct agent *a)
{
    struct result r = {0};
    size_t size = 3000000 + 17;
    uint8_t *data = malloc(size);
    for (size_t i = 0; i < size; i++)
        data[i] = rng_byte();
    char path[PATH_MAX];
    tpath(path, sizeof(path), "a/b/c/big.bin");

    uint32_t id = path_req(a, PROTO_FILE_WRITE, path, PROTO_W_PARENTS, 0600);
    for (size_t off = 0; off < size; off += PROTO_CHUNK) {
        size_t n = size - off < PROTO_CHUNK ? size - off : PROTO_CHUNK;
        send_frame(a, id, PROTO_DATA, off + n == size ? PROTO_F_FIN : 0, data + off, n);
    }
    ok(collect(a, id, &r) == 0 && r.ok && r.nstat == 1 && r.stat.size == size &&
           r.stat.type == PROTO_FT_FILE && r.stat.mode == 0600,
       "FILE_WRITE with PARENTS and MODE: STAT_RESULT then OK");
    result_free(&r);

    struct stat st;
    uint8_t *disk = malloc(size + 1);
    FILE *fp = fopen(path, "rb");
    size_t got = fp ? fread(disk, 1, size + 1, fp) : 0;
    if (fp)
        fclose(fp);
    ok(got == size && !memcmp(disk, data, size) && stat(path, &st) == 0 &&
           (st.st_mode & 07777) == 0600,
       "file on disk is byte-exact with mode 0600");
    free(disk);

    id = read_req(a, path, -1, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nstat == 1 && r.stat.size == size &&
           r.data.len == size && !memcmp(r.data.data, data, size),
       "FILE_READ of the whole file is byte-exact");
    result_free(&r);

    id = read_req(a, path, 1234567, 1000001);
    ok(collect(a, id, &r) == 0 && r.ok && r.data.len == 1000001 &&
           !memcmp(r.data.data, data + 1234567, 1000001),
       "FILE_READ with OFFSET and LENGTH returns that slice");
    result_free(&r);

    id = read_req(a, path, (int64_t)size - 10, 1000);
    ok(collect(a, id, &r) == 0 && r.ok && r.data.len == 10 &&
           !memcmp(r.data.data, data + size - 10, 10),
       "LENGTH past the end stops at EOF");
    result_free(&r);

    id = read_req(a, path, (int64_t)size + 10, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nstat == 1 && r.data.len == 0,
       "OFFSET past the end: STAT_RESULT, no DATA, OK");
    result_free(&r);

    id = read_req(a, path, 0, 0);
    ok(collect(a, id, &r) == 0 && r.ok && r.data.len == 0, "LENGTH 0 reads nothing");
    result_free(&r);

    id = path_req(a, PROTO_FILE_WRITE, path, PROTO_W_EXCL, -1);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, "x", 1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EEXIST,
       "EXCL on an existing file: ERROR EEXIST");
    result_free(&r);

    id = path_req(a, PROTO_FILE_WRITE, path, PROTO_W_APPEND, -1);
    send_frame(a, id, PROTO_DATA, 0, "ab", 2);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, "c", 1);
    ok(collect(a, id, &r) == 0 && r.ok && r.stat.size == size + 3 && r.stat.mode == 0600,
       "APPEND appends and keeps the mode when MODE is absent");
    result_free(&r);

    id = path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.ok && r.stat.size == 0, "plain write truncates; empty FIN");
    result_free(&r);

    tpath(path, sizeof(path), "a");
    id = read_req(a, path, -1, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EISDIR && r.nstat == 0,
       "FILE_READ of a directory: ERROR EISDIR");
    result_free(&r);

    tpath(path, sizeof(path), "nope/x");
    id = read_req(a, path, -1, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT, "FILE_READ of nothing: ENOENT");
    result_free(&r);
    id = path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT,
       "FILE_WRITE without PARENTS into a missing directory: ENOENT");
    result_free(&r);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, "late", 4); /* ignored */

    /* a duplicate id is refused without disturbing the live request */
    tpath(path, sizeof(path), "dup.txt");
    id = path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, path);
    send_fields(a, id, PROTO_FILE_WRITE, &b);
    proto_buf_free(&b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EEXIST, "duplicate live id: EEXIST");
    result_free(&r);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, "one", 3);
    ok(collect(a, id, &r) == 0 && r.ok && r.stat.size == 3, "the first request still completes");
    result_free(&r);
    free(data);
}

static void test_files_meta(struct agent *a)
{
    struct result r = {0};
    char path[PATH_MAX], p2[PATH_MAX];

    /* list */
    tpath(path, sizeof(path), "list");
    mkdir(path, 0755);
    tpath(p2, sizeof(p2), "list/f1");
    FILE *fp = fopen(p2, "w");
    fputs("12345", fp);
    fclose(fp);
    tpath(p2, sizeof(p2), "list/d1");
    mkdir(p2, 0700);
    tpath(p2, sizeof(p2), "list/l1");
    symlink("f1", p2);
    uint32_t id = path_req(a, PROTO_FILE_LIST, path, 0, -1);
    int seen = 0;
    if (collect(a, id, &r) == 0 && r.ok && r.nentries == 3) {
        for (int i = 0; i < 3; i++) {
            struct entry *e = &r.entries[i];
            if (!strcmp(e->name, "f1") && e->type == PROTO_FT_FILE && e->size == 5)
                seen |= 1;
            if (!strcmp(e->name, "d1") && e->type == PROTO_FT_DIR && e->mode == 0700)
                seen |= 2;
            if (!strcmp(e->name, "l1") && e->type == PROTO_FT_SYMLINK && !strcmp(e->target, "f1"))
                seen |= 4;
        }
    }
    ok(seen == 7, "FILE_LIST: file, directory and symlink (with TARGET), no . or ..");
    result_free(&r);

    tpath(path, sizeof(path), "many");
    mkdir(path, 0755);
    for (int i = 0; i < 3000; i++) {
        snprintf(p2, sizeof(p2), "%s/many/file-with-a-longish-name-%04d", tmpdir, i);
        close(open(p2, O_WRONLY | O_CREAT, 0644));
    }
    id = path_req(a, PROTO_FILE_LIST, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nentries == 3000 && r.entry_frames > 1,
       "FILE_LIST of 3000 entries spans several frames (%d entries, %d frames)", r.nentries,
       r.entry_frames);
    result_free(&r);

    tpath(path, sizeof(path), "list/f1");
    id = path_req(a, PROTO_FILE_LIST, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOTDIR, "FILE_LIST of a file: ENOTDIR");
    result_free(&r);

    /* stat */
    id = path_req(a, PROTO_FILE_STAT, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nstat == 1 && r.stat.type == PROTO_FT_FILE &&
           r.stat.size == 5,
       "FILE_STAT of a file");
    result_free(&r);
    tpath(path, sizeof(path), "list/l1");
    id = path_req(a, PROTO_FILE_STAT, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.stat.type == PROTO_FT_SYMLINK &&
           !strcmp(r.stat.target, "f1"),
       "FILE_STAT does not follow a symlink and reports TARGET");
    result_free(&r);
    tpath(path, sizeof(path), "list/none");
    id = path_req(a, PROTO_FILE_STAT, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT && strstr(r.msg, path),
       "FILE_STAT of nothing: ENOENT naming the path");
    result_free(&r);

    /* mkdir */
    tpath(path, sizeof(path), "m/x/y");
    id = path_req(a, PROTO_FILE_MKDIR, path, PROTO_W_PARENTS, -1);
    struct stat st;
    ok(collect(a, id, &r) == 0 && r.ok && stat(path, &st) == 0 && S_ISDIR(st.st_mode),
       "FILE_MKDIR with PARENTS creates the chain");
    result_free(&r);
    id = path_req(a, PROTO_FILE_MKDIR, path, PROTO_W_PARENTS, -1);
    ok(collect(a, id, &r) == 0 && r.ok, "again with PARENTS: OK");
    result_free(&r);
    id = path_req(a, PROTO_FILE_MKDIR, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EEXIST, "again without PARENTS: EEXIST");
    result_free(&r);
    tpath(path, sizeof(path), "m/z");
    id = path_req(a, PROTO_FILE_MKDIR, path, 0, 0700);
    ok(collect(a, id, &r) == 0 && r.ok && stat(path, &st) == 0 && (st.st_mode & 07777) == 0700,
       "FILE_MKDIR with MODE 0700");
    result_free(&r);
    tpath(path, sizeof(path), "list/f1/sub");
    id = path_req(a, PROTO_FILE_MKDIR, path, PROTO_W_PARENTS, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOTDIR, "mkdir under a file: ENOTDIR");
    result_free(&r);

    /* remove */
    tpath(path, sizeof(path), "outside");
    mkdir(path, 0755);
    tpath(p2, sizeof(p2), "outside/keep.txt");
    close(open(p2, O_WRONLY | O_CREAT, 0644));
    const char *tree[] = {"r", "r/d1", "r/d1/d2", "r/d1/d2/d3", "r/e"};
    for (size_t i = 0; i < WR_ARRAY_LEN(tree); i++) {
        tpath(p2, sizeof(p2), tree[i]);
        mkdir(p2, 0755);
        snprintf(p2 + strlen(p2), sizeof(p2) - strlen(p2), "/file");
        close(open(p2, O_WRONLY | O_CREAT, 0644));
    }
    tpath(p2, sizeof(p2), "r/d1/link-out");
    symlink(path, p2);
    tpath(p2, sizeof(p2), "r/d1/d2/ro");
    mkdir(p2, 0555); /* removable: it is empty, and its parent is writable */

    tpath(path, sizeof(path), "r");
    id = path_req(a, PROTO_FILE_REMOVE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOTEMPTY,
       "FILE_REMOVE of a full directory without RECURSIVE: ENOTEMPTY");
    result_free(&r);
    id = path_req(a, PROTO_FILE_REMOVE, path, PROTO_W_RECURSIVE, -1);
    ok(collect(a, id, &r) == 0 && r.ok && lstat(path, &st) < 0 && errno == ENOENT,
       "FILE_REMOVE RECURSIVE removes the tree");
    result_free(&r);
    tpath(p2, sizeof(p2), "outside/keep.txt");
    ok(stat(p2, &st) == 0, "a symlink inside the tree was not followed");

    tpath(p2, sizeof(p2), "link-to-outside");
    tpath(path, sizeof(path), "outside");
    symlink(path, p2);
    snprintf(path, sizeof(path), "%s/", p2);
    id = path_req(a, PROTO_FILE_REMOVE, path, PROTO_W_RECURSIVE, -1);
    tpath(path, sizeof(path), "outside/keep.txt");
    ok(collect(a, id, &r) == 0 && r.ok && lstat(p2, &st) < 0 && stat(path, &st) == 0,
       "removing \"link/\" removes the link, not its target's contents");
    result_free(&r);

    id = path_req(a, PROTO_FILE_REMOVE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && stat(path, &st) < 0, "FILE_REMOVE of a file");
    result_free(&r);
    id = path_req(a, PROTO_FILE_REMOVE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT, "FILE_REMOVE of nothing: ENOENT");
    result_free(&r);
}

static void test_bad_requests(struct agent *a)
{
    struct result r = {0};
    struct proto_buf b = {0};
    uint32_t id;

    id = next_id++;
    proto_put_str(&b, PT_CWD, "/");
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "EXEC without ARG: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_bytes(&b, PT_ARG, "ec\0ho", 5);
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "ARG with NUL: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_ARG, "true");
    proto_put_bytes(&b, PT_STDIN_PIPE, "\0\1", 2);
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "2-byte STDIN_PIPE: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_ARG, "true");
    proto_put_str(&b, PT_ENV, "NOEQUALS");
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "ENV without '=': EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_ARG, "true");
    proto_put_str(&b, PT_CWD, tmpdir);
    proto_put_str(&b, 999, "unknown tags are skipped");
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0, "unknown field tags are ignored");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_ARG, "true");
    send_frame(a, id, PROTO_EXEC, PROTO_F_FIN, b.data, b.len);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "FIN on EXEC: EINVAL");
    result_free(&r);

    id = next_id++;
    send_frame(a, id, PROTO_EXEC, 0,
               "\0\3\0\0\0\11"
               "ab",
               8);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "truncated field: EINVAL");
    result_free(&r);

    id = path_req(a, PROTO_FILE_STAT, "", 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "empty PATH: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_bytes(&b, PT_PATH, "/tmp\0/x", 7);
    send_fields(a, id, PROTO_FILE_STAT, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "PATH with NUL: EINVAL");
    result_free(&r);

    char *longp = malloc(PROTO_MAX_PATH + 2);
    memset(longp, 'a', PROTO_MAX_PATH + 1);
    longp[0] = '/';
    longp[PROTO_MAX_PATH + 1] = '\0';
    id = path_req(a, PROTO_FILE_STAT, longp, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENAMETOOLONG,
       "PATH over PROTO_MAX_PATH: ENAMETOOLONG");
    result_free(&r);
    free(longp);

    id = next_id++;
    send_frame(a, id, PROTO_FILE_STAT, 0, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "FILE_STAT without PATH: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_PATH, tmpdir);
    proto_put_u32(&b, PT_OFFSET, 5);
    send_fields(a, id, PROTO_FILE_READ, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "4-byte OFFSET: EINVAL");
    result_free(&r);

    id = path_req(a, PROTO_FILE_MKDIR, "/tmp/x", 0x100, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "unknown WFLAGS bit: EINVAL");
    result_free(&r);
    id = path_req(a, PROTO_FILE_MKDIR, "/tmp/x", 0, 010000);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "MODE over 07777: EINVAL");
    result_free(&r);
    proto_buf_free(&b);
}

static void test_cap(struct agent *a)
{
    /* Open writes are cheap live requests: fill the table, see the next one refused. */
    enum { CAP = 1024 };
    char path[PATH_MAX];
    tpath(path, sizeof(path), "cap.txt");
    uint32_t first = next_id;
    for (int i = 0; i < CAP; i++)
        path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    struct result r = {0};
    uint32_t id = path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EAGAIN,
       "request %d over the cap: ERROR EAGAIN", CAP + 1);
    result_free(&r);
    int done = 0;
    for (int i = 0; i < CAP; i++)
        send_frame(a, first + (uint32_t)i, PROTO_DATA, PROTO_F_FIN, NULL, 0);
    for (int i = 0; i < CAP; i++) {
        if (collect(a, first + (uint32_t)i, &r) == 0 && r.ok)
            done++;
        result_free(&r);
    }
    ok(done == CAP, "the %d live requests all complete (%d)", CAP, done);
}

static void test_teardown(void)
{
    struct agent a;
    struct result r = {0};

    /* unknown type in a header: fatal */
    agent_start(&a);
    uint8_t raw[PROTO_HEADER_LEN];
    struct proto_header h = {.len = 0, .id = 1, .type = 999, .flags = 0};
    proto_header_encode(&h, raw);
    write_all(a.fd, raw, sizeof(raw));
    int st = agent_wait(&a, 5000);
    ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "unknown frame type: agent exits 2");
    agent_close(&a);

    /* oversized length: fatal */
    agent_start(&a);
    h = (struct proto_header){.len = PROTO_MAX_PAYLOAD + 1, .id = 1, .type = PROTO_DATA};
    proto_header_encode(&h, raw);
    write_all(a.fd, raw, sizeof(raw));
    st = agent_wait(&a, 5000);
    ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "oversized frame: agent exits 2");
    agent_close(&a);

    /* a type only the agent sends: fatal */
    agent_start(&a);
    h = (struct proto_header){.len = 0, .id = 1, .type = PROTO_OK};
    proto_header_encode(&h, raw);
    write_all(a.fd, raw, sizeof(raw));
    st = agent_wait(&a, 5000);
    ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "OK sent to the agent: agent exits 2");
    agent_close(&a);

    /* EOF: running commands are killed, the agent exits 0 */
    agent_start(&a);
    uint32_t id = sh_req(&a, "setsid sleep 1000 & echo $!; echo $$; exec sleep 1000");
    int got = collect_until(&a, id, &r, 2);
    pid_t p1 = 0, p2 = 0;
    if (got == 1)
        sscanf((char *)r.out.data, "%d %d", &p1, &p2);
    result_free(&r);
    close(a.fd);
    a.fd = -1;
    st = agent_wait(&a, 5000);
    ok(got == 1 && st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "EOF: agent exits 0");
    ok(p1 > 0 && p2 > 0 && pid_gone(p1, 5000) && pid_gone(p2, 5000),
       "EOF: the agent's commands are killed (%d %d)", p1, p2);
    agent_close(&a);
}

static int rm_rf(const char *path)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    return system(cmd);
}

static void find_agent(int argc, char **argv)
{
    const char *env = getenv("WITHRUNTIME_AGENT");
    if (argc > 1)
        snprintf(agent_path, sizeof(agent_path), "%s", argv[1]);
    else if (env && *env)
        snprintf(agent_path, sizeof(agent_path), "%s", env);
    else if (strchr(argv[0], '/'))
        snprintf(agent_path, sizeof(agent_path), "%.*s/../withruntime-agent",
                 (int)(strrchr(argv[0], '/') - argv[0]), argv[0]);
    else
        snprintf(agent_path, sizeof(agent_path), "build/withruntime-agent");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    find_agent(argc, argv);
    if (access(agent_path, X_OK) < 0) {
        ok(0, "agent binary %s is there (make build/withruntime-agent)", agent_path);
        return tap_done();
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/wr-test-agent-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp");
        return tap_done();
    }
    snprintf(logpath, sizeof(logpath), "%s.log", tmpdir);

    struct agent a;
    if (agent_start(&a) < 0) {
        ok(0, "agent starts");
        return tap_done();
    }
    test_hello(&a);
    test_exec_basic(&a);
    test_stdin(&a);
    test_many(&a);
    test_signal(&a);
    test_files_rw(&a);
    test_files_meta(&a);
    test_bad_requests(&a);
    test_cap(&a);
    close(a.fd);
    a.fd = -1;
    int st = agent_wait(&a, 5000);
    ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "agent exits 0 at EOF");
    agent_close(&a);
    test_teardown();

    if (tap_failed) {
        printf("# agent log (%s):\n", logpath);
        FILE *lf = fopen(logpath, "r");
        char line[2048];
        while (lf && fgets(line, sizeof(line), lf))
            printf("#   %s", line);
        if (lf)
            fclose(lf);
    }
    rm_rf(tmpdir);
    unlink(logpath);
    return tap_done();
}
