"""The connection layer (issue 8, points 1 and 7; docs/architecture.md "Connections and fds"):
a connection cap at which the connection idle the longest makes room, a header deadline that
closes slowloris clients, per-route body limits answered before the body is read, and a memory
budget that makes request bodies wait their turn instead of piling up in the daemon."""

import json
import os
import socket
import threading
import time

import pytest

import conftest
from test_body_limits import read_status, send_head
from test_connections import ShortIdleDaemon, closed_by_peer_within, serve_own
from test_output import RssWatch, rss

MIB = 1024 * 1024
CAP = 32
HEADER_S = 2
BODY_MIB = 8
UNKNOWN = "sb-aaaaaaaaaaaaaaaaaaaaa"
UPLOAD = f"/v1/sandboxes/{UNKNOWN}/files/content?path=/workspace/x"


class LimitedDaemon(ShortIdleDaemon):
    """A daemon of its own with a small connection cap, a short header deadline and a body
    budget of one upload; its idle timeout is long, so that only the cap and the deadline close
    connections here."""

    def serve_argv(self):
        return super().serve_argv() + ["--idle-timeout", "60", "--max-connections", str(CAP),
                                       "--header-timeout", str(HEADER_S), "--body-memory-mib",
                                       str(BODY_MIB)]


@pytest.fixture(scope="module")
def limited(daemon):
    yield from serve_own(LimitedDaemon(daemon))


def auth(d):
    return conftest.auth_header(d.port).encode()


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def health(port):
    """GET /v1/health on a new connection; the status, or None if the daemon closed it."""
    s = send_head(port, "GET", "/v1/health", ["Connection: close"])
    try:
        return read_status(s)
    finally:
        s.close()


def body_head(port, method, path, length):
    """A request's head announcing a JSON body of length bytes (none of it sent)."""
    return send_head(port, method, path, ["Content-Type: application/json",
                                          f"Content-Length: {length}"])


def read_response(s):
    """A whole answer with a Content-Length: (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head.split(b" ", 2)[1]), body


def test_slowloris_is_closed_at_the_header_deadline(limited):
    slow = [connect(limited.port) for _ in range(10)]
    for s in slow:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth(limited) + b"X-Slow: ")
    try:
        # a byte now and then keeps the idle timeout away, not the header deadline
        for _ in range(3):
            time.sleep(0.5)
            for s in slow:
                try:
                    s.sendall(b"a")
                except OSError:
                    pass  # closed already
        assert health(limited.port) == 200
        assert all(closed_by_peer_within(s, 15) for s in slow), "a slow client kept its connection"
    finally:
        for s in slow:
            s.close()
    assert "http.header_timeout" in limited.log_bytes().decode(errors="replace")


def test_headers_that_arrive_in_time_are_answered(limited):
    s = connect(limited.port)
    try:
        for part in (b"GET /v1/health HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n", auth(limited),
                     b"\r\n"):
            s.sendall(part)
            time.sleep(0.2)
        status, body = read_response(s)
        assert status == 200 and json.loads(body)["status"] == "ok"
    finally:
        s.close()


def test_at_the_cap_the_connection_idle_the_longest_makes_room(limited):
    pid = limited.proc.pid
    base = open_fds(pid)
    socks = []
    try:
        for _ in range(3 * CAP):
            socks.append(connect(limited.port))
            time.sleep(0.005)  # an order the daemon sees too
        assert health(limited.port) == 200
        # the daemon holds at most CAP of them (and its own fds); the oldest were let go
        assert open_fds(pid) <= base + CAP + 2, (open_fds(pid), base)
        assert closed_by_peer_within(socks[0], 5), "the oldest idle connection was kept"
        closed = sum(closed_by_peer_within(s, 0.1) for s in socks)
        assert closed >= 2 * CAP, f"only {closed} of {3 * CAP} idle connections were closed"
        # a kept connection still works
        last = socks[-1]
        last.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth(limited) + b"\r\n")
        assert read_response(last)[0] == 200
    finally:
        for s in socks:
            s.close()


def test_slow_connections_at_the_cap_delay_a_new_one_only_until_the_deadline(limited):
    """With every slot taken by a slowloris client (none idle to close), a new connection waits
    in the backlog, and is answered once the header deadline has closed them."""
    slow = [connect(limited.port) for _ in range(CAP)]
    try:
        for s in slow:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth(limited))
        assert health(limited.port) == 200
        assert all(closed_by_peer_within(s, 15) for s in slow)
    finally:
        for s in slow:
            s.close()


def test_a_json_route_refuses_a_big_body_before_reading_it(daemon):
    """2 MiB is within the upload limit but over the JSON one: refused from the headers alone,
    with the API's error, while the same size to the upload route is read (and answered)."""
    s = body_head(daemon.port, "POST", "/v1/sandboxes", 2 * MIB)
    try:
        status, body = read_response(s)  # no byte of the body sent
        assert status == 413
        assert json.loads(body)["error"]["code"] == "payload_too_large"
        assert b"1048576" in body  # the route's limit, named
    finally:
        s.close()
    s = body_head(daemon.port, "PUT", UPLOAD, 2 * MIB)
    try:
        s.sendall(b"x" * (2 * MIB))
        status, body = read_response(s)
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    finally:
        s.close()


def test_a_refused_body_sent_anyway_does_not_hide_the_answer(daemon):
    """A client that sends its whole body without waiting still reads the 413 (the daemon
    drops what follows for a moment instead of resetting the connection)."""
    body = json.dumps({"metadata": {"k": "x" * (3 * MIB)}}).encode()
    r = daemon.client.raw("POST", "/v1/sandboxes", {"Content-Type": "application/json",
                                                    "Content-Length": str(len(body))}, body)
    assert r.status == 413 and r.error[0] == "payload_too_large"


def upload(port, results, i):
    try:
        s = body_head(port, "PUT", UPLOAD, 8 * MIB)
        try:
            s.sendall(b"y" * (8 * MIB))
            results[i] = read_response(s)[0]
        finally:
            s.close()
    except OSError as e:
        results[i] = repr(e)


@pytest.mark.slow  # RSS under ASan counts its quarantine of freed memory, not what is held
def test_parallel_uploads_wait_for_the_body_budget(limited):
    """Six 8 MiB uploads at once to a daemon whose body budget is one upload: each is read in
    its turn (the others wait unread), all are answered, and the daemon never holds six."""
    pid = limited.proc.pid
    before = rss(pid)
    results = [None] * 6
    with RssWatch(pid) as watch:
        threads = [threading.Thread(target=upload, args=(limited.port, results, i))
                   for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [404] * 6, results
    growth = (watch.peak - before) / MIB
    assert growth < 3 * BODY_MIB, f"the daemon grew by {growth:.0f} MiB for 6 x 8 MiB bodies"
