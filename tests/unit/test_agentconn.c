/*
 * Unit tests for the daemon's end of the agent channel (src/daemon/agentconn.c), the parser of
 * what an untrusted agent sends: frames are written into the other end of a socketpair and the
 * event loop is turned until they are handled. Every way an agent can break the protocol must
 * kill the connection (never the process), and the death must answer each open request once.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fault.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "proto/proto.h"
#include "tap.h"

static struct event_base *base;

struct state {
    int ready, dead;
    char reason[256];
};

struct calls {
    int frames, deaths, terminal;
    uint16_t last_type;
    char reason[256];
};

static void on_state(void *arg, int ok_, const char *reason)
{
    struct state *s = arg;
    if (ok_)
        s->ready++;
    else {
        s->dead++;
        snprintf(s->reason, sizeof(s->reason), "%s", reason ? reason : "");
    }
}

static void on_frame(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct calls *c = arg;
    if (!h) {
        c->deaths++;
        snprintf(c->reason, sizeof(c->reason), "%s", (const char *)payload);
        return;
    }
    c->frames++;
    c->last_type = h->type;
}

/* Turns the loop until nothing is left to do right now (bounded). */
static void pump(void)
{
    for (int i = 0; i < 20; i++) {
        usleep(1000);
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
}

static void put_frame(int fd, uint32_t id, uint16_t type, uint16_t flags, const void *p, size_t len)
{
    struct proto_buf b = {0};
    proto_frame_build(&b, id, type, flags, p, len);
    (void)!write_all(fd, b.data, b.len);
    proto_buf_free(&b);
}

static void put_hello(int fd, uint32_t version)
{
    struct proto_buf f = {0};
    proto_put_u32(&f, PT_VERSION, version);
    proto_put_u32(&f, PT_PID, 1);
    put_frame(fd, 0, PROTO_HELLO, 0, f.data, f.len);
    proto_buf_free(&f);
}

/* Reads one frame the daemon side sent; returns its header. */
static struct proto_header take_frame(int fd)
{
    uint8_t hb[PROTO_HEADER_LEN];
    struct proto_header h = {0};
    if (read_full(fd, hb, sizeof(hb)) != (ssize_t)sizeof(hb) || proto_header_decode(hb, &h) < 0)
        return h;
    uint8_t *p = xmalloc(h.len + 1);
    (void)!read_full(fd, p, h.len);
    free(p);
    return h;
}

struct pair {
    struct agentconn *c;
    int agent; /* the agent's end */
    struct state st;
};

static void open_pair(struct pair *p, int hello_ms)
{
    int sv[2];
    memset(p, 0, sizeof(*p));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    p->agent = sv[1];
    p->c = agentconn_new(base, sv[0], hello_ms, on_state, &p->st);
}

static void close_pair(struct pair *p)
{
    agentconn_close(p->c, "test over");
    close(p->agent);
}

static void test_hello_and_request(void)
{
    struct pair p;
    open_pair(&p, 5000);
    struct calls c = {0};
    ok(agentconn_request(p.c, PROTO_PING, NULL, 0, on_frame, &c) == 0, "no request before HELLO");
    put_hello(p.agent, PROTO_VERSION);
    pump();
    ok(p.st.ready == 1 && p.st.dead == 0, "HELLO makes the connection ready");
    uint32_t id = agentconn_request(p.c, PROTO_PING, NULL, 0, on_frame, &c);
    pump();
    struct proto_header h = take_frame(p.agent);
    ok(id != 0 && h.type == PROTO_PING && h.id == id, "the request goes out with its id");
    /* A header split over two writes is handled once complete. */
    uint8_t hb[PROTO_HEADER_LEN];
    struct proto_header pong = {.len = 0, .id = id, .type = PROTO_PONG};
    proto_header_encode(&pong, hb);
    (void)!write(p.agent, hb, 5);
    pump();
    ok(c.frames == 0, "half a header is not a frame");
    (void)!write(p.agent, hb + 5, sizeof(hb) - 5);
    pump();
    ok(c.frames == 1 && c.last_type == PROTO_PONG, "the rest completes it");
    put_frame(p.agent, id, PROTO_PONG, 0, NULL, 0);
    pump();
    ok(c.frames == 1 && p.st.dead == 0, "a late frame for a finished request is dropped");
    put_frame(p.agent, 999, PROTO_STDOUT, 0, "x", 1);
    pump();
    ok(p.st.dead == 0, "a frame for an unknown id is dropped, not fatal");
    ok(agentconn_alive(p.c), "still alive");
    close_pair(&p);
    ok(c.deaths == 0, "a finished request gets no death notice on close");
}

static void expect_death(const char *name, void (*send)(int fd), int after_hello,
                         const char *reason)
{
    struct pair p;
    open_pair(&p, 5000);
    if (after_hello) {
        put_hello(p.agent, PROTO_VERSION);
        pump();
    }
    struct calls c = {0};
    uint32_t id = after_hello ? agentconn_request(p.c, PROTO_EXEC, NULL, 0, on_frame, &c) : 0;
    send(p.agent);
    pump();
    ok(p.st.dead == 1 && strstr(p.st.reason, reason), "%s: dead (%s)", name, p.st.reason);
    ok(!agentconn_alive(p.c), "%s: not alive", name);
    if (after_hello)
        ok(id && c.deaths == 1 && c.frames == 0, "%s: the open request is answered once", name);
    ok(agentconn_request(p.c, PROTO_PING, NULL, 0, on_frame, &c) == 0 &&
           agentconn_send(p.c, id, PROTO_STDIN, 0, "x", 1) < 0,
       "%s: nothing more goes out", name);
    close_pair(&p);
    ok(p.st.dead == 1 && c.deaths == (after_hello ? 1 : 0), "%s: close adds no second notice",
       name);
}

static void send_garbage(int fd)
{
    (void)!write(fd, "\xde\xad\xbe\xef\xde\xad\xbe\xef\xde\xad\xbe\xef", 12);
}

static void send_oversized(int fd)
{
    uint8_t hb[PROTO_HEADER_LEN];
    struct proto_header h = {.len = PROTO_MAX_PAYLOAD + 1, .id = 1, .type = PROTO_STDOUT};
    /* proto_header_encode does not check; the reader must. */
    proto_header_encode(&h, hb);
    (void)!write(fd, hb, sizeof(hb));
}

static void send_bad_flags(int fd)
{
    uint8_t hb[PROTO_HEADER_LEN];
    struct proto_header h = {.len = 0, .id = 1, .type = PROTO_STDOUT, .flags = 0x8000};
    proto_header_encode(&h, hb);
    (void)!write(fd, hb, sizeof(hb));
}

static void send_stdout(int fd)
{
    put_frame(fd, 1, PROTO_STDOUT, 0, "x", 1);
}

static void send_bad_version(int fd)
{
    put_hello(fd, PROTO_VERSION + 1);
}

static void send_empty_hello(int fd)
{
    put_frame(fd, 0, PROTO_HELLO, 0, NULL, 0);
}

static void send_hello(int fd)
{
    put_hello(fd, PROTO_VERSION);
}

static void send_exec(int fd)
{
    put_frame(fd, 1, PROTO_EXEC, 0, NULL, 0);
}

static void send_stdin(int fd)
{
    put_frame(fd, 1, PROTO_STDIN, 0, "x", 1);
}

static void send_eof(int fd)
{
    shutdown(fd, SHUT_WR);
}

static void send_half_frame_then_eof(int fd)
{
    uint8_t hb[PROTO_HEADER_LEN];
    struct proto_header h = {.len = 100, .id = 1, .type = PROTO_STDOUT};
    proto_header_encode(&h, hb);
    (void)!write(fd, hb, sizeof(hb));
    (void)!write(fd, "abc", 3);
    shutdown(fd, SHUT_WR);
}

static void test_hostile(void)
{
    expect_death("malformed header", send_garbage, 0, "malformed frame header");
    expect_death("malformed header after HELLO", send_garbage, 1, "malformed frame header");
    expect_death("len over the maximum", send_oversized, 1, "malformed frame header");
    expect_death("unknown flag bits", send_bad_flags, 1, "malformed frame header");
    expect_death("frame before HELLO", send_stdout, 0, "before HELLO");
    expect_death("wrong version", send_bad_version, 0, "version");
    expect_death("HELLO without fields", send_empty_hello, 0, "version");
    expect_death("second HELLO", send_hello, 1, "second HELLO");
    expect_death("EXEC from the agent", send_exec, 1, "only the daemon sends");
    expect_death("STDIN from the agent", send_stdin, 1, "only the daemon sends");
    expect_death("EOF", send_eof, 1, "closed the control channel");
    expect_death("EOF mid-frame", send_half_frame_then_eof, 1, "closed the control channel");
}

static void test_hello_timeout(void)
{
    struct pair p;
    open_pair(&p, 30);
    struct timeval tv = {0, 150 * 1000};
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
    ok(p.st.dead == 1 && strstr(p.st.reason, "did not say HELLO"), "silence: HELLO timeout (%s)",
       p.st.reason);
    close_pair(&p);
}

static void test_death_answers_each_request_once(void)
{
    struct pair p;
    open_pair(&p, 5000);
    put_hello(p.agent, PROTO_VERSION);
    pump();
    struct calls a = {0}, b = {0}, cancelled = {0};
    uint32_t ia = agentconn_request(p.c, PROTO_EXEC, NULL, 0, on_frame, &a);
    uint32_t ib = agentconn_request(p.c, PROTO_FILE_READ, NULL, 0, on_frame, &b);
    uint32_t ic = agentconn_request(p.c, PROTO_FILE_LIST, NULL, 0, on_frame, &cancelled);
    agentconn_cancel(p.c, ic);
    ok(ia && ib && ic && ia != ib && ib != ic, "distinct ids");
    put_frame(p.agent, ia, PROTO_STDOUT, 0, "out", 3);
    pump();
    ok(a.frames == 1 && a.last_type == PROTO_STDOUT, "a non-terminal frame reaches its request");
    close(p.agent);
    pump();
    ok(a.deaths == 1 && b.deaths == 1 && cancelled.deaths == 0,
       "death answers each open request once, a cancelled one never");
    ok(strstr(a.reason, "control channel") != NULL, "with the reason: %s", a.reason);
    ok(p.st.dead == 1, "the owner hears of it once");
    agentconn_close(p.c, "over");
    ok(a.deaths == 1 && b.deaths == 1 && p.st.dead == 1, "close after death adds nothing");
}

static void test_close_answers_open_requests(void)
{
    struct pair p;
    open_pair(&p, 5000);
    put_hello(p.agent, PROTO_VERSION);
    pump();
    struct calls a = {0};
    agentconn_request(p.c, PROTO_EXEC, NULL, 0, on_frame, &a);
    agentconn_close(p.c, "the sandbox is being deleted");
    ok(a.deaths == 1 && !strcmp(a.reason, "the sandbox is being deleted"),
       "close answers open requests with its reason");
    ok(p.st.dead == 0, "the owner, who closed it, gets no death notice");
    close(p.agent);
}

/* Closing the connection from inside one of its own callbacks (the daemon does this when a
 * request's answer makes it give up on the sandbox) must not free it under the caller. */
struct closer {
    struct agentconn *c;
    int calls;
};

static void close_from_frame(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct closer *cl = arg;
    cl->calls++;
    if (h && cl->c) {
        struct agentconn *c = cl->c;
        cl->c = NULL;
        agentconn_close(c, "closed from a callback");
    }
}

static void test_close_inside_callback(void)
{
    struct pair p;
    open_pair(&p, 5000);
    put_hello(p.agent, PROTO_VERSION);
    pump();
    struct closer cl = {.c = p.c};
    uint32_t id = agentconn_request(p.c, PROTO_EXEC, NULL, 0, close_from_frame, &cl);
    put_frame(p.agent, id, PROTO_STDOUT, 0, "a", 1);
    put_frame(p.agent, id, PROTO_STDOUT, 0, "b", 1);
    pump();
    ok(cl.calls == 2, "the request hears its frame, then its death, and nothing after (%d)",
       cl.calls);
    close(p.agent);
}

static void test_send_fault(void)
{
    struct pair p;
    open_pair(&p, 5000);
    put_hello(p.agent, PROTO_VERSION);
    pump();
    struct calls c = {0};
    uint32_t id = agentconn_request(p.c, PROTO_EXEC, NULL, 0, on_frame, &c);
    setenv("WR_FAULTS", "agentconn.send.STDIN=EIO:1", 1);
    fault_reset();
    ok(agentconn_send(p.c, id, PROTO_STDIN, 0, "x", 1) < 0, "agentconn.send fault fails a send");
    ok(agentconn_send(p.c, id, PROTO_STDIN, 0, "x", 1) == 0, "the next send works");
    setenv("WR_FAULTS", "agentconn.send.STDIN=EIO:1", 1);
    fault_reset();
    ok(agentconn_request(p.c, PROTO_PING, NULL, 0, on_frame, &c) != 0,
       "a fault on another frame type leaves a PING alone");
    setenv("WR_FAULTS", "agentconn.send.*=EIO:1", 1);
    fault_reset();
    ok(agentconn_request(p.c, PROTO_PING, NULL, 0, on_frame, &c) == 0,
       "a request whose send fails gets no id");
    unsetenv("WR_FAULTS");
    fault_reset();
    ok(agentconn_send(p.c, id, PROTO_STDIN, 0, NULL, PROTO_MAX_PAYLOAD + 1) < 0,
       "a payload over the maximum is refused");
    close_pair(&p);
}

/* Opens a ready pair: HELLO said. */
static void open_ready(struct pair *p)
{
    open_pair(p, 5000);
    put_hello(p->agent, PROTO_VERSION);
    pump();
}

static void test_wrong_answer_type(void)
{
    struct pair p;
    open_ready(&p);
    struct calls c = {0};
    uint32_t id = agentconn_request(p.c, PROTO_FILE_STAT, "", 0, on_frame, &c);
    pump();
    take_frame(p.agent);
    put_frame(p.agent, id, PROTO_STDOUT, 0, "x", 1); /* a STAT answered with command output */
    pump();
    ok(p.st.dead == 1 && c.deaths == 1 && strstr(c.reason, "protocol violation"),
       "STDOUT for a FILE_STAT kills the connection: %s", c.reason);
    close_pair(&p);

    open_ready(&p);
    c = (struct calls){0};
    id = agentconn_request(p.c, PROTO_EXEC, "", 0, on_frame, &c);
    pump();
    take_frame(p.agent);
    put_frame(p.agent, id, PROTO_OK, 0, NULL, 0); /* an exec ends with EXIT, never OK */
    pump();
    ok(p.st.dead == 1 && c.deaths == 1 && c.frames == 0, "OK for an EXEC kills the connection");
    close_pair(&p);
}

static void test_credit(void)
{
    struct pair p;
    open_ready(&p);
    struct calls c = {0};
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, "/x");
    uint32_t id = agentconn_request_windowed(p.c, PROTO_FILE_READ, &b, 1000, on_frame, &c);
    proto_buf_free(&b);
    pump();
    struct proto_header h = take_frame(p.agent);
    ok(id && h.type == PROTO_FILE_READ, "a windowed request goes out");
    static uint8_t data[1000];
    put_frame(p.agent, id, PROTO_STAT_RESULT, 0, NULL, 0);
    put_frame(p.agent, id, PROTO_DATA, 0, data, 600);
    put_frame(p.agent, id, PROTO_DATA, 0, data, 400);
    pump();
    ok(p.st.dead == 0 && c.frames == 3, "output up to the window is taken");
    agentconn_credit(p.c, id, 100); /* less than a quarter of nothing new: below the step */
    agentconn_credit(p.c, id, 1000);
    pump();
    h = take_frame(p.agent);
    ok(h.type == PROTO_CREDIT && h.id == id, "agentconn_credit sends CREDIT");
    put_frame(p.agent, id, PROTO_DATA, 0, data, 1000);
    pump();
    ok(p.st.dead == 0, "output within the new credit is taken");
    put_frame(p.agent, id, PROTO_DATA, 0, data, 1);
    pump();
    ok(p.st.dead == 1 && strstr(p.st.reason, "more"), "one byte past the credit kills: %s",
       p.st.reason);
    close_pair(&p);

    /* CANCEL goes out for an open request, and not for a finished one. */
    open_ready(&p);
    c = (struct calls){0};
    id = agentconn_request(p.c, PROTO_FILE_LIST, "", 0, on_frame, &c);
    pump();
    take_frame(p.agent);
    agentconn_abort(p.c, id);
    agentconn_abort(p.c, id);
    pump();
    h = take_frame(p.agent);
    int fl = fcntl(p.agent, F_GETFL);
    fcntl(p.agent, F_SETFL, fl | O_NONBLOCK);
    uint8_t extra;
    ok(h.type == PROTO_CANCEL && h.id == id && read(p.agent, &extra, 1) < 0,
       "agentconn_abort sends one CANCEL, then forgets the request");
    fcntl(p.agent, F_SETFL, fl);
    put_frame(p.agent, id, PROTO_DIR_ENTRIES, 0, NULL, 0);
    pump();
    ok(c.frames == 0 && p.st.dead == 0, "late frames for it are dropped");
    close_pair(&p);
}

