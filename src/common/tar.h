/*
 * Tar archives of directory trees, both ways, streamed in bounded memory: a writer that walks a
 * tree and hands out a ustar stream (with pax records for long names and big sizes), and an
 * extractor fed a stream piece by piece that writes it under a target directory. Both sides
 * are used where the other end is not trusted: the agent archives and extracts inside a
 * sandbox, the CLI extracts what a sandbox sent on the user's machine.
 *
 * What is kept: directories, regular files, symlinks (as symlinks, never followed), permission
 * bits (setuid, setgid and sticky are dropped on extraction), mtimes. What is not: owners, hard
 * links (the writer stores every name of a file as a file of its own; the extractor skips a
 * hard-link entry), devices, FIFOs, sockets (skipped both ways and counted).
 *
 * The extractor never writes outside its target: an entry whose name is absolute or has a ".."
 * component is refused, every directory on the way is opened relative to its parent with
 * O_NOFOLLOW (so an entry through a symlink, one the archive made or one that was there, is
 * refused), and a file or symlink replaces only what is at its own name, unlinked first.
 */
#ifndef WR_COMMON_TAR_H
#define WR_COMMON_TAR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

#define TAR_BLOCK 512
/* Longest entry name or symlink target either side accepts. */
#define TAR_MAX_NAME 4096
/* Deepest directory either side descends into. */
#define TAR_MAX_DEPTH 256
/* Largest pax extended header or GNU long name the extractor reads. */
#define TAR_MAX_EXT (64u << 10)
/* Most memory the extractor keeps for the directories it made (their names, to set their modes
 * and mtimes at the end): 64 MiB is a million directories of 40-byte names. */
#define TAR_MAX_DIR_BYTES (64u << 20)

/**
 * Opens the directory `name` in dirfd for reading, never through a symlink (ELOOP for one,
 * ENOTDIR for another non-directory), in a way that holds under gVisor too (see tar.c).
 * Returns the fd or -1 with errno set.
 */
int tar_open_dir(int dirfd, const char *name);

/* ---- headers (exposed for the tests) ---- */

/** What one header says, after pax and GNU long-name records are applied. */
struct tar_hdr {
    char type; /* '0' file, '5' directory, '2' symlink, '1' hard link, ... */
    char name[TAR_MAX_NAME + 1];
    char link[TAR_MAX_NAME + 1];
    uint64_t size;
    uint32_t mode;
    int64_t mtime;
};

/**
 * Parses one 512-byte block as a ustar (or GNU, or v7) header into h (name and link from the
 * block itself). Returns 1 for a header, 0 for an all-zero block (the end), -1 with err set
 * for a bad checksum, a malformed or out-of-range number.
 */
int tar_parse_header(const uint8_t *blk, struct tar_hdr *h, struct wr_err *err);

/**
 * Applies the records of a pax extended header (data[len]) to h: path, linkpath, size, mtime.
 * Returns 0, or -1 with err set for a malformed record or a value out of range.
 */
int tar_apply_pax(const uint8_t *data, size_t len, struct tar_hdr *h, struct wr_err *err);

/**
 * Appends the header blocks for h to out (a pax 'x' header first when the name or link does
 * not fit ustar's fields or the size is 8 GiB or more). Returns the bytes written (a multiple
 * of 512), or 0 if outcap is too small. outcap of 3 * 512 + 2 * TAR_MAX_NAME + 512 is enough.
 */
size_t tar_build_header(const struct tar_hdr *h, uint8_t *out, size_t outcap);

/* ---- writing an archive of a tree ---- */

struct tarw;

/**
 * Starts an archive of `name` in the directory open at dirfd (not taken; `name` may be "."):
 * a directory's contents, with names relative to it (the directory itself has no entry), or a
 * single file or symlink under its own name. Nothing is followed (a final symlink is archived
 * as a symlink). Returns NULL with err set if name cannot be opened.
 */
struct tarw *tarw_new(int dirfd, const char *name, struct wr_err *err);

/**
 * Fills buf with up to cap bytes of the archive. Returns the bytes written, 0 at the end, -1
 * with err set on a read error (the archive is unusable). A file that shrank while it was read
 * is padded with zeros to the size its header gave; one that grew is cut at that size.
 */
ssize_t tarw_read(struct tarw *w, uint8_t *buf, size_t cap, struct wr_err *err);

/** Entries skipped (devices, FIFOs, sockets, entries that vanished) so far. */
uint64_t tarw_skipped(const struct tarw *w);

/** Frees w, closing what it holds. NULL is fine. */
void tarw_free(struct tarw *w);

/* ---- extracting an archive under a directory ---- */

struct untar_limits {
    uint64_t max_bytes;   /* of file data in all; 0: no limit */
    uint64_t max_entries; /* 0: no limit */
};

struct untar;

/** Starts an extraction under the directory open at dirfd (taken). */
struct untar *untar_new(int dirfd, const struct untar_limits *lim);

/**
 * Extracts what buf[len] holds of the archive. Returns 0, or -1 with err set: a malformed
 * archive, a refused entry (outside the target, through a symlink), a limit passed, or a
 * filesystem error. What was extracted before stays. After an error, feed again fails.
 */
int untar_feed(struct untar *u, const uint8_t *buf, size_t len, struct wr_err *err);

/**
 * Ends the extraction: the archive must have ended (its end marker, or a whole last entry
 * followed by nothing); directories get their modes and mtimes. Returns 0, or -1 with err set.
 */
int untar_finish(struct untar *u, struct wr_err *err);

/** Counts so far: entries extracted, bytes of file data written, entries skipped. */
void untar_counts(const struct untar *u, uint64_t *entries, uint64_t *bytes, uint64_t *skipped);

/** The name of the first skipped entry and its kind ("hard link", "device", ...), or NULL. */
const char *untar_first_skipped(const struct untar *u, const char **kind);

/** Frees u, closing what it holds. NULL is fine. */
void untar_free(struct untar *u);

#endif
