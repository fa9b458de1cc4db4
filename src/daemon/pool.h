/*
 * The warm pool: sandboxes of the default image and size, created ahead and kept running
 * unseen, so a create with those settings is answered at once by claiming one (its id, its
 * writable layer and disk, its cgroup and its network namespace were made for it alone and
 * nothing has run in it but its agent); the user's settings (environment, metadata, lease,
 * network policy, secrets, key, cost cap) are attached at the claim, as a cold create would
 * have them. Refilled in the background one at a time, only while the driver's queue is idle
 * and the host has room, so it never slows running sandboxes or a user's create. Entries are
 * destroyed at shutdown and, if a daemon died with them, at the next start.
 */
#ifndef WR_DAEMON_POOL_H
#define WR_DAEMON_POOL_H

struct daemon;
struct sandbox;
struct sink;

#define POOL_DEFAULT_SIZE 2
#define POOL_MAX_SIZE 64

/** 1 if the pool entry sb can be claimed now (running, idle, its agent answering). */
int pool_ready(const struct sandbox *sb);

/**
 * Claims a ready entry with tmp's image and size, if there is one: gives it tmp's settings,
 * answers s with it (201) and returns 1. 0 if none: the caller creates tmp cold. tmp has been
 * checked and admitted; its reservation (meter.h) is moved to the entry.
 */
int pool_claim(struct daemon *d, struct sandbox *tmp, struct sink *s);

/** Starts a refill if the pool is short; deletes entries that failed. From the daemon's tick. */
void pool_tick(struct daemon *d);

#endif
