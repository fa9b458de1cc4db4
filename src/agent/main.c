/*
 * withruntime-agent: PID 1 inside every sandbox. It reads request frames from
 * fd 0, writes answers to fd 1 (under gVisor both are the same socket to the
 * daemon), runs commands, does file operations and reaps every process that
 * ends up its child. One thread, one poll() loop: nothing here may block on
 * the daemon or on a command, because the same loop has to deliver SIGKILL.
 * Run on the host (tests), it is a child subreaper so it still reaps orphans.
 * As PID 1 its commands run in a child pid namespace, out of their reach (pidns.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/log.h"
#include "common/util.h"

/* How often the commands' namespace init is sent SIGCONT, in case a stop went unnoticed. */
#define HOLDER_CONT_MS 1000

/* Channel bytes read per loop iteration, so requests cannot starve command output. */
#define READ_BUDGET (1u << 20)

struct agent ag;

static int sigfd = -1;

/* ---- the request table ---- */

static struct req **bucket(uint32_t id)
{
    return &ag.hash[(id * 2654435761u) % AGENT_HASH_SIZE];
}

struct req *req_find(uint32_t id)
{
    for (struct req *r = *bucket(id); r; r = r->hnext)
        if (r->id == id)
            return r;
    return NULL;
}

int req_admit(uint32_t id)
{
    if (req_find(id)) {
        chan_error(id, EEXIST, "request id %u is already in use", id);
        return -1;
    }
    if (ag.nreqs >= AGENT_MAX_REQUESTS) {
        chan_error(id, EAGAIN, "too many requests in flight (%d)", AGENT_MAX_REQUESTS);
        return -1;
    }
    return 0;
}

void req_add(struct req *r)
{
    struct req **b = bucket(r->id);
    r->hnext = *b;
    *b = r;
    r->next = NULL;
    r->prev = ag.tail;
    if (ag.tail)
        ag.tail->next = r;
    else
        ag.head = r;
    ag.tail = r;
    ag.nreqs++;
}

void req_remove(struct req *r)
{
    for (struct req **p = bucket(r->id); *p; p = &(*p)->hnext) {
        if (*p == r) {
            *p = r->hnext;
            break;
        }
    }
    if (r->prev)
        r->prev->next = r->next;
    else
        ag.head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        ag.tail = r->prev;
    r->prev = r->next = r->hnext = NULL;
    ag.nreqs--;
}

int req_window(struct req *r, const uint8_t *payload, size_t len)
{
    struct proto_field f;
    int rc = proto_find(payload, len, PT_WINDOW, &f);
    if (rc < 0 || (rc == 1 && proto_field_u64(&f, &r->credit) < 0))
        return -1;
    r->windowed = rc == 1;
    return 0;
}

size_t req_room(const struct req *r, size_t want)
{
    if (!r->windowed || r->credit >= want)
        return want;
    return (size_t)r->credit;
}

void req_spend(struct req *r, size_t n)
{
    if (r->windowed)
        r->credit = r->credit > n ? r->credit - n : 0;
}

/* CREDIT: more room for a windowed request's output. */
static void req_credit(struct req *r, const uint8_t *payload, size_t len)
{
    struct proto_field f;
    uint64_t more;
    if (proto_find(payload, len, PT_LENGTH, &f) != 1 || proto_field_u64(&f, &more) < 0) {
        log_warn(NULL, "agent.bad_credit", "id=%u", r->id);
        return;
    }
    if (r->windowed)
        r->credit = UINT64_MAX - r->credit < more ? UINT64_MAX : r->credit + more;
}

/* CANCEL: the daemon no longer wants the request. Reads, lists and writes end here and now;
 * a command is killed and answers EXIT as usual. */
static void req_cancel(struct req *r)
{
    if (r->kind == REQ_EXEC) {
        exec_cancel(r);
        return;
    }
    req_remove(r);
    if (r->kind == REQ_ARCHIVE || r->kind == REQ_EXTRACT)
        archive_free(r);
    else
        file_free(r);
}

