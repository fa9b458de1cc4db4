/*
 * Freezing idle sandboxes and thawing them on use; the rules are in idle.h. Everything here
 * runs on the loop thread except the driver calls, which run on the daemon's freezer queue
 * (one thread of its own, so a thaw never waits behind a slow start or a stats read).
 */
#include "daemon/idle.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/command.h"
#include "daemon/daemon.h"
#include "daemon/meter.h"
#include "daemon/sandbox.h"
#include "daemon/work.h"
#include "store/store.h"

int idle_due(uint64_t freeze_after_ms, uint64_t idle_ms, unsigned active, int running_commands)
{
    return freeze_after_ms > 0 && active == 0 && running_commands == 0 &&
           idle_ms >= freeze_after_ms;
}

static int running_commands(const struct sandbox *sb)
{
    int n = 0;
    for (const struct command *c = sb->commands; c; c = c->next)
        n += c->state == CMD_RUNNING;
    return n;
}

struct freezer_job {
    struct sandbox *sb;
    int frozen;      /* what was asked: 1 freeze, 0 thaw */
    const char *why; /* a freeze before the idle period was up: why (the event's reason) */
    int rc;
    uint64_t started_ms;
    struct driver_spec spec;
    struct wr_err err;
};

static void freezer_run(void *p)
{
    struct freezer_job *j = p;
    j->rc = driver_freeze(j->sb->d->driver, &j->spec, j->frozen, &j->err);
}

static void submit(struct sandbox *sb, int frozen, const char *why);

/* A freeze asked for by the pressure check is an event of the sandbox's (a pool entry has no
 * history); a freeze for idleness is too common to record. */
static void frozen_early(struct sandbox *sb, const char *why, unsigned long long ms)
{
    log_info(sb->id, "sandbox.frozen", "ms=%llu reason=%s", ms, why);
    struct wr_err err = {0};
    if (!sb->pooled && store_event_add(sb->d->store, sb->id, "frozen", "running", why, &err) < 0)
        log_error(sb->id, "store.failed", "error=\"%s\"", err.msg);
}

static void freezer_done(void *p)
{
    struct freezer_job *j = p;
    struct sandbox *sb = j->sb;
    uint64_t now = now_ms_monotonic();
    unsigned long long ms = (unsigned long long)(now - j->started_ms);
    sb->freezer_busy = 0;
    if (j->frozen && j->rc == 0) {
        sb->frozen = 1;
        meter_freeze(sb);
        if (j->why)
            frozen_early(sb, j->why, ms);
        else
            log_info(sb->id, "sandbox.frozen", "ms=%llu", ms);
    } else if (j->frozen) {
        /* It stays awake; asked again after another idle period. */
        sb->idle_since_ms = now;
        log_warn(sb->id, "sandbox.freeze_failed", "error=\"%s\"", j->err.msg);
    } else if (j->rc == 0) {
        sb->frozen = 0;
        meter_thaw(sb);
        /* The watchdog counts from now: a PING sent before the freeze is answered now. */
        sb->last_pong_ms = now;
        if (sb->ping_id)
            sb->ping_sent_ms = now;
        log_info(sb->id, "sandbox.thawed", "ms=%llu", ms);
    }
    int thaw_failed = !j->frozen && j->rc < 0;
    if (sandbox_unpark(sb) || sb->unlinked || sb->d->shutting_down) {
        /* Torn down (the driver thaws), gone, or the daemon is stopping it. */
    } else if (thaw_failed && sb->state == SB_RUNNING && sb->conn) {
        char why[WR_ERR_MSG_MAX + 40];
        snprintf(why, sizeof(why), "the sandbox could not be thawed: %s", j->err.msg);
        sandbox_lost(sb, "agent_unresponsive", why);
    } else if (sb->frozen && sb->thaw_wanted && sb->state == SB_RUNNING) {
        submit(sb, 0, NULL); /* something came for it while it was being frozen */
    }
    if (!sb->frozen)
        sb->thaw_wanted = 0;
    sandbox_unref(sb);
    free(j);
}

static void submit(struct sandbox *sb, int frozen, const char *why)
{
    struct daemon *d = sb->d;
    struct freezer_job *j = xcalloc(1, sizeof(*j));
    j->sb = sb;
    sandbox_ref(sb);
    j->frozen = frozen;
    j->why = why;
    j->started_ms = now_ms_monotonic();
    sandbox_spec(sb, &j->spec);
    sb->freezer_busy = 1;
    work_submit(d->wq_freeze, freezer_run, freezer_done, j);
}

/* Whether sb may be frozen now, besides having been idle long enough. */
static int may_freeze(const struct sandbox *sb)
{
    const struct daemon *d = sb->d;
    return d->cfg.freeze_after_ms > 0 && d->driver->freeze && d->wq_freeze && !d->shutting_down &&
           sb->state == SB_RUNNING && !sb->busy && !sb->frozen && !sb->freezer_busy &&
           !sb->create_job && !sb->ping_id && agentconn_alive(sb->conn);
}

