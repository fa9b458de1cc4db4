/*
 * Sandbox records and their create/delete sequences. Driver calls run on
 * worker threads (work.c); everything else, including every state change,
 * happens on the loop thread, so a sandbox needs no lock.
 */
#include "daemon/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/ids.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/command.h"
#include "daemon/idle.h"
#include "daemon/keys.h"
#include "daemon/meter.h"
#include "daemon/metrics.h"
#include "daemon/netlog.h"
#include "daemon/session.h"
#include "daemon/work.h"
#include "net/gateway.h"
#include "store/store.h"

#define PING_EVERY_MS 5000
#define WATCHDOG_MS 20000

const char *const sandbox_state_names[] = {"creating", "running",  "stopped",  "failed",
                                           "deleting", "stopping", "starting", NULL};

const char *const sandbox_reason_names[] = {"user",
                                            "created",
                                            "lease_ended",
                                            "agent_died",
                                            "agent_unresponsive",
                                            "oom",
                                            "daemon_shutdown",
                                            "daemon_restart",
                                            "create_failed",
                                            "start_failed",
                                            "stop_failed",
                                            "delete_failed",
                                            "retention_ended",
                                            "pruned",
                                            "cost_cap",
                                            "daily_limit",
                                            "memory_pressure",
                                            NULL};

const char *sandbox_state_name(enum sb_state s)
{
    return (unsigned)s < WR_ARRAY_LEN(sandbox_state_names) - 1 ? sandbox_state_names[s] : "unknown";
}

int sandbox_state_parse(const char *name)
{
    for (size_t i = 0; sandbox_state_names[i]; i++)
        if (strcmp(name, sandbox_state_names[i]) == 0)
            return (int)i;
    return -1;
}

_Static_assert(DRIVER_ID_LEN == SB_ID_LEN, "a sandbox id is the driver's container id");

void sandbox_new_id(char *out)
{
    static const char b32[] = SB_ID_ALPHABET;
    _Static_assert(sizeof(b32) == 33, "32 characters: 5 bits each");
    uint8_t rnd[SB_ID_LEN - sizeof(SB_ID_PREFIX) + 1];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read_full(fd, rnd, sizeof(rnd)) != (ssize_t)sizeof(rnd))
        abort(); /* no randomness: ids could collide, refuse to go on */
    close(fd);
    size_t plen = sizeof(SB_ID_PREFIX) - 1;
    memcpy(out, SB_ID_PREFIX, plen);
    for (size_t i = 0; i < sizeof(rnd); i++)
        out[plen + i] = b32[rnd[i] & 31];
    out[SB_ID_LEN] = '\0';
}

struct sandbox *sandbox_new(struct daemon *d)
{
    struct sandbox *sb = xcalloc(1, sizeof(*sb));
    sb->d = d;
    sb->refs = 1;
    sb->state = SB_CREATING;
    snprintf(sb->image, sizeof(sb->image), "default");
    sb->cpus = 2;
    sb->memory_mib = 4096;
    sb->disk_mib = d->cfg.default_disk_mib;
    sb->timeout_seconds = d->cfg.default_timeout;
    snprintf(sb->on_lease_end, sizeof(sb->on_lease_end), "stop");
    sb->env = json_object();
    sb->metadata = json_object();
    sb->network = json_pack("{s:b}", "internet", 0);
    sb->secrets = json_object();
    sb->net_slot = -1;
    sb->max_cost_micros = -1;
    return sb;
}

static void sandbox_free(struct sandbox *sb)
{
    meter_end(sb); /* gives back a reservation a create that never ran still held */
    command_free_all(sb);
    session_free_all(sb);
    json_decref(sb->env);
    json_decref(sb->metadata);
    json_decref(sb->network);
    netlog_free(sb->netlog);
    json_decref(sb->secrets);
    free(sb);
}

void sandbox_ref(struct sandbox *sb)
{
    sb->refs++;
}

void sandbox_unref(struct sandbox *sb)
{
    if (--sb->refs == 0)
        sandbox_free(sb);
}

/* The daemon's list holds its own reference. */
static void link_sandbox(struct daemon *d, struct sandbox *sb)
{
    sandbox_ref(sb);
    sb->next = d->sandboxes;
    d->sandboxes = sb;
    d->nsandboxes++;
}

static void unlink_sandbox(struct sandbox *sb);

/* A sandbox the driver has destroyed: out of the store (its events stay), out of the list. */
static void sandbox_forget(struct sandbox *sb, const char *reason)
{
    struct wr_err err = {0};
    if (store_sandbox_delete(sb->d->store, sb->id, &err) < 0)
        log_error(sb->id, "store.failed", "error=\"%s\"", err.msg);
    if (!sb->pooled) {
        store_event_add(sb->d->store, sb->id, "deleted", "deleted", reason, NULL);
        metrics_add(MC_DELETES, 1);
    }
    unlink_sandbox(sb);
}

/* Removes sb from the daemon's list and drops the list's reference. */
static void unlink_sandbox(struct sandbox *sb)
{
    struct daemon *d = sb->d;
    for (struct sandbox **p = &d->sandboxes; *p; p = &(*p)->next) {
        if (*p == sb) {
            *p = sb->next;
            d->nsandboxes--;
            sb->unlinked = 1;
            sandbox_unref(sb);
            return;
        }
    }
}