/* ---- ending ---- */

/* Leaves nothing behind on the host. As PID 1 there is nothing to do: when init exits, the
 * kernel kills every process in the sandbox, faster than we could. */
static __attribute__((noreturn)) void agent_exit(int code)
{
    if (!ag.is_init)
        tree_signal(ag.pid, 0, SIGKILL);
    exit(code);
}

static __attribute__((noreturn)) void protocol_fatal(const char *what, const uint8_t *hdr)
{
    log_error(NULL, "agent.protocol_error",
              "what=\"%s\" header=%02x%02x%02x%02x.%02x%02x%02x%02x.%02x%02x.%02x%02x", what,
              hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], hdr[5], hdr[6], hdr[7], hdr[8], hdr[9],
              hdr[10], hdr[11]);
    agent_exit(2);
}

/* ---- dispatch ---- */

/* Types that start a request (and are answered on their id). */
static int is_request(uint16_t type)
{
    switch (type) {
    case PROTO_PING:
    case PROTO_EXEC:
    case PROTO_SESSION:
    case PROTO_FILE_READ:
    case PROTO_FILE_WRITE:
    case PROTO_FILE_LIST:
    case PROTO_FILE_STAT:
    case PROTO_FILE_MKDIR:
    case PROTO_FILE_REMOVE:
    case PROTO_FILE_ARCHIVE:
    case PROTO_FILE_EXTRACT: return 1;
    default: return 0;
    }
}

/* PONG, with how many processes run besides the agent's own (PT_PROCS) when it can tell. */
static void pong(uint32_t id)
{
    struct proto_buf b = {0};
    int n = tree_count_others();
    if (n >= 0)
        proto_put_u32(&b, PT_PROCS, (uint32_t)n);
    chan_send(id, PROTO_PONG, 0, b.data, b.len);
    proto_buf_free(&b);
}

static void dispatch(const struct proto_header *h, const uint8_t *payload, const uint8_t *hdr)
{
    struct req *r;
    int fin = (h->flags & PROTO_F_FIN) != 0;

    /* FIN belongs to the streams; on a request it means the daemon and agent disagree about
     * the protocol, which the daemon hears about on that request. */
    if (fin && is_request(h->type)) {
        chan_error(h->id, EINVAL, "flag FIN not allowed on %s", proto_type_name(h->type));
        return;
    }
    switch (h->type) {
    case PROTO_PING: pong(h->id); break;
    case PROTO_CANCEL:
        /* A request that just ended races with its cancel: not an error. */
        if ((r = req_find(h->id)))
            req_cancel(r);
        break;
    case PROTO_CREDIT:
        if ((r = req_find(h->id)))
            req_credit(r, payload, h->len);
        break;
    case PROTO_EXEC: exec_start(h->id, payload, h->len, 0); break;
    case PROTO_SESSION: exec_start(h->id, payload, h->len, 1); break;
    case PROTO_RESIZE:
        if (fin)
            log_warn(NULL, "agent.bad_resize", "id=%u flags=FIN", h->id);
        else if ((r = req_find(h->id)) && r->kind == REQ_EXEC)
            exec_resize(r, payload, h->len);
        break;
    case PROTO_STDIN:
        /* Frames for a request that just ended race with its end: not an error. */
        if ((r = req_find(h->id)) && r->kind == REQ_EXEC)
            exec_stdin(r, payload, h->len, fin);
        break;
    case PROTO_SIGNAL:
        if (fin)
            log_warn(NULL, "agent.bad_signal", "id=%u flags=FIN", h->id);
        else if ((r = req_find(h->id)) && r->kind == REQ_EXEC)
            exec_signal(r, payload, h->len);
        break;
    case PROTO_FILE_READ: file_read_start(h->id, payload, h->len); break;
    case PROTO_FILE_WRITE: file_write_start(h->id, payload, h->len); break;
    case PROTO_DATA:
        if ((r = req_find(h->id)) && r->kind == REQ_WRITE)
            file_write_data(r, payload, h->len, fin);
        break;
    case PROTO_FILE_LIST: file_list_start(h->id, payload, h->len); break;
    case PROTO_FILE_STAT: file_stat(h->id, payload, h->len); break;
    case PROTO_FILE_MKDIR: file_mkdir(h->id, payload, h->len); break;
    case PROTO_FILE_REMOVE: file_remove(h->id, payload, h->len); break;
    case PROTO_FILE_ARCHIVE: archive_start(h->id, payload, h->len); break;
    case PROTO_FILE_EXTRACT: extract_start(h->id, payload, h->len); break;
    default:
        /* HELLO, PONG, STDOUT, ... only ever travel towards the daemon. */
        protocol_fatal("frame type the daemon never sends", hdr);
    }
}

