/*
 * Unit tests for the SQLite store (src/store): sandbox rows and their event history survive a
 * reopen, walks stop when asked, and the fault points fail the way SQLite would.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fault.h"
#include "store/store.h"
#include "tap.h"

struct rows {
    int n;
    char ids[8][32];
    char states[8][16];
    char docs[8][64];
    int stop_after;
};

static int collect(void *arg, const char *id, const char *state, const char *doc)
{
    struct rows *r = arg;
    if (r->n < 8) {
        snprintf(r->ids[r->n], sizeof(r->ids[0]), "%s", id);
        snprintf(r->states[r->n], sizeof(r->states[0]), "%s", state);
        snprintf(r->docs[r->n], sizeof(r->docs[0]), "%s", doc);
    }
    r->n++;
    return r->stop_after && r->n >= r->stop_after;
}

struct events {
    int n;
    char last_type[16], last_state[16], last_reason[32];
    int null_reason;
};

static int collect_event(void *arg, int64_t at, const char *type, const char *state,
                         const char *reason)
{
    struct events *e = arg;
    e->n++;
    snprintf(e->last_type, sizeof(e->last_type), "%s", type);
    snprintf(e->last_state, sizeof(e->last_state), "%s", state ? state : "(null)");
    snprintf(e->last_reason, sizeof(e->last_reason), "%s", reason ? reason : "(null)");
    e->null_reason += !reason;
    return 0;
}

static void arm(const char *spec)
{
    setenv("WR_FAULTS", spec, 1);
    fault_reset();
}

struct audit_seen {
    int n;
    int64_t first_seq, last_seq;
    char first_route[64];
};

static int collect_audit(void *arg, int64_t seq, const struct store_audit *a)
{
    struct audit_seen *w = arg;
    if (w->n++ == 0) {
        w->first_seq = seq;
        snprintf(w->first_route, sizeof(w->first_route), "%s", a->route);
    }
    w->last_seq = seq;
    return 0;
}

/* Batches go in whole and in order, and the trail is trimmed to about STORE_AUDIT_KEPT. */
static void test_audit(struct store *s)
{
    struct wr_err err = {0};
    enum { BATCH = 256 };
    static char routes[BATCH][32];
    struct store_audit a[BATCH];
    for (int i = 0; i < BATCH; i++) {
        snprintf(routes[i], sizeof(routes[i]), "/v1/route/%d", i);
        a[i] = (struct store_audit){.at_ms = 1000 + i,
                                    .key_id = "",
                                    .method = "POST",
                                    .route = routes[i],
                                    .sandbox_id = "",
                                    .status = 200};
    }
    ok(store_audit_add(s, a, 3, &err) == 0, "a batch of 3: %s", err.msg);
    struct audit_seen w = {0};
    ok(store_audit_foreach(s, INT64_MAX, 10, collect_audit, &w, &err) == 0 && w.n == 3 &&
           !strcmp(w.first_route, "/v1/route/2") && w.first_seq == 3 && w.last_seq == 1,
       "newest first, in the batch's order: n=%d first=%s", w.n, w.first_route);
    ok(store_audit_add(s, a, 0, &err) == 0, "an empty batch is nothing");

    arm("store.audit=ENOSPC:1");
    ok(store_audit_add(s, a, BATCH, &err) < 0 && strstr(err.msg, "full"), "store.audit: %s",
       err.msg);
    arm("");
    err = (struct wr_err){0};
    struct audit_seen w2 = {0};
    ok(store_audit_foreach(s, INT64_MAX, BATCH, collect_audit, &w2, &err) == 0 && w2.n == 3,
       "a failed batch adds nothing");

    /* Past STORE_AUDIT_KEPT, the oldest go: the trail stays within a batch of it. */
    int batches = STORE_AUDIT_KEPT / BATCH + 3;
    int failed = 0;
    for (int b = 0; b < batches && !failed; b++)
        failed = store_audit_add(s, a, BATCH, &err) < 0;
    struct audit_seen w3 = {0};
    ok(!failed && store_audit_foreach(s, INT64_MAX, STORE_AUDIT_KEPT + 2 * BATCH, collect_audit,
                                      &w3, &err) == 0,
       "%d batches: %s", batches, err.msg);
    int64_t total = 3 + (int64_t)batches * BATCH;
    ok(w3.first_seq == total && w3.n >= STORE_AUDIT_KEPT && w3.n <= STORE_AUDIT_KEPT + BATCH,
       "trimmed to about %d: %d kept, the newest %lld", STORE_AUDIT_KEPT, w3.n,
       (long long)w3.first_seq);
}

