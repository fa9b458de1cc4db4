"""Flow control and disconnects (issue 8, points 1-3): a download or a streamed command goes
only as fast as its caller reads, so a slow or vanished caller costs the daemon a bounded amount
of memory and the sandbox no work; a caller that goes away stops the agent; a big transfer does
not keep the sandbox from answering anything else."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse

import pytest

import conftest
from test_connections import ShortIdleDaemon, serve_own
from test_output import RssWatch, rss

MIB = 1024 * 1024
# What one slow download may add to the daemon's memory: its bytes in flight (4 MiB between the
# agent's credit and the caller's queue), the channel's input buffer (2 MiB) and the allocator's
# slack. Without flow control the daemon grew by ~400 MiB a second here.
SLOW_READER_GROWTH = 48 * MIB


def raw_request(daemon, method, path, query=None, rcvbuf=16384):
    """Sends a request on a socket with a small receive buffer and returns the socket after the
    status line and headers (the body is left to read, or not)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(60)
    s.connect(("127.0.0.1", daemon.port))
    target = path + ("?" + urllib.parse.urlencode(query) if query else "")
    s.sendall(f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              f"{conftest.auth_header(daemon.port)}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        assert chunk, f"connection closed in the headers: {head!r}"
        head += chunk
    status = int(head.split(b" ", 2)[1])
    return s, status, head


def sandbox_cpu_usec(client, sid):
    return client.request("GET", f"/v1/sandboxes/{sid}/stats").json()["cpu_usec"]


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def make_huge_file(client, sid, name="huge"):
    r = client.request("POST", f"/v1/sandboxes/{sid}/exec",
                       {"command": f"truncate -s 1T /workspace/{name}"})
    assert r.status == 200 and r.json()["exit_code"] == 0, r


def test_slow_reader_of_a_huge_file_costs_little_and_leaving_stops_it(daemon, client, sandbox):
    make_huge_file(client, sandbox)
    before = rss(daemon.proc.pid)
    s, status, _ = raw_request(daemon, "GET", f"/v1/sandboxes/{sandbox}/files/content",
                               {"path": "/workspace/huge"})
    assert status == 200
    got = 0
    with RssWatch(daemon.proc.pid) as watch:
        # 4 s of a reader taking 256 KiB a second, then 2 s of not reading at all
        for _ in range(16):
            got += len(s.recv(65536))
            time.sleep(0.25)
        time.sleep(2)
    assert got > 0
    growth = watch.peak - before
    assert growth < SLOW_READER_GROWTH, \
        f"the daemon grew by {growth / MIB:.0f} MiB for a reader that took {got} bytes"
    # The sandbox is not reading ahead either: it waits for the caller.
    cpu0 = sandbox_cpu_usec(client, sandbox)
    time.sleep(2)
    waiting = sandbox_cpu_usec(client, sandbox) - cpu0
    assert waiting < 500_000, f"the sandbox used {waiting} us of CPU in 2 s while nobody read"

    # The caller goes away: the daemon cancels the read (logged), and the sandbox stays usable.
    s.close()
    wait_for(lambda: b"files.read_cancelled" in daemon.log_bytes(), 10, "files.read_cancelled")
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec", {"command": "echo ok"})
    assert r.status == 200 and r.json()["stdout"] == "ok\n"


def test_caller_leaving_a_fast_read_stops_the_agent(daemon, client, sandbox):
    """A reader that takes bytes as fast as it can, then leaves: the sandbox stops sending
    (its CPU goes back to idle) instead of reading a terabyte for nobody."""
    make_huge_file(client, sandbox, "huge2")
    s, status, _ = raw_request(daemon, "GET", f"/v1/sandboxes/{sandbox}/files/content",
                               {"path": "/workspace/huge2"}, rcvbuf=1 << 20)
    assert status == 200
    got = 0
    while got < 200 * MIB:
        chunk = s.recv(1 << 20)
        assert chunk
        got += len(chunk)
    s.close()
    wait_for(lambda: b"files.read_cancelled" in daemon.log_bytes(), 10, "files.read_cancelled")
    time.sleep(1)  # the cancel is on its way; what the agent had in flight drains
    cpu0 = sandbox_cpu_usec(client, sandbox)
    time.sleep(2)
    used = sandbox_cpu_usec(client, sandbox) - cpu0
    # reading the sparse file flat out costs about a whole core (2,000,000 us in 2 s)
    assert used < 500_000, f"the sandbox used {used} us of CPU in the 2 s after the caller left"


def test_streamed_command_waits_for_its_reader(daemon, client, sandbox):
    """A streamed command whose caller does not read blocks on its output, as on a slow
    terminal, and finishes once the caller reads."""
    size = 14_000_000
    body = json.dumps({"command": f"head -c {size} /dev/zero | tr '\\0' y; touch /tmp/wrote-all",
                       "stream": True, "max_output_bytes": 16 * MIB}).encode()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    s.settimeout(60)
    s.connect(("127.0.0.1", daemon.port))
    s.sendall(f"POST /v1/sandboxes/{sandbox}/exec HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              f"{conftest.auth_header(daemon.port)}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
              + body)
    time.sleep(3)  # the caller reads nothing for 3 s

    def wrote_all():
        r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                           {"command": "test -e /tmp/wrote-all"})
        return r.json()["exit_code"] == 0

    assert not wrote_all(), "the command wrote 14 MB although its caller read none of it"
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        chunk = s.recv(1 << 20)
        assert chunk, "the stream ended without its last chunk"
        data += chunk
    s.close()
    lines = [json.loads(line) for line in data.split(b"\r\n") if line.startswith(b"{")]
    out = sum(len(e["data"]) for e in lines if e.get("type") == "stdout")
    assert lines[-1]["type"] == "exit" and lines[-1]["exit_code"] == 0, lines[-1]
    assert out == size
    assert wrote_all()


