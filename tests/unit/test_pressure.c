/*
 * The reaction to memory pressure (daemon/pressure.h, and the idle rule it uses from
 * daemon/idle.h): when the host counts as under pressure (and when no longer), that only idle
 * sandboxes are picked, least recently used first, that each is asked (its agent's process
 * count) and frozen at once with an event saying why, and that nothing more is asked once the
 * pressure is gone. The agents are the other ends of socketpairs this test answers; the driver
 * is a test one that records its freezes.
 */
#include <event2/event.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/command.h"
#include "daemon/daemon.h"
#include "daemon/idle.h"
#include "daemon/pressure.h"
#include "daemon/sandbox.h"
#include "daemon/work.h"
#include "driver/driver.h"
#include "proto/proto.h"
#include "store/store.h"
#include "tap.h"

#define HOST 16000 /* MiB: keeps 1000 (1/16); under pressure below 2000, ends at 3000 or more */

static int test_pressure_on(void)
{
    struct admission_host h = {.mem_available_mib = 8000, .pressure_some = 0, .pressure_full = 0};
    ok(!pressure_on(HOST, &h, 0), "half the host available, no stalls: no pressure");
    h.mem_available_mib = 1999;
    ok(pressure_on(HOST, &h, 0), "below the kept 1/16 plus a margin of 1/16: pressure");
    h.mem_available_mib = 2500;
    ok(!pressure_on(HOST, &h, 0), "above 1/8 available: no pressure yet");
    ok(pressure_on(HOST, &h, 1), "once on, it holds until 3/16 is available again");
    h.mem_available_mib = 3000;
    ok(!pressure_on(HOST, &h, 1), "3/16 available: the pressure is gone");
    h.mem_available_mib = 8000;
    h.pressure_some = 10;
    ok(pressure_on(HOST, &h, 0), "tasks stalled on memory 10%% of the last 10 s: pressure");
    h.pressure_some = 9.9;
    ok(!pressure_on(HOST, &h, 0), "9.9%%: not");
    struct admission_host unknown = {
        .mem_available_mib = -1, .pressure_some = -1, .pressure_full = -1};
    ok(!pressure_on(HOST, &unknown, 1), "nothing known (no MemAvailable, no PSI): never pressure");
    h.mem_available_mib = 0;
    h.pressure_some = 0;
    ok(!pressure_on(0, &h, 0), "host memory unknown: MemAvailable alone says nothing");
    return 0;
}

/* ---- a daemon with five running sandboxes and a driver that records freezes ---- */

static pthread_mutex_t frozen_mu = PTHREAD_MUTEX_INITIALIZER;
static char frozen_ids[8][DRIVER_ID_LEN + 1];
static int nfrozen;

static int rec_freeze(const struct driver_spec *spec, int frozen, struct wr_err *err)
{
    pthread_mutex_lock(&frozen_mu);
    if (frozen && nfrozen < 8)
        snprintf(frozen_ids[nfrozen++], sizeof(frozen_ids[0]), "%s", spec->id);
    pthread_mutex_unlock(&frozen_mu);
    return 0;
}

static const struct driver_ops rec_driver = {.name = "rec", .freeze = rec_freeze};

static struct daemon d;
static struct sandbox sbs[5];
static int agents[5]; /* the agents' ends */

static void on_state(void *arg, int up, const char *reason)
{
}

static void on_exec(void *arg, const struct proto_header *h, const uint8_t *payload)
{
}

static void pump(void)
{
    for (int i = 0; i < 20; i++) {
        usleep(1000);
        event_base_loop(d.base, EVLOOP_NONBLOCK);
    }
}

static void put_frame(int fd, uint32_t id, uint16_t type, const struct proto_buf *f)
{
    struct proto_buf b = {0};
    proto_frame_build(&b, id, type, 0, f ? f->data : NULL, f ? f->len : 0);
    (void)!write_all(fd, b.data, b.len);
    proto_buf_free(&b);
}

/* Answers the PING waiting on agent i's end, if any, with procs processes besides the agent.
 * Returns 1 if there was one. */
static int answer(int i, uint32_t procs)
{
    uint8_t hb[PROTO_HEADER_LEN];
    struct proto_header h = {0};
    if (recv(agents[i], hb, sizeof(hb), MSG_DONTWAIT) != (ssize_t)sizeof(hb) ||
        proto_header_decode(hb, &h) < 0 || h.type != PROTO_PING)
        return 0;
    uint8_t skip[256];
    if (h.len > sizeof(skip) || read_full(agents[i], skip, h.len) != (ssize_t)h.len)
        return 0;
    struct proto_buf f = {0};
    proto_put_u32(&f, PT_PROCS, procs);
    put_frame(agents[i], h.id, PROTO_PONG, &f);
    proto_buf_free(&f);
    return 1;
}

static void add_sandbox(int i, uint64_t last_use)
{
    struct sandbox *sb = &sbs[i];
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    agents[i] = sv[1];
    sb->d = &d;
    sb->refs = 1;
    snprintf(sb->id, sizeof(sb->id), "sb-test%d", i);
    sb->state = SB_RUNNING;
    sb->conn = agentconn_new(d.base, sv[0], 5000, on_state, sb);
    struct proto_buf f = {0};
    proto_put_u32(&f, PT_VERSION, PROTO_VERSION);
    proto_put_u32(&f, PT_PID, 1);
    put_frame(agents[i], 0, PROTO_HELLO, &f);
    proto_buf_free(&f);
    agentconn_on_send(sb->conn, idle_on_send, sb);
    sb->idle_since_ms = last_use;
    sb->next = d.sandboxes;
    d.sandboxes = sb;
    d.nsandboxes++;
}

