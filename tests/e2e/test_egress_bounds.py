"""The egress proxy's resource bounds, against the fake internet (see test_egress.py).

A daemon of this module's own runs with a hard fd limit of 1024, as a service would under a
host's defaults: its proxy's global connection cap comes from that limit (docs/architecture.md,
"The egress proxy's bounds"). What is checked is what a sandbox and the host would see:

- a sandbox that holds every proxy connection the cap allows cannot shut out a neighbour, which
  still connects (one of the hog's connections is closed for it, logged `fair_share`);
- downloads a sandbox does not read hold little on the daemon's upstream sockets (their
  receive queues, read with `ss` in the daemon's network namespace) and on its sockets towards
  the sandbox (their send queues, in the gateway's namespace), and arrive whole once read;
- a policy change closes the open connections it no longer allows, and keeps the others.
"""

import hashlib
import os
import random
import re
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import fakenet  # noqa: E402
from conftest import SandboxFactory  # noqa: E402
from test_connections import serve_own  # noqa: E402
from test_egress import EgressDaemon, curl, netlog, run  # noqa: E402

FD_LIMIT = 1024
# proxy_conns_for_fds (src/net/proxy.h): half the fds for the API, 128 kept, a quarter of the
# rest for the proxy at 2 fds a connection.
PROXY_CAP = (FD_LIMIT - FD_LIMIT // 2 - 128) // 4
# PROXY_UPSTREAM_RCVBUF (src/net/proxy.h) as the kernel keeps it, doubled, and one more 64 KiB
# (GRO) packet that may land while it is just under that. Measured: 252,296 at most (883,808 with
# the kernel's autotuning, before the proxy set it).
UPSTREAM_QUEUE_MAX = 2 * 128 * 1024 + 64 * 1024
# PROXY_CLIENT_NOTSENT (src/net/proxy.h), the unsent bytes towards the sandbox, plus one write of
# the relay's (16 KiB) and room for a TLS record. Measured: ~37-46 KB (1.1-1.6 MB before).
SANDBOX_QUEUE_MAX = 64 * 1024 + 64 * 1024
GATEWAY_PROXY_PORT = 15001  # src/net/gateway.h


class BoundedDaemon(EgressDaemon):
    """The egress daemon with a hard fd limit of FD_LIMIT (its soft limit is raised to it)."""

    def serve_argv(self):
        return ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--"] + super().serve_argv()


@pytest.fixture(scope="module")
def net():
    with fakenet.started() as n:
        yield n


@pytest.fixture(scope="module")
def bounded(daemon, net):
    yield from serve_own(BoundedDaemon(daemon, net))


@pytest.fixture
def sb(bounded):
    f = SandboxFactory(bounded.client)
    yield f
    f.cleanup()


def wait_for(what, probe, seconds=60, every=0.1):
    """Polls probe() until it returns something true (returned), or fails after seconds."""
    deadline = time.monotonic() + seconds
    while True:
        v = probe()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(every)


def read_file(d, sid, path):
    """The file's text, or None if it is not there (yet)."""
    code, out, _ = run(d, sid, f"cat {path} 2>/dev/null")
    return out if code == 0 else None


def background(d, sid, script, args):
    """Runs a Python script in the sandbox in the background (its output in /tmp/bg.log)."""
    d.client.write_file(sid, "/tmp/bg.py", script.encode())
    code, out, err = run(d, sid, f"nohup python3 /tmp/bg.py {args} >/tmp/bg.log 2>&1 &")
    assert code == 0, (out, err)


# ---- fair shares ----

HOG = r'''
import os, re, socket, sys, time
addr, host, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
req = ("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode()
def ask(s):
    s.sendall(req)
    data = b""
    while b"\r\n\r\n" not in data:
        b = s.recv(4096)
        if not b:
            return False
        data += b
    head, _, body = data.partition(b"\r\n\r\n")
    n = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < n:
        b = s.recv(4096)
        if not b:
            return False
        body += b
    return head.startswith(b"HTTP/1.1 200")
held, refused = [], 0
for i in range(want):
    s = socket.create_connection((addr, 80), timeout=20)
    try:
        good = ask(s)
    except OSError:
        good = False
    if good:
        held.append(s)
    else:
        refused += 1
        s.close()
open("/tmp/hog.tmp", "w").write("%d %d\n" % (len(held), refused))
os.rename("/tmp/hog.tmp", "/tmp/hog.out")
while not os.path.exists("/tmp/hog.stop"):
    time.sleep(0.05)
alive = 0
for s in held:
    s.setblocking(False)
    try:
        alive += s.recv(1) != b""
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
open("/tmp/hog.tmp", "w").write("%d\n" % alive)
os.rename("/tmp/hog.tmp", "/tmp/hog.final")
'''


def test_a_neighbour_connects_while_another_sandbox_holds_the_whole_cap(bounded, net, sb):
    m = re.search(rb"event=gateway.open .*proxy_max_conns=(\d+)", bounded.log_bytes())
    assert m and int(m.group(1)) == PROXY_CAP, "the proxy's cap is sized to the fd limit"
    policy = {"internet": True, "allow": ["example.test"]}
    hog = sb(network=policy)["id"]
    neighbour = sb(network=policy)["id"]
    background(bounded, hog, HOG, f"{net.addr('example.test')} example.test {PROXY_CAP + 20}")
    out = wait_for("the hog's connections", lambda: read_file(bounded, hog, "/tmp/hog.out"), 120)
    held, refused = map(int, out.split())
    assert held == PROXY_CAP and refused == 20, out  # it holds every connection there is

    code, body, status = curl(bounded, neighbour, "http://example.test/")
    assert status == 200 and "hello from example.test" in body, (code, body)

    bounded.client.write_file(hog, "/tmp/hog.stop", b"")
    alive = int(wait_for("the hog's count", lambda: read_file(bounded, hog, "/tmp/hog.final")))
    assert alive == PROXY_CAP - 1, "one of the hog's connections made room for the neighbour"
    reasons = [e["reason"] for e in netlog(bounded, hog)["entries"]]
    assert reasons.count("too_many_connections") == 20 and "fair_share" in reasons, reasons
    assert netlog(bounded, neighbour)["entries"] == []


# ---- downloads a sandbox does not read ----

DOWNLOADS = r'''
import hashlib, os, re, socket, sys, time
addr, host, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
socks = []
for i in range(n):
    s = socket.create_connection((addr, 80), timeout=60)
    s.sendall(("GET /bytes/%d HTTP/1.1\r\nHost: %s\r\n\r\n" % (size, host)).encode())
    socks.append(s)
open("/tmp/dl.sent", "w").write("sent\n")
while not os.path.exists("/tmp/dl.go"):
    time.sleep(0.05)
out = []
for s in socks:
    f = s.makefile("rb")
    status = f.readline().split()[1].decode()
    length = None
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        m = re.match(rb"(?i)content-length: *(\d+)", line)
        if m:
            length = int(m.group(1))
    h, got = hashlib.sha256(), 0
    while got < length:
        b = f.read(min(1 << 20, length - got))
        if not b:
            break
        h.update(b)
        got += len(b)
    out.append("%s %d %s" % (status, got, h.hexdigest()))
open("/tmp/dl.tmp", "w").write("\n".join(out) + "\n")
os.rename("/tmp/dl.tmp", "/tmp/dl.out")
'''


def upstream_queues(net, addr):
    """The receive queues (bytes) of the daemon's established connections to addr:80."""
    r = net.run_in_host_ns(["ss", "-Htn", "state", "established", "dst", addr, "dport", "= :80"])
    assert r.returncode == 0, r.stderr
    return [int(line.split()[0]) for line in r.stdout.splitlines() if line.strip()]


def sandbox_side_queues(d):
    """The send queues (bytes) of the proxy's sockets towards sandboxes: in the gateway's network
    namespace, which only the daemon holds (an fd of its own, never named)."""
    pid, queues, seen = d.proc.pid, [], set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            ns = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if not ns.startswith("net:[") or ns in seen:
            continue
        seen.add(ns)
        r = subprocess.run(["nsenter", f"--net=/proc/{pid}/fd/{fd}", "ss", "-Htn", "state",
                            "established", "sport", f"= :{GATEWAY_PROXY_PORT}"],
                           capture_output=True, text=True, timeout=30)
        queues += [int(line.split()[1]) for line in r.stdout.splitlines() if line.strip()]
    return queues


def test_unread_downloads_hold_little_on_the_upstream_sockets(bounded, net, sb):
    n, size = 6, 32 << 20
    sid = sb(network={"internet": True, "allow": ["example.test"]})["id"]
    addr = net.addr("example.test")
    background(bounded, sid, DOWNLOADS, f"{addr} example.test {n} {size}")
    wait_for("the requests", lambda: read_file(bounded, sid, "/tmp/dl.sent"))

    # Every download stalls with bytes waiting on its upstream socket; then keep watching.
    seen = []
    def stalled():
        q = upstream_queues(net, addr)
        seen.extend(q)
        return len(q) == n and all(q)
    wait_for("the downloads to fill their queues", stalled, 60, every=0.05)
    for _ in range(20):
        seen.extend(upstream_queues(net, addr))
    assert max(seen) <= UPSTREAM_QUEUE_MAX, (
        f"an upstream socket held {max(seen)} unread bytes (bound {UPSTREAM_QUEUE_MAX})")
    towards = sandbox_side_queues(bounded)
    assert len(towards) == n and all(towards), towards  # stalled there too
    assert max(towards) <= SANDBOX_QUEUE_MAX, (
        f"{max(towards)} bytes waited to go to the sandbox (bound {SANDBOX_QUEUE_MAX})")

    bounded.client.write_file(sid, "/tmp/dl.go", b"")
    out = wait_for("the downloads", lambda: read_file(bounded, sid, "/tmp/dl.out"), 120)
    block = random.Random(20240501).randbytes(1 << 20)  # fakeinet_server's BYTES_BLOCK
    want = hashlib.sha256(block * (size >> 20)).hexdigest()
    assert out.split("\n")[:n] == [f"200 {size} {want}"] * n, out


# ---- a policy change and the connections already open ----

KEPT = r'''
import os, re, select, socket, sys, time
ex_addr, pypi_addr = sys.argv[1], sys.argv[2]
def ask(s, host):
    s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        b = s.recv(4096)
        if not b:
            return "closed"
        data += b
    head, _, body = data.partition(b"\r\n\r\n")
    n = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < n:
        b = s.recv(4096)
        if not b:
            return "closed"
        body += b
    return head.split()[1].decode()
def closed_within(s, seconds):
    if not select.select([s], [], [], seconds)[0]:
        return "open"
    try:
        return "closed" if s.recv(1) == b"" else "data"
    except OSError:
        return "closed"
def report(name, text):
    open("/tmp/%s.tmp" % name, "w").write(text + "\n")
    os.rename("/tmp/%s.tmp" % name, "/tmp/%s" % name)
def wait(path):
    while not os.path.exists(path):
        time.sleep(0.05)
ex = socket.create_connection((ex_addr, 80), timeout=20)
pypi = socket.create_connection((pypi_addr, 80), timeout=20)
report("kept.ready", "%s %s" % (ask(ex, "example.test"), ask(pypi, "pypi.org")))
wait("/tmp/kept.go1")  # example.test is no longer allowed
report("kept.one", "%s %s" % (closed_within(ex, 15), ask(pypi, "pypi.org")))
wait("/tmp/kept.go2")  # no internet at all
report("kept.two", closed_within(pypi, 15))
'''


def test_a_tightened_policy_closes_open_connections_it_no_longer_allows(bounded, net, sb):
    both = {"internet": True, "allow": ["example.test", "pypi.org"]}
    sid = sb(network=both)["id"]
    background(bounded, sid, KEPT, f"{net.addr('example.test')} {net.addr('pypi.org')}")
    out = wait_for("the kept connections", lambda: read_file(bounded, sid, "/tmp/kept.ready"))
    assert out.split() == ["200", "200"], out

    bounded.client.expect(200, "PUT", f"/v1/sandboxes/{sid}/network",
                          {"internet": True, "allow": ["pypi.org"]})
    bounded.client.write_file(sid, "/tmp/kept.go1", b"")
    out = wait_for("the first change", lambda: read_file(bounded, sid, "/tmp/kept.one"))
    assert out.split() == ["closed", "200"], (
        "the connection to example.test is closed, the one to pypi.org still answers: " + out)
    entries = netlog(bounded, sid)["entries"]
    assert [(e["host"], e["reason"]) for e in entries] == [("example.test", "policy_changed")]

    bounded.client.expect(200, "PUT", f"/v1/sandboxes/{sid}/network", {"internet": False})
    bounded.client.write_file(sid, "/tmp/kept.go2", b"")
    out = wait_for("the second change", lambda: read_file(bounded, sid, "/tmp/kept.two"))
    assert out.split() == ["closed"], "internet false closes every connection: " + out
