/*
 * Sandbox images: read-only Debian root filesystems built with mmdebstrap from
 * the host's own apt sources, kept in the state directory and shared by every
 * sandbox as the lower layer of its overlay.
 *
 * Layout under <state_dir>/images/<name>/:
 *   builds/<build>/rootfs      one complete build (never modified once renamed into place)
 *   builds/<build>/image.json  its metadata (name, created, packages, size)
 *   rootfs -> builds/<build>/rootfs   the current build (a symlink, swapped atomically)
 *   .lock                      flock(2) held while building
 * A sandbox is pinned to the build it was created from (image_rootfs() returns the resolved
 * build path): its writable layer holds copies of files such as dpkg's status from that
 * build, so a rebuild must not change the layer underneath it. Older builds are therefore
 * kept by a forced rebuild.
 */
#ifndef WR_IMAGE_H
#define WR_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define IMAGE_NAME_MAX 64

/** What image_list reports about one built image. */
struct image_info {
    char name[IMAGE_NAME_MAX + 1];
    uint64_t size_bytes; /* disk use of the current build's root filesystem */
    int64_t created_at;  /* unix seconds */
};

/** Returns 1 if name is a valid image name ([a-z0-9][a-z0-9._-]{0,63}), else 0. */
int image_name_valid(const char *name);

/**
 * Builds image `name` (only "default" has a recipe: Debian bookworm with python3, pip, venv,
 * git, curl, ca-certificates, build-essential, procps and /workspace) unless a complete build
 * exists and force is 0. Progress and mmdebstrap's output go to log_fd (-1 = discarded).
 * Blocks for the whole build (tens of seconds to minutes); a concurrent build of the same
 * image waits for the first and then finds it cached. Returns 0, or -1 with err set.
 */
int image_build(const char *state_dir, const char *name, int force, int log_fd, struct wr_err *err);

/** What a build reports as it goes: how far (0..1000), the stage in words, and an estimate of
 * the milliseconds left (-1: unknown). */
struct image_progress {
    void (*fn)(void *arg, int permille, const char *stage, int64_t left_ms);
    void *arg;
};

/** image_build, calling pr->fn (pr may be NULL) at every stage and about twice a second while
 * mmdebstrap runs, and once with 1000 at the end of a build. The estimate comes from the
 * image's previous build time when there is one. */
int image_build_progress(const char *state_dir, const char *name, int force, int log_fd,
                         const struct image_progress *pr, struct wr_err *err);

/** Whether line is one of mmdebstrap's stage lines ("I: extracting archives..."): returns 1
 * with how far the build is once the stage starts (permille) and the stage in words. */
int image_stage_of(const char *line, int *permille, const char **words);

/** The estimated milliseconds left: from the previous build's time (prev_ms > 0) or, without
 * one, from how far the build is after elapsed_ms; -1 when there is nothing to go on yet. */
int64_t image_eta_ms(uint64_t elapsed_ms, int permille, uint64_t prev_ms);

/**
 * Writes the path of image `name`'s current root filesystem (a resolved, build-specific
 * path: store it with the sandbox) into out. Fails with ENOENT and "image <name> is not
 * built; run `withruntime image build`" if there is none. Returns 0 or -1.
 */
int image_rootfs(const char *state_dir, const char *name, char *out, size_t outlen,
                 struct wr_err *err);

/** Called by image_list for each built image; a nonzero return stops the listing. */
typedef int (*image_list_cb)(void *arg, const struct image_info *info);

/**
 * Calls cb for every built image in the state directory, in name order. Images without a
 * complete build are skipped. Returns 0 (also when there are no images), the callback's
 * nonzero value if it stopped the listing, or -1 with err set.
 */
int image_list(const char *state_dir, image_list_cb cb, void *arg, struct wr_err *err);

#endif