/* Reads and handles what the channel has. Returns 1 at EOF (or a read error: same thing,
 * the daemon is gone), else 0. */
static int read_channel(struct proto_reader *rd)
{
    /* An upload's DATA frames are 256 KiB: reads this big take several at once */
    static uint8_t buf[1u << 20];
    size_t total = 0;
    while (total < READ_BUDGET && chan_pending() < AGENT_OUT_HARD) {
        ssize_t n = read(ag.in_fd, buf, sizeof(buf));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            log_warn(NULL, "agent.channel_read", "error=\"%s\"", strerror(errno));
            return 1;
        }
        if (n == 0) {
            if (rd->hdr_got && !(rd->hdr_got == PROTO_HEADER_LEN && rd->payload_got == rd->h.len))
                log_warn(NULL, "agent.channel_eof", "partial_frame=1");
            return 1;
        }
        total += (size_t)n;
        size_t off = 0;
        while (off < (size_t)n) {
            /* A whole frame in buf is handled from there: the reader copies only frames split
             * between two reads. */
            struct proto_header h;
            if (proto_reader_idle(rd) && (size_t)n - off >= PROTO_HEADER_LEN) {
                if (proto_header_decode(buf + off, &h) < 0)
                    protocol_fatal("malformed frame header", buf + off);
                if ((size_t)n - off - PROTO_HEADER_LEN >= h.len) {
                    dispatch(&h, buf + off + PROTO_HEADER_LEN, buf + off);
                    off += PROTO_HEADER_LEN + h.len;
                    continue;
                }
            }
            int done;
            size_t used = proto_reader_feed(rd, buf + off, (size_t)n - off, &done);
            if (used == (size_t)-1)
                protocol_fatal("malformed frame header", rd->hdr);
            off += used;
            if (done)
                dispatch(&rd->h, rd->payload, rd->hdr);
        }
    }
    return 0;
}

static void reap(void)
{
    struct signalfd_siginfo si;
    while (read(sigfd, &si, sizeof(si)) > 0)
        ;
    for (;;) {
        int status;
        /* WUNTRACED: a stopped holder must be continued. A stopped command is left alone. */
        pid_t pid = waitpid(-1, &status, WNOHANG | WUNTRACED);
        if (pid <= 0)
            return; /* 0: children left but none exited; -1: ECHILD */
        if (!pidns_reaped(pid, status) && !WIFSTOPPED(status))
            exec_reaped(pid, status);
    }
}

/* ---- set-up ---- */

static void ignore_signal(int sig)
{
    (void)sig;
}

/* Signals the kernel sends for a fault of the thread itself. */
static int fault_signal(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGTRAP ||
           sig == SIGSYS;
}