struct sandbox *sandbox_find(struct daemon *d, const char *id)
{
    for (struct sandbox *sb = d->sandboxes; sb; sb = sb->next)
        if (strcmp(sb->id, id) == 0)
            return sb;
    return NULL;
}

json_t *sandbox_to_json(const struct sandbox *sb)
{
    char created[32], lease[32];
    format_rfc3339(sb->created_at, created, sizeof(created));
    format_rfc3339((sb->lease_ends_ms + 999) / 1000, lease, sizeof(lease));
    json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:O, s:O, s:i, s:s, s:O, s:s, s:s}", "id",
                          sb->id, "state", sandbox_state_name(sb->state), "image", sb->image,
                          "cpus", sb->cpus, "memory_mib", sb->memory_mib, "disk_mib", sb->disk_mib,
                          "env", sb->env, "metadata", sb->metadata, "timeout_seconds",
                          sb->timeout_seconds, "on_lease_end", sb->on_lease_end, "network",
                          sb->network, "created_at", created, "lease_ends_at", lease);
    json_t *names = json_array();
    const char *name;
    json_t *ph;
    json_object_foreach(sb->secrets, name, ph)
    {
        json_array_append_new(names, json_string(name));
    }
    json_object_set_new(o, "secrets", names);
    json_object_set_new(o, "key_id", sb->key_id[0] ? json_string(sb->key_id) : json_null());
    json_object_set_new(o, "max_cost_micros",
                        sb->max_cost_micros >= 0 ? json_integer(sb->max_cost_micros) : json_null());
    json_object_set_new(o, "cost_micros", json_integer(sb->cost_micros));
    json_object_set_new(o, "frozen", json_boolean(sb->frozen && sb->state == SB_RUNNING));
    if (sb->reason[0] &&
        (sb->state == SB_FAILED || sb->state == SB_STOPPED || sb->state == SB_STOPPING))
        json_object_set_new(o, "state_reason", json_string(sb->reason));
    if (sb->detail[0] && sb->state == SB_FAILED) {
        json_t *dt = json_string(sb->detail);
        json_object_set_new(o, "state_detail", dt ? dt : json_string("(not valid UTF-8)"));
    }
    return o;
}

