"""The fake internet itself (tests/e2e/fakenet.py), without a withruntime daemon: from the
daemon's future host namespace, the fake DNS, web servers, package index and metadata service
answer and log what they got, set_dns takes effect, nothing else is reachable, and stop()
leaves no namespace or process behind."""

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import fakenet  # noqa: E402

pytestmark = pytest.mark.timeout(60)

# Helpers for the snippets run in the host namespace: a raw DNS query (never the system
# resolver) and a raw HTTP/1.1 exchange over an optionally TLS-wrapped socket.
LIB = r'''
import errno, json, os, socket, ssl, struct, sys, time

def dns(name, qtype=1, server=%(dns)r, tcp=False):
    qid = int.from_bytes(os.urandom(2), "big")
    labels = name.rstrip(".").split(".")
    qn = b"".join(bytes([len(l)]) + l.encode() for l in labels) + b"\0"
    msg = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qn + struct.pack("!HH", qtype, 1)
    if tcp:
        s = socket.create_connection((server, 53), timeout=3)
        s.sendall(struct.pack("!H", len(msg)) + msg)
        n = struct.unpack("!H", s.recv(2, socket.MSG_WAITALL))[0]
        r = s.recv(n, socket.MSG_WAITALL)
        s.close()
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.sendto(msg, (server, 53))
        r = s.recv(4096)
    assert r[:2] == msg[:2], "wrong id"
    flags, qd, an = struct.unpack("!HHH", r[2:8])
    i = 12 + len(qn) + 4
    addrs = []
    for _ in range(an):
        assert r[i] & 0xC0 == 0xC0
        t, c, ttl, rdlen = struct.unpack("!HHIH", r[i + 2:i + 12])
        if t == 1:
            addrs.append(socket.inet_ntoa(r[i + 12:i + 12 + rdlen]))
        i += 12 + rdlen
    return {"rcode": flags & 15, "aa": bool(flags & 0x400), "qd": qd, "an": an,
            "addrs": addrs, "qname": r[12:12 + len(qn)] == qn}

def connect(addr, port=80, cafile=None, sni=None):
    s = socket.create_connection((addr, port), timeout=5)
    if cafile:
        ctx = ssl.create_default_context(cafile=cafile)
        s = ctx.wrap_socket(s, server_hostname=sni)
    return s

def exchange(s, method, path, host, headers=(), body=b""):
    req = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    for k, v in headers:
        req += f"{k}: {v}\r\n"
    if body:
        req += f"Content-Length: {len(body)}\r\n"
    s.sendall(req.encode() + b"\r\n" + body)
    f = s.makefile("rb")
    status = f.readline().decode().split(" ", 2)
    hdrs = {}
    while True:
        line = f.readline().decode()
        if line in ("\r\n", ""):
            break
        k, v = line.split(":", 1)
        hdrs[k.strip().lower()] = v.strip()
    data = b"" if method == "HEAD" else f.read(int(hdrs.get("content-length", 0)))
    return {"status": int(status[1]), "headers": hdrs, "body": data.decode("latin-1")}

def get(addr, path, host, port=80, cafile=None, sni=None, headers=()):
    s = connect(addr, port, cafile, sni)
    try:
        return exchange(s, "GET", path, host, headers)
    finally:
        s.close()

def out(x):
    print(json.dumps(x))
'''


def run_py(net, code, resolver=False, ns=None, **kw):
    """Runs LIB + code with python3 in the host namespace (or ns); returns what it out()s."""
    src = LIB % {"dns": net.dns} + code
    if ns is not None:
        argv = ["nsenter", f"--net={ns}", "--", sys.executable, "-c", src]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    elif resolver:
        r = net.run_with_fake_resolver([sys.executable, "-c", src], timeout=30, **kw)
    else:
        r = net.run_in_host_ns([sys.executable, "-c", src], timeout=30, **kw)
    assert r.returncode == 0, f"snippet failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def netns_list():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def shared_net(tmp_path_factory):
    fn = fakenet.FakeNet(tmp_path_factory.mktemp("fakenet"))
    try:
        fn.start()
        yield fn
    finally:
        fn.stop()


@pytest.fixture
def net(shared_net):
    shared_net.reset_logs()
    yield shared_net
    # a test that changed the DNS table puts it back
    for name, addr in shared_net.hosts.items():
        shared_net.set_dns(name, addr)


