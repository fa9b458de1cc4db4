/*
 * The daemon <-> agent control channel: length-prefixed frames on one byte
 * stream, each carrying a request id so many operations run at once.
 * docs/protocol.md is the full description; this header is its code.
 *
 * Frame: 12-byte header, then `len` bytes of payload. All integers big-endian.
 *   u32 len    payload length, <= PROTO_MAX_PAYLOAD
 *   u32 id     request id chosen by the daemon (0 is used only by HELLO)
 *   u16 type   enum proto_type
 *   u16 flags  PROTO_F_*; unknown bits must be zero
 *
 * Payload, by type: either raw bytes (STDIN, STDOUT, STDERR, DATA) or a list
 * of fields, each `u16 tag, u32 len, bytes` (enum proto_tag). Integer fields
 * are exactly 4 or 8 bytes. A field may repeat (ARG, ENV).
 *
 * Both sides treat the other as untrusted: every length is checked against
 * the buffer and the limits below before it is used.
 */
#ifndef WR_PROTO_H
#define WR_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION 3
#define PROTO_HEADER_LEN 12
#define PROTO_MAX_PAYLOAD (1u << 20)       /* 1 MiB */
#define PROTO_CHUNK 65536                  /* preferred size of a data frame */
#define PROTO_FILE_CHUNK PROTO_MAX_PAYLOAD /* largest DATA frame of a FILE_READ answer */
#define PROTO_MAX_PATH 4096
#define PROTO_MAX_ARGS 4096 /* ARG fields per EXEC */
#define PROTO_MAX_ENVS 4096 /* ENV fields per EXEC */

enum proto_type {
    /* agent -> daemon, unsolicited, id 0: fields VERSION, PID */
    PROTO_HELLO = 1,
    /* daemon -> agent: no fields; agent answers PONG with the same id, with field PROCS when it
     * can count them */
    PROTO_PING = 2,
    PROTO_PONG = 3,
    /* daemon -> agent, for an open request: no fields. The agent ends the request at once and
     * sends nothing more for it: a READ or LIST stops, a WRITE closes its file (what was
     * written stays), an EXEC's process tree is killed (its EXIT is still sent). Unknown or
     * finished ids are ignored: a CANCEL races with the request's end. */
    PROTO_CANCEL = 4,
    /* daemon -> agent, for an open request that asked with a WINDOW: fields LENGTH (u64), more
     * bytes the agent may send (see PT_WINDOW). Unknown or finished ids are ignored. */
    PROTO_CREDIT = 5,

    /* daemon -> agent: start a process. Fields: ARG (1+, argv[0] is looked up in PATH
     * when it has no '/'), ENV (0+, "K=V"; the agent's base env is replaced by exactly these),
     * CWD (optional, default /workspace), STDIN_PIPE (u32 1 = daemon will send STDIN frames;
     * absent/0 = /dev/null). Answered by STDOUT/STDERR frames then one EXIT, or by one ERROR
     * if the process could not be started. */
    PROTO_EXEC = 10,
    /* daemon -> agent: raw bytes for the process's stdin; flag FIN closes it */
    PROTO_STDIN = 11,
    /* daemon -> agent: fields SIGNUM. Sent to the command's whole process tree. */
    PROTO_SIGNAL = 12,
    /* agent -> daemon: raw output bytes */
    PROTO_STDOUT = 13,
    PROTO_STDERR = 14,
    /* agent -> daemon: fields EXIT_CODE (i32 as u32; -1 if killed), TERM_SIGNAL (u32, 0 if
     * exited normally). Ends the request; sent after all STDOUT/STDERR of that process. */
    PROTO_EXIT = 15,

