"""Many idle and slow clients at once: the daemon keeps answering everyone else."""

import resource
import socket
import time

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
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for _ in range(3):
            for s in slow:
                s.sendall(b"a")
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