static void setup(void)
{
    ag.pid = getpid();
    ag.is_init = ag.pid == 1;
    ag.in_fd = 0;
    ag.out_fd = 1;
    ag.holder_mnt = -1;
    ag.holder_root = -1;
    ag.self_pidns = -1;

    if (fcntl(0, F_GETFD) < 0 || fcntl(1, F_GETFD) < 0) {
        log_error(NULL, "agent.no_channel", "error=\"fd 0 and 1 must be the channel\"");
        exit(2);
    }
    if (fcntl(2, F_GETFD) < 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0 && fd != 2) {
            dup2(fd, 2);
            close(fd);
        }
    }
    /* Nothing we inherited should reach the commands. */
    close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);

    /* Caught by a handler that does nothing rather than ignored: an execve puts a caught
     * signal back to SIG_DFL by itself, while SIG_IGN survives it, so each command would have
     * to undo every ignored signal before its exec, a system call each (~60 of them: 60-400 µs
     * of an exec of `true` under gVisor, measured). SA_RESTART: our reads and writes go on; a
     * poll sees EINTR, which the loop expects. */
    struct sigaction nothing = {.sa_handler = ignore_signal, .sa_flags = SA_RESTART};
    sigfillset(&nothing.sa_mask);
    sigemptyset(&ag.ignored);
    sigaction(SIGPIPE, &nothing, NULL);
    if (ag.is_init) {
        /* The sandbox's own processes must not be able to stop the agent, and gVisor does
         * not shield init from signals the way Linux does: every signal that can be caught is
         * caught and dropped (SIGCHLD is taken through the signalfd below). SIGKILL and SIGSTOP
         * cannot be; see docs/protocol.md. The signals of a fault are ignored instead, so that
         * a real fault still kills us (the kernel forces an ignored one; a handler that
         * returned would fault again, forever). */
        for (int sig = 1; sig < NSIG; sig++) {
            if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD)
                continue;
            if (fault_signal(sig)) {
                signal(sig, SIG_IGN);
                sigaddset(&ag.ignored, sig);
            } else {
                sigaction(sig, &nothing, NULL);
            }
        }
        if (mkdir(AGENT_WORKSPACE, 0755) < 0 && errno != EEXIST)
            log_warn(NULL, "agent.workspace", "error=\"%s\"", strerror(errno));
        if (chdir(AGENT_WORKSPACE) < 0)
            log_warn(NULL, "agent.workspace", "error=\"%s\"", strerror(errno));
    } else if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
        log_warn(NULL, "agent.subreaper", "error=\"%s\"", strerror(errno));
    }

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd < 0) {
        log_error(NULL, "agent.signalfd", "error=\"%s\"", strerror(errno));
        exit(2);
    }

    /* Three fds per command: let the cap on requests, not the fd limit, be what binds. */
    getrlimit(RLIMIT_NOFILE, &ag.nofile);
    struct rlimit raised = ag.nofile;
    raised.rlim_cur = raised.rlim_max;
    setrlimit(RLIMIT_NOFILE, &raised);

    fcntl(ag.in_fd, F_SETFL, fcntl(ag.in_fd, F_GETFL) | O_NONBLOCK);
    fcntl(ag.out_fd, F_SETFL, fcntl(ag.out_fd, F_GETFL) | O_NONBLOCK);

    /* Last: the holder inherits the signal set-up above, and its death must reach sigfd. */
    if (ag.is_init) {
        ag.bounding = caps_bounding();
        pidns_init();
    }
}

static void send_hello(void)
{
    struct proto_buf b = {0};
    proto_put_u32(&b, PT_VERSION, PROTO_VERSION);
    proto_put_u32(&b, PT_PID, (uint32_t)ag.pid);
    chan_send_fields(0, PROTO_HELLO, &b);
    proto_buf_free(&b);
}

/* ---- the loop ---- */