def test_layout(net):
    assert net.addr("pypi.org") == "198.51.100.10"
    assert net.addr("files.pythonhosted.org") == "198.51.100.11"
    assert net.addr("api.github.test") == "198.51.100.12"
    assert net.addr("evil.test") == "198.51.100.13"
    assert net.addr("Example.Test") == "198.51.100.14"
    assert net.addr("metadata.test") == "169.254.169.254"
    assert net.dns == "198.51.100.53"
    assert net.public_ranges == "198.51.100.0/24"
    names = netns_list()
    assert os.path.basename(net.host_ns) in names and os.path.basename(net.inet_ns) in names
    routes = net.run_in_host_ns(["ip", "-4", "route"]).stdout
    assert "default" not in routes
    assert "169.254.169.254 dev veth0" in routes
    assert "198.51.100.0/24 dev veth0" in routes
    inet_routes = subprocess.run(["nsenter", f"--net={net.inet_ns}", "ip", "-4", "route"],
                                 capture_output=True, text=True, timeout=30).stdout
    assert "default" not in inet_routes
    with open(net.ca_pem) as f:
        assert "BEGIN CERTIFICATE" in f.read()


def test_dns(net):
    r = run_py(net, """
out({"a": dns("PyPI.org"), "files": dns("Files.PythonHosted.ORG."),
     "aaaa": dns("pypi.org", qtype=28), "mx": dns("evil.test", qtype=15),
     "nx": dns("nosuch.example"), "nx_aaaa": dns("nosuch.example", qtype=28),
     "tcp": dns("api.github.test", tcp=True), "meta": dns("metadata.test")})
""")
    assert r["a"] == {"rcode": 0, "aa": True, "qd": 1, "an": 1, "addrs": ["198.51.100.10"],
                      "qname": True}
    assert r["files"]["addrs"] == ["198.51.100.11"]
    assert r["aaaa"]["rcode"] == 0 and r["aaaa"]["an"] == 0
    assert r["mx"]["rcode"] == 0 and r["mx"]["an"] == 0
    assert r["nx"]["rcode"] == 3 and r["nx"]["an"] == 0
    assert r["nx_aaaa"]["rcode"] == 3
    assert r["tcp"]["rcode"] == 0 and r["tcp"]["addrs"] == ["198.51.100.12"]
    assert r["meta"]["addrs"] == ["169.254.169.254"]
    assert net.dns_queries() == ["pypi.org", "files.pythonhosted.org", "pypi.org",
                                 "evil.test", "nosuch.example", "nosuch.example",
                                 "api.github.test", "metadata.test"]
    protos = [q["proto"] for q in net.dns_records()]
    assert protos == ["udp"] * 6 + ["tcp", "udp"]
    assert {q["client"] for q in net.dns_records()} == {"198.51.100.1"}


def test_set_dns(net):
    net.set_dns("pypi.org", "127.0.0.1")
    net.set_dns("New.Test", "198.51.100.14")
    net.set_dns("evil.test", None)
    r = run_py(net, 'out([dns("pypi.org"), dns("new.test"), dns("evil.test")])')
    assert r[0]["addrs"] == ["127.0.0.1"]
    assert r[1]["addrs"] == ["198.51.100.14"]
    assert r[2]["rcode"] == 3
    net.set_dns("pypi.org", net.addr("pypi.org"))
    net.set_dns("new.test", None)
    r = run_py(net, 'out([dns("pypi.org"), dns("new.test")])')
    assert r[0]["addrs"] == ["198.51.100.10"] and r[1]["rcode"] == 3
    with pytest.raises(RuntimeError):
        net.set_dns("bad.test", "not-an-address")


def test_http_index_and_default_answer(net):
    r = run_py(net, f"""
a = get("198.51.100.10", "/simple/wr-hello/", "pypi.org")
b = get("198.51.100.10", "/simple/", "pypi.org")
c = get("198.51.100.14", "/x?y=1", "example.test", headers=[("Authorization", "Bearer t0k")])
d = get("198.51.100.10", "/simple/nosuch/", "pypi.org")
# keep-alive: two requests on one connection, the second a POST with a body
s = connect("198.51.100.12")
e1 = exchange(s, "GET", "/repos", "api.github.test")
e2 = exchange(s, "POST", "/upload", "api.github.test", body=b"secret=1")
s.close()
out([a, b, c, d, e1, e2])
""")
    a, b, c, d, e1, e2 = r
    assert a["status"] == 200 and a["headers"]["content-type"].startswith("text/html")
    url = ("https://files.pythonhosted.org/packages/wr_hello-1.0-py3-none-any.whl"
           f"#sha256={net.wheel_sha256}")
    assert f'href="{url}"' in a["body"]
    assert b["status"] == 200 and 'href="/simple/wr-hello/"' in b["body"]
    assert c["status"] == 200 and c["body"] == "hello from example.test\n"
    assert c["headers"]["content-type"].startswith("text/plain")
    assert c["headers"]["x-seen-authorization"] == "Bearer t0k"
    assert "x-seen-authorization" not in a["headers"]
    assert d["status"] == 404
    assert e1["body"] == "hello from api.github.test\n" and e2["status"] == 200

    reqs = net.requests()
    assert [(q["host"], q["scheme"], q["method"], q["path"]) for q in reqs] == [
        ("pypi.org", "http", "GET", "/simple/wr-hello/"),
        ("pypi.org", "http", "GET", "/simple/"),
        ("example.test", "http", "GET", "/x?y=1"),
        ("pypi.org", "http", "GET", "/simple/nosuch/"),
        ("api.github.test", "http", "GET", "/repos"),
        ("api.github.test", "http", "POST", "/upload"),
    ]
    assert all(q["sni"] is None and q["client"] == "198.51.100.1" for q in reqs)
    assert reqs[2]["headers"]["authorization"] == "Bearer t0k"
    assert reqs[5]["body"] == "secret=1"
    assert len(net.requests("pypi.org")) == 3
    assert net.requests(host="198.51.100.12") == reqs[4:]
    assert net.requests("evil.test") == []