/* The stored document: the API object plus what only the daemon needs. */
static char *sandbox_doc(const struct sandbox *sb)
{
    json_t *o = sandbox_to_json(sb);
    json_object_set_new(o, "created_unix", json_integer(sb->created_at));
    json_object_set_new(o, "state_since_unix", json_integer(sb->state_since));
    json_object_set_new(o, "lease_ends_ms", json_integer(sb->lease_ends_ms));
    json_object_set_new(o, "reason", json_string(sb->reason));
    json_object_set_new(o, "detail", json_string(sb->detail));
    json_object_set_new(o, "rootfs", json_string(sb->rootfs));
    json_object_set(o, "secret_placeholders", sb->secrets);
    if (sb->pooled)
        json_object_set_new(o, "pooled", json_true());
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Saves the sandbox's document. Returns 0, or -1 with err set (and logged). */
static int persist(struct sandbox *sb, struct wr_err *err)
{
    char *doc = sandbox_doc(sb);
    int rc = doc ? store_sandbox_put(sb->d->store, sb->id, sandbox_state_name(sb->state), doc, err)
                 : wr_err_set(err, ENOMEM, "cannot encode the sandbox's record");
    if (rc < 0)
        log_error(sb->id, "store.failed", "error=\"%s\"", err->msg);
    free(doc);
    return rc;
}

void sandbox_persist(struct sandbox *sb)
{
    struct wr_err err = {0};
    persist(sb, &err);
}

/* Sets state, reason and detail, records the event, logs. Does not persist. */
static void change_state(struct sandbox *sb, enum sb_state st, const char *reason,
                         const char *detail)
{
    enum sb_state was = sb->state;
    sb->state = st;
    if (st != SB_RUNNING)
        sb->memory_used_mib = 0; /* a reading belongs to one run */
    sb->state_since = now_unix();
    /* Money: metered while running; leaving for anything but a start gives its reservation
     * back (creating and starting hold the one their admission took). */
    if (st == SB_RUNNING && was != SB_RUNNING && !sb->pooled)
        meter_begin(sb);
    else if (st != SB_RUNNING && st != SB_CREATING && st != SB_STARTING)
        meter_end(sb);
    snprintf(sb->reason, sizeof(sb->reason), "%s", reason ? reason : "");
    snprintf(sb->detail, sizeof(sb->detail), "%s", detail ? detail : "");
    struct wr_err err = {0};
    /* A pool entry has no history: a claimed one's begins at its claim. */
    if (!sb->pooled && store_event_add(sb->d->store, sb->id, "state", sandbox_state_name(st),
                                       sb->reason, &err) < 0)
        log_error(sb->id, "store.failed", "error=\"%s\"", err.msg);
    if (st == SB_FAILED) {
        log_error(sb->id, "sandbox.state", "state=failed reason=%s detail=\"%s\"", sb->reason,
                  sb->detail);
        if (!sb->pooled)
            metrics_failed(sb->reason);
    } else
        log_info(sb->id, "sandbox.state", "state=%s reason=\"%s\"", sandbox_state_name(st),
                 sb->reason);
}

void sandbox_set_state(struct sandbox *sb, enum sb_state st, const char *reason)
{
    change_state(sb, st, reason, NULL);
    sandbox_persist(sb);
}

void sandbox_claimed(struct sandbox *sb)
{
    sb->pooled = 0;
    change_state(sb, SB_CREATING, "user", NULL);
    change_state(sb, SB_RUNNING, "created", NULL);
    sandbox_persist(sb);
}

void sandbox_set_failed(struct sandbox *sb, const char *reason, const char *detail)
{
    change_state(sb, SB_FAILED, reason, detail);
    sandbox_persist(sb);
}

struct sandbox *sandbox_lookup(struct daemon *d, const char *id, const struct principal *who,
                               struct wr_err *err)
{
    struct sandbox *sb = sb_id_valid(id) ? sandbox_find(d, id) : NULL;
    if (sb && (sb->pooled || !principal_sees(who, sb->key_id)))
        sb = NULL; /* another key's: the same answer as none at all */
    if (!sb)
        wr_err_kind(err, WR_E_NOT_FOUND, 0, "sandbox %.64s not found", id);
    return sb;
}

int sandbox_check_running(const struct sandbox *sb, struct wr_err *err)
{
    if (sb->state == SB_RUNNING && agentconn_alive(sb->conn))
        return 0;
    if (sb->state == SB_STOPPED && strcmp(sb->reason, "cost_cap") == 0)
        return wr_err_kind(err, WR_E_COST_LIMIT, 0,
                           "sandbox %s was stopped at its max_cost_micros (%lld micro-dollars; "
                           "it cost %lld): it does not run again; its files are kept until it "
                           "is deleted",
                           sb->id, (long long)sb->max_cost_micros, (long long)sb->cost_micros);
    if (sb->state == SB_STOPPED && strcmp(sb->reason, "daily_limit") == 0)
        return wr_err_kind(err, WR_E_COST_LIMIT, 0,
                           "sandbox %s was stopped at its key's daily spending limit (key %s); "
                           "start it again once the limit allows (the next UTC day, or when the "
                           "admin raises it)",
                           sb->id, sb->key_id);
    if (sb->state == SB_STOPPED)
        return wr_err_kind(err, WR_E_CONFLICT, 0,
                           "sandbox %s is stopped (%s): start it again first", sb->id,
                           sb->reason[0] ? sb->reason : "stopped");
    if (sb->state == SB_FAILED)
        return wr_err_kind(err, WR_E_CONFLICT, 0,
                           "sandbox %s has failed (%s%s%s): start it again, or delete it", sb->id,
                           sb->reason, sb->detail[0] ? ": " : "", sb->detail);
    return wr_err_kind(err, WR_E_CONFLICT, 0, "sandbox %s is %s, not running", sb->id,
                       sandbox_state_name(sb->state));
}

int sandbox_check_idle(const struct sandbox *sb, struct wr_err *err)
{
    if (!sb->busy && sb->state != SB_CREATING && sb->state != SB_DELETING &&
        sb->state != SB_STOPPING && sb->state != SB_STARTING)
        return 0;
    return wr_err_kind(err, WR_E_CONFLICT, 0, "sandbox %s is %s; try again in a moment", sb->id,
                       sandbox_state_name(sb->state));
}

void sandbox_set_lease(struct sandbox *sb, int timeout_seconds)
{
    sb->timeout_seconds = timeout_seconds;
    sb->lease_ends_ms = now_ms_wall() + (int64_t)timeout_seconds * 1000;
    sandbox_persist(sb);
    log_info(sb->id, "lease.set", "timeout_seconds=%d", timeout_seconds);
}

void sandbox_set_network(struct sandbox *sb, json_t *policy)
{
    json_decref(sb->network);
    sb->network = json_deep_copy(policy);
    sandbox_persist(sb);
    char *text = json_dumps(policy, JSON_COMPACT);
    log_info(sb->id, "network.set", "policy=%s", text ? text : "?");
    free(text);
    /* Open connections too, not only the next ones: a tightened policy must not leave a
     * download or a kept-alive connection to a host it now forbids. */
    if (sb->net_slot >= 0)
        gateway_slot_policy_changed(sb->d->gw, sb->net_slot);
}

void sandbox_spec(const struct sandbox *sb, struct driver_spec *spec)
{
    memset(spec, 0, sizeof(*spec));
    spec->id = sb->id;
    spec->dir = sb->dir;
    spec->image_rootfs = sb->rootfs;
    spec->agent_path = sb->d->cfg.agent_path;
    spec->cpus = sb->cpus;
    spec->memory_mib = sb->memory_mib;
    spec->pids_max = sb->d->cfg.pids_max;
    spec->disk_mib = sb->disk_mib;
    spec->extra_ca_pem = sb->d->extra_ca_pem;
}

/* ---- driver jobs ---- */

enum job_kind { JOB_START, JOB_STOP, JOB_DESTROY, JOB_STATS };

struct sandbox_job {
    struct sandbox *sb;
    enum job_kind kind;
    struct driver_spec spec;
    int rc;
    int fd;
    struct wr_err err;
    uint64_t started_ms;
    sandbox_done_cb done;
    void *arg;
    int is_create;   /* a failed start removes everything (create) or keeps the files (start) */
    char reason[32]; /* the reason the finished state will carry */
    char failure[WR_ERR_MSG_MAX]; /* for create: why it failed, kept across the cleanup */
    struct driver_stats stats;    /* JOB_STATS */
    sandbox_stats_cb stats_done;
    /* The gateway slot this job holds (-1: none): a start's until the agent says HELLO, when it
     * passes to the sandbox; a stop's or destroy's, taken from the sandbox. job_free gives it
     * back, after the worker has unplumbed it. */
    int net_slot;
    int dns_fd;          /* a start's resolver socket, until the slot is activated */
    work_fn parked_done; /* parked behind a freeze or thaw (submit_teardown) */
};

/* Worker: the sandbox's network namespace for this start, made and joined to the gateway. */
static int start_with_network(struct sandbox_job *j, const struct driver_ops *drv)
{
    struct gateway *gw = j->sb->d->gw;
    int nsfd = -1;
    if (gateway_plumb(gw, j->net_slot, &nsfd, &j->dns_fd, j->spec.nameserver, &j->err) < 0)
        return -1;
    j->spec.netns_fd = nsfd;
    int rc = driver_start(drv, &j->spec, &j->fd, &j->err);
    /* runsc's processes hold the namespace now; the daemon needs only the gateway's end. */
    close(nsfd);
    j->spec.netns_fd = -1;
    if (rc < 0) {
        struct wr_err e;
        if (gateway_unplumb(gw, j->net_slot, &e) < 0)
            log_warn(j->sb->id, "network.unplumb_failed", "error=\"%s\"", e.msg);
    }
    return rc;
}

static void job_run(void *p)
{
    struct sandbox_job *j = p;
    const struct driver_ops *drv = j->sb->d->driver;
    j->fd = -1;
    switch (j->kind) {
    case JOB_START:
        j->rc = j->net_slot >= 0 ? start_with_network(j, drv)
                                 : driver_start(drv, &j->spec, &j->fd, &j->err);
        break;
    case JOB_STOP: j->rc = driver_stop(drv, &j->spec, &j->err); break;
    case JOB_DESTROY: j->rc = driver_destroy(drv, &j->spec, &j->err); break;
    case JOB_STATS: j->rc = driver_stats(drv, &j->spec, &j->stats, &j->err); break;
    }
    if ((j->kind == JOB_STOP || j->kind == JOB_DESTROY) && j->net_slot >= 0) {
        struct wr_err e;
        if (gateway_unplumb(j->sb->d->gw, j->net_slot, &e) < 0)
            log_warn(j->sb->id, "network.unplumb_failed", "error=\"%s\"", e.msg);
    }
}

/*
 * Queues a stop or destroy job (j->sb is busy). While a freeze or thaw of it is on a worker the
 * job waits for that to finish (sandbox_unpark), so the two never race on its cgroup. The driver
 * thaws before it kills: the sandbox counts as awake from here.
 */
static void submit_teardown(struct sandbox_job *j, work_fn done)
{
    struct sandbox *sb = j->sb;
    sb->frozen = 0;
    sb->thaw_wanted = 0;
    if (sb->freezer_busy && !sb->parked) {
        j->parked_done = done;
        sb->parked = j;
        return;
    }
    work_submit(sb->d->wq, job_run, done, j);
}

int sandbox_unpark(struct sandbox *sb)
{
    struct sandbox_job *j = sb->parked;
    if (!j)
        return 0;
    sb->parked = NULL;
    sb->frozen = 0;
    work_submit(sb->d->wq, job_run, j->parked_done, j);
    return 1;
}

static struct sandbox_job *job_new(struct sandbox *sb, enum job_kind kind, sandbox_done_cb done,
                                   void *arg)
{
    struct sandbox_job *j = xcalloc(1, sizeof(*j));
    j->sb = sb;
    sandbox_ref(sb);
    j->kind = kind;
    sandbox_spec(sb, &j->spec);
    j->done = done;
    j->arg = arg;
    j->fd = -1;
    j->dns_fd = -1;
    j->net_slot = -1;
    if (kind == JOB_STOP || kind == JOB_DESTROY) {
        j->net_slot = sb->net_slot;
        sb->net_slot = -1;
    }
    j->started_ms = now_ms_monotonic();
    return j;
}

static void job_free(struct sandbox_job *j)
{
    if (j->fd >= 0)
        close(j->fd);
    if (j->dns_fd >= 0)
        close(j->dns_fd);
    gateway_slot_release(j->sb->d->gw, j->net_slot);
    sandbox_unref(j->sb);
    free(j);
}

/* Stats jobs go to their own queue so a burst of slow starts never delays an exec. */
static void stats_done(void *p)
{
    struct sandbox_job *j = p;
    if (j->rc < 0)
        memset(&j->stats, 0, sizeof(j->stats));
    else if (j->sb->state == SB_RUNNING)
        j->sb->memory_used_mib = (long long)(j->stats.memory_bytes >> 20);
    j->stats_done(j->sb, j->rc, &j->stats, j->arg);
    job_free(j);
}

void sandbox_read_stats(struct sandbox *sb, sandbox_stats_cb cb, void *arg)
{
    struct sandbox_job *j = job_new(sb, JOB_STATS, NULL, arg);
    j->stats_done = cb;
    work_submit(sb->d->wq_fast, job_run, stats_done, j);
}

/*
 * A start failed and its leftovers are cleaned up: a new sandbox is destroyed again and
 * forgotten; an existing one is stopped (files kept) and marked failed.
 */
static void start_cleanup_done(void *p)
{
    struct sandbox_job *j = p;
    struct sandbox *sb = j->sb;
    sb->busy = 0;
    if (j->rc < 0)
        log_error(sb->id, "sandbox.cleanup_failed", "error=\"%s\"", j->err.msg);
    if (j->is_create && j->rc == 0)
        sandbox_forget(sb, "create_failed");
    else
        sandbox_set_failed(sb, j->is_create ? "create_failed" : "start_failed", j->failure);
    j->done(sb, 0, j->failure, j->arg);
    job_free(j);
}

static void start_fail(struct sandbox_job *j, const char *why)
{
    struct sandbox *sb = j->sb;
    snprintf(j->failure, sizeof(j->failure), "%s", why);
    log_error(sb->id, j->is_create ? "sandbox.create_failed" : "sandbox.start_failed",
              "error=\"%s\"", why);
    if (sb->conn) {
        agentconn_close(sb->conn, why);
        sb->conn = NULL;
    }
    j->kind = j->is_create ? JOB_DESTROY : JOB_STOP;
    j->rc = 0;
    wr_err_clear(&j->err);
    sb->busy = 1;
    submit_teardown(j, start_cleanup_done);
}

/* A failed sandbox's runsc state, mounts and cgroups are gone; it stays failed. A delete or
 * start asked for meanwhile runs now. */
static void failed_cleanup_done(void *p)
{
    struct sandbox_job *j = p;
    struct sandbox *sb = j->sb;
    sb->busy = 0;
    if (j->rc < 0)
        log_error(sb->id, "sandbox.cleanup_failed", "error=\"%s\"", j->err.msg);
    enum sb_deferred what = sb->deferred;
    sb->deferred = SB_DEFER_NONE;
    if (what == SB_DEFER_DELETE)
        sandbox_delete(sb, sb->deferred_done, sb->deferred_arg);
    else if (what == SB_DEFER_START)
        sandbox_start(sb, sb->deferred_done, sb->deferred_arg);
    job_free(j);
}

int sandbox_defer(struct sandbox *sb, enum sb_deferred what, sandbox_done_cb done, void *arg)
{
    if (sb->state != SB_FAILED || !sb->busy || sb->deferred != SB_DEFER_NONE)
        return -1;
    sb->deferred = what;
    sb->deferred_done = done;
    sb->deferred_arg = arg;
    return 0;
}

/* The lost sandbox is failed for good: record why, then clean up its leftovers. */
static void lost_settle(struct sandbox *sb, const char *reason, const char *detail)
{
    sandbox_set_failed(sb, reason, detail);
    if (sb->busy || sb->d->shutting_down)
        return;
    struct sandbox_job *cleanup = job_new(sb, JOB_STOP, NULL, NULL);
    sb->busy = 1;
    submit_teardown(cleanup, failed_cleanup_done);
}

/* Whether the host's OOM killer was at work in it is known: that is why it died, if so. */
static void lost_stats_done(void *p)
{
    struct sandbox_job *j = p;
    struct sandbox *sb = j->sb;
    sb->busy = 0;
    lost_settle(sb, j->rc == 0 && j->stats.oom_kills > 0 ? "oom" : "agent_died", j->failure);
    job_free(j);
}

void sandbox_lost(struct sandbox *sb, const char *reason, const char *detail)
{
    /* The agent went away (or stopped answering) under a running sandbox: it is no longer
     * usable. If the host's OOM killer was at work in its cgroup, that is why (under gVisor a
     * host memory kill takes the whole sandbox down). Its leftovers are cleaned up; its files
     * stay, and start brings it back. */
    struct agentconn *c = sb->conn;
    sb->conn = NULL;
    log_error(sb->id, "sandbox.lost", "reason=%s detail=\"%s\"", reason ? reason : "?", detail);
    agentconn_close(c, detail);
    if (reason || sb->busy || sb->d->shutting_down) {
        lost_settle(sb, reason ? reason : "agent_died", detail);
        return;
    }
    /* Failed from now on; the reason is settled once the driver has said whether the OOM
     * killer was at work (a worker reads it). Meanwhile it is busy, so nothing else starts. */
    sb->state = SB_FAILED;
    snprintf(sb->reason, sizeof(sb->reason), "agent_died");
    snprintf(sb->detail, sizeof(sb->detail), "%s", detail);
    struct sandbox_job *j = job_new(sb, JOB_STATS, NULL, NULL);
    snprintf(j->failure, sizeof(j->failure), "%s", detail);
    sb->busy = 1;
    work_submit(sb->d->wq_fast, job_run, lost_stats_done, j);
}

/* The agent said HELLO, or the channel died. */
static void on_agent_state(void *arg, int ok, const char *reason)
{
    struct sandbox *sb = arg;
    struct sandbox_job *j = sb->create_job;
    if (j) {
        sb->create_job = NULL;
        if (!ok) {
            char why[WR_ERR_MSG_MAX];
            snprintf(why, sizeof(why), "sandbox did not start: %s", reason);
            start_fail(j, why);
            return;
        }
        log_info(sb->id, "sandbox.started", "ms=%llu",
                 (unsigned long long)(now_ms_monotonic() - j->started_ms));
        sb->net_slot = j->net_slot;
        j->net_slot = -1;
        idle_reset(sb);
        sandbox_set_state(sb, SB_RUNNING, j->is_create ? "created" : "user");
        j->done(sb, 1, NULL, j->arg);
        job_free(j);
        return;
    }
    if (!ok && sb->state == SB_RUNNING)
        sandbox_lost(sb, agentconn_gave_up(sb->conn) ? "agent_unresponsive" : NULL, reason);
}

static void create_start_done(void *p)
{
    struct sandbox_job *j = p;
    struct sandbox *sb = j->sb;
    sb->busy = 0;
    if (j->rc < 0) {
        start_fail(j, j->err.msg[0] ? j->err.msg : "the driver could not start the sandbox");
        return;
    }
    if (j->net_slot >= 0) {
        struct wr_err e = {0};
        if (gateway_slot_activate(sb->d->gw, j->net_slot, steal_fd(&j->dns_fd), &e) < 0) {
            char why[WR_ERR_MSG_MAX];
            snprintf(why, sizeof(why), "cannot serve the sandbox's DNS: %s", e.msg);
            start_fail(j, why);
            return;
        }
    }
    int fd = steal_fd(&j->fd);
    sb->create_job = j;
    sb->conn = agentconn_new(sb->d->base, fd, sb->d->cfg.hello_timeout_ms, on_agent_state, sb);
    agentconn_set_deadline(sb->conn, sb->d->cfg.agent_deadline_ms);
    agentconn_on_send(sb->conn, idle_on_send, sb);
}

static void start_job(struct sandbox *sb, int is_create, sandbox_done_cb done, void *arg)
{
    sb->oom_kills_seen = 0; /* a start makes its cgroup afresh */
    struct sandbox_job *j = job_new(sb, JOB_START, done, arg);
    j->is_create = is_create;
    if (sb->d->gw) {
        struct wr_err e = {0};
        j->net_slot = gateway_slot_take(sb->d->gw, sb->id, &e);
        if (j->net_slot < 0) {
            start_fail(j, e.msg);
            return;
        }
    }
    if (mkdir(sb->dir, 0700) < 0 && errno != EEXIST) {
        /* The path is the host's: the log has it, the API the words. */
        char why[WR_ERR_MSG_MAX];
        int e = errno;
        log_error(sb->id, "sandbox.mkdir_failed", "path=\"%s\" error=\"%s\"", sb->dir, strerror(e));
        snprintf(why, sizeof(why),
                 "cannot create the directory of sandbox %s: %s (the daemon log has the details)",
                 sb->id, strerror(e));
        start_fail(j, why);
        return;
    }
    sb->busy = 1;
    work_submit(sb->d->wq, job_run, create_start_done, j);
}

void sandbox_create(struct sandbox *sb, sandbox_done_cb done, void *arg)
{
    struct daemon *d = sb->d;
    sb->created_at = now_unix();
    sb->lease_ends_ms = now_ms_wall() + (int64_t)sb->timeout_seconds * 1000;
    snprintf(sb->dir, sizeof(sb->dir), "%s/sandboxes/%s", d->cfg.state_dir, sb->id);
    link_sandbox(d, sb);
    /* A sandbox the daemon cannot record would be lost at its next start: refuse it now. */
    struct wr_err err = {0};
    sb->state = SB_CREATING;
    if (persist(sb, &err) < 0) {
        char why[WR_ERR_MSG_MAX];
        snprintf(why, sizeof(why), "cannot record it in the state database: %s", err.msg);
        unlink_sandbox(sb);
        done(sb, 0, why, arg);
        return;
    }
    change_state(sb, SB_CREATING, "user", NULL);
    start_job(sb, 1, done, arg);
}

void sandbox_start(struct sandbox *sb, sandbox_done_cb done, void *arg)
{
    sb->lease_ends_ms = now_ms_wall() + (int64_t)sb->timeout_seconds * 1000;
    sandbox_set_state(sb, SB_STARTING, "user");
    start_job(sb, 0, done, arg);
}

/* A stop or destroy finished: the sandbox settles as the job's reason says, or failed. */
static void stop_done(void *p)
{
    struct sandbox_job *j = p;
    struct sandbox *sb = j->sb;
    sb->busy = 0;
    if (j->rc < 0) {
        char why[WR_ERR_MSG_MAX];
        snprintf(why, sizeof(why), "%s failed: %s", j->kind == JOB_STOP ? "stop" : "delete",
                 j->err.msg);
        sandbox_set_failed(sb, j->kind == JOB_STOP ? "stop_failed" : "delete_failed", j->err.msg);
        if (j->done)
            j->done(sb, 0, why, j->arg);
    } else {
        if (j->kind == JOB_STOP) {
            sandbox_set_state(sb, SB_STOPPED, j->reason);
        } else {
            log_info(sb->id, "sandbox.deleted", "ms=%llu",
                     (unsigned long long)(now_ms_monotonic() - j->started_ms));
            sandbox_forget(sb, j->reason);
        }
        if (j->done)
            j->done(sb, 1, NULL, j->arg);
    }
    job_free(j);
}

/* Queues a stop (files kept) or a destroy of sb, settling with reason when done. */
static void submit_stop(struct sandbox *sb, enum job_kind kind, const char *reason,
                        sandbox_done_cb done, void *arg)
{
    struct sandbox_job *j = job_new(sb, kind, done, arg);
    snprintf(j->reason, sizeof(j->reason), "%s", reason);
    sb->busy = 1;
    submit_teardown(j, stop_done);
}

void sandbox_stop(struct sandbox *sb, const char *reason, sandbox_done_cb done, void *arg)
{
    sandbox_set_state(sb, SB_STOPPING, reason);
    if (sb->conn) {
        char why[96];
        snprintf(why, sizeof(why), "the sandbox is being stopped (%s)", reason);
        agentconn_close(sb->conn, why);
        sb->conn = NULL;
    }
    submit_stop(sb, JOB_STOP, reason, done, arg);
}

void sandbox_delete(struct sandbox *sb, sandbox_done_cb done, void *arg)
{
    sandbox_delete_reason(sb, "user", done, arg);
}

void sandbox_delete_reason(struct sandbox *sb, const char *reason, sandbox_done_cb done, void *arg)
{
    sandbox_set_state(sb, SB_DELETING, reason);
    if (sb->conn) {
        /* EOF on its channel makes the agent kill everything and exit: teardown is fast. */
        agentconn_close(sb->conn, "the sandbox is being deleted");
        sb->conn = NULL;
    }
    submit_stop(sb, JOB_DESTROY, reason, done, arg);
}

/* ---- start-up and shutdown ---- */

static int reason_known(const char *reason)
{
    for (const char *const *p = sandbox_reason_names; *p; p++)
        if (!strcmp(*p, reason))
            return 1;
    return 0;
}

/* Fills sb from its stored document. Returns 0, or -1 if the row is unusable. */
static int load_doc(struct sandbox *sb, const char *id, const char *state, const char *doc)
{
    json_error_t jerr;
    json_t *o = json_loads(doc, 0, &jerr);
    if (!o || !sb_id_valid(id)) {
        log_error(id, "store.bad_row", "error=\"%s\"", o ? "bad id" : jerr.text);
        json_decref(o);
        return -1;
    }
    snprintf(sb->id, sizeof(sb->id), "%s", id);
    const char *image = NULL, *ole = NULL, *reason = NULL, *detail = NULL, *rootfs = NULL;
    json_t *env = NULL, *md = NULL, *net = NULL;
    json_int_t created = 0, lease = 0, since = 0;
    json_unpack(o, "{s?s, s?i, s?i, s?i, s?i, s?s, s?o, s?o, s?o, s?I, s?I, s?s, s?s, s?s, s?I}",
                "image", &image, "cpus", &sb->cpus, "memory_mib", &sb->memory_mib, "disk_mib",
                &sb->disk_mib, "timeout_seconds", &sb->timeout_seconds, "on_lease_end", &ole, "env",
                &env, "metadata", &md, "network", &net, "created_unix", &created, "lease_ends_ms",
                &lease, "reason", &reason, "detail", &detail, "rootfs", &rootfs, "state_since_unix",
                &since);
    if (image)
        snprintf(sb->image, sizeof(sb->image), "%s", image);
    const char *key_id = json_string_value(json_object_get(o, "key_id"));
    if (key_id)
        snprintf(sb->key_id, sizeof(sb->key_id), "%s", key_id);
    sb->pooled = json_is_true(json_object_get(o, "pooled"));
    json_t *cap = json_object_get(o, "max_cost_micros");
    if (json_is_integer(cap) && json_integer_value(cap) >= 0)
        sb->max_cost_micros = json_integer_value(cap);
    if (ole)
        snprintf(sb->on_lease_end, sizeof(sb->on_lease_end), "%s", ole);
    if (env && json_is_object(env))
        json_object_update(sb->env, env);
    if (md && json_is_object(md))
        json_object_update(sb->metadata, md);
    if (net && json_is_object(net)) {
        json_decref(sb->network);
        sb->network = json_incref(net);
    }
    json_t *ph = json_object_get(o, "secret_placeholders");
    if (json_is_object(ph))
        json_object_update(sb->secrets, ph);
    if (detail)
        snprintf(sb->detail, sizeof(sb->detail), "%s", detail);
    if (reason && reason_known(reason)) {
        snprintf(sb->reason, sizeof(sb->reason), "%s", reason);
    } else if (reason && reason[0]) {
        /* Recorded before reasons were codes: the words become the detail. */
        snprintf(sb->detail, sizeof(sb->detail), "%s", reason);
        snprintf(sb->reason, sizeof(sb->reason), "%s",
                 !strcmp(state, "failed") ? "agent_died" : "daemon_restart");
    }
    if (rootfs)
        snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", rootfs);
    sb->created_at = created;
    /* Recorded before state_since was: its retention counts from now. */
    sb->state_since = since > 0 ? since : now_unix();
    sb->lease_ends_ms = lease;
    json_decref(o);
    snprintf(sb->dir, sizeof(sb->dir), "%s/sandboxes/%s", sb->d->cfg.state_dir, sb->id);
    int st = sandbox_state_parse(state);
    sb->state = st < 0 ? SB_FAILED : (enum sb_state)st;
    return 0;
}

static void recovery_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    if (!ok)
        log_error(sb->id, "sandbox.recovery_failed", "error=\"%s\"", message);
}