# The reader of test_big_transfer_leaves_the_sandbox_answering, in a process of its own so that
# it reads flat out whatever the test's own thread does. It reads exactly what the answer says
# (its Content-Length, or chunks up to the last), then stops.
BIG_READER = r"""
import os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
s.sendall(f"GET {sys.argv[2]} HTTP/1.1\r\nHost: 127.0.0.1\r\n{os.environ['AUTH']}\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(65536)
    if not chunk:
        sys.exit(f"connection closed in the headers: {head!r}")
    head += chunk
head, body = head.split(b"\r\n\r\n", 1)
fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
length = int(fields.get(b"Content-Length", -1))
buf, got, tail = bytearray(1 << 20), len(body), body[-7:]
while got != length and tail != b"\r\n0\r\n\r\n":
    n = s.recv_into(buf)
    if n == 0:
        sys.exit(f"connection closed after {got} bytes of the body")
    got += n
    tail = (tail + bytes(buf[max(0, n - 7):n]))[-7:]
print(head.split(b" ", 2)[1].decode(), got)
"""


def test_big_transfer_leaves_the_sandbox_answering(daemon, client, sandbox):
    """4 GiB read flat out while other calls run: every call is answered, and the sandbox is
    never taken for dead."""
    make_huge_file(client, sandbox, "huge3")
    total = 4 * 1024 * MIB
    target = f"/v1/sandboxes/{sandbox}/files/content?" + urllib.parse.urlencode(
        {"path": "/workspace/huge3", "length": total})
    reader = subprocess.Popen([sys.executable, "-c", BIG_READER, str(daemon.port), target],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, AUTH=conftest.auth_header(daemon.port)))
    answered = 0
    while reader.poll() is None:
        r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec", {"command": "true"},
                           timeout=30)
        assert r.status == 200 and r.json()["exit_code"] == 0, r
        r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/stat",
                           query={"path": "/workspace/huge3"}, timeout=30)
        assert r.status == 200, r
        answered += 1
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err.decode()
    status, got = out.split()
    assert status == b"200" and int(got) >= total, out  # the body (and any chunk framing)
    assert answered >= 1
    info = client.request("GET", f"/v1/sandboxes/{sandbox}").json()
    assert info["state"] == "running", info