/* Turns the loop until cond or about ms have passed. */
#define PUMP_UNTIL(cond, ms)                                                                       \
    for (int waited_ = 0; !(cond) && waited_ < (ms); waited_ += 20)                                \
        pump();

static void test_deadline(void)
{
    struct pair p;
    open_ready(&p);
    agentconn_set_deadline(p.c, 200);
    struct calls c = {0}, w = {0}, e = {0};
    /* A windowed read out of credit waits on us, not the agent; an exec on its own timer. */
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, "/x");
    uint32_t rid = agentconn_request_windowed(p.c, PROTO_FILE_READ, &b, 10, on_frame, &w);
    proto_buf_free(&b);
    agentconn_request(p.c, PROTO_EXEC, "", 0, on_frame, &e);
    static uint8_t data[10];
    put_frame(p.agent, rid, PROTO_DATA, 0, data, 10);
    PUMP_UNTIL(0, 1000);
    ok(p.st.dead == 0 && w.frames == 1, "an exec and a read out of credit outlive the deadline");
    agentconn_request(p.c, PROTO_FILE_STAT, "", 0, on_frame, &c);
    PUMP_UNTIL(p.st.dead, 5000);
    ok(p.st.dead == 1 && agentconn_gave_up(p.c) && c.deaths == 1 && w.deaths == 1 &&
           e.deaths == 1 && strstr(c.reason, "did not answer a FILE_STAT"),
       "an unanswered FILE_STAT past the deadline fails every request: %s", c.reason);
    close_pair(&p);
}