def test_https(net):
    r = run_py(net, f"""
ca = {net.ca_pem!r}
a = get("198.51.100.10", "/simple/wr-hello/", "pypi.org", 443, ca, "pypi.org")
b = get("198.51.100.13", "/", "evil.test", 443, ca, "evil.test",
        headers=[("Authorization", "Basic eA==")])
c = get("198.51.100.11", "/packages/wr_hello-1.0-py3-none-any.whl",
        "files.pythonhosted.org", 443, ca, "files.pythonhosted.org")
# identity by address: evil.test's address cannot pass for pypi.org
try:
    connect("198.51.100.13", 443, ca, "pypi.org")
    mismatch = "connected"
except ssl.SSLCertVerificationError as e:
    mismatch = "verify failed"
# the system's trust store does not know the test CA
try:
    socket.setdefaulttimeout(5)
    ssl.create_default_context(cafile="/etc/ssl/certs/ca-certificates.crt").wrap_socket(
        socket.create_connection(("198.51.100.10", 443)), server_hostname="pypi.org")
    untrusted = "connected"
except ssl.SSLCertVerificationError:
    untrusted = "verify failed"
out([a, b, c["status"], len(c["body"]), mismatch, untrusted])
""")
    a, b, status, size, mismatch, untrusted = r
    assert a["status"] == 200 and net.wheel_sha256 in a["body"]
    assert b["body"] == "hello from evil.test\n"
    assert b["headers"]["x-seen-authorization"] == "Basic eA=="
    assert status == 200 and size == os.path.getsize(net.wheel_path)
    assert mismatch == "verify failed" and untrusted == "verify failed"
    reqs = net.requests()
    assert [(q["host"], q["scheme"], q["sni"], q["path"]) for q in reqs] == [
        ("pypi.org", "https", "pypi.org", "/simple/wr-hello/"),
        ("evil.test", "https", "evil.test", "/"),
        ("files.pythonhosted.org", "https", "files.pythonhosted.org",
         "/packages/wr_hello-1.0-py3-none-any.whl"),
    ]


def test_metadata_service_answers_and_logs(net):
    # reachable from the host namespace on purpose: a bug would reach it, and the egress
    # tests assert that requests("169.254.169.254") stays empty
    r = run_py(net, 'out(get("169.254.169.254", "/latest/meta-data/", "169.254.169.254"))')
    assert r["status"] == 200 and r["body"] == "hello from metadata.test\n"
    (q,) = net.requests("169.254.169.254")
    assert q["path"] == "/latest/meta-data/" and q["host"] == "metadata.test"
    assert net.requests("metadata.test") == [q]


def test_wheel_is_valid_and_installs(net, tmp_path):
    with zipfile.ZipFile(net.wheel_path) as z:
        names = set(z.namelist())
        assert names == {"wr_hello.py", "wr_hello-1.0.dist-info/METADATA",
                         "wr_hello-1.0.dist-info/WHEEL", "wr_hello-1.0.dist-info/RECORD"}
        meta = z.read("wr_hello-1.0.dist-info/METADATA").decode()
        assert "Name: wr-hello\n" in meta and "Version: 1.0\n" in meta
        wheel = z.read("wr_hello-1.0.dist-info/WHEEL").decode()
        assert "Root-Is-Purelib: true" in wheel and "Tag: py3-none-any" in wheel
        rows = list(csv.reader(io.StringIO(z.read("wr_hello-1.0.dist-info/RECORD").decode())))
        assert {row[0] for row in rows} == names
        for path, digest, size in rows:
            if path.endswith("RECORD"):
                assert digest == "" and size == ""
                continue
            data = z.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + want.decode() and int(size) == len(data)
    target = tmp_path / "t"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                        "--target", str(target), net.wheel_path],
                       env=net.client_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", "import wr_hello; print(wr_hello.greet())"],
                       env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True,
                       text=True, timeout=30)
    assert r.stdout == "hello from the fake index\n", r.stderr