static int load_one(void *arg, const char *id, const char *state, const char *doc)
{
    struct daemon *d = arg;
    struct sandbox *sb = sandbox_new(d);
    if (load_doc(sb, id, state, doc) < 0) {
        sandbox_unref(sb);
        return 0;
    }
    link_sandbox(d, sb);
    if (sb->pooled) {
        /* A pool entry of the previous daemon: nobody's, so gone. */
        submit_stop(sb, JOB_DESTROY, "daemon_restart", recovery_done, NULL);
    } else if (sb->state == SB_CREATING || sb->state == SB_DELETING) {
        /* It never finished being created, or was being deleted: finish the delete. */
        submit_stop(sb, JOB_DESTROY, "daemon_restart", recovery_done, NULL);
    } else if (sb->state == SB_RUNNING || sb->state == SB_STOPPING || sb->state == SB_STARTING) {
        /* Its channel died with the previous daemon: stop it cleanly, files kept. */
        int lease_over = sb->lease_ends_ms <= now_ms_wall();
        if (lease_over && strcmp(sb->on_lease_end, "delete") == 0)
            submit_stop(sb, JOB_DESTROY, "lease_ended", recovery_done, NULL);
        else
            submit_stop(sb, JOB_STOP, lease_over ? "lease_ended" : "daemon_restart", recovery_done,
                        NULL);
    }
    sandbox_unref(sb);
    return 0;
}