static int was_frozen(const char *id)
{
    for (int i = 0; i < nfrozen; i++)
        if (strcmp(frozen_ids[i], id) == 0)
            return 1;
    return 0;
}

static int event_reason(void *arg, int64_t at, const char *type, const char *state,
                        const char *reason)
{
    if (strcmp(type, "frozen") == 0 && strcmp(state, "running") == 0)
        snprintf(arg, 32, "%s", reason);
    return 0;
}

static void test_freeze_under_pressure(const char *dir)
{
    struct wr_err err = {0};
    char db[256];
    snprintf(db, sizeof(db), "%s/db", dir);
    d.store = store_open(db, &err);
    ok(d.store != NULL, "store_open (%s)", err.msg);
    d.base = event_base_new();
    d.wq_freeze = work_queue_new(d.base, 1);
    d.driver = &rec_driver;
    d.cfg.freeze_after_ms = 3600 * 1000; /* an hour: no freeze comes from idleness here */
    d.host_memory_mib = HOST;
    uint64_t now = now_ms_monotonic();
    /* Last used (oldest first): 3, 0, 4, 1, 2. */
    add_sandbox(0, now - 4000);
    add_sandbox(1, now - 2000);
    add_sandbox(2, now - 1000);
    add_sandbox(3, now - 5000);
    add_sandbox(4, now - 3000);
    pump();
    /* Busy: 1 runs a background command, 2 has a request open (an exec). */
    struct command cmd = {.state = CMD_RUNNING};
    sbs[1].commands = &cmd;
    ok(agentconn_request(sbs[2].conn, PROTO_EXEC, NULL, 0, on_exec, NULL) != 0, "an exec on 2");
    (void)!answer(2, 0); /* drains nothing: the EXEC is not a PING */

    struct sandbox *pick[5];
    size_t n = idle_pick_lru(&d, 0, pick, 5);
    ok(n == 3 && pick[0] == &sbs[3] && pick[1] == &sbs[0] && pick[2] == &sbs[4],
       "the idle ones, least recently used first: 3, 0, 4 (got %zu: %s %s %s)", n,
       n > 0 ? pick[0]->id : "", n > 1 ? pick[1]->id : "", n > 2 ? pick[2]->id : "");
    n = idle_pick_lru(&d, 0, pick, 2);
    ok(n == 2 && pick[0] == &sbs[3] && pick[1] == &sbs[0],
       "at most max of them: the max least recently used of all (3, 0)");
    sbs[4].frozen = 1;
    n = idle_pick_lru(&d, 1, pick, 5);
    ok(n == 3 && pick[2] == &sbs[4], "frozen ones too when asked (the seam pause will use)");
    ok(idle_pick_lru(&d, 0, pick, 5) == 2, "else not");
    sbs[4].frozen = 0;

    struct admission_host roomy = {.mem_available_mib = 8000, .pressure_some = 0};
    struct admission_host short_ = {.mem_available_mib = 500, .pressure_some = 0};
    ok(pressure_check(&d, &roomy) == 0 && !d.memory_pressure, "no pressure: nothing asked");
    ok(pressure_check(&d, &short_) == 3 && d.memory_pressure,
       "under pressure: each idle sandbox asked at once, long before --freeze-after");
    ok(pressure_check(&d, &short_) == 0, "a sandbox already asked is not asked again");
    pump();
    /* 4 has a process of its own besides the agent (a leftover): it stays awake. */
    ok(answer(3, 0) && answer(0, 0) && answer(4, 1), "the three agents got the question");
    ok(!answer(1, 0) && !answer(2, 0), "the busy ones were not asked");
    for (int i = 0; i < 200 && nfrozen < 2; i++)
        pump();
    pump();
    ok(nfrozen == 2 && was_frozen("sb-test3") && was_frozen("sb-test0"),
       "the idle ones with nothing running are frozen (%d)", nfrozen);
    ok(sbs[3].frozen && sbs[0].frozen && !sbs[4].frozen && !sbs[1].frozen && !sbs[2].frozen,
       "frozen: 3 and 0; awake: 4 (a process runs), 1 and 2 (busy)");
    char reason[32] = "";
    store_event_foreach(d.store, "sb-test3", 10, event_reason, reason, &err);
    ok(strcmp(reason, "memory_pressure") == 0, "its events say it was frozen for memory_pressure");

    /* The pressure ends: 4, idle again, is no longer asked. */
    sbs[4].idle_since_ms = now_ms_monotonic() - 10000;
    ok(pressure_check(&d, &roomy) == 0 && !d.memory_pressure,
       "the pressure is gone: nothing more is asked");
    pump();
    ok(!answer(4, 0), "no question went to 4");
    short_.mem_available_mib = 2500; /* above where it starts, below where it would end */
    ok(pressure_check(&d, &short_) == 0 && !d.memory_pressure, "not yet back at the start mark");

    /* --freeze-after 0 turns freezing off, under pressure too. */
    d.cfg.freeze_after_ms = 0;
    short_.mem_available_mib = 500;
    ok(pressure_check(&d, &short_) == 0, "--freeze-after 0: nothing is frozen, pressure or not");

    sbs[1].commands = NULL;
    for (int i = 0; i < 5; i++) {
        agentconn_close(sbs[i].conn, "test over");
        close(agents[i]);
    }
    work_queue_free(d.wq_freeze);
    store_close(d.store);
    event_base_free(d.base);
}

int main(void)
{
    test_pressure_on();
    char dir[] = "/tmp/wr-test-pressure-XXXXXX";
    ok(mkdtemp(dir) != NULL, "temp dir");
    test_freeze_under_pressure(dir);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
    return tap_done();
}