int main(int argc, char **argv)
{
    struct proto_reader rd;
    struct pollfd *fds = NULL;
    struct req **owners = NULL;
    size_t cap = 0;
    int timeout = -1;
    uint64_t holder_cont_ms = 0;

    /* Our stderr is a file on the host that a command can make us write to (kill -STOP 1 in a
     * loop): 50 lines at once, then 5 a second (the host caps the file as well). */
    log_set_rate(50, 5);
    /* The same binary is the commands' namespace init (pidns.c), which only the agent starts:
     * PID 1 of a namespace that a command, lacking CAP_SYS_ADMIN, cannot create. */
    if (argc > 0 && !strcmp(argv[0], AGENT_HOLDER_NAME) && getpid() == 1)
        holder_main();
    setup();
    proto_reader_init(&rd);
    send_hello();
    log_info(NULL, "agent.start", "pid=%d init=%d version=%d", (int)ag.pid, ag.is_init,
             PROTO_VERSION);

    for (;;) {
        size_t pending = chan_pending();
        int may_read = pending < AGENT_OUT_SOFT;
        size_t need = 3 + 4 * (size_t)ag.nreqs; /* exec_pollfds: up to 4 each */
        if (need > cap) {
            cap = need * 2;
            fds = xrealloc(fds, cap * sizeof(*fds));
            owners = xrealloc(owners, cap * sizeof(*owners));
        }
        size_t n = 0;
        fds[n] = (struct pollfd){.fd = sigfd, .events = POLLIN};
        owners[n++] = NULL;
        ssize_t in_idx = -1;
        if (pending < AGENT_OUT_HARD) {
            fds[n] = (struct pollfd){.fd = ag.in_fd, .events = POLLIN};
            owners[n] = NULL;
            in_idx = (ssize_t)n++;
        }
        if (pending) {
            /* Only wakes the loop; the flush at the end of each turn does the writing. */
            fds[n] = (struct pollfd){.fd = ag.out_fd, .events = POLLOUT};
            owners[n++] = NULL;
        }
        int jobs = 0;
        for (struct req *r = ag.head; r; r = r->next) {
            if (r->kind == REQ_EXEC)
                exec_pollfds(r, fds, owners, &n, may_read);
            else if (r->kind == REQ_LIST || r->kind == REQ_EXTRACT ||
                     ((r->kind == REQ_READ || r->kind == REQ_ARCHIVE) && req_room(r, 1)))
                jobs = 1; /* a read without credit waits for CREDIT on the channel */
        }
        if (jobs && may_read)
            timeout = 0;

        if (poll(fds, n, timeout) < 0 && errno != EINTR) {
            log_error(NULL, "agent.poll", "error=\"%s\"", strerror(errno));
            agent_exit(1);
        }

        /* Requests are only freed further down, so owners[] stays valid here. */
        for (size_t i = 0; i < n; i++)
            if (owners[i] && fds[i].revents)
                exec_event(owners[i], fds[i].fd, fds[i].revents);
        if (fds[0].revents)
            reap();
        int eof = 0;
        if (in_idx >= 0 && fds[in_idx].revents)
            eof = read_channel(&rd);

        struct req *next;
        for (struct req *r = ag.head; r; r = next) {
            next = r->next;
            if ((r->kind == REQ_READ || r->kind == REQ_LIST) && file_job_step(r)) {
                req_remove(r);
                file_free(r);
            } else if ((r->kind == REQ_ARCHIVE || r->kind == REQ_EXTRACT) && archive_job_step(r)) {
                req_remove(r);
                archive_free(r);
            }
        }
        uint64_t now = now_ms_monotonic();
        timeout = -1;
        /* The holder is continued whenever a stop is reported (pidns_reaped), but a storm of
         * SIGSTOP/SIGCONT from inside can leave it stopped with the report lost (seen under
         * gVisor): then nothing would reap orphans. So it is also continued every second;
         * SIGCONT to a running process does nothing. */
        if (ag.holder > 0) {
            if (now - holder_cont_ms >= HOLDER_CONT_MS) {
                kill(ag.holder, SIGCONT);
                holder_cont_ms = now;
            }
            timeout = HOLDER_CONT_MS;
        }
        for (struct req *r = ag.head; r; r = next) {
            next = r->next;
            if (r->kind == REQ_EXEC && exec_check(r, now, &timeout)) {
                req_remove(r);
                exec_free(r);
            }
        }

        if (chan_flush() < 0) {
            log_info(NULL, "agent.exit", "reason=\"channel closed for writing\"");
            agent_exit(0);
        }
        if (eof) {
            /* Fast teardown: the daemon closed the channel, so nobody will read anything more. */
            log_info(NULL, "agent.exit", "reason=eof");
            agent_exit(0);
        }
    }
}