struct sends {
    int n;
    uint16_t last;
};

static void on_send(void *arg, uint16_t type)
{
    struct sends *s = arg;
    s->n++;
    s->last = type;
}

/* What idle freezing (daemon/idle.h) relies on: every frame out is announced first, and only
 * requests other than PING count as the sandbox being in use. */
static void test_active_and_on_send(void)
{
    struct pair p;
    open_pair(&p, 5000);
    struct sends sn = {0};
    agentconn_on_send(p.c, on_send, &sn);
    put_hello(p.agent, PROTO_VERSION);
    pump();
    struct calls c = {0};
    uint32_t ping = agentconn_request(p.c, PROTO_PING, NULL, 0, on_frame, &c);
    ok(sn.n == 1 && sn.last == PROTO_PING && agentconn_active(p.c) == 0,
       "a PING is announced and is not activity");
    uint32_t st = agentconn_request(p.c, PROTO_FILE_STAT, "", 0, on_frame, &c);
    ok(sn.n == 2 && sn.last == PROTO_FILE_STAT && agentconn_active(p.c) == 1,
       "a FILE_STAT is announced and counts as open");
    uint32_t ex = agentconn_request(p.c, PROTO_EXEC, "", 0, on_frame, &c);
    agentconn_send(p.c, ex, PROTO_STDIN, 0, "x", 1);
    ok(sn.n == 4 && sn.last == PROTO_STDIN && agentconn_active(p.c) == 2,
       "a request's later frames are announced too");
    put_frame(p.agent, st, PROTO_OK, 0, NULL, 0);
    put_frame(p.agent, ping, PROTO_PONG, 0, NULL, 0);
    pump();
    ok(agentconn_active(p.c) == 1, "answered requests no longer count");
    agentconn_cancel(p.c, ex);
    ok(agentconn_active(p.c) == 0, "nor cancelled ones");
    agentconn_request(p.c, PROTO_FILE_STAT, "", 0, on_frame, &c);
    close_pair(&p);
}