int main(void)
{
    char dir[] = "/tmp/wr-test-store-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char path[128];
    snprintf(path, sizeof(path), "%s/wr.db", dir);
    struct wr_err err = {0};
    unsetenv("WR_FAULTS_FILE");
    arm("");

    struct store *s = store_open(path, &err);
    ok(s != NULL, "open creates the database (%s)", err.msg);
    if (!s)
        return tap_done();
    ok(store_sandbox_put(s, "sb-b", "running", "{\"v\":1}", &err) == 0, "put");
    ok(store_sandbox_put(s, "sb-a", "creating", "{\"v\":2}", &err) == 0, "put another");
    ok(store_sandbox_put(s, "sb-b", "stopped", "{\"v\":3}", &err) == 0, "put replaces");
    struct rows r = {0};
    ok(store_sandbox_foreach(s, collect, &r, &err) == 0 && r.n == 2, "two rows");
    ok(!strcmp(r.ids[0], "sb-b") && !strcmp(r.ids[1], "sb-a"),
       "oldest first, and a replace keeps its place");
    ok(!strcmp(r.states[0], "stopped") && !strcmp(r.docs[0], "{\"v\":3}"),
       "a replace updates state and doc");
    struct rows r1 = {.stop_after = 1};
    ok(store_sandbox_foreach(s, collect, &r1, &err) == 0 && r1.n == 1, "a walk stops when asked");

    ok(store_event_add(s, "sb-a", "state", "running", "created", &err) == 0, "event");
    ok(store_event_add(s, "sb-a", "deleted", NULL, NULL, &err) == 0, "event with NULLs");
    ok(store_event_add(s, "sb-b", "state", "failed", "x", &err) == 0, "other sandbox's event");
    struct events e = {0};
    ok(store_event_foreach(s, "sb-a", 100, collect_event, &e, &err) == 0 && e.n == 2,
       "events of one sandbox");
    ok(!strcmp(e.last_type, "deleted") && e.null_reason == 1, "in order, NULLs kept");
    struct events e1 = {0};
    ok(store_event_foreach(s, "sb-a", 1, collect_event, &e1, &err) == 0 && e1.n == 1 &&
           !strcmp(e1.last_reason, "created"),
       "limit");

    ok(store_sandbox_delete(s, "sb-a", &err) == 0, "delete");
    ok(store_sandbox_delete(s, "sb-missing", &err) == 0, "deleting a missing row succeeds");
    struct events e2 = {0};
    store_event_foreach(s, "sb-a", 100, collect_event, &e2, &err);
    ok(e2.n == 2, "a deleted sandbox's events stay");

    /* A sandbox's history keeps its newest STORE_EVENTS_KEPT events. */
    int added = 0;
    for (int i = 0; i < STORE_EVENTS_KEPT + 50; i++)
        added +=
            store_event_add(s, "sb-many", "state", "running", i < 50 ? "old" : "new", &err) == 0;
    struct events e3 = {0};
    ok(added == STORE_EVENTS_KEPT + 50 &&
           store_event_foreach(s, "sb-many", STORE_EVENTS_KEPT * 2, collect_event, &e3, &err) ==
               0 &&
           e3.n == STORE_EVENTS_KEPT,
       "events per sandbox are bounded (%d kept)", e3.n);
    struct events e4 = {0};
    store_event_foreach(s, "sb-many", 1, collect_event, &e4, &err);
    ok(!strcmp(e4.last_reason, "new"), "the oldest ones went");
    struct events e5 = {0};
    store_event_foreach(s, "sb-b", 100, collect_event, &e5, &err);
    ok(e5.n == 1, "other sandboxes' events are untouched");

    /* Fault points: the errors SQLite would give. */
    arm("store.put=EBUSY:1,store.event=ENOSPC:1,store.delete=EIO:1,store.list=EBUSY:1");
    wr_err_clear(&err);
    ok(store_sandbox_put(s, "sb-c", "running", "{}", &err) < 0 && err.code == EBUSY &&
           strstr(err.msg, "database is locked") && strstr(err.msg, "store.put"),
       "store.put: %s", err.msg);
    ok(store_event_add(s, "sb-c", "state", "running", "r", &err) < 0 &&
           strstr(err.msg, "database or disk is full"),
       "store.event: %s", err.msg);
    ok(store_sandbox_delete(s, "sb-b", &err) < 0 && err.code == EIO, "store.delete: %s", err.msg);
    struct rows r2 = {0};
    ok(store_sandbox_foreach(s, collect, &r2, &err) < 0 && r2.n == 0, "store.list");
    struct rows r3 = {0};
    ok(store_sandbox_foreach(s, collect, &r3, &err) == 0 && r3.n == 1 && !strcmp(r3.ids[0], "sb-b"),
       "after the faults: nothing changed by the failed operations");
    store_close(s);

    arm("store.open=EBUSY:1");
    ok(store_open(path, &err) == NULL && strstr(err.msg, "database is locked"), "store.open: %s",
       err.msg);
    arm("");
    s = store_open(path, &err);
    struct rows r4 = {0};
    ok(s && store_sandbox_foreach(s, collect, &r4, &err) == 0 && r4.n == 1,
       "a reopen sees what was stored");
    store_close(s);
    store_close(NULL);

    s = store_open(path, &err);
    test_audit(s);
    store_close(s);

    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ok(system(cmd) == 0, "cleanup");
    unsetenv("WR_FAULTS");
    return tap_done();
}
