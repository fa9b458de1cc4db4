#!/usr/bin/env python3
"""Writes the seed corpus for tests/fuzz/fuzz_proto.c into tests/fuzz/corpus/proto/.

Each file is a byte stream as the daemon or the agent would see it on the
channel: valid frames of every type, a mixed stream, and broken ones (the
fuzzer starts from both). The constants mirror src/proto/proto.h and
docs/protocol.md. Run from the repository root; the output is committed, so
re-run only when the protocol changes.
"""
import os
import struct
import sys

MAX_PAYLOAD = 1 << 20

T = dict(HELLO=1, PING=2, PONG=3, EXEC=10, STDIN=11, SIGNAL=12, STDOUT=13, STDERR=14, EXIT=15,
         FILE_READ=20, FILE_WRITE=21, FILE_LIST=22, FILE_STAT=23, FILE_MKDIR=24,
         FILE_REMOVE=25, DATA=30, STAT_RESULT=31, DIR_ENTRIES=32, OK=33, ERROR=34, SESSION=40,
         RESIZE=41)
PT = dict(VERSION=1, PID=2, ARG=3, ENV=4, CWD=5, STDIN_PIPE=6, SIGNUM=7, EXIT_CODE=8,
          TERM_SIGNAL=9, PATH=10, OFFSET=11, LENGTH=12, MODE=13, WFLAGS=14, NAME=15, TYPE=16,
          SIZE=17, MTIME=18, ERRNO=19, MESSAGE=20, TARGET=21, WINDOW=22, PROCS=23, EXIT_WAIT=24,
          TTY=25, ROWS=26, COLS=27)
FIN = 1
W_PARENTS, W_APPEND, W_RECURSIVE, W_EXCL = 1, 2, 4, 8


def frame(type_, id_, payload=b"", flags=0, length=None):
    n = len(payload) if length is None else length
    return struct.pack(">IIHH", n, id_, type_, flags) + payload


def fb(tag, data):
    if isinstance(data, str):
        data = data.encode()
    return struct.pack(">HI", PT[tag] if isinstance(tag, str) else tag, len(data)) + data


def u32(tag, v):
    return fb(tag, struct.pack(">I", v & 0xFFFFFFFF))


def u64(tag, v):
    return fb(tag, struct.pack(">Q", v))


def stat_fields(ftype, size, mode, mtime, target=None):
    out = u32("TYPE", ftype) + u64("SIZE", size) + u32("MODE", mode) + u64("MTIME", mtime)
    if target is not None:
        out += fb("TARGET", target)
    return out