/* A burst of DATA frames, each filled from its sequence number, checked as it arrives. */
struct burst {
    int frames, bad, ended, deaths;
    uint64_t bytes;
};

static uint8_t burst_byte(int seq, size_t i)
{
    return (uint8_t)(seq * 31 + i * 7);
}

static void on_burst(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct burst *b = arg;
    if (!h) {
        b->deaths++;
        return;
    }
    if (h->type == PROTO_OK) {
        b->ended = 1;
        return;
    }
    if (h->type != PROTO_DATA)
        return;
    for (size_t i = 0; i < h->len; i++)
        if (payload[i] != burst_byte(b->frames, i)) {
            b->bad++;
            break;
        }
    b->frames++;
    b->bytes += h->len;
}

/* The same for a request that takes its DATA as buffers: checked chain by chain. */
static void on_burst_data(void *arg, const struct proto_header *h, struct evbuffer *payload)
{
    struct burst *b = arg;
    size_t len = evbuffer_get_length(payload), i = 0;
    struct evbuffer_iovec v[32];
    int n = evbuffer_peek(payload, -1, NULL, v, 32);
    if (len != h->len || n > 32)
        b->bad++;
    for (int k = 0; k < n && k < 32; k++)
        for (size_t j = 0; j < v[k].iov_len; j++, i++)
            if (((uint8_t *)v[k].iov_base)[j] != burst_byte(b->frames, i)) {
                b->bad++;
                k = n;
                break;
            }
    b->frames++;
    b->bytes += len;
    evbuffer_drain(payload, len / 2); /* what the callee leaves is dropped */
}

