/*
 * What the agent tests share: one real withruntime-agent started on the host over a
 * socketpair, the way the daemon runs it inside a sandbox, and the means to send it requests
 * and collect their answers. Each test_agent_*.c file drives one mechanism through it (commands,
 * files, frames and teardown), with an agent of its own. The agent is found at argv[1],
 * $WITHRUNTIME_AGENT, or next to the test's build directory (<dir of argv[0]>/../withruntime-agent,
 * so build/ and build-san/ both work).
 *
 * Everything here is static: each test is a single translation unit.
 */
#ifndef WR_TESTS_AGENT_HARNESS_H
#define WR_TESTS_AGENT_HARNESS_H

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

static inline int agent_start(struct agent *a)
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

static inline void agent_close(struct agent *a)
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
static inline int agent_wait(struct agent *a, int timeout_ms)
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

static inline void send_frame(struct agent *a, uint32_t id, uint16_t type, uint16_t flags,
                              const void *payload, size_t len)
{
    struct proto_buf fr = {0};
    if (proto_frame_build(&fr, id, type, flags, payload, len) == 0)
        write_all(a->fd, fr.data, fr.len);
    proto_buf_free(&fr);
}

static inline void send_fields(struct agent *a, uint32_t id, uint16_t type,
                               const struct proto_buf *b)
{
    send_frame(a, id, type, 0, b->data, b->len);
}

/* Reads the next frame from the channel. Returns NULL on timeout, EOF or a bad frame. */
static inline struct frame *read_frame(struct agent *a, int timeout_ms)
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

static inline void result_free(struct result *r)
{
    proto_buf_free(&r->out);
    proto_buf_free(&r->err);
    proto_buf_free(&r->data);
    memset(r, 0, sizeof(*r));
}

static inline void append(struct proto_buf *b, const uint8_t *p, size_t n)
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
static inline void parse_entry_field(const struct proto_field *f, struct entry *e)
{
    switch (f->tag) {
    case PT_NAME: proto_field_str(f, e->name, sizeof(e->name)); break;
    case PT_TYPE: proto_field_u32(f, &e->type); break;
    case PT_SIZE: proto_field_u64(f, &e->size); break;
    case PT_MODE: proto_field_u32(f, &e->mode); break;
    case PT_TARGET: proto_field_str(f, e->target, sizeof(e->target)); break;
    }
}

static inline void absorb(struct result *r, const struct frame *f)
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

static inline int terminal(uint16_t type)
{
    return type == PROTO_EXIT || type == PROTO_ERROR || type == PROTO_OK || type == PROTO_PONG;
}

/*
 * Gathers frames for id until its terminal frame (returns 0), or until stdout holds `lines`
 * newlines when lines > 0 (returns 1). Frames for other ids are queued for later. -1 on
 * timeout or a dead channel.
 */
static inline int collect_until(struct agent *a, uint32_t id, struct result *r, int lines)
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

static inline int collect(struct agent *a, uint32_t id, struct result *r)
{
    return collect_until(a, id, r, 0);
}

/* ---- building requests ---- */

/* argv and env are NULL-terminated (env may be NULL: empty environment). */
static inline uint32_t exec_req(struct agent *a, const char *const *argv, const char *const *env,
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

static inline uint32_t sh_req(struct agent *a, const char *script)
{
    const char *argv[] = {"sh", "-c", script, NULL};
    return exec_req(a, argv, base_env, NULL, 0);
}

static inline uint32_t path_req(struct agent *a, uint16_t type, const char *path, uint32_t wflags,
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

static inline void tpath(char *out, size_t n, const char *rel)
{
    snprintf(out, n, "%s/%s", tmpdir, rel);
}

/* Waits until pid no longer exists: not even a zombie, so someone reaped it. */
static inline int pid_gone(pid_t pid, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        if (kill(pid, 0) < 0 && errno == ESRCH)
            return 1;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* Reads the agent's first frame and drops it. Returns 1 if it was HELLO with id 0. */
static inline int agent_skip_hello(struct agent *a)
{
    struct frame *f = read_frame(a, TIMEOUT_MS);
    int hello = f && f->h.type == PROTO_HELLO && f->h.id == 0;
    if (f) {
        free(f->payload);
        free(f);
    }
    return hello;
}

/* ---- a test program's start and end ---- */

static inline int rm_rf(const char *path)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    return system(cmd);
}

static inline void find_agent(int argc, char **argv)
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

/*
 * Finds the agent, makes a scratch directory (tmpdir) and starts one agent in a. Returns 0, or
 * -1 after a failing ok() (then return tap_done()).
 */
static inline int harness_begin(int argc, char **argv, struct agent *a)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    find_agent(argc, argv);
    if (access(agent_path, X_OK) < 0) {
        ok(0, "agent binary %s is there (make build/withruntime-agent)", agent_path);
        return -1;
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/wr-test-agent-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp");
        return -1;
    }
    snprintf(logpath, sizeof(logpath), "%s.log", tmpdir);
    if (agent_start(a) < 0) {
        ok(0, "agent starts");
        return -1;
    }
    return 0;
}

/* Closes a's channel, as a daemon that goes away does, and checks the agent then exits 0. */
static inline void harness_stop_agent(struct agent *a)
{
    close(a->fd);
    a->fd = -1;
    int st = agent_wait(a, 5000);
    ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "agent exits 0 at EOF");
    agent_close(a);
}

/* Prints the agents' log if a test failed, removes the scratch directory and the log. Returns
 * the exit status of the test program (tap_done). */
static inline int harness_done(void)
{
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

#endif