int sandbox_load_all(struct daemon *d, struct wr_err *err)
{
    return store_sandbox_foreach(d->store, load_one, d, err);
}

static void on_pong(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct sandbox *sb = arg;
    sb->ping_id = 0;
    if (h)
        sb->last_pong_ms = now_ms_monotonic();
}

static void on_watch_stats(struct sandbox *sb, int rc, const struct driver_stats *st, void *arg)
{
    if (rc == 0 && sb->state == SB_RUNNING)
        sb->oom_kills_seen = st->oom_kills;
}

/*
 * Pings each running sandbox's agent every few seconds, unless the daemon froze it. An agent that
 * has not answered for WATCHDOG_MS (stopped, or stuck) makes its sandbox failed with reason
 * agent_unresponsive, so calls stop hanging on it and start can bring it back.
 */
static void watchdog(struct sandbox *sb)
{
    uint64_t now = now_ms_monotonic();
    /* A frozen agent cannot answer; its clock starts again at the thaw (idle.c). */
    if (!agentconn_alive(sb->conn) || sb->frozen || sb->freezer_busy)
        return;
    if (sb->ping_id) {
        if (now - sb->ping_sent_ms > WATCHDOG_MS)
            sandbox_lost(sb, "agent_unresponsive", "the agent stopped answering pings");
        return;
    }
    if (now - sb->last_pong_ms < PING_EVERY_MS && now - sb->ping_sent_ms < PING_EVERY_MS)
        return;
    sb->ping_sent_ms = now;
    sb->ping_id = agentconn_request(sb->conn, PROTO_PING, NULL, 0, on_pong, sb);
    sandbox_read_stats(sb, on_watch_stats, NULL);
}

