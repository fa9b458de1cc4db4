/*
 * The fake driver, for tests: a "sandbox" is the agent as a plain host process on a
 * socketpair, in its own pid namespace (and, for the real agent, its own mount namespace
 * rooted in an overlay of the image). No gVisor, no cgroups, no disk quota: it exists so
 * that tests can make every driver step fail (fault points fake.start.dir, .overlay,
 * .socketpair, .spawn, fake.stop, fake.destroy) and run hostile agents. Chosen only by name
 * (`serve --driver fake`), never by auto-selection.
 */
#ifndef WR_DRIVER_FAKE_H
#define WR_DRIVER_FAKE_H

#include "driver/driver.h"

/** The fake driver's table. */
extern const struct driver_ops driver_fake;

#endif