# slow: 1 GiB of output; and its "memory goes back" half holds for glibc's allocator, not for
# the sanitizer build's (ASan keeps freed memory in quarantine), whose run leaves slow tests out
@pytest.mark.slow
def test_background_output_memory_is_bounded(daemon, client, make_sandbox):
    """32 background commands writing 32 MiB each: each keeps its last MiB, so the daemon holds
    tens of MiB, not the 1 GiB they wrote; deleting the sandbox gives it back."""
    # 2 GiB: its process cap (memory_mib / 16 = 128) leaves room for 32 pipelines of three
    sb = make_sandbox(memory_mib=2048)["id"]
    before = rss(daemon.proc.pid)
    cids = []
    for _ in range(32):
        r = client.request("POST", f"/v1/sandboxes/{sb}/exec",
                           {"command": "head -c 33554432 /dev/zero | tr '\\0' x",
                            "background": True, "max_output_bytes": 16 * MIB})
        assert r.status == 201, r
        cids.append(r.json()["id"])
    with RssWatch(daemon.proc.pid) as watch:
        for cid in cids:
            r = client.request("POST", f"/v1/sandboxes/{sb}/commands/{cid}/wait",
                               {"timeout_seconds": 300}, timeout=330)
            assert r.status == 200 and r.json()["state"] == "exited", r
            assert r.json()["stdout_bytes"] == 33554432
    growth = watch.peak - before
    assert growth < 96 * MIB, f"the daemon grew by {growth / MIB:.0f} MiB"
    out = client.request("GET", f"/v1/sandboxes/{sb}/commands/{cids[-1]}/output").json()
    assert out["stdout"] == "x" * MIB and out["stdout_offset"] == 32 * MIB - MIB
    assert client.request("DELETE", f"/v1/sandboxes/{sb}").status == 200
    wait_for(lambda: rss(daemon.proc.pid) < before + 24 * MIB, 15,
             "the daemon's memory to return close to where it was")


class SmallBudgetDaemon(ShortIdleDaemon):
    """A daemon of its own (sharing the session's image) with a 16 MiB output budget."""

    def serve_argv(self):
        return conftest.Daemon.serve_argv(self) + ["--output-memory-mib", "16"]


@pytest.fixture(scope="module")
def budget_daemon(daemon):
    yield from serve_own(SmallBudgetDaemon(daemon))


def test_output_budget_refuses_what_does_not_fit(budget_daemon):
    """With 16 MiB for output in all: an exec that could keep 2 x 16 MiB is refused with 503
    saying why; four slow downloads (4 MiB in flight each) fit, a fifth does not, nor an
    exec; once they end the budget is free again."""
    d = budget_daemon
    c = d.client
    sid = c.request("POST", "/v1/sandboxes", {"memory_mib": 512}).json()["id"]
    try:
        r = c.request("POST", f"/v1/sandboxes/{sid}/exec",
                      {"command": "true", "max_output_bytes": 16 * MIB})
        assert r.status == 503 and r.error[0] == "unavailable", r
        assert "max_output_bytes" in r.error[1], r
        make_huge_file(c, sid)
        held = []
        for _ in range(4):  # 4 x 4 MiB: exactly the budget
            s, status, _ = raw_request(d, "GET", f"/v1/sandboxes/{sid}/files/content",
                                       {"path": "/workspace/huge"})
            held.append((s, status))
        assert [st for _, st in held] == [200] * 4
        s, status, head = raw_request(d, "GET", f"/v1/sandboxes/{sid}/files/content",
                                      {"path": "/workspace/huge"})
        s.close()
        assert status == 503, head
        r = c.request("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
        assert r.status == 503, r
        for s, _ in held:
            s.close()
        wait_for(lambda: c.request("POST", f"/v1/sandboxes/{sid}/exec",
                                   {"command": "echo ok"}).status == 200,
                 15, "the budget to be given back")
    finally:
        assert c.request("DELETE", f"/v1/sandboxes/{sid}").status == 200


def test_caller_leaving_a_whole_exec_kills_the_command(daemon, client, sandbox):
    """A non-streamed exec waits with nothing on the wire; its caller leaves: the command is
    killed, as a shell's would be, instead of running to its timeout."""
    body = json.dumps({"command": "sleep 271", "timeout_seconds": 600}).encode()
    s = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
    s.sendall(f"POST /v1/sandboxes/{sandbox}/exec HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              f"{conftest.auth_header(daemon.port)}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
              + body)

    def running():
        r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                           {"command": "pgrep -f 'sleep 27[1]' >/dev/null"})
        return r.json()["exit_code"] == 0

    wait_for(running, 10, "the command to start")
    s.close()
    wait_for(lambda: not running(), 10, "the command to be killed after its caller left")
    assert b"exec.client_gone" in daemon.log_bytes()