/* Leases: a sandbox whose lease has ended is stopped or deleted, as on_lease_end says. */
static void lease_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    if (!ok)
        log_error(sb->id, "lease.end_failed", "error=\"%s\"", message);
}

void sandbox_check_leases(struct daemon *d)
{
    int64_t now = now_ms_wall();
    uint64_t mono = now_ms_monotonic();
    struct sandbox *next;
    for (struct sandbox *sb = d->sandboxes; sb; sb = next) {
        next = sb->next;
        if (sb->state == SB_RUNNING && !sb->busy)
            watchdog(sb);
        if (sb->state == SB_RUNNING && !sb->busy)
            idle_tick(sb, mono);
        if (sb->state != SB_RUNNING || sb->busy || sb->lease_ends_ms > now)
            continue;
        log_info(sb->id, "lease.ended", "on_lease_end=%s", sb->on_lease_end);
        if (strcmp(sb->on_lease_end, "delete") == 0)
            sandbox_delete_reason(sb, "lease_ended", lease_done, NULL);
        else
            sandbox_stop(sb, "lease_ended", lease_done, NULL);
    }
}

/* ---- retention ---- */

int sandbox_expired(const struct sandbox *sb, int64_t now, int64_t age)
{
    return (sb->state == SB_STOPPED || sb->state == SB_FAILED) && !sb->busy &&
           sb->deferred == SB_DEFER_NONE && now - sb->state_since >= age;
}