/* The channel is read in big pieces into a buffer of its own: frames of every size up to the
 * largest, split across reads and across the buffer's refills, arrive whole and in order. With
 * as_buffers, the request takes its DATA as buffers: big payloads are read straight into them. */
static void test_big_frames(int as_buffers)
{
    static const size_t sizes[] = {PROTO_MAX_PAYLOAD,
                                   7,
                                   256 << 10,
                                   0,
                                   PROTO_MAX_PAYLOAD - 1,
                                   65536,
                                   1,
                                   PROTO_MAX_PAYLOAD,
                                   300000,
                                   12,
                                   PROTO_MAX_PAYLOAD};
    enum { ROUNDS = 3 };
    struct pair p;
    open_ready(&p);
    struct burst b = {0};
    struct proto_buf f = {0};
    proto_put_str(&f, PT_PATH, "/x");
    uint32_t id = agentconn_request_windowed(p.c, PROTO_FILE_READ, &f, 64 << 20, on_burst, &b);
    proto_buf_free(&f);
    if (as_buffers)
        agentconn_on_data(p.c, id, on_burst_data);
    pump();
    struct proto_header h = take_frame(p.agent);
    uint64_t total = 0;
    int nframes = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (size_t k = 0; k < WR_ARRAY_LEN(sizes); k++, nframes++)
            total += sizes[k];
    pid_t pid = fork();
    if (pid == 0) { /* the agent: writes it all, blocking, in pieces of odd sizes */
        uint8_t *buf = xmalloc(PROTO_MAX_PAYLOAD);
        int seq = 0;
        for (int r = 0; r < ROUNDS; r++)
            for (size_t k = 0; k < WR_ARRAY_LEN(sizes); k++, seq++) {
                for (size_t i = 0; i < sizes[k]; i++)
                    buf[i] = burst_byte(seq, i);
                struct proto_buf fr = {0};
                proto_frame_build(&fr, id, PROTO_DATA, 0, buf, sizes[k]);
                for (size_t off = 0; off < fr.len; off += 77777)
                    (void)!write_all(p.agent, fr.data + off,
                                     fr.len - off < 77777 ? fr.len - off : 77777);
                proto_buf_free(&fr);
            }
        put_frame(p.agent, id, PROTO_STDOUT, 0, "x", 1); /* a violation after it all */
        _exit(0);
    }
    for (int i = 0; i < 20000 && !b.deaths; i++) {
        usleep(500);
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    waitpid(pid, NULL, 0);
    const char *how = as_buffers ? " as buffers" : "";
    ok(id && h.type == PROTO_FILE_READ && b.deaths == 1 && strstr(p.st.reason, "STDOUT"),
       "a burst of %d frames (%llu bytes) is taken whole%s, then the violation after it: %s",
       nframes, (unsigned long long)total, how, p.st.reason);
    ok(b.frames == nframes && b.bytes == total && b.bad == 0,
       "every frame arrives in order with its bytes%s (%d frames, %d bad)", how, b.frames, b.bad);
    close_pair(&p);
}

int main(void)
{
    unsetenv("WR_FAULTS");
    unsetenv("WR_FAULTS_FILE");
    base = event_base_new();
    test_hello_and_request();
    test_active_and_on_send();
    test_hostile();
    test_hello_timeout();
    test_death_answers_each_request_once();
    test_close_answers_open_requests();
    test_close_inside_callback();
    test_send_fault();
    test_wrong_answer_type();
    test_credit();
    test_big_frames(0);
    test_big_frames(1);
    test_deadline();
    event_base_free(base);
    return tap_done();
}
