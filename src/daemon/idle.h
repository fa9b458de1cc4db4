/*
 * Idle sandboxes cost no CPU. Under gVisor's systrap platform an idle sandbox still burns
 * ~2 % of a core (the sentry polls), so a running sandbox that has had nothing to do for
 * cfg.freeze_after_ms is frozen through its driver (the cgroup freezer under gvisor: 0 CPU),
 * and thawed by the next frame the daemon sends its agent.
 *
 * "Nothing to do" is decided conservatively, every tick, on the loop thread:
 *   - it is running, with a live agent, no driver operation in flight (busy), no watchdog PING
 *     outstanding;
 *   - no request to its agent is open (an exec, a background command, a file transfer, a
 *     stream: agentconn_active), and none has been for freeze_after_ms;
 *   - and then its agent, asked (a PING), says no process runs besides its own (PT_PROCS = 0),
 *     with no frame sent to it since the question: a leftover or background process, or an
 *     agent that cannot tell, keeps it awake.
 *
 * Under memory pressure (daemon/pressure.h) the idle period is not waited for: every sandbox
 * idle by the rest of the rule is frozen at once (idle_freeze_now), and that freeze is an
 * event of the sandbox's.
 *
 * Thawing is transparent: agentconn calls idle_on_send before every frame it sends, and a
 * frozen sandbox's frame waits in the channel while a worker thaws it (a few ms). Stop and
 * destroy need no thaw from here: the driver thaws before it kills. A stop or destroy asked
 * for while a freeze or thaw is on a worker waits for it (sandbox.c parks the job), so the two
 * never race on the cgroup.
 *
 * Frozen is a property of a running sandbox, not a state of its own: the lease runs on, the
 * watchdog pings only awake sandboxes (and counts from the thaw), the meter bills memory and
 * no CPU floor for frozen time (meter.h).
 */
#ifndef WR_DAEMON_IDLE_H
#define WR_DAEMON_IDLE_H

#include <stddef.h>
#include <stdint.h>

struct daemon;
struct sandbox;

/** The default of `serve --freeze-after`, ms. */
#define IDLE_DEFAULT_FREEZE_AFTER_MS 3000

/**
 * Whether a sandbox that has been idle for idle_ms, with `active` requests open and
 * `running_commands` background commands running, is due for the agent's process count
 * (pure; tests/unit/test_idle.c). freeze_after_ms 0: never.
 */
int idle_due(uint64_t freeze_after_ms, uint64_t idle_ms, unsigned active, int running_commands);

/** Checks sb against the rules above and starts a freeze when they hold. From the tick. */
void idle_tick(struct sandbox *sb, uint64_t now_ms);

/**
 * The running sandboxes that are idle by what the daemon knows (nothing in flight: no driver
 * operation, request, background command or PING), least recently used first, at most max of
 * them into out; frozen ones too if frozen_too. Whether a process besides the agent runs is
 * the agent's to say (idle_freeze_now asks). The seam for anything that reclaims idle
 * sandboxes' memory under pressure (daemon/pressure.h; later, pausing them to disk).
 */
size_t idle_pick_lru(struct daemon *d, int frozen_too, struct sandbox **out, size_t max);

/**
 * Freezes sb now, without waiting for its idle period, if it is idle: asks its agent for the
 * process count (as idle_tick does) and freezes it if none runs besides the agent and nothing
 * was sent meanwhile; the freeze is then an event of sb's with reason `why` (a static string).
 * Returns 1 if the question went out, 0 if sb may not be frozen now (not idle by idle_pick_lru's
 * rule, already frozen or asked, or freezing is off: --freeze-after 0 or a driver that cannot).
 */
int idle_freeze_now(struct sandbox *sb, const char *why);

/** Hooked to sb's agent connection (agentconn_on_send): notes use, thaws a frozen sandbox. */
void idle_on_send(void *sb, uint16_t type);

/** The sandbox's agent connection is new (a start): it is awake and counts as used now. */
void idle_reset(struct sandbox *sb);

#endif