static void retention_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    if (!ok)
        log_error(sb->id, "retention.delete_failed", "error=\"%s\"", message);
}

void sandbox_check_retention(struct daemon *d)
{
    int64_t keep = d->cfg.stopped_retention;
    if (keep <= 0)
        return;
    int64_t now = now_unix();
    struct sandbox *next;
    for (struct sandbox *sb = d->sandboxes; sb; sb = next) {
        next = sb->next;
        if (!sandbox_expired(sb, now, keep))
            continue;
        log_info(sb->id, "retention.ended", "state=%s since=%lld retention_seconds=%lld",
                 sandbox_state_name(sb->state), (long long)sb->state_since, (long long)keep);
        sandbox_delete_reason(sb, "retention_ended", retention_done, NULL);
    }
}

void sandbox_stop_all(struct daemon *d)
{
    for (struct sandbox *sb = d->sandboxes; sb; sb = sb->next) {
        if (sb->conn) {
            agentconn_close(sb->conn, "the daemon is shutting down");
            sb->conn = NULL;
        }
        if (sb->state == SB_RUNNING && !sb->busy)
            submit_stop(sb, sb->pooled ? JOB_DESTROY : JOB_STOP, "daemon_shutdown", recovery_done,
                        NULL);
    }
}

void sandbox_free_all(struct daemon *d)
{
    while (d->sandboxes) {
        struct sandbox *sb = d->sandboxes;
        if (sb->conn) {
            agentconn_close(sb->conn, "the daemon is shutting down");
            sb->conn = NULL;
        }
        unlink_sandbox(sb);
    }
}
