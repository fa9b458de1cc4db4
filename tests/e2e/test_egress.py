"""Egress: a sandbox's `network` policy, enforced on the host, against a fake internet.

The daemon under test runs inside a network namespace these tests create (fakenet.FakeNet),
whose only link leads to a second namespace holding the fake internet: a DNS server, web servers
for pypi.org, files.pythonhosted.org, api.github.test, evil.test and example.test (HTTP and HTTPS
with a test CA), and a fake metadata service at 169.254.169.254. Nothing else is reachable from
there, so a bug in the proxy cannot send traffic anywhere real. The daemon is told the fake
internet's range counts as public, which resolver to ask, and to make sandboxes trust the test
CA; the tests talk to it over its Unix socket.

What a sandbox sees is checked from inside it (curl, Python, getent), and what the fake internet
saw from its own logs: a denied name never reaches the fake DNS, a denied host's server never
sees a request.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import conftest  # noqa: E402
import fakenet  # noqa: E402
import wrclient  # noqa: E402
from conftest import SandboxFactory  # noqa: E402
from test_connections import serve_own  # noqa: E402

ALLOW_PYPI = {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]}
BLOCKED_WORDS = "egress policy blocked"


class EgressDaemon(conftest.Daemon):
    """A daemon of its own in the fake internet's host namespace, sharing the session's image."""

    def __init__(self, session, net):
        parent = os.path.dirname(os.path.abspath(session.state_dir))
        state = tempfile.mkdtemp(prefix="wr-egress-", dir=parent)
        os.symlink(os.path.join(os.path.abspath(session.state_dir), "images"),
                   os.path.join(state, "images"))
        super().__init__(state_dir=state)
        self.net = net
        self.client = wrclient.Client(unix_path=self.socket_path)

    def build_image(self):
        pass  # the session's, through the symlink

    def serve_argv(self):
        return (["nsenter", f"--net={self.net.host_ns}"] + super().serve_argv() +
                ["--egress", "on", "--dns-upstream", fakenet.DNS_ADDR,
                 "--public-ranges", fakenet.PUBLIC_RANGES, "--extra-ca-file", self.net.ca_pem])


@pytest.fixture(scope="module")
def net():
    with fakenet.started() as n:
        yield n


@pytest.fixture(scope="module")
def egress(daemon, net):
    yield from serve_own(EgressDaemon(daemon, net))


@pytest.fixture
def sb(egress):
    """Makes sandboxes on the egress daemon, deleted after the test."""
    f = SandboxFactory(egress.client)
    yield f
    f.cleanup()


def run(d, sid, command, timeout=60):
    """Runs a shell command in sandbox sid: (exit code, stdout, stderr) as text."""
    r = d.client.exec(sid, command, timeout_seconds=timeout)
    return (r["exit_code"], wrclient.output(r).decode(errors="replace"),
            wrclient.output(r, "stderr").decode(errors="replace"))


def curl(d, sid, args, timeout=20):
    """curl in the sandbox: (curl's exit code, body, HTTP status or 0)."""
    _, out, _ = run(d, sid, f"curl -sS -m 10 -o /tmp/body -w '%{{http_code}}' {args}; "
                    "echo \" $?\"; cat /tmp/body 2>/dev/null; rm -f /tmp/body", timeout)
    first, _, body = out.partition("\n")
    status, _, code = first.strip().partition(" ")
    return int(code), body, int(status) if status.isdigit() else 0


def netlog(d, sid):
    r = d.client.expect(200, "GET", f"/v1/sandboxes/{sid}/network/log")
    return r.json()


def denied(d, sid, host):
    return [e for e in netlog(d, sid)["entries"] if e["host"] == host]


def lookup(d, sid, name):
    """getent in the sandbox: the addresses it resolved ([] if the lookup failed)."""
    code, out, _ = run(d, sid, f"getent ahostsv4 {name} | awk '{{print $1}}' | sort -u")
    return out.split() if code == 0 else []


# ---- the policy's three shapes ----


def test_no_internet_reaches_nothing_dns_included(egress, net, sb):
    sid = sb()["id"]  # the default: {"internet": false}
    net.reset_logs()
    assert lookup(egress, sid, "pypi.org") == []
    code, body, status = curl(egress, sid, f"http://{net.addr('pypi.org')}/")
    assert status == 403 and BLOCKED_WORDS in body, (code, body)
    code, _, status = curl(egress, sid, f"--resolve pypi.org:443:{net.addr('pypi.org')} "
                           "https://pypi.org/")
    assert code != 0 and status == 0
    assert net.dns_queries() == [], "a lookup left the host"
    assert net.requests() == [], "a connection reached the internet"
    reasons = {e["reason"] for e in netlog(egress, sid)["entries"]}
    assert "no_internet" in reasons, netlog(egress, sid)


def test_allow_list_lets_pypi_through_and_nothing_else(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    net.reset_logs()
    assert lookup(egress, sid, "pypi.org") == [net.addr("pypi.org")]
    code, body, status = curl(egress, sid, "https://pypi.org/simple/wr-hello/")
    assert code == 0 and status == 200 and "wr_hello" in body, (code, body)
    code, body, status = curl(egress, sid, "https://files.pythonhosted.org/")
    assert code == 0 and status == 200, (code, body)
    # connections let through are logged too (the daemon's log, not the sandbox's denials)
    lines = [line for line in egress.log_bytes().splitlines() if b"event=network.allowed" in line]
    assert any(sid.encode() in line and b'host="files.pythonhosted.org" port=443' in line
               for line in lines), lines[-5:]
    # evil.test: no answer from DNS, and no way through with the address either
    assert lookup(egress, sid, "evil.test") == []
    code, _, status = curl(egress, sid,
                           f"--resolve evil.test:443:{net.addr('evil.test')} https://evil.test/")
    assert code != 0 and status == 0, "a TLS connection to a denied host was not closed"
    code, body, status = curl(egress, sid,
                              f"--resolve evil.test:80:{net.addr('evil.test')} http://evil.test/")
    assert status == 403 and BLOCKED_WORDS in body and "evil.test" in body, body
    assert "evil.test" not in net.dns_queries(), "a denied name reached the upstream DNS"
    assert net.requests("evil.test") == [], "the denied host got a request"
    seen = {(e["via"], e["reason"]) for e in denied(egress, sid, "evil.test")}
    assert ("dns", "not_allowed") in seen and ("proxy", "not_allowed") in seen, seen


def test_internet_true_reaches_any_public_host(egress, net, sb):
    sid = sb(network={"internet": True, "deny": ["evil.test"]})["id"]
    code, body, status = curl(egress, sid, "https://example.test/")
    assert code == 0 and status == 200 and "example.test" in body, body
    assert lookup(egress, sid, "evil.test") == []
    code, body, status = curl(egress, sid,
                              f"--resolve evil.test:80:{net.addr('evil.test')} http://evil.test/")
    assert status == 403 and "(denied)" in body, body
    assert net.requests("evil.test") == []
    seen = {(e["via"], e["reason"]) for e in denied(egress, sid, "evil.test")}
    assert seen == {("dns", "not_allowed"), ("proxy", "denied")}, seen


# ---- what pinning to names refuses ----


@pytest.mark.parametrize("name", ["pythonhosted.org.evil.test", "evilpythonhosted.org",
                                  "pypi.org.evil.test"])
def test_lookalike_names_are_refused(egress, net, sb, name):
    sid = sb(network=ALLOW_PYPI)["id"]
    net.set_dns(name, net.addr("evil.test"))
    assert lookup(egress, sid, name) == []
    code, body, status = curl(egress, sid,
                              f"--resolve {name}:80:{net.addr('evil.test')} http://{name}/")
    assert status == 403 and name in body, body
    assert net.requests("evil.test") == []


def test_userinfo_trick_goes_to_the_real_host(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    # curl reads pypi.org as a user name: the host is evil.test
    code, body, status = curl(egress, sid, f"--resolve evil.test:80:{net.addr('evil.test')} "
                              "http://pypi.org@evil.test/")
    assert status == 403 and "evil.test" in body, body
    assert net.requests("evil.test") == []


RAW_HTTP = r'''
import socket, sys
s = socket.create_connection((sys.argv[1], 80), timeout=10)
def req(host):
    s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b:
            return "closed"
        head += b
    n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return head.split(b" ")[1].decode() + " " + body.decode()
for h in sys.argv[2:]:
    print(req(h))
'''


def test_each_request_on_a_kept_alive_connection_is_checked(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    egress.client.write_file(sid, "/tmp/raw.py", RAW_HTTP.encode())
    code, out, err = run(egress, sid, f"python3 /tmp/raw.py {net.addr('pypi.org')} "
                         "pypi.org pypi.org evil.test")
    lines = [line for line in out.splitlines() if line]
    assert lines[0].startswith("200 ") and lines[1].startswith("200 "), (out, err)
    assert lines[2].startswith("403 ") and "evil.test" in lines[2], (out, err)
    assert net.requests("evil.test") == []


WS_CLIENT = r'''
import base64, hashlib, json, os, socket, ssl, struct, sys

addr, script, tls_name = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
s = socket.create_connection((addr, 443 if tls_name else 80), timeout=10)
if tls_name:  # the system's CAs, which include the daemon's
    s = ssl.create_default_context().wrap_socket(s, server_hostname=tls_name[0])
buf = b""

def fill():
    global buf
    b = s.recv(65536)
    if not b:
        raise EOFError
    buf += b

def take(n):
    global buf
    while len(buf) < n:
        fill()
    out, buf = buf[:n], buf[n:]
    return out

def answer(head_only=False):
    """The next answer: "STATUS first-body-line" (a HEAD's: no body), or "closed"."""
    global buf
    try:
        while b"\r\n\r\n" not in buf:
            fill()
    except EOFError:
        return "closed"
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    fields = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:]}
    status = lines[0].split(" ")[1]
    n = 0 if head_only or status == "101" else int(fields.get("content-length", "0"))
    body = take(n).decode(errors="replace")
    if status == "101":
        want = base64.b64encode(hashlib.sha1(KEY + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
                                .digest()).decode()
        return "101 accept=" + str(fields.get("sec-websocket-accept") == want)
    return status + " " + body.split("\n")[0]

KEY = base64.b64encode(os.urandom(16))

def request(method, path, host, extra=""):
    return (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n").encode()

def ws_headers(proto="websocket"):
    return (f"Upgrade: {proto}\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {KEY.decode()}"
            "\r\nSec-WebSocket-Version: 13\r\n")

def frame(text):
    data, mask = text.encode(), os.urandom(4)
    return (struct.pack("!BB", 0x81, 0x80 | len(data)) + mask +
            bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

def read_frame():
    head = take(2)
    return take(head[1] & 0x7F).decode()

out = []
for step in script:
    op = step[0]
    if op == "send":  # [["GET", path, host, ws-protocol or ""], ...] in one write
        s.sendall(b"".join(request(m, p, h, ws_headers(w) if w else "") for m, p, h, w in step[1]))
    elif op == "answer":
        out.append(answer(head_only=step[1:] == ["head"]))
    elif op == "echo":
        s.sendall(frame(step[1]))
        out.append("frame " + read_frame())
    elif op == "closed_within":  # whether the proxy closes within that many seconds
        s.settimeout(step[1])
        try:
            while True:
                fill()
        except EOFError:
            out.append("closed")
        except socket.timeout:
            out.append("open")
print(json.dumps(out))
'''


def ws_client(d, sid, addr, script, tls_name=""):
    """Runs WS_CLIENT in sandbox sid against addr:80 (or addr:443 over TLS to tls_name): the list
    of what it saw, step by step."""
    d.client.write_file(sid, "/tmp/ws.py", WS_CLIENT.encode())
    code, out, err = run(d, sid, f"python3 /tmp/ws.py {addr} '{json.dumps(script)}' {tls_name}")
    assert code == 0, (out, err)
    return json.loads(out)


def test_an_upgrade_answered_without_101_opens_no_tunnel(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    net.reset_logs()
    # one write: a handshake pypi.org answers 200 (no WebSocket at /), then a request for
    # another host, which a server routing by Host would serve if it got it
    seen = ws_client(egress, sid, net.addr("pypi.org"), [
        ["send", [["GET", "/", "pypi.org", "websocket"], ["GET", "/ride", "evil.test", ""]]],
        ["answer"], ["answer"], ["closed_within", 5]])
    assert seen[0] == "200 hello from pypi.org", seen
    assert seen[1].startswith("403 ") and "evil.test" in seen[1], seen
    assert seen[2] == "closed", seen
    got = [(r["path"], r["headers"].get("host")) for r in net.requests()]
    assert got == [("/", "pypi.org")], got


def test_a_websocket_to_an_allowed_host_works_and_h2c_is_refused(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    net.reset_logs()
    # a HEAD before the handshake (its answer has a Content-Length and no body), then the
    # handshake, then frames both ways through the tunnel
    seen = ws_client(egress, sid, net.addr("pypi.org"), [
        ["send", [["HEAD", "/", "pypi.org", ""], ["GET", "/ws", "pypi.org", "websocket"]]],
        ["answer", "head"], ["answer"], ["echo", "hello through the proxy"], ["echo", "again"]])
    assert seen == ["200 ", "101 accept=True", "frame hello through the proxy", "frame again"], seen
    seen = ws_client(egress, sid, net.addr("pypi.org"), [
        ["send", [["GET", "/", "pypi.org", "h2c"]]], ["answer"], ["closed_within", 5]])
    assert seen[0].startswith("403 ") and "(upgrade)" in seen[0] and seen[1] == "closed", seen
    code, body, status = curl(egress, sid, "--http2 http://pypi.org/h2c")  # Upgrade: h2c
    assert status == 403 and "(upgrade)" in body, (code, status, body)
    code, body, status = curl(egress, sid, "http://pypi.org/h1")
    assert status == 200, (code, status, body)
    assert [r["path"] for r in net.requests()] == ["/", "/ws", "/h1"], net.requests()
    assert ("proxy", "upgrade") in {(e["via"], e["reason"]) for e in denied(egress, sid,
                                                                              "pypi.org")}


def test_the_same_over_intercepted_tls(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    net.reset_logs()
    seen = ws_client(egress, sid, net.addr("pypi.org"), [
        ["send", [["GET", "/", "pypi.org", "websocket"], ["GET", "/ride", "evil.test", ""]]],
        ["answer"], ["answer"], ["closed_within", 5]], tls_name="pypi.org")
    assert seen[0] == "200 hello from pypi.org", seen
    assert seen[1].startswith("403 ") and "(host_mismatch)" in seen[1], seen
    assert seen[2] == "closed", seen
    seen = ws_client(egress, sid, net.addr("pypi.org"), [
        ["send", [["GET", "/ws", "pypi.org", "websocket"]]], ["answer"], ["echo", "wss works"]],
        tls_name="pypi.org")
    assert seen == ["101 accept=True", "frame wss works"], seen
    got = [(r["scheme"], r["path"], r["headers"].get("host")) for r in net.requests()]
    assert got == [("https", "/", "pypi.org"), ("https", "/ws", "pypi.org")], got


def test_a_refusal_comes_after_the_answers_before_it_then_the_close(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    net.reset_logs()
    seen = ws_client(egress, sid, net.addr("pypi.org"), [
        ["send", [["GET", "/a", "pypi.org", ""], ["HEAD", "/b", "pypi.org", ""],
                  ["GET", "/simple/", "pypi.org", ""], ["GET", "/d", "evil.test", ""],
                  ["GET", "/e", "pypi.org", ""]]],
        ["answer"], ["answer", "head"], ["answer"], ["answer"], ["closed_within", 5]])
    assert seen[:3] == ["200 hello from pypi.org", "200 ", "200 <!DOCTYPE html>"], seen
    assert seen[3].startswith("403 ") and "evil.test" in seen[3] and seen[4] == "closed", seen
    assert [r["path"] for r in net.requests()] == ["/a", "/b", "/simple/"], net.requests()


def test_a_refused_websocket_handshake_is_closed(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    net.reset_logs()
    # refused by the policy: the proxy answers, then closes
    seen = ws_client(egress, sid, net.addr("evil.test"), [
        ["send", [["GET", "/ws", "evil.test", "websocket"]]], ["answer"], ["closed_within", 5]])
    assert seen[0].startswith("403 ") and seen[1] == "closed", seen
    assert net.requests("evil.test") == []
    # refused by the server: its answer, then the proxy closes (what came behind it stays)
    seen = ws_client(egress, sid, net.addr("pypi.org"), [
        ["send", [["GET", "/ws-refused", "pypi.org", "websocket"], ["GET", "/x", "pypi.org", ""]]],
        ["answer"], ["closed_within", 5]])
    assert seen == ["403 no WebSocket for you", "closed"], seen
    assert [r["path"] for r in net.requests()] == ["/ws-refused"], net.requests()


def test_connect_is_refused(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    code, out, _ = run(egress, sid,
                       f"printf 'CONNECT evil.test:443 HTTP/1.1\\r\\nHost: evil.test:443\\r\\n\\r\\n'"
                       f" | curl -sS -m 10 telnet://{net.addr('pypi.org')}:80 | head -1")
    assert " 403 " in out, out
    assert net.requests("evil.test") == []


@pytest.mark.parametrize("target", ["http://127.1/", "http://0x7f000001/", "http://[::1]/",
                                    "http://169.254.169.254/latest/meta-data/",
                                    "http://10.200.0.1/", "http://198.51.100.1/"])
def test_address_targets_are_refused(egress, net, sb, target):
    sid = sb(network={"internet": True})["id"]
    net.reset_logs()
    code, body, status = curl(egress, sid, target)
    assert code != 0 or status == 403, (code, status, body)
    assert net.requests() == [], "an address target reached the fake internet"


OWN_ADDR = ("python3 -c \"import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
            "s.connect(('192.0.2.1',9));print(s.getsockname()[0])\"")


def test_another_sandbox_is_out_of_reach(egress, net, sb):
    a = sb(network={"internet": True})["id"]
    b = sb(network={"internet": True})["id"]
    code, addr_b, _ = run(egress, b, OWN_ADDR)
    addr_b = addr_b.strip()
    assert code == 0 and addr_b.startswith("10.200."), addr_b
    # b listens; a tries it by address, and by a name that resolves to it
    egress.client.exec(b, "nohup python3 -m http.server 8080 >/dev/null 2>&1 &")
    code, out, _ = run(egress, b, "sleep 1; curl -s -m 5 -o /dev/null -w '%{http_code}' "
                       "http://127.0.0.1:8080/")
    assert out == "200", "control: b's server answers inside b"
    code, body, status = curl(egress, a, f"http://{addr_b}:8080/")
    assert status == 403 and "(address)" in body, (code, status, body)
    net.set_dns("neighbour.test", addr_b)
    code, body, status = curl(egress, a, f"--resolve neighbour.test:8080:{net.addr('pypi.org')} "
                              "http://neighbour.test:8080/")
    assert status in (403, 502) and "Directory listing" not in body, (status, body)


def test_the_daemons_own_api_is_out_of_reach(egress, net, sb):
    sid = sb(network={"internet": True})["id"]
    # 127.0.0.1 inside is the sandbox's own loopback; the host's address goes to the proxy
    code, body, status = curl(egress, sid, f"http://127.0.0.1:{egress.port}/v1/health")
    assert code != 0 and status == 0, (code, status, body)
    code, body, status = curl(egress, sid, f"http://{fakenet.HOST_ADDR}:{egress.port}/v1/health")
    assert status == 403 and "(address)" in body, (code, status, body)
    # a name that resolves to the daemon's host, or to loopback, gets nothing dialed, and the
    # sandbox's resolver does not hand the address out either (the host's is in a "public" range)
    for name, addr in (("sneaky.test", fakenet.HOST_ADDR), ("loop.test", "127.0.0.1")):
        net.set_dns(name, addr)
        code, body, status = curl(egress, sid, f"--resolve {name}:80:{net.addr('pypi.org')} "
                                  f"http://{name}/")
        assert status in (403, 502) and "health" not in body, (name, status, body)
        assert lookup(egress, sid, name) == [], name
        assert ("dns", "private_address") in {(e["via"], e["reason"])
                                              for e in denied(egress, sid, name)}, name


def test_a_repeated_lookup_is_answered_from_the_cache_and_only_where_allowed(egress, net, sb):
    # the resolvers share a cache: within the answer's TTL (an hour here: the cache keeps it 300 s)
    # a second lookup does not reach the upstream, and a sandbox whose policy refuses the name
    # is refused though the answer is cached
    name = "cached.test"
    net.set_dns(name, net.addr("example.test"), ttl=3600)
    a = sb(network={"internet": True, "allow": [name]})["id"]
    b = sb(network=ALLOW_PYPI)["id"]
    assert lookup(egress, a, name) == [net.addr("example.test")]
    assert lookup(egress, a, name) == [net.addr("example.test")]
    assert lookup(egress, b, name) == []
    assert net.dns_queries().count(name) == 1, net.dns_queries()
    assert ("dns", "not_allowed") in {(e["via"], e["reason"]) for e in denied(egress, b, name)}


FOREIGN_DNS = r'''
import socket, struct, sys
name = b"".join(bytes([len(p)]) + p.encode() for p in sys.argv[2].split(".")) + b"\0"
q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + name + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(q, (sys.argv[1], 53))
try:
    print("answered", len(s.recv(512)))
except socket.timeout:
    print("no answer")
'''


def test_a_neighbours_resolver_neither_answers_nor_logs(egress, net, sb):
    a = sb(network={"internet": True})["id"]
    b = sb(network=ALLOW_PYPI)["id"]
    _, conf, _ = run(egress, b, "cat /etc/resolv.conf")
    ns_b = [line.split()[1] for line in conf.splitlines() if line.startswith("nameserver")][0]
    egress.client.write_file(a, "/tmp/q.py", FOREIGN_DNS.encode())
    # a asks b's resolver for a name b's policy refuses: b must not be charged with it
    code, out, err = run(egress, a, f"python3 /tmp/q.py {ns_b} forged-by-a.test")
    assert out.strip() == "no answer", (out, err)
    # control: b's own refused lookup lands in b's log
    assert lookup(egress, b, "own-denial.test") == []
    hosts = {e["host"] for e in netlog(egress, b)["entries"]}
    assert "own-denial.test" in hosts and "forged-by-a.test" not in hosts, hosts
    assert not denied(egress, a, "forged-by-a.test")


def test_dns_that_points_an_allowed_name_at_loopback_gets_nothing_dialed(egress, net, sb):
    # a name of its own: the proxy caches what it resolved (up to the answer's TTL)
    sid = sb(network={"internet": True, "allow": ["rebind.test"]})["id"]
    net.set_dns("rebind.test", "127.0.0.1")
    assert lookup(egress, sid, "rebind.test") == []
    code, body, status = curl(egress, sid, f"--resolve rebind.test:80:{net.addr('pypi.org')} "
                              "http://rebind.test/")
    assert status == 403 and "private_address" in body, body
    assert net.requests() == [] or all(r["host"] != "rebind.test" for r in net.requests())


LOCAL_SERVER = r'''
import socket, sys
srv = socket.socket()
srv.bind(("0.0.0.0", 0))
srv.listen(1)
port = srv.getsockname()[1]
for name in ("localhost", socket.gethostname()):
    c = socket.create_connection((name, port), timeout=10)
    a, _ = srv.accept()
    c.sendall(b"hi")
    print(name, a.recv(2).decode())
    a.close()
    c.close()
'''


def test_localhost_and_own_name_resolve_without_the_resolver(egress, net, sb):
    sid = sb()["id"]  # no internet: any lookup that reached the resolver would be refused
    code, out, err = run(egress, sid, "getent hosts localhost; getent hosts $(hostname)")
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert lines[0].split()[0] == "::1" and "localhost" in lines[0].split()[1:], lines
    assert sid in lines[1].split()[1:], lines
    code, out, err = run(egress, sid, "getent ahostsv4 localhost | head -1; hostname")
    assert out.split()[0] == "127.0.0.1" and out.split()[-1] == sid, out
    egress.client.write_file(sid, "/tmp/local.py", LOCAL_SERVER.encode())
    code, out, err = run(egress, sid, "python3 /tmp/local.py")
    assert code == 0 and out.split() == ["localhost", "hi", sid, "hi"], (out, err)
    assert netlog(egress, sid)["entries"] == [], "a lookup reached the resolver"
    # the file is the sandbox's own: an edit stays across stop and start
    run(egress, sid, "echo '127.0.0.1 mine.test' >> /etc/hosts")
    egress.client.expect(200, "POST", f"/v1/sandboxes/{sid}/stop", {})
    egress.client.expect(200, "POST", f"/v1/sandboxes/{sid}/start", {})
    code, out, _ = run(egress, sid, "getent hosts mine.test localhost")
    assert code == 0 and "mine.test" in out and "localhost" in out, out


def test_udp_other_than_dns_and_ipv6_go_nowhere(egress, net, sb):
    sid = sb(network={"internet": True})["id"]
    net.reset_logs()
    code, out, err = run(egress, sid, "python3 -c \""
                         "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                         f"s.sendto(b'x',('{net.addr('example.test')}',443));"
                         f"s.sendto(b'x',('{fakenet.DNS_ADDR}',53));print('sent')\"; "
                         "python3 -c \"import socket;socket.create_connection(('2001:db8::1',80),"
                         "timeout=3)\" 2>&1 | tail -1")
    assert "sent" in out and "Error" in out, (out, err)
    time.sleep(0.5)
    assert net.dns_queries() == [] and net.requests() == []


# ---- changes, restarts, clean-up ----


def test_policy_change_applies_to_the_next_connection(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    code, body, status = curl(egress, sid, "http://example.test/")
    assert status in (0, 403) and net.requests("example.test") == []
    r = egress.client.expect(200, "PUT", f"/v1/sandboxes/{sid}/network",
                             {"internet": True, "allow": ["example.test"]})
    assert r.json()["network"] == {"internet": True, "allow": ["example.test"]}
    code, body, status = curl(egress, sid, "http://example.test/")
    assert status == 200 and "example.test" in body, body
    code, body, status = curl(egress, sid,
                              f"--resolve pypi.org:80:{net.addr('pypi.org')} http://pypi.org/")
    assert status == 403, body


def test_stop_start_keeps_policy_and_network(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    egress.client.expect(200, "POST", f"/v1/sandboxes/{sid}/stop", {})
    egress.client.expect(200, "POST", f"/v1/sandboxes/{sid}/start", {})
    assert egress.client.get(sid)["network"] == ALLOW_PYPI
    code, body, status = curl(egress, sid, "https://pypi.org/simple/")
    assert status == 200, body
    code, body, status = curl(egress, sid, "http://evil.test/")
    assert status in (0, 403)


def host_interfaces(d):
    r = subprocess.run(["nsenter", f"--net={d.net.host_ns}", "ip", "-o", "link"],
                       capture_output=True, text=True, check=True)
    return sorted(line.split(":")[1].strip() for line in r.stdout.splitlines())


def net_namespaces(d):
    """The network namespaces the daemon d and the processes below it are in or hold open
    (other daemons on this host, and other tests, make and drop their own meanwhile)."""
    out = set()
    for pid in [d.proc.pid] + list(d.descendants()):
        links = [f"/proc/{pid}/ns/net"]
        try:
            links += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target.startswith("net:["):
                out.add(target[5:-1])
    return out


def daemon_fds(d):
    return len(os.listdir(f"/proc/{d.proc.pid}/fd"))


@pytest.mark.timeout(600)
def test_delete_removes_namespaces_and_interfaces(egress, net):
    c = egress.client
    before_if, before_ns, before_fds = (host_interfaces(egress), net_namespaces(egress),
                                        daemon_fds(egress))
    for i in range(50):
        sid = c.create(network=ALLOW_PYPI)["id"]
        if i % 10 == 0:  # now and then, use it
            code, _, status = curl(egress, sid, "http://pypi.org/simple/")
            assert status == 200
        c.delete(sid)
    assert host_interfaces(egress) == before_if
    assert net_namespaces(egress) - before_ns == set(), "namespaces left behind"
    assert daemon_fds(egress) <= before_fds + 2


def test_daemon_restart_keeps_policy_and_network(egress, net):
    c = egress.client
    sid = c.create(network=ALLOW_PYPI)["id"]
    try:
        egress.proc.terminate()
        egress.proc.wait(timeout=30)
        egress.start(clean=False)
        assert c.get(sid)["network"] == ALLOW_PYPI
        if c.get(sid)["state"] != "running":
            c.expect(200, "POST", f"/v1/sandboxes/{sid}/start", {})
        code, body, status = curl(egress, sid, "https://pypi.org/simple/")
        assert status == 200, body
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_network_log_is_bounded_and_named(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    run(egress, sid, "for i in $(seq 1 250); do getent hosts x$i.evil.test; done; true",
        timeout=120)
    log = netlog(egress, sid)
    assert log["id"] == sid and log["total"] >= 250
    assert len(log["entries"]) == 200
    e = log["entries"][-1]
    assert e["via"] == "dns" and e["host"].endswith(".evil.test") and e["reason"] == "not_allowed"
    assert "x250.evil.test" in {x["host"] for x in log["entries"]}


def test_pip_install_from_the_fake_index(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    code, out, err = run(egress, sid, "pip install --no-cache-dir wr-hello 2>&1 && "
                         "python3 -c 'import wr_hello; print(wr_hello.greet())'", timeout=120)
    assert code == 0 and "hello from the fake index" in out, (out, err)


# ---- a daemon without networking ----


@pytest.fixture(scope="module")
def no_egress():
    from test_failures import FakeDaemon, serve_checked
    from conftest import WR_AGENT
    yield from serve_checked(FakeDaemon(WR_AGENT, ["--egress", "off"]))


def test_egress_off_says_so_and_refuses_internet(no_egress, client):
    h = no_egress.req("GET", "/v1/health").json()
    assert h["network"]["enabled"] is False and "--egress off" in h["network"]["reason"], h
    r = no_egress.req("POST", "/v1/sandboxes", {"network": {"internet": True}})
    assert r.status == 503 and "network" in r.error[1] and "--egress off" in r.error[1], r
    assert no_egress.req("GET", "/v1/sandboxes").json()["sandboxes"] == []
    r = no_egress.req("POST", "/v1/sandboxes", {"memory_mib": 256})
    assert r.status == 201, r
    sid = r.json()["id"]
    r = no_egress.req("PUT", f"/v1/sandboxes/{sid}/network", {"internet": True})
    assert r.status == 503, r
    assert no_egress.req("DELETE", f"/v1/sandboxes/{sid}").status == 200
    # the session's daemon, on this host, has it
    assert client.health()["network"]["enabled"] is True