def corpus():
    c = {}
    c["hello"] = frame(T["HELLO"], 0, u32("VERSION", 1) + u32("PID", 1))
    c["ping"] = frame(T["PING"], 7)
    c["pong"] = frame(T["PONG"], 7)
    c["exec"] = frame(T["EXEC"], 1, fb("ARG", "sh") + fb("ARG", "-c") + fb("ARG", "echo hi")
                      + fb("ENV", "PATH=/usr/bin:/bin") + fb("ENV", "HOME=/root")
                      + fb("CWD", "/workspace"))
    c["exec-stdin"] = (frame(T["EXEC"], 2, fb("ARG", "cat") + u32("STDIN_PIPE", 1))
                       + frame(T["STDIN"], 2, b"hello ") + frame(T["STDIN"], 2, b"world", FIN))
    c["signal"] = frame(T["SIGNAL"], 2, u32("SIGNUM", 9))
    c["session"] = (frame(T["SESSION"], 3, fb("ARG", "sh") + u32("TTY", 1) + u32("ROWS", 24)
                          + u32("COLS", 80) + u64("WINDOW", 65536))
                    + frame(T["RESIZE"], 3, u32("ROWS", 50) + u32("COLS", 132))
                    + frame(T["STDIN"], 3, b"exit\n", FIN))
    c["resize-bad"] = frame(T["RESIZE"], 3, u32("ROWS", 0) + fb("COLS", "xy"))
    c["output"] = (frame(T["STDOUT"], 1, b"hi\n") + frame(T["STDERR"], 1, b"oops\n")
                   + frame(T["EXIT"], 1, u32("EXIT_CODE", 0) + u32("TERM_SIGNAL", 0)))
    c["exit-killed"] = frame(T["EXIT"], 3, u32("EXIT_CODE", -1) + u32("TERM_SIGNAL", 9))
    c["file-read"] = frame(T["FILE_READ"], 4, fb("PATH", "notes.txt") + u64("OFFSET", 10)
                           + u64("LENGTH", 4096))
    c["file-read-answer"] = (frame(T["STAT_RESULT"], 4, stat_fields(1, 5, 0o644, 1700000000))
                             + frame(T["DATA"], 4, b"hello") + frame(T["OK"], 4))
    c["file-write"] = (frame(T["FILE_WRITE"], 5, fb("PATH", "/workspace/a/b.txt")
                             + u32("MODE", 0o600) + u32("WFLAGS", W_PARENTS | W_EXCL))
                       + frame(T["DATA"], 5, b"x" * 100) + frame(T["DATA"], 5, b"", FIN))
    c["file-list"] = frame(T["FILE_LIST"], 6, fb("PATH", "/workspace"))
    c["dir-entries"] = (frame(T["DIR_ENTRIES"], 6,
                              fb("NAME", "a.txt") + stat_fields(1, 12, 0o644, 1700000000)
                              + fb("NAME", "src") + stat_fields(2, 4096, 0o755, 1700000001)
                              + fb("NAME", "link") + stat_fields(3, 5, 0o777, 1, "a.txt"))
                        + frame(T["OK"], 6))
    c["file-stat"] = frame(T["FILE_STAT"], 8, fb("PATH", "/etc/passwd"))
    c["mkdir"] = frame(T["FILE_MKDIR"], 9, fb("PATH", "x/y/z") + u32("MODE", 0o700)
                       + u32("WFLAGS", W_PARENTS))
    c["remove"] = frame(T["FILE_REMOVE"], 10, fb("PATH", "x") + u32("WFLAGS", W_RECURSIVE))
    c["error"] = frame(T["ERROR"], 11, u32("ERRNO", 2) + fb("MESSAGE", "command not found: foo"))
    c["mixed-stream"] = b"".join([c["hello"], c["ping"], c["exec"], c["output"], c["file-write"],
                                  c["file-read-answer"], c["dir-entries"], c["error"]])
    c["data-chunk"] = frame(T["DATA"], 12, bytes(range(256)) * 256, FIN)

    # broken on purpose
    c["bad-len"] = frame(T["DATA"], 1, b"", length=MAX_PAYLOAD + 1)
    c["bad-type"] = frame(999, 1)
    c["bad-type-zero"] = c["ping"] + frame(0, 1)
    c["bad-flags"] = frame(T["STDIN"], 1, b"x", flags=0x8001)
    c["truncated-header"] = c["ping"][:7]
    c["truncated-frame"] = frame(T["STDOUT"], 1, b"abcdef")[:15]
    c["truncated-field"] = frame(T["EXEC"], 1, struct.pack(">HI", PT["ARG"], 9) + b"ab")
    c["field-len-huge"] = frame(T["FILE_STAT"], 1, struct.pack(">HI", PT["PATH"], 0xFFFFFFFF))
    c["bad-int-size"] = frame(T["SIGNAL"], 1, fb("SIGNUM", b"\x00\x00\x00\x00\x09")
                              ) + frame(T["FILE_READ"], 2, fb("PATH", "/x") + u32("OFFSET", 1))
    c["nul-in-path"] = frame(T["FILE_STAT"], 1, fb("PATH", b"/etc\x00/passwd"))
    c["unknown-tag"] = frame(T["EXEC"], 1, fb("ARG", "true") + fb(999, "ignored"))
    c["trailing-garbage"] = c["ping"] + b"\x00\x00\x00"
    return c


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/proto"
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(corpus().items()):
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
    print(f"wrote {len(corpus())} files to {out}")


if __name__ == "__main__":
    main()