    /* daemon -> agent: fields PATH, OFFSET (u64, default 0), LENGTH (u64, default to EOF).
     * Answered by one STAT_RESULT (of the opened file), DATA frames, then OK; or ERROR. */
    PROTO_FILE_READ = 20,
    /* daemon -> agent: fields PATH, MODE (u32, default 0644), WFLAGS (u32 PROTO_W_*).
     * Followed by DATA frames from the daemon with the same id, the last with flag FIN
     * (an empty DATA+FIN is fine). Answered by STAT_RESULT then OK, or ERROR (which may
     * come early; the daemon then stops sending DATA). */
    PROTO_FILE_WRITE = 21,
    /* daemon -> agent: fields PATH. Answered by zero or more DIR_ENTRIES frames then OK, or
     * ERROR (which may come after some DIR_ENTRIES, e.g. E2BIG for a huge directory). */
    PROTO_FILE_LIST = 22,
    /* daemon -> agent: fields PATH. Answered by STAT_RESULT then OK, or ERROR.
     * Does not follow a final symlink (lstat). */
    PROTO_FILE_STAT = 23,
    /* daemon -> agent: fields PATH, MODE (default 0755), WFLAGS (PROTO_W_PARENTS honoured).
     * Answered by OK or ERROR; an existing directory is OK with PROTO_W_PARENTS. */
    PROTO_FILE_MKDIR = 24,
    /* daemon -> agent: fields PATH, WFLAGS (PROTO_W_RECURSIVE honoured). OK or ERROR. */
    PROTO_FILE_REMOVE = 25,

    /* either direction: raw bytes of a file */
    PROTO_DATA = 30,
    /* agent -> daemon: fields TYPE, SIZE, MODE, MTIME (and NAME for directory entries) */
    PROTO_STAT_RESULT = 31,
    /* agent -> daemon: repeated groups NAME, TYPE, SIZE, MODE, MTIME (one group per entry,
     * NAME starts each group) */
    PROTO_DIR_ENTRIES = 32,
    /* agent -> daemon: success, ends the request */
    PROTO_OK = 33,
    /* agent -> daemon: fields ERRNO (u32), MESSAGE; ends the request */
    PROTO_ERROR = 34,

    /* daemon -> agent: fields PATH, WINDOW. A tar archive (ustar, pax records for long names)
     * of PATH (a final symlink followed): a directory's contents, names relative to it, or a
     * single file or symlink under its own name. Answered by DATA frames (against credit) then
     * OK, or ERROR (which may come after some DATA). */
    PROTO_FILE_ARCHIVE = 50,
    /* daemon -> agent: fields PATH (the target directory, made with its parents if missing),
     * SOURCE (a tar file in the sandbox), WFLAGS (PROTO_W_REMOVE_SOURCE honoured). Extracts
     * SOURCE under PATH, refusing entries that would land outside it. Answered by EXTRACTED
     * frames (progress, at least every 5 s, and one at the end) then OK, or ERROR. */
    PROTO_FILE_EXTRACT = 51,
    /* agent -> daemon: fields ENTRIES, SIZE (bytes of file data), SKIPPED, and NAME and
     * MESSAGE (the first skipped entry and its kind) when SKIPPED > 0 */
    PROTO_EXTRACTED = 52,
    /* daemon -> agent: start an interactive session. Fields as EXEC (ARG, ENV, CWD, WINDOW;
     * stdin is always a pipe or the terminal), plus TTY (u32 1 = a pseudo-terminal is the
     * process's stdin, stdout and stderr and its controlling terminal; 0 = pipes as EXEC),
     * ROWS and COLS (u32, the terminal's size; default 24x80). Answered like EXEC: STDOUT
     * (and, without TTY, STDERR) frames then one EXIT, or one ERROR. STDIN, SIGNAL, CANCEL and
     * CREDIT work as for EXEC; STDIN with FIN on a terminal sends its end-of-file character. */
    PROTO_SESSION = 40,
    /* daemon -> agent, for a live SESSION with TTY: fields ROWS, COLS. The terminal's size is
     * set (TIOCSWINSZ) and its foreground process group gets SIGWINCH. No answer; ignored for
     * any other id. */
    PROTO_RESIZE = 41,
};

enum proto_flag {
    PROTO_F_FIN = 1 << 0, /* last STDIN / DATA frame of a request */
};
#define PROTO_F_KNOWN (PROTO_F_FIN)