def test_pip_install_from_the_fake_index(net, tmp_path):
    """pip with its default index (https://pypi.org/simple), resolving through the fake DNS
    (run_with_fake_resolver) and trusting the test CA: the whole path a sandbox will take."""
    target = tmp_path / "t"
    r = net.run_with_fake_resolver(
        [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--retries", "0",
         "--timeout", "10", "--target", str(target), "wr-hello"],
        env=net.client_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Successfully installed wr-hello-1.0" in r.stdout
    r = subprocess.run([sys.executable, "-c", "import wr_hello; print(wr_hello.greet())"],
                       env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True,
                       text=True, timeout=30)
    assert r.stdout == "hello from the fake index\n", r.stderr
    assert "pypi.org" in net.dns_queries()
    assert "files.pythonhosted.org" in net.dns_queries()
    paths = [(q["host"], q["scheme"], q["path"]) for q in net.requests()]
    assert ("pypi.org", "https", "/simple/wr-hello/") in paths
    assert ("files.pythonhosted.org", "https",
            "/packages/wr_hello-1.0-py3-none-any.whl") in paths
    assert net.requests()[0]["headers"]["user-agent"].startswith("pip/")


def test_nothing_else_is_reachable(net):
    code = """
res = {}
for addr in ("1.1.1.1", "8.8.8.8", "10.0.0.1", "192.168.1.1", "127.0.0.53"):
    t0 = time.monotonic()
    try:
        socket.create_connection((addr, 53), timeout=3).close()
        res[addr] = "connected"
    except OSError as e:
        res[addr] = [errno.errorcode.get(e.errno, str(e.errno)), time.monotonic() - t0]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("1.1.1.1", 53))
    res["udp"] = "sent"
except OSError as e:
    res["udp"] = errno.errorcode.get(e.errno)
try:
    socket.create_connection(("2606:4700:4700::1111", 443), timeout=3).close()
    res["v6"] = "connected"
except OSError as e:
    res["v6"] = errno.errorcode.get(e.errno, str(e))
out(res)
"""
    for ns in (net.host_ns, net.inet_ns):
        r = run_py(net, code, ns=ns)
        for addr in ("1.1.1.1", "8.8.8.8", "10.0.0.1", "192.168.1.1"):
            err, secs = r[addr]
            assert err == "ENETUNREACH" and secs < 1, (ns, addr, r)
        # nothing listens on the namespace's own loopback
        assert r["127.0.0.53"][0] == "ECONNREFUSED", (ns, r)
        assert r["udp"] == "ENETUNREACH", (ns, r)
        assert r["v6"] in ("ENETUNREACH", "EADDRNOTAVAIL", "EAFNOSUPPORT"), (ns, r)


def test_start_stop_leaves_nothing(tmp_path):
    fn = fakenet.FakeNet(tmp_path)
    fn.start()
    try:
        names = [os.path.basename(fn.host_ns), os.path.basename(fn.inet_ns)]
        assert set(names) <= set(netns_list())
        pid = fn.proc.pid
        assert os.path.exists(f"/proc/{pid}")
        # a process a test starts in the host namespace and forgets
        sleeper = subprocess.Popen(["nsenter", f"--net={fn.host_ns}", "sleep", "60"])
        want = f"net:[{os.stat(fn.host_ns).st_ino}]"
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{sleeper.pid}/ns/net") != want:
            assert time.monotonic() < deadline, "nsenter did not enter the namespace"
            time.sleep(0.01)
    finally:
        fn.stop()
    sleeper.wait(timeout=10)
    assert not set(names) & set(netns_list())
    assert not os.path.exists(fn.host_ns) and not os.path.exists(fn.inet_ns)
    assert not os.path.exists(f"/proc/{pid}")
    fn.stop()  # idempotent


def test_failed_start_cleans_up(tmp_path):
    class Broken(fakenet.FakeNet):
        def _probe(self):
            self.pid_seen = self.proc.pid
            raise RuntimeError("probe failed on purpose")

    fn = Broken(tmp_path)
    with pytest.raises(RuntimeError, match="on purpose"):
        fn.start()
    assert fn.proc is None and not os.path.exists(f"/proc/{fn.pid_seen}")
    assert not {os.path.basename(fn.host_ns), os.path.basename(fn.inet_ns)} & set(netns_list())
    fn.stop()
