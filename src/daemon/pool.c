/*
 * The warm pool (pool.h).
 */
#include "daemon/pool.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "daemon/admission.h"
#include "daemon/agentconn.h"
#include "daemon/daemon.h"
#include "daemon/meter.h"
#include "daemon/sandbox.h"
#include "daemon/sink.h"
#include "daemon/work.h"
#include "image/image.h"

/* After a refill fails (no image yet, no room, the driver failed), wait this long. */
#define REFILL_BACKOFF_MS 10000
/* A refill waits this long after the last claim: a burst's first commands run before a boot
 * takes the host's CPU. */
#define REFILL_QUIET_MS 1000

int pool_ready(const struct sandbox *sb)
{
    return sb->pooled && sb->state == SB_RUNNING && !sb->busy && agentconn_alive(sb->conn);
}

/* The settings a pool entry is made with: a create with no image, size or disk given. */
static void pool_shape(const struct daemon *d, struct sandbox *sb)
{
    snprintf(sb->image, sizeof(sb->image), "default");
    sb->cpus = d->cfg.max_cpus < 2 ? d->cfg.max_cpus : 2;
    sb->memory_mib = 4096;
    sb->disk_mib = d->cfg.default_disk_mib;
}

/* Same image build (a rebuilt image makes older entries stale), size and disk. */
static int same_shape(const struct sandbox *a, const struct sandbox *b)
{
    return !strcmp(a->image, b->image) && !strcmp(a->rootfs, b->rootfs) && a->cpus == b->cpus &&
           a->memory_mib == b->memory_mib && a->disk_mib == b->disk_mib;
}

int pool_claim(struct daemon *d, struct sandbox *tmp, struct sink *s)
{
    struct sandbox *sb = NULL;
    for (struct sandbox *e = d->sandboxes; e && !sb; e = e->next)
        if (pool_ready(e) && same_shape(e, tmp))
            sb = e;
    if (!sb)
        return 0;
    /* The user's settings, as a cold create would have them. */
    snprintf(sb->key_id, sizeof(sb->key_id), "%s", tmp->key_id);
    sb->timeout_seconds = tmp->timeout_seconds;
    snprintf(sb->on_lease_end, sizeof(sb->on_lease_end), "%s", tmp->on_lease_end);
    json_object_clear(sb->env);
    json_object_update(sb->env, tmp->env);
    json_object_clear(sb->metadata);
    json_object_update(sb->metadata, tmp->metadata);
    json_decref(sb->network);
    sb->network = json_deep_copy(tmp->network);
    json_object_clear(sb->secrets);
    json_object_update(sb->secrets, tmp->secrets);
    sb->max_cost_micros = tmp->max_cost_micros;
    sb->created_at = now_unix();
    sb->lease_ends_ms = now_ms_wall() + (int64_t)sb->timeout_seconds * 1000;
    /* tmp's reservation is given back and taken again for the entry (nothing runs between:
     * the same room). */
    meter_end(tmp);
    struct wr_err err = {0};
    sb->pooled = 0;
    if (meter_admit(sb, &err) < 0) {
        sb->pooled = 1; /* back to the pool; the next claim sets every field again */
        sb->lease_ends_ms = now_ms_wall() + 10LL * 365 * 86400 * 1000;
        sink_fail(s, &err);
        return 1;
    }
    sandbox_claimed(sb);
    /* Its cgroup counted its boot and its wait in the pool: the user's CPU is measured from
     * the first reading after the claim (that first slice is billed at the floor). */
    sb->meter_cpu_known = 0;
    if (d->pool_retry_ms < now_ms_monotonic() + REFILL_QUIET_MS)
        d->pool_retry_ms = now_ms_monotonic() + REFILL_QUIET_MS;
    log_info(sb->id, "pool.claimed", "key=%s", sb->key_id[0] ? sb->key_id : "-");
    sink_reply(s, SINK_CREATED, sandbox_to_json(sb));
    return 1;
}

static void refill_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    struct daemon *d = sb->d;
    d->pool_refilling = 0;
    if (!ok) {
        log_warn(sb->id, "pool.refill_failed", "error=\"%s\"", message);
        d->pool_retry_ms = now_ms_monotonic() + REFILL_BACKOFF_MS;
    }
}

static void entry_gone(struct sandbox *sb, int ok, const char *message, void *arg)
{
    if (!ok)
        log_error(sb->id, "pool.delete_failed", "error=\"%s\"", message);
}

void pool_tick(struct daemon *d)
{
    char rootfs[PATH_MAX];
    struct wr_err err = {0};
    if (image_rootfs(d->cfg.state_dir, "default", rootfs, sizeof(rootfs), &err) < 0)
        rootfs[0] = '\0';
    int have = 0;
    struct sandbox *next;
    for (struct sandbox *sb = d->sandboxes; sb; sb = next) {
        next = sb->next;
        if (!sb->pooled)
            continue;
        /* An entry whose agent died, that was stopped, or whose image was rebuilt since, is
         * nobody's and never will be: gone. */
        int stale = sb->state == SB_RUNNING && strcmp(sb->rootfs, rootfs) != 0;
        if ((sb->state == SB_FAILED || sb->state == SB_STOPPED || stale) && !sb->busy) {
            sandbox_delete_reason(sb, "daemon_shutdown", entry_gone, NULL);
            continue;
        }
        have += sb->state == SB_RUNNING || sb->state == SB_CREATING;
    }
    if (d->shutting_down || d->pool_refilling || have >= d->cfg.pool_size ||
        now_ms_monotonic() < d->pool_retry_ms || work_pending(d->wq) > 0)
        return;
    struct sandbox *sb = sandbox_new(d);
    sandbox_new_id(sb->id);
    pool_shape(d, sb);
    sb->pooled = 1;
    snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", rootfs);
    if (!rootfs[0] || admission_check(d, sb, 1, &err) < 0) {
        /* No image yet, or no room: quietly later. */
        d->pool_retry_ms = now_ms_monotonic() + REFILL_BACKOFF_MS;
        sandbox_unref(sb);
        return;
    }
    d->pool_refilling = 1;
    sandbox_create(sb, refill_done, NULL);
    /* Never on a lease: it has no user yet (ten years; its claim sets the user's). Not
     * INT64_MAX: the lease is rounded up to the second when shown. */
    sb->lease_ends_ms = now_ms_wall() + 10LL * 365 * 86400 * 1000;
    sandbox_unref(sb);
}