enum proto_tag {
    PT_VERSION = 1,     /* u32 */
    PT_PID = 2,         /* u32 */
    PT_ARG = 3,         /* bytes (no NUL) */
    PT_ENV = 4,         /* bytes "K=V" (no NUL) */
    PT_CWD = 5,         /* bytes */
    PT_STDIN_PIPE = 6,  /* u32 */
    PT_SIGNUM = 7,      /* u32 */
    PT_EXIT_CODE = 8,   /* u32 (int32) */
    PT_TERM_SIGNAL = 9, /* u32 */
    PT_PATH = 10,       /* bytes (no NUL) */
    PT_OFFSET = 11,     /* u64 */
    PT_LENGTH = 12,     /* u64 */
    PT_MODE = 13,       /* u32: permission bits (07777) */
    PT_WFLAGS = 14,     /* u32: PROTO_W_* */
    PT_NAME = 15,       /* bytes */
    PT_TYPE = 16,       /* u32: enum proto_ftype */
    PT_SIZE = 17,       /* u64 */
    PT_MTIME = 18,      /* u64: seconds since the epoch */
    PT_ERRNO = 19,      /* u32: Linux errno */
    PT_MESSAGE = 20,    /* bytes */
    PT_TARGET = 21,     /* bytes: symlink target, in STAT_RESULT / DIR_ENTRIES when a link */
    /* u64, on EXEC and FILE_READ: flow control. The agent may send at most this many bytes of
     * payload in the request's STDOUT+STDERR (EXEC) or DATA (FILE_READ) frames, plus what
     * later CREDIT frames add; it holds back (leaving the pipe or file unread) until credit
     * comes. Absent: no limit. The daemon treats a request that overruns its credit as a
     * protocol violation. */
    PT_WINDOW = 22,
    /* u32, in PONG: processes in the sandbox besides the agent and its commands' namespace
     * init (zombies count). The daemon freezes an idle sandbox only when this is 0; absent
     * means unknown, so never. The agent's word only decides whether its own sandbox may
     * sleep: a lie costs the liar CPU or latency, no one else. */
    PT_PROCS = 23,
    /* u64, on EXIT (optional): microseconds from the agent reaping the command's main process
     * to its sending EXIT (waiting for the pipes to close, sending the last output). */
    PT_EXIT_WAIT = 24,
    /* bytes, on FILE_EXTRACT: the archive's path in the sandbox */
    PT_SOURCE = 50,
    /* u64, on EXTRACTED: entries extracted, entries skipped */
    PT_ENTRIES = 51,
    PT_SKIPPED = 52,
    /* u32, on SESSION: 1 = a pseudo-terminal, 0 = pipes */
    PT_TTY = 25,
    /* u32, on SESSION and RESIZE: the terminal's size, 1 ... 10000 */
    PT_ROWS = 26,
    PT_COLS = 27,
};

enum proto_wflags {
    PROTO_W_PARENTS = 1 << 0,       /* create missing parent directories */
    PROTO_W_APPEND = 1 << 1,        /* FILE_WRITE: append instead of truncating */
    PROTO_W_RECURSIVE = 1 << 2,     /* FILE_REMOVE: remove a directory and its contents */
    PROTO_W_EXCL = 1 << 3,          /* FILE_WRITE: fail if it exists */
    PROTO_W_REMOVE_SOURCE = 1 << 4, /* FILE_EXTRACT: remove SOURCE when done (or failed) */
};

enum proto_ftype {
    PROTO_FT_FILE = 1,
    PROTO_FT_DIR = 2,
    PROTO_FT_SYMLINK = 3,
    PROTO_FT_OTHER = 4,
};

struct proto_header {
    uint32_t len;
    uint32_t id;
    uint16_t type;
    uint16_t flags;
};

/** Encodes h into out[PROTO_HEADER_LEN]. */
void proto_header_encode(const struct proto_header *h, uint8_t *out);

/**
 * Decodes and validates a header from in[PROTO_HEADER_LEN].
 * Returns 0, or -1 if len > PROTO_MAX_PAYLOAD, the type is unknown, or unknown flag bits are set.
 */
int proto_header_decode(const uint8_t *in, struct proto_header *out);

/** Returns a static name for a frame type ("EXEC"), or "UNKNOWN". */
const char *proto_type_name(uint16_t type);

/** Returns 1 if type is one of enum proto_type, else 0 (what proto_header_decode accepts). */
int proto_type_known(uint16_t type);

/** Returns 1 if frames of this type carry raw bytes (STDIN, STDOUT, STDERR, DATA), 0 if fields. */
int proto_type_is_raw(uint16_t type);

/* ---- building a field payload ---- */

/** A growable byte buffer for building payloads. Zero-initialise before use. */
struct proto_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
};

/** Frees the buffer's memory and zeroes it (it may be used again). */
void proto_buf_free(struct proto_buf *b);
/** Empties the buffer, keeping its memory. */
void proto_buf_reset(struct proto_buf *b);
/**
 * Appends one field. Aborts on out-of-memory (payloads are bounded by PROTO_MAX_PAYLOAD) and
 * if len does not fit the field's u32 length. Does not check PROTO_MAX_PAYLOAD: the caller
 * does, or proto_frame_build refuses the result.
 */
