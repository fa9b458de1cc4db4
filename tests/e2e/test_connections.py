"""Many idle and slow clients at once: the daemon keeps answering everyone else."""

import http.client
import os
import resource
import shutil
import socket
import time

import pytest

import conftest
from wrclient import chunk_bytes as output_of

IDLE = 2000
SLOW = 200


def open_many(port, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(s)
    return socks


def test_idle_and_slow_connections_do_not_starve_others(daemon, client, make_sandbox):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = IDLE + SLOW + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= want, "this test needs more fds"
    sid = make_sandbox(memory_mib=256)["id"]
    socks = []
    try:
        socks += open_many(daemon.port, IDLE)
        slow = open_many(daemon.port, SLOW)
        socks += slow
        # slowloris: a request line and half a header, then a byte now and then
        for s in slow:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                      conftest.auth_header(daemon.port).encode() + b"X-Slow: ")
        for _ in range(3):
            for s in slow:
                try:
                    s.sendall(b"a")
                except OSError:
                    pass  # closed at the header deadline (serve --header-timeout, 10 s)
            t0 = time.monotonic()
            h = client.request("GET", "/v1/health", timeout=10)
            assert h.status == 200, h
            assert time.monotonic() - t0 < 5
        r = client.exec(sid, "echo still here", timeout_seconds=30)
        assert r["stdout"] == "still here\n"
        other = make_sandbox(memory_mib=256)["id"]
        assert client.exec(other, "true")["exit_code"] == 0
    finally:
        for s in socks:
            s.close()
    # and once they are gone, the daemon still answers
    assert client.request("GET", "/v1/health").status == 200


IDLE_TIMEOUT = 2


class ShortIdleDaemon(conftest.OwnStateDaemon):
    """A daemon of its own (sharing the session's image) with a short --idle-timeout."""

    prefix = "wr-idle-"

    def serve_argv(self):
        return super().serve_argv() + ["--idle-timeout", str(IDLE_TIMEOUT)]


def serve_own(d):
    """Runs a daemon of a test module's own (a ShortIdleDaemon or a subclass) for a fixture:
    starts it, yields it, then stops it and checks it left nothing and exited cleanly."""
    d.start()
    yield d
    leftovers, status = d.stop()
    shutil.rmtree(d.state_dir, ignore_errors=True)  # `images` is a symlink: removed, not followed
    assert not leftovers, f"sandboxes left by the tests: {leftovers}"
    assert status == 0, f"daemon did not exit cleanly on SIGTERM: {status}\n{d.log_tail()}"
    shutil.rmtree(d.logdir, ignore_errors=True)


@pytest.fixture(scope="module")
def idle_daemon(daemon):
    yield from serve_own(ShortIdleDaemon(daemon))


def closed_by_peer_within(sock, seconds):
    """Waits (polling, up to seconds) for the daemon to close sock; True if it did."""
    sock.settimeout(0.5)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if sock.recv(4096) == b"":
                return True
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True
    return False


def test_idle_connections_are_closed(idle_daemon):
    # a connection that never sends anything
    quiet = socket.create_connection(("127.0.0.1", idle_daemon.port), timeout=10)
    # a kept-alive connection after one answer
    kept = socket.create_connection(("127.0.0.1", idle_daemon.port), timeout=10)
    kept.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                 conftest.auth_header(idle_daemon.port).encode() + b"\r\n")
    first = kept.recv(65536)
    assert first.startswith(b"HTTP/1.1 200"), first
    t0 = time.monotonic()
    try:
        assert closed_by_peer_within(quiet, 30), "an idle connection was never closed"
        assert closed_by_peer_within(kept, 30), "an idle kept-alive connection was never closed"
        # not before its time
        assert time.monotonic() - t0 >= IDLE_TIMEOUT - 0.5
    finally:
        quiet.close()
        kept.close()
    assert idle_daemon.client.request("GET", "/v1/health").status == 200


def test_a_long_exec_outlives_the_idle_timeout(idle_daemon):
    c = idle_daemon.client
    sid = c.create(memory_mib=256)["id"]
    try:
        # answered whole at the end: no byte on the wire for longer than the idle timeout
        t0 = time.monotonic()
        r = c.exec(sid, f"sleep {3 * IDLE_TIMEOUT}; echo woke", timeout_seconds=60)
        assert r["stdout"] == "woke\n" and r["exit_code"] == 0, r
        assert time.monotonic() - t0 >= 3 * IDLE_TIMEOUT
        # streamed, with a silent gap longer than the idle timeout
        with c.stream(sid, {"command": f"echo a; sleep {3 * IDLE_TIMEOUT}; echo b",
                            "timeout_seconds": 60}) as s:
            assert s.status == 200
            events = s.read_all()
        out = b"".join(output_of(e) for e in events if e["type"] == "stdout")
        assert out == b"a\nb\n", events
        assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0, events
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_answers_go_out_without_waiting_for_acks(daemon):
    """Nagle's algorithm is off on the API's TCP connections. With it on, a write made while an
    earlier segment is unacknowledged waits for the client's delayed ACK, up to 40 ms: every
    answer over TLS paid it (its header block and body are records of their own), and so could
    a stream's pieces. bench/sdk.py measures the cost; here the daemon's end of a connection
    is read for the option itself."""
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
    try:
        conn.request("GET", "/v1/health")
        first = conn.getresponse()
        first.read()  # answered: the daemon has set the connection up
        sock = conn.sock
        end = conftest.daemons_end(daemon.proc.pid, sock)
        try:
            assert end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            end.close()
        # the copy's close left the daemon's end open: the same connection answers again
        conn.request("GET", "/v1/health")
        again = conn.getresponse()
        again.read()
        assert conn.sock is sock and again.status == first.status
    finally:
        conn.close()
