#!/usr/bin/env python3
"""A hostile withruntime agent for the failure tests (tests/e2e/test_failures.py).

The fake driver runs it instead of withruntime-agent (`serve --driver fake --agent THIS`), with
the channel to the daemon on fd 0 and fd 1 (docs/protocol.md). It reads its mode from the file
`hostile.mode` beside it (read at every start, so a test can change it between starts) and then
misbehaves in that one way. Every mode that stays connected answers PING with PONG, so the
daemon's watchdog sees a live agent and only the misbehaviour under test is in play.

Modes:
  good              HELLO; EXEC -> EXIT 0; any other request -> ERROR ENOSYS
  silent            HELLO, then reads and never answers anything (not even PING)
  exit_after_hello  HELLO, then exits (the channel closes)
  wrong_type        EXEC is answered with OK; file requests with EXIT (terminal frames of
                    the wrong kind for the operation)
  data_overrun      FILE_READ: STAT_RESULT announcing 10 bytes, then 4 MiB of DATA, then OK
  million_entries   FILE_LIST: 1,000,000 entries in DIR_ENTRIES frames, then OK
  oversized         first request: a header announcing a payload over PROTO_MAX_PAYLOAD
  garbage           first request: 16 bytes that are no frame header
  daemon_type       first request: a frame of type EXEC, which only the daemon sends
  close_mid         first request: half a STDOUT frame, then exit
  close_unread      first request: waits (up to 10 s) until more of the daemon's frames are
                    queued to it, then half a STDOUT frame and exit without reading them (the
                    kernel then reports the close to the daemon as ECONNRESET, not EOF)
  bad_version       HELLO with protocol version 99
  hello_twice       HELLO twice
  stderr_flood      as good, while a thread writes 32 MiB of lines to stderr (agent.log on the
                    host), then "flood done"
"""

import os
import select
import struct
import sys
import threading

HELLO, PING, PONG = 1, 2, 3
EXEC, STDIN, SIGNAL, STDOUT, STDERR, EXIT = 10, 11, 12, 13, 14, 15
FILE_READ, FILE_WRITE, FILE_LIST, FILE_STAT, FILE_MKDIR, FILE_REMOVE = 20, 21, 22, 23, 24, 25
DATA, STAT_RESULT, DIR_ENTRIES, OK, ERROR = 30, 31, 32, 33, 34
REQUESTS = {PING, EXEC, FILE_READ, FILE_WRITE, FILE_LIST, FILE_STAT, FILE_MKDIR, FILE_REMOVE}

PT_VERSION, PT_PID, PT_EXIT_CODE, PT_TERM_SIGNAL = 1, 2, 8, 9
PROTO_VERSION = 3  # src/proto/proto.h
PT_NAME, PT_TYPE, PT_SIZE, PT_MODE, PT_MTIME, PT_ERRNO, PT_MESSAGE = 15, 16, 17, 13, 18, 19, 20
FT_FILE = 1
MAX_PAYLOAD = 1 << 20
ENOSYS = 38


def field(tag, value):
    return struct.pack(">HI", tag, len(value)) + value


def u32(tag, v):
    return field(tag, struct.pack(">I", v))


def u64(tag, v):
    return field(tag, struct.pack(">Q", v))


def frame(ftype, rid, payload=b"", flags=0):
    return struct.pack(">IIHH", len(payload), rid, ftype, flags) + payload


def send(data):
    view = memoryview(data)
    while view:
        n = os.write(1, view)
        view = view[n:]


def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            sys.exit(0)  # the daemon closed the channel
        buf += chunk
    return buf


def frames():
    while True:
        length, rid, ftype, flags = struct.unpack(">IIHH", read_exact(12))
        yield rid, ftype, read_exact(length) if length else b""


def hello(version=PROTO_VERSION):
    send(frame(HELLO, 0, u32(PT_VERSION, version) + u32(PT_PID, os.getpid())))