/* The agent's answer: how many processes run besides its own. */
static void on_probe(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct sandbox *sb = arg;
    const char *why = sb->freeze_why;
    sb->probe_id = 0;
    sb->freeze_why = NULL;
    if (!h || h->type != PROTO_PONG)
        return; /* the connection died: the sandbox is being lost */
    uint32_t procs = UINT32_MAX;
    struct proto_field f;
    if (proto_find(payload, h->len, PT_PROCS, &f) == 1 && proto_field_u32(&f, &procs) < 0)
        procs = UINT32_MAX;
    uint64_t now = now_ms_monotonic();
    if (procs != 0) {
        /* Something runs (or the agent cannot tell): awake for another idle period. */
        sb->idle_since_ms = now;
        log_debug(sb->id, "sandbox.freeze_skipped", "procs=%lld",
                  procs == UINT32_MAX ? -1LL : (long long)procs);
        return;
    }
    /* Used since the question (a frame went out, or a request is open): not idle after all. */
    if (sb->idle_since_ms != sb->probe_since || agentconn_active(sb->conn) > 0 ||
        running_commands(sb) > 0 || !may_freeze(sb))
        return;
    submit(sb, 1, why);
}

void idle_tick(struct sandbox *sb, uint64_t now_ms)
{
    if (!may_freeze(sb) || sb->probe_id)
        return;
    unsigned active = agentconn_active(sb->conn);
    int cmds = running_commands(sb);
    if (active > 0 || cmds > 0) {
        sb->idle_since_ms = now_ms;
        return;
    }
    uint64_t idle = now_ms > sb->idle_since_ms ? now_ms - sb->idle_since_ms : 0;
    if (!idle_due(sb->d->cfg.freeze_after_ms, idle, active, cmds))
        return;
    sb->probe_since = sb->idle_since_ms;
    sb->freeze_why = NULL;
    sb->probe_id = agentconn_request(sb->conn, PROTO_PING, NULL, 0, on_probe, sb);
}

/* The half of idle the daemon knows without asking the agent: running, nothing in flight
 * (no driver operation, freeze or thaw, PING, request or background command). */
static int quiet(const struct sandbox *sb)
{
    return sb->state == SB_RUNNING && !sb->busy && !sb->freezer_busy && !sb->create_job &&
           !sb->ping_id && !sb->probe_id && agentconn_alive(sb->conn) &&
           agentconn_active(sb->conn) == 0 && running_commands(sb) == 0;
}

/* Least recently used first; the id breaks ties, so the order never depends on the list's. */
static int by_last_use(const void *a, const void *b)
{
    const struct sandbox *x = *(struct sandbox *const *)a, *y = *(struct sandbox *const *)b;
    if (x->idle_since_ms != y->idle_since_ms)
        return x->idle_since_ms < y->idle_since_ms ? -1 : 1;
    return strcmp(x->id, y->id);
}

size_t idle_pick_lru(struct daemon *d, int frozen_too, struct sandbox **out, size_t max)
{
    /* Insertion into out, kept in order and cut at max: the max least recently used of all. */
    size_t n = 0;
    for (struct sandbox *sb = d->sandboxes; sb && max > 0; sb = sb->next) {
        if (!quiet(sb) || (sb->frozen && !frozen_too))
            continue;
        if (n == max && by_last_use(&sb, &out[n - 1]) >= 0)
            continue;
        size_t i = n < max ? n++ : n - 1;
        for (; i > 0 && by_last_use(&sb, &out[i - 1]) < 0; i--)
            out[i] = out[i - 1];
        out[i] = sb;
    }
    return n;
}

int idle_freeze_now(struct sandbox *sb, const char *why)
{
    if (!may_freeze(sb) || !quiet(sb))
        return 0;
    sb->probe_since = sb->idle_since_ms;
    sb->freeze_why = why;
    sb->probe_id = agentconn_request(sb->conn, PROTO_PING, NULL, 0, on_probe, sb);
    if (!sb->probe_id)
        sb->freeze_why = NULL;
    return sb->probe_id != 0;
}

void idle_on_send(void *arg, uint16_t type)
{
    struct sandbox *sb = arg;
    if (type != PROTO_PING)
        sb->idle_since_ms = now_ms_monotonic();
    if (!sb->frozen && !sb->freezer_busy)
        return;
    sb->thaw_wanted = 1;
    if (sb->frozen && !sb->freezer_busy && !sb->parked)
        submit(sb, 0, NULL);
}

void idle_reset(struct sandbox *sb)
{
    sb->frozen = 0;
    sb->thaw_wanted = 0;
    sb->probe_id = 0;
    sb->freeze_why = NULL;
    sb->idle_since_ms = now_ms_monotonic();
}