void proto_put_bytes(struct proto_buf *b, uint16_t tag, const void *data, size_t len);
/** Appends a string field (without its NUL). */
void proto_put_str(struct proto_buf *b, uint16_t tag, const char *s);
/** Appends a 4-byte big-endian integer field. */
void proto_put_u32(struct proto_buf *b, uint16_t tag, uint32_t v);
/** Appends an 8-byte big-endian integer field. */
void proto_put_u64(struct proto_buf *b, uint16_t tag, uint64_t v);

/**
 * Builds a whole frame (header + payload) into `out` (reset first).
 * Returns 0, or -1 if the payload is larger than PROTO_MAX_PAYLOAD.
 */
int proto_frame_build(struct proto_buf *out, uint32_t id, uint16_t type, uint16_t flags,
                      const void *payload, size_t len);

/* ---- reading a field payload ---- */

/** One field, pointing into the payload (not copied, not NUL-terminated). */
struct proto_field {
    uint16_t tag;
    uint32_t len;
    const uint8_t *data;
};

/** An iterator over the fields of a payload. */
struct proto_iter {
    const uint8_t *p;
    size_t left;
};

/** Starts iterating over payload[len] (payload may be NULL when len is 0). Copies nothing. */
void proto_iter_init(struct proto_iter *it, const void *payload, size_t len);

/**
 * Yields the next field. Returns 1 with *f set, 0 at the end, -1 if the payload is malformed
 * (a field running past the end).
 */
int proto_iter_next(struct proto_iter *it, struct proto_field *f);

/** Checks that the whole payload is a well-formed field list. Returns 0 or -1. */
int proto_fields_valid(const void *payload, size_t len);

/**
 * Finds the first field with this tag. Returns 1 (found), 0 (absent), -1 (malformed payload;
 * the whole payload is checked, even past a match).
 */
int proto_find(const void *payload, size_t len, uint16_t tag, struct proto_field *out);

/** Reads a field as u32. Returns 0, or -1 if its length is not exactly 4. */
int proto_field_u32(const struct proto_field *f, uint32_t *out);
/** Reads a field as u64. Returns 0, or -1 if its length is not exactly 8. */
int proto_field_u64(const struct proto_field *f, uint64_t *out);

/**
 * Copies a byte field into a NUL-terminated string in out[outlen].
 * Returns 0, or -1 if it contains a NUL byte or does not fit.
 */
int proto_field_str(const struct proto_field *f, char *out, size_t outlen);

/**
 * Returns a malloc'd NUL-terminated copy, or NULL if the field contains NUL (caller frees).
 * Aborts on out-of-memory.
 */
char *proto_field_strdup(const struct proto_field *f);

/* ---- reading frames from a stream ---- */

/**
 * An incremental frame reader over a byte stream: feed it bytes as they come,
 * take whole frames out. Holds at most one frame's bytes.
 */
struct proto_reader {
    uint8_t hdr[PROTO_HEADER_LEN];
    size_t hdr_got;
    struct proto_header h;
    uint8_t *payload; /* PROTO_MAX_PAYLOAD bytes, allocated on first use */
    size_t payload_got;
    int bad; /* set once a malformed header was seen; the stream is unusable */
};

/** Initialises a reader (allocates nothing yet). */
void proto_reader_init(struct proto_reader *r);
/** Frees the reader's buffer; the reader may be initialised again. */
void proto_reader_free(struct proto_reader *r);

/**
 * Consumes bytes from buf[len] until one frame is complete or the input runs out.
 * Returns the number of bytes consumed; sets *done = 1 when a frame is complete (then
 * r->h and r->payload hold it until the next call; payload is never NULL then, even for an
 * empty frame), and returns (size_t)-1 on a malformed header (r->bad is set; the stream must be
 * closed). The header is checked as soon as its 12 bytes are in, before any payload.
 */
size_t proto_reader_feed(struct proto_reader *r, const uint8_t *buf, size_t len, int *done);

/**
 * Whether the reader is between frames (nothing of a next frame fed yet): a caller holding a
 * whole frame in its own buffer may then handle it from there instead of feeding it.
 */
int proto_reader_idle(const struct proto_reader *r);

#endif