def error(rid, message):
    send(frame(ERROR, rid, u32(PT_ERRNO, ENOSYS) + field(PT_MESSAGE, message.encode())))


def stat_fields(size):
    return u32(PT_TYPE, FT_FILE) + u64(PT_SIZE, size) + u32(PT_MODE, 0o644) + u64(PT_MTIME, 0)


def million_entries(rid):
    batch, count = [], 0
    size = 0
    for i in range(1_000_000):
        e = field(PT_NAME, b"f%07d" % i) + stat_fields(0)
        if size + len(e) > MAX_PAYLOAD:
            send(frame(DIR_ENTRIES, rid, b"".join(batch)))
            batch, size = [], 0
        batch.append(e)
        size += len(e)
        count += 1
    send(frame(DIR_ENTRIES, rid, b"".join(batch)))
    send(frame(OK, rid))


def answer(mode, rid, ftype, first):
    """Answers one request; returns False to stop (exit)."""
    if ftype == PING:
        send(frame(PONG, rid))
        return True
    if first and mode == "oversized":
        send(struct.pack(">IIHH", MAX_PAYLOAD + 1, rid, STDOUT, 0) + b"x" * 64)
        return True
    if first and mode == "garbage":
        send(b"\xde\xad\xbe\xef" * 4)
        return True
    if first and mode == "daemon_type":
        send(frame(EXEC, rid, field(3, b"true")))
        return True
    if first and mode == "close_mid":
        send(struct.pack(">IIHH", 1000, rid, STDOUT, 0) + b"y" * 10)
        return False
    if first and mode == "close_unread":
        poller = select.poll()
        poller.register(0, select.POLLIN)
        poller.poll(10_000)
        send(struct.pack(">IIHH", 1000, rid, STDOUT, 0) + b"y" * 10)
        return False
    if mode == "wrong_type" and ftype == EXEC:
        send(frame(OK, rid))
        return True
    if mode == "wrong_type" and ftype in (FILE_READ, FILE_LIST, FILE_STAT):
        send(frame(EXIT, rid, u32(PT_EXIT_CODE, 0) + u32(PT_TERM_SIGNAL, 0)))
        return True
    if mode == "data_overrun" and ftype == FILE_READ:
        send(frame(STAT_RESULT, rid, stat_fields(10)))
        chunk = b"z" * 65536
        for _ in range(64):
            send(frame(DATA, rid, chunk))
        send(frame(OK, rid))
        return True
    if mode == "no_files" and ftype in (FILE_READ, FILE_LIST, FILE_STAT):
        return True  # never answered: the daemon's deadline must
    if mode == "million_entries" and ftype == FILE_LIST:
        million_entries(rid)
        return True
    if ftype == EXEC:
        send(frame(EXIT, rid, u32(PT_EXIT_CODE, 0) + u32(PT_TERM_SIGNAL, 0)))
        return True
    if ftype in REQUESTS:
        error(rid, f"hostile agent ({mode}) does not do this")
    return True  # STDIN, SIGNAL, DATA for an open request: dropped


def flood():
    lines = (b"flood " + b"x" * 57 + b"\n") * 1024  # 64 KiB
    for _ in range(512):
        os.write(2, lines)
    os.write(2, b"flood done\n")


def main():
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    try:
        with open(os.path.join(here, "hostile.mode")) as f:
            mode = f.read().strip() or "good"
    except OSError:
        mode = "good"
    print(f"hostile agent: mode {mode}, pid {os.getpid()}", file=sys.stderr, flush=True)

    hello(99 if mode == "bad_version" else PROTO_VERSION)
    if mode == "hello_twice":
        hello()
    if mode == "exit_after_hello":
        return
    if mode == "stderr_flood":
        threading.Thread(target=flood, daemon=True).start()
    first = True
    for rid, ftype, _payload in frames():
        if mode == "silent":
            continue
        if ftype not in REQUESTS:
            continue
        if not answer(mode, rid, ftype, first and ftype != PING):
            return
        if ftype != PING:
            first = False


if __name__ == "__main__":
    main()
