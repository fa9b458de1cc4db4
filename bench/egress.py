#!/usr/bin/env python3
"""withruntime egress benchmark: the egress proxy against the direct path, in one run.

Every TCP connection out of a sandbox goes through the daemon's egress proxy, which checks the
TLS SNI / HTTP Host against the sandbox's `network` policy and dials upstream itself. This
measures what that costs, against a fake internet in network namespaces of its own
(tests/e2e/fakenet.py: nothing is reachable from there but the fake servers):

  * download throughput of a large body (`GET /bytes/<n>` on example.test, 256 MiB by default)
    with curl: over HTTPS from inside a sandbox through the proxy; the baseline, the same
    download by the same curl binary (the image's, chrooted) run directly in the daemon's
    network namespace, the path the proxy itself dials; and both over plain HTTP. Repetitions
    interleaved, medians, ratio proxy / direct; CPU seconds per GiB of the daemon (the proxy:
    with its egress process, where the proxy runs now),
    the sandbox (its cgroup), the fake server and the direct curl, to see where time goes;
  * a second baseline for the same downloads, interleaved with them: the sandbox's curl against
    a server in the daemon's gateway namespace (the fake server's own handler, on the sandbox's
    slot gateway address, let through by two bench-only nft rules before the redirect to the
    proxy), which shares the sandbox's network path (gVisor's netstack, the veth) without the
    proxy. Ratios proxy / gateway (what the proxy costs) and gateway / direct (what that path
    costs); CPU seconds per GiB of the sandbox and that server;
  * connection set-up: N small HTTPS GETs (a new curl and connection each), curl's
    time_namelookup / time_connect / time_appconnect / time_total, p50 / p90, in the sandbox
    (by name, through the sandbox's resolver and the proxy) and direct (--resolve);
  * name lookups: the sandbox's resolver asked for example.test's A record N times from inside
    the sandbox (a python client over UDP, one query at a time, and getaddrinfo, the libc path
    curl takes), p50 / p90 / p99; beside it in the same run, the floor of the path (AAAA queries
    for the same name, which the resolver answers empty without asking upstream: gVisor's
    netstack, the veth and the daemon's event loop) and the baseline (the same client in the
    daemon's network namespace asking the fake upstream directly, without our resolver);
  * create -> first exec `true` -> delete, one at a time, interleaved between a daemon with
    `--egress off` and one with `--egress on` (a sandbox with the default policy, and one
    allowed example.test), both in the fake internet's host namespace, each on a temporary
    state directory of its own that links the image of --image-state-dir.

Writes bench/results/egress.json (with the commit measured) and egress.png, prints JSON on
stdout, and the downloads' medians and ratios on stderr. Cleans up (the gateway server by PID
and its rules, sandboxes, daemons by PID, state directories, the namespaces) on any exit.
"""

import argparse
import datetime
import http.client
import ipaddress
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))

import run as base  # noqa: E402  (bench/run.py: write_json, percentile, machine_info, ...)
import fakenet  # noqa: E402

log = base.log
ROOT = base.ROOT
HOST = "example.test"  # the fake host the downloads come from
ALLOW = {"internet": True, "allow": [HOST]}
CLK_TCK = os.sysconf("SC_CLK_TCK")
DL_FORMAT = "%{http_code} %{size_download} %{speed_download} %{time_total}"
SETUP_FORMAT = ("%{http_code} %{time_namelookup} %{time_connect} %{time_appconnect} "
                "%{time_starttransfer} %{time_total}")
SETUP_KEYS = ("namelookup", "connect", "appconnect", "starttransfer", "total")
# What the sandbox's curl trusts: the one CA of the certificates it is shown, as the direct curl
# has it. The proxy terminates TLS, so inside that is the daemon's CA (STATE_DIR/ca/ca.pem).
SANDBOX_CA = "/tmp/daemon-ca.pem"
GATEWAY_CA = "/tmp/gateway-ca.pem"  # the gateway server's own CA, in the sandbox
GATEWAY_NAME = "gateway.test"  # its certificate's name; the sandbox's curl --resolve's it

# The server of the gateway baseline, run in the daemon's gateway namespace by the host's
# python: the fake internet's own HTTP handler and server classes (tests/e2e/fakeinet_server.py:
# GET /bytes/<n> streamed a MiB at a time, with a Content-Length), so the baseline's server costs
# what the fake server costs. argv: the directory of fakeinet_server.py, the address to bind
# (the slot's gateway address; ports chosen by the kernel), its request log, certificate and key.
# Prints "ready HTTP_PORT HTTPS_PORT"; EOF on stdin (the bench went away) ends it.
GATEWAY_SERVER = r"""
import os, sys, threading
sys.path.insert(0, sys.argv[1])
import fakeinet_server as f
addr, log, cert, key = sys.argv[2:6]
class State:
    http_log = f.Log(log)
plain = f.HTTPServer(State, "gateway", addr, 0)
tls = f.HTTPServer(State, "gateway", addr, 0, f.tls_context(cert, key))
for srv in (plain, tls):
    threading.Thread(target=srv.serve_forever, daemon=True).start()
print("ready", plain.server_port, tls.server_port, flush=True)
sys.stdin.read()
os._exit(0)
"""

# The lookup client, the same code inside the sandbox (image's python3, under gVisor) and in the
# daemon's namespace (the host's python3): argv server, name, n; one UDP socket, one query at a
# time, a fresh id each; kinds interleaved so that drift hits them alike. "a": the A record (what
# goes upstream on a miss), "aaaa": answered by our resolver without asking anyone (the floor
# of the path inside), "gai": getaddrinfo(AF_UNSPEC, SOCK_STREAM) (libc: A and AAAA at once),
# only where /etc/resolv.conf names that server. Prints {"kind": [ms, ...]} and the rcodes seen.
LOOKUP_CLIENT = r"""
import json, os, random, socket, struct, sys, time
server, name, n, kinds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
qn = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.connect((server, 53))
def ask(qtype):
    qid = random.getrandbits(16)
    msg = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qn + struct.pack("!HH", qtype, 1)
    t0 = time.perf_counter()
    s.send(msg)
    while True:
        r = s.recv(2048)
        if len(r) >= 12 and struct.unpack("!H", r[:2])[0] == qid:
            break
    return time.perf_counter() - t0, r[3] & 15, struct.unpack("!H", r[6:8])[0]
def gai():
    t0 = time.perf_counter()
    socket.getaddrinfo(name, 443, socket.AF_UNSPEC, socket.SOCK_STREAM)
    return time.perf_counter() - t0, 0, 1
run = {"a": lambda: ask(1), "aaaa": lambda: ask(28), "gai": gai}
for k in kinds:
    run[k]()  # warm: the first of each is not counted
out = {k: [] for k in kinds}
rcodes = {k: {} for k in kinds}
for i in range(n):
    for k in kinds:
        dt, rc, an = run[k]()
        out[k].append(round(dt * 1000, 4))
        key = f"{rc}/{an}"
        rcodes[k][key] = rcodes[k].get(key, 0) + 1
print(json.dumps({"ms": out, "rcode_answers": rcodes}))
"""


# ---------------------------------------------------------------- the API over a Unix socket

class UnixConn(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        self.sock = s


class UnixApi:
    def __init__(self, sock_path):
        self.sock_path = sock_path

    def call(self, method, path, body=None, timeout=300, data=None):
        conn = UnixConn(self.sock_path, timeout)
        try:
            headers = {}
            if data is not None:
                headers["Content-Type"] = "application/octet-stream"
            elif body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            payload = r.read()
        finally:
            conn.close()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path} -> {r.status}: {payload[:300]!r}")
        return json.loads(payload) if payload else None


# ---------------------------------------------------------------- a daemon in the host ns

class NsDaemon:
    """`withruntime serve` in the fake internet's host namespace (nsenter execs it: its PID is
    the daemon's), on a fresh state directory whose `images` links the built image."""

    def __init__(self, args, net, egress):
        self.net, self.egress = net, egress
        self.bin, self.agent = args.bin, args.agent
        self.state_dir = tempfile.mkdtemp(prefix=f"wr-egress-bench-{egress}-", dir="/var/tmp")
        os.symlink(os.path.join(os.path.abspath(args.image_state_dir), "images"),
                   os.path.join(self.state_dir, "images"))
        self.sock = os.path.join(self.state_dir, "withruntime.sock")
        self.log_path = os.path.join(self.state_dir, "daemon.log")
        self.api = UnixApi(self.sock)
        self.proc = None
        self.live = set()

    def start(self):
        argv = ["nsenter", f"--net={self.net.host_ns}", "--", self.bin, "serve",
                "--state-dir", self.state_dir, "--listen", "none", "--socket", self.sock,
                "--agent", self.agent, "--egress", self.egress, "--pool", "0"]
        if self.egress == "on":
            argv += ["--dns-upstream", fakenet.DNS_ADDR, "--public-ranges",
                     fakenet.PUBLIC_RANGES, "--extra-ca-file", self.net.ca_pem]
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon (--egress {self.egress}) exited "
                                   f"{self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api.call("GET", "/v1/health", timeout=2)
                return self
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daemon (--egress {self.egress}) did not answer in "
                                       f"60 s:\n{self.log_tail()}")
                time.sleep(0.1)

    def log_tail(self, n=30):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

    def cpu_seconds(self):
        return proc_cpu(self.proc.pid)

    def helper_pids(self):
        """The daemon's egress process and signer (src/net/netproc.h), where the proxy runs
        since the daemon no longer parses sandboxes' bytes itself; none on older daemons."""
        out = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open(f"/proc/{p}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if ppid == self.proc.pid and len(argv) > 1 and argv[1] in (b"__net", b"__signer"):
                out.append(int(p))
        return out

    def cpu_user_sys(self):
        """(user, sys) seconds of the daemon and its egress processes together."""
        u, s = proc_cpu(self.proc.pid, split=True)
        for pid in self.helper_pids():
            try:
                hu, hs = proc_cpu(pid, split=True)
            except OSError:
                continue
            u, s = u + hu, s + hs
        return u, s

    # -- sandboxes

    def create(self, **fields):
        sb = self.api.call("POST", "/v1/sandboxes", fields)
        self.live.add(sb["id"])
        return sb["id"]

    def delete(self, sid):
        self.api.call("DELETE", f"/v1/sandboxes/{sid}")
        self.live.discard(sid)

    def exec(self, sid, command, timeout=300):
        r = self.api.call("POST", f"/v1/sandboxes/{sid}/exec",
                          {"command": command, "timeout_seconds": timeout},
                          timeout=timeout + 30)
        if r.get("stdout_encoding") != "utf-8":
            raise RuntimeError(f"exec {command!r}: output not text: {str(r)[:300]}")
        return r

    def write_file(self, sid, path, data):
        q = urllib.parse.urlencode({"path": path})
        self.api.call("PUT", f"/v1/sandboxes/{sid}/files/content?{q}", data=data)

    def cpu_usec(self, sid):
        return self.api.call("GET", f"/v1/sandboxes/{sid}/stats")["cpu_usec"]

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            for sid in list(self.live):
                try:
                    self.delete(sid)
                except Exception as e:  # keep cleaning
                    log(f"could not delete {sid}: {e}")
            try:  # and any the bench lost track of
                for sb in self.api.call("GET", "/v1/sandboxes")["sandboxes"]:
                    self.api.call("DELETE", f"/v1/sandboxes/{sb['id']}")
            except Exception as e:
                log(f"could not list/delete sandboxes: {e}")
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        base.remove_state_dir(self.state_dir)  # `images` is a symlink: removed, not followed


def proc_cpu(pid, split=False):
    """utime + stime of a process (seconds); split: (utime, stime)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    u, s = int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK
    return (u, s) if split else u + s


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- curl, both ways

class Curl:
    """The image's curl run directly in the host namespace: chrooted into the image's rootfs
    (the same binary and libraries as in the sandbox), in a private mount namespace with a
    tmpfs on its /tmp that holds the fake CA; --resolve instead of a resolver."""

    def __init__(self, net, rootfs):
        self.net, self.rootfs = net, rootfs

    def direct_argv(self, script):
        setup = ('set -e; mount -t tmpfs -o size=1m none "$0/tmp"; cp "$1" "$0/tmp/ca.pem"; '
                 'exec chroot "$0" /bin/sh -c "$2"')
        return ["nsenter", f"--net={self.net.host_ns}", "--", "unshare", "--mount",
                "--propagation", "private", "--", "sh", "-c", setup, self.rootfs,
                self.net.ca_pem, script]

    def direct(self, script, timeout=300):
        r = subprocess.run(self.direct_argv(script), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"direct curl failed ({r.returncode}): {r.stderr[-500:]}")
        return r.stdout

    def resolve_opts(self, port):
        return f"--cacert /tmp/ca.pem --resolve {HOST}:{port}:{self.net.addr(HOST)}"


# ---------------------------------------------------------------- the gateway baseline

def sandbox_resolver(d, sid):
    """The nameserver of the sandbox's /etc/resolv.conf: its slot's gateway address."""
    return d.exec(sid, "sed -n 's/^nameserver //p' /etc/resolv.conf")["stdout"].split()[0]


class GatewayServer:
    """A bench-only server in the daemon's gateway namespace, on the gateway address of one
    sandbox's slot (its end of the veth, 10.200.x.(4k+1), which is also the sandbox's resolver):
    the sandbox reaches it through gVisor's netstack and the veth as it reaches the proxy, but
    the proxy is not in the way. Two rules let the bench's two ports through, for that sandbox's
    interface and that address only: one at the top of chain `pre` (before the redirect to the
    proxy) and one in chain `in` (policy drop). The namespace is held only by the daemon, by an
    fd (src/net/gateway.c): it is entered by the daemon's /proc/<pid>/fd/<n>.

    stop() deletes the rules and kills the server by PID; idempotent, safe after a start() that
    failed halfway. The namespace goes with the daemon once the server is gone."""

    def __init__(self, d, sid, workdir):
        self.d, self.sid = d, sid
        self.dir = os.path.join(workdir, "gateway")
        self.addr = self.ns = self.ifname = None
        self.ports = {}  # scheme -> port
        self.proc = None
        self.rules = []  # (chain, handle) of the rules added, to delete

    @property
    def pid(self):
        return self.proc.pid  # nsenter execs the server: the same PID

    def start(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        self.addr = sandbox_resolver(self.d, self.sid)
        a = ipaddress.ip_address(self.addr)
        if a not in ipaddress.ip_network("10.200.0.0/16") or int(a) & 3 != 1:
            raise RuntimeError(f"the sandbox's resolver {self.addr} is not a slot's gateway "
                               "address (10.200.x.(4k+1))")
        self.ns, self.ifname = self.find_ns()
        os.makedirs(self.dir, exist_ok=True)
        ca_pem, leaves = fakenet.make_certs(self.dir, [GATEWAY_NAME])
        with open(ca_pem, "rb") as f:
            self.d.write_file(self.sid, GATEWAY_CA, f.read())
        cert, key = leaves[GATEWAY_NAME]
        with open(os.path.join(self.dir, "server.stderr"), "ab") as err:
            self.proc = subprocess.Popen(
                ["nsenter", f"--net={self.ns}", "--", sys.executable, "-c", GATEWAY_SERVER,
                 os.path.dirname(fakenet.SERVER), self.addr,
                 os.path.join(self.dir, "http.jsonl"), cert, key],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                start_new_session=True)
        line = self._read_line(15).split()
        if len(line) != 3 or line[0] != "ready":
            raise RuntimeError(f"gateway server did not start ({line!r}): {self._tail()}")
        self.ports = {"http": int(line[1]), "https": int(line[2])}
        match = (f'iifname "{self.ifname}" ip daddr {self.addr} '
                 f'tcp dport {{ {self.ports["http"]}, {self.ports["https"]} }} accept')
        self._rule("insert", "pre", match)  # at the top: before the redirect to the proxy
        self._rule("add", "in", match)

    def find_ns(self):
        """(the path of the daemon's fd of its gateway namespace, the name of the sandbox's
        interface there): the namespace where a wrs* link holds the sandbox's gateway address."""
        pid = self.d.proc.pid
        seen = set()
        for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
            path = f"/proc/{pid}/fd/{fd}"
            try:
                link = os.readlink(path)
            except OSError:
                continue
            if not link.startswith("net:[") or link in seen:
                continue
            seen.add(link)
            r = subprocess.run(["nsenter", f"--net={path}", "--", "ip", "-4", "-j", "addr",
                                "show", "to", f"{self.addr}/32"], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                continue
            for dev in json.loads(r.stdout or "[]"):
                if dev.get("ifname", "").startswith("wrs") and any(
                        x.get("local") == self.addr for x in dev.get("addr_info", [])):
                    return path, dev["ifname"]
        raise RuntimeError(f"no network namespace of the daemon (pid {pid}) has a wrs* link "
                           f"with {self.addr}: is it the gateway's?")

    def _nft(self, *words):
        r = subprocess.run(["nsenter", f"--net={self.ns}", "--", "nft", *words],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"nft {' '.join(words)}: {r.stderr.strip()}")
        return r.stdout

    def _rule(self, verb, chain, match):
        out = self._nft("--echo", "--handle", f"{verb} rule inet withruntime {chain} {match}")
        m = re.search(r"# handle (\d+)", out)
        if not m:
            raise RuntimeError(f"nft {verb} rule in {chain}: no handle in {out!r}")
        self.rules.append((chain, m.group(1)))

    def _read_line(self, timeout):
        fd, buf = self.proc.stdout.fileno(), b""
        deadline = time.monotonic() + timeout
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"gateway server: no answer in {timeout} s: {self._tail()}")
            b = os.read(fd, 256)
            if not b:
                raise RuntimeError(f"gateway server exited ({self.proc.poll()}): "
                                   f"{self._tail()}")
            buf += b
        return buf.decode().strip()

    def _tail(self):
        try:
            with open(os.path.join(self.dir, "server.stderr"), "rb") as f:
                return f.read()[-1500:].decode(errors="replace")
        except OSError:
            return ""

    def curl_args(self, scheme, path):
        """curl's arguments in the sandbox for path of this server: --resolve, no lookup."""
        port = self.ports[scheme]
        tls = f"--cacert {GATEWAY_CA} " if scheme == "https" else ""
        return (f"{tls}--resolve {GATEWAY_NAME}:{port}:{self.addr} "
                f"{scheme}://{GATEWAY_NAME}:{port}{path}")

    def stop(self):
        while self.rules:
            chain, handle = self.rules.pop()
            try:
                self._nft("delete", "rule", "inet", "withruntime", chain, "handle", handle)
            except Exception as e:  # keep cleaning: the namespace goes with the daemon anyway
                log(f"gateway: could not delete rule {handle} of {chain}: {e}")
        proc, self.proc = self.proc, None
        if proc is not None and not fakenet.kill_server(proc):
            log(f"gateway server {proc.pid} did not exit")


def parse_download(out, want):
    code, size, speed, total = out.split()
    if code != "200" or int(size) != want:
        raise RuntimeError(f"download: HTTP {code}, {size} bytes of {want}")
    return {"mib_s": float(speed) / 2**20, "seconds": float(total)}


def measure_downloads(args, d, curl, sid, gw):
    """The same download four ways, each over HTTPS and HTTP, interleaved: in the sandbox
    through the proxy (sandbox_*); in the sandbox from the gateway server, the same netstack and
    veth without the proxy (sandbox_gateway_*, gw: a started GatewayServer); and direct."""
    size = args.mib << 20
    path = f"/bytes/{size}"
    url = {"https": f"https://{HOST}{path}", "http": f"http://{HOST}{path}"}
    w = f"-w '{DL_FORMAT}'"
    srv = fakenet_server_pid(curl.net)

    def in_sandbox(what, opts, server, server_pid):
        """curl opts in the sandbox; CPU of the daemon (the proxy), the sandbox and server."""
        t = (d.cpu_user_sys(), d.cpu_usec(sid), proc_cpu(server_pid))
        r = d.exec(sid, f"curl -sS -m 240 -o /dev/null {w} {opts}")
        if r["exit_code"] != 0:
            raise RuntimeError(f"sandbox curl {what}: {str(r)[:500]}")
        res = parse_download(r["stdout"], size)
        u, s = d.cpu_user_sys()
        res["cpu_s"] = {"daemon": u + s - sum(t[0]), "daemon_user": u - t[0][0],
                        "daemon_sys": s - t[0][1],
                        "sandbox": (d.cpu_usec(sid) - t[1]) / 1e6,
                        server: proc_cpu(server_pid) - t[2]}
        return res

    def proxied(scheme):
        return in_sandbox(scheme, f"--cacert {SANDBOX_CA} {url[scheme]}", "fake_server", srv)

    def gateway(scheme):
        return in_sandbox(f"gateway {scheme}", gw.curl_args(scheme, path), "gateway_server",
                          gw.pid)

    def direct(scheme):
        port = 443 if scheme == "https" else 80
        t = (children_cpu(), proc_cpu(srv))
        out = curl.direct(f"curl -sS -m 240 -o /dev/null {w} {curl.resolve_opts(port)} "
                          f"{url[scheme]}")
        res = parse_download(out, size)
        res["cpu_s"] = {"curl": children_cpu() - t[0], "fake_server": proc_cpu(srv) - t[1]}
        return res

    runs = {"sandbox_https": lambda: proxied("https"),
            "sandbox_gateway_https": lambda: gateway("https"),
            "direct_https": lambda: direct("https"),
            "sandbox_http": lambda: proxied("http"),
            "sandbox_gateway_http": lambda: gateway("http"),
            "direct_http": lambda: direct("http")}
    log("download warm-up (1 MiB each way)")
    small = 1 << 20
    d.exec(sid, f"curl -sS -o /dev/null https://{HOST}/bytes/{small} "
                f"-o /dev/null http://{HOST}/bytes/{small}")
    for scheme in ("https", "http"):  # and a failure here says what is wrong, before the reps
        r = d.exec(sid, f"curl -sS -m 60 -o /dev/null {gw.curl_args(scheme, f'/bytes/{small}')}")
        if r["exit_code"] != 0:
            raise RuntimeError(f"sandbox curl from the gateway server ({scheme}): "
                               f"{str(r)[:500]}")
    curl.direct(f"curl -sS -o /dev/null {curl.resolve_opts(443)} https://{HOST}/bytes/{small}")
    samples = {k: [] for k in runs}
    names = list(runs)
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]  # rotate: no fixed order
        for k in order:
            samples[k].append(runs[k]())
        log(f"download rep {rep + 1}/{args.reps}: " + ", ".join(
            f"{k} {samples[k][-1]['mib_s']:.0f}" for k in names) + " MiB/s")

    out = {"size_mib": args.mib, "repetitions": args.reps, "url_path": f"/bytes/{size}"}
    for k, xs in samples.items():
        speeds = [x["mib_s"] for x in xs]
        gib = args.mib / 1024 * len(xs)
        cpu = {c: round(sum(x["cpu_s"][c] for x in xs) / gib, 2) for c in xs[0]["cpu_s"]}
        out[k] = {"median_mib_s": round(statistics.median(speeds), 1),
                  "min_mib_s": round(min(speeds), 1), "max_mib_s": round(max(speeds), 1),
                  "samples_mib_s": [round(s, 1) for s in speeds],
                  "cpu_seconds_per_gib": cpu}
    out["ratio_proxy_over_direct_https"] = round(
        out["sandbox_https"]["median_mib_s"] / out["direct_https"]["median_mib_s"], 3)
    out["ratio_proxy_over_direct_http"] = round(
        out["sandbox_http"]["median_mib_s"] / out["direct_http"]["median_mib_s"], 3)
    for scheme in ("https", "http"):
        # proxy / direct = (proxy / gateway) x (gateway / direct): what the proxy costs, and
        # what the sandbox's own network path (gVisor's netstack, the veth) costs
        gmed = out[f"sandbox_gateway_{scheme}"]["median_mib_s"]
        out[f"ratio_proxy_over_gateway_{scheme}"] = round(
            out[f"sandbox_{scheme}"]["median_mib_s"] / gmed, 3)
        out[f"ratio_gateway_over_direct_{scheme}"] = round(
            gmed / out[f"direct_{scheme}"]["median_mib_s"], 3)
    out["gateway_server"] = {"name": GATEWAY_NAME, "addr": gw.addr, "ports": gw.ports,
                             "interface": gw.ifname}
    out["goal_ratio"] = 0.8
    return out


def fakenet_server_pid(net):
    return net.proc.pid  # nsenter execs the server: the same PID


def setup_stats(rows):
    """curl's cumulative times, and the phases between them: the name lookup, the TCP connect
    (to the proxy, in the sandbox), the TLS handshake (through the proxy: its sniffing of the
    ClientHello, its own lookup and dial) and the wait for the first byte."""
    out = {"n": len(rows)}

    def put(k, ms):
        out[k] = {"p50_ms": round(base.percentile(ms, 50), 2),
                  "p90_ms": round(base.percentile(ms, 90), 2)}

    for i, k in enumerate(SETUP_KEYS):
        put(k, [r[i] * 1000 for r in rows])
    put("phase_tcp", [(r[1] - r[0]) * 1000 for r in rows])
    if any(r[2] for r in rows):
        put("phase_tls", [(r[2] - r[1]) * 1000 for r in rows])
    put("phase_first_byte", [(r[3] - max(r[1], r[2])) * 1000 for r in rows])
    return out


def parse_setup(out, n):
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) != 1 + len(SETUP_KEYS):
            continue
        if f[0] != "200":
            raise RuntimeError(f"set-up GET: HTTP {f[0]}")
        rows.append([float(x) for x in f[1:]])
    if len(rows) != n:
        raise RuntimeError(f"set-up: {len(rows)} answers of {n}:\n{out[-500:]}")
    return rows


def measure_setup(args, d, curl, sid, gw=None):
    """N small GETs, a new curl process and connection each: HTTPS (TLS done = appconnect) and
    plain HTTP (the proxy's first byte = starttransfer), in the sandbox by name through its
    resolver and the proxy, and direct with --resolve. Both curls trust the fake CA alone.
    With gw (GatewayServer) also in the sandbox from the gateway server (--resolve, no proxy):
    what the sandbox's own network path costs a connection, told apart from the proxy."""
    n = args.setup_n
    w = f"-w '{SETUP_FORMAT}\\n'"
    out = {}
    for scheme, port in (("https", 443), ("http", 80)):
        loop = (f"for i in $(seq {n}); do curl -sS -m 20 -o /dev/null {w} @OPTS@ "
                f"{scheme}://{HOST}/; done")
        log(f"connection set-up: {n} {scheme.upper()} GETs in the sandbox, {n} direct")
        d.exec(sid, f"curl -sS -o /dev/null --cacert {SANDBOX_CA} {scheme}://{HOST}/")  # warm
        r = d.exec(sid, loop.replace("@OPTS@", f"--cacert {SANDBOX_CA}"))
        if r["exit_code"] != 0:
            raise RuntimeError(f"sandbox set-up loop: {str(r)[:500]}")
        sandbox = parse_setup(r["stdout"], n)
        direct = parse_setup(curl.direct(loop.replace("@OPTS@", curl.resolve_opts(port))), n)
        res = {"sandbox_by_name": setup_stats(sandbox), "direct_resolve": setup_stats(direct)}
        if gw is not None:
            gloop = (f"for i in $(seq {n}); do curl -sS -m 20 -o /dev/null {w} "
                     f"{gw.curl_args(scheme, '/bytes/16')}; done")
            r = d.exec(sid, gloop)
            if r["exit_code"] != 0:
                raise RuntimeError(f"sandbox gateway set-up loop: {str(r)[:500]}")
            res["sandbox_gateway"] = setup_stats(parse_setup(r["stdout"], n))
        keys = ("appconnect", "total") if scheme == "https" else ("starttransfer", "total")
        for k in keys:
            for q in ("p50_ms", "p90_ms"):
                res[f"ratio_{k}_{q[:3]}"] = round(
                    res["sandbox_by_name"][k][q] / res["direct_resolve"][k][q], 2)
        out[scheme] = res
    return out


def lookup_stats(ms):
    return {"n": len(ms), "p50_ms": round(base.percentile(ms, 50), 3),
            "p90_ms": round(base.percentile(ms, 90), 3),
            "p99_ms": round(base.percentile(ms, 99), 3),
            "mean_ms": round(statistics.fmean(ms), 3), "max_ms": round(max(ms), 3)}


def measure_lookup(args, d, net, sid):
    """N lookups of HOST from inside the sandbox through its resolver (A: what a cache serves;
    AAAA: answered by the resolver alone, the floor; getaddrinfo), against the same client in
    the daemon's namespace asking the fake upstream directly (A; getaddrinfo with the fake
    resolver in /etc/resolv.conf). The fake DNS gives TTL 5 s."""
    n = args.lookup_n
    log(f"name lookups: {n} of each kind in the sandbox, {n} direct")
    quoted = LOOKUP_CLIENT.replace("'", "'\\''")
    ns = on_ns = sandbox_resolver(d, sid)
    r = d.exec(sid, f"python3 -c '{quoted}' {ns} {HOST} {n} a,aaaa,gai", timeout=120)
    if r["exit_code"] != 0:
        raise RuntimeError(f"sandbox lookup client: {str(r)[:500]}")
    inside = json.loads(r["stdout"])
    p = net.run_with_fake_resolver(["python3", "-c", LOOKUP_CLIENT, fakenet.DNS_ADDR, HOST,
                                    str(n), "a,gai"], timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"direct lookup client: {p.stderr[-500:]}")
    direct = json.loads(p.stdout)
    out = {"name": HOST, "upstream_ttl_s": 5, "resolver": on_ns,
           "sandbox_a": lookup_stats(inside["ms"]["a"]),
           "sandbox_aaaa_floor": lookup_stats(inside["ms"]["aaaa"]),
           "sandbox_getaddrinfo": lookup_stats(inside["ms"]["gai"]),
           "direct_a": lookup_stats(direct["ms"]["a"]),
           "direct_getaddrinfo": lookup_stats(direct["ms"]["gai"]),
           "rcode_answers": {"sandbox": inside["rcode_answers"],
                             "direct": direct["rcode_answers"]},
           "samples_ms": {"sandbox": inside["ms"], "direct": direct["ms"]}}
    if inside["rcode_answers"]["a"] != {"0/1": n} or direct["rcode_answers"]["a"] != {"0/1": n}:
        raise RuntimeError(f"lookups did not all answer one address: {out['rcode_answers']}")
    return out


def measure_create(args, on, off):
    n = args.create_n
    variants = {"egress_off": (off, {}),
                "egress_on_default_policy": (on, {}),
                "egress_on_allow": (on, {"network": ALLOW})}
    log(f"create -> first exec -> delete, {n} one at a time per variant, interleaved")
    for d, extra in variants.values():  # warm-up, not counted
        sid = d.create(memory_mib=args.memory_mib, **extra)
        d.exec(sid, "true")
        d.delete(sid)
    first = {k: [] for k in variants}
    whole = {k: [] for k in variants}
    names = list(variants)
    for i in range(n):
        for k in names[i % 3:] + names[:i % 3]:
            d, extra = variants[k]
            t0 = time.perf_counter()
            sid = d.create(memory_mib=args.memory_mib, **extra)
            r = d.exec(sid, "true")
            t1 = time.perf_counter()
            if r["exit_code"] != 0:
                raise RuntimeError(f"exec true: {r}")
            d.delete(sid)
            first[k].append(t1 - t0)
            whole[k].append(time.perf_counter() - t0)
    out = {}
    for k in names:
        out[k] = {"through_delete": base.stats_ms(whole[k]),
                  "to_first_exec": base.stats_ms(first[k])}
    for k in names[1:]:
        for q in ("p50_ms", "p90_ms"):
            out[f"ratio_{k}_over_off_{q[:3]}"] = round(
                out[k]["through_delete"][q] / out["egress_off"]["through_delete"][q], 2)
    return out


# ---------------------------------------------------------------- summary and chart

def summary(res):
    """The downloads in a few lines for the log: medians, the ratios, CPU per GiB."""
    dl = res["results"]["download"]
    lines = [f"download {dl['size_mib']} MiB x{dl['repetitions']}, median MiB/s "
             "(CPU s/GiB: the client (sandbox or direct curl), the daemon, the server):"]
    for scheme in ("https", "http"):
        for way in ("direct", "sandbox_gateway", "sandbox"):
            k = f"{way}_{scheme}"
            cpu = dl[k]["cpu_seconds_per_gib"]
            server = cpu.get("fake_server", cpu.get("gateway_server"))
            lines.append(f"  {k:22} {dl[k]['median_mib_s']:8.1f}   ("
                         f"{cpu.get('sandbox', cpu.get('curl'))}, {cpu.get('daemon', '-')}, "
                         f"{server})")
        lines.append(f"  {scheme}: proxy/direct {dl[f'ratio_proxy_over_direct_{scheme}']:.3f}"
                     f" = gateway/direct (gVisor's netstack, the veth) "
                     f"{dl[f'ratio_gateway_over_direct_{scheme}']:.3f}"
                     f" x proxy/gateway (the proxy) "
                     f"{dl[f'ratio_proxy_over_gateway_{scheme}']:.3f}")
    return "\n".join(lines)


def chart(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install -r bench/requirements.txt); no chart")
        return False
    r = res["results"]
    fig, axes = plt.subplots(1, 4, figsize=(21, 5.2))

    ax = axes[0]
    dl = r["download"]
    keys = ["direct_https", "sandbox_gateway_https", "sandbox_https",
            "direct_http", "sandbox_gateway_http", "sandbox_http"]
    labels = ["HTTPS\ndirect", "HTTPS\nsandbox→\ngateway", "HTTPS\nsandbox+\nproxy",
              "HTTP\ndirect", "HTTP\nsandbox→\ngateway", "HTTP\nsandbox+\nproxy"]
    colors = ["#6a9f4a", "#8e5ea2", "#3b6fb6", "#a8cf8e", "#c6a7d6", "#9db7db"]
    meds = [dl[k]["median_mib_s"] for k in keys]
    err = [[m - dl[k]["min_mib_s"] for m, k in zip(meds, keys)],
           [dl[k]["max_mib_s"] - m for m, k in zip(meds, keys)]]
    ax.bar(range(len(keys)), meds, color=colors, yerr=err, capsize=4)
    for x, (v, k) in enumerate(zip(meds, keys)):
        ax.text(x + 0.08, v, f"{v:.0f}", ha="left", va="bottom", fontsize=8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("MiB/s (median, min–max)")
    ax.set_title(f"{dl['size_mib']} MiB download ×{dl['repetitions']}; proxy/direct = "
                 "gateway/direct × proxy/gateway:\n" + ", ".join(
                     f"{sc.upper()} {dl[f'ratio_proxy_over_direct_{sc}']:.2f} = "
                     f"{dl[f'ratio_gateway_over_direct_{sc}']:.2f} × "
                     f"{dl[f'ratio_proxy_over_gateway_{sc}']:.2f}" for sc in ("https", "http")),
                 fontsize=9)

    ax = axes[1]
    su = r["setup"]
    groups = [("https", "appconnect", "HTTPS: TLS done"), ("https", "total", "HTTPS: GET done"),
              ("http", "starttransfer", "HTTP: first byte")]
    width = 0.2
    for i, (scheme, gk, gl) in enumerate(groups):
        for who, col, lab in (("direct_resolve", "#6a9f4a", "direct"),
                              ("sandbox_by_name", "#3b6fb6", "sandbox+proxy")):
            for j, q in enumerate(("p50_ms", "p90_ms")):
                x = i + (0 if who == "direct_resolve" else 2 * width) + j * width
                v = su[scheme][who][gk][q]
                ax.bar(x, v, width, color=col, alpha=1.0 if j == 0 else 0.55,
                       label=f"{lab} {q[:3]}" if i == 0 else None)
                ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([k + 1.5 * width for k in range(len(groups))])
    ax.set_xticklabels([f"{gl}\n(time_{gk})" for _, gk, gl in groups], fontsize=8)
    ax.set_ylabel("ms")
    ax.set_title(f"small GET, new curl + connection each "
                 f"(n={su['https']['direct_resolve']['n']})", fontsize=9)
    ax.legend(fontsize=7)

    ax = axes[2]
    cr = r["create"]
    vk = ["egress_off", "egress_on_default_policy", "egress_on_allow"]
    vl = ["--egress off", "--egress on\ndefault policy", f"--egress on\nallow {HOST}"]
    vc = ["#e08a2c", "#3b6fb6", "#9db7db"]
    for j, q in enumerate(("p50_ms", "p90_ms")):
        for k, (key, col) in enumerate(zip(vk, vc)):
            x = j + k * 0.27
            v = cr[key]["through_delete"][q]
            ax.bar(x, v, 0.27, color=col, label=vl[k].replace("\n", " ") if j == 0 else None)
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([0.27, 1.27])
    ax.set_xticklabels(["p50", "p90"])
    ax.set_ylabel("ms")
    ax.set_title(f"create → exec true → delete (n={cr['egress_off']['through_delete']['n']} "
                 "each, interleaved)", fontsize=9)
    ax.legend(fontsize=7)

    ax = axes[3]
    lk = r["lookup"]
    kinds = [("direct_a", "A, direct\n(upstream)", "#6a9f4a"),
             ("sandbox_aaaa_floor", "AAAA inside\n(resolver alone)", "#a8cf8e"),
             ("sandbox_a", "A inside\n(resolver)", "#3b6fb6"),
             ("direct_getaddrinfo", "getaddrinfo\ndirect", "#c9a227"),
             ("sandbox_getaddrinfo", "getaddrinfo\ninside", "#9db7db")]
    for j, q in enumerate(("p50_ms", "p99_ms")):
        for k, (key, lab, col) in enumerate(kinds):
            x = j * (len(kinds) + 1) + k
            v = lk[key][q]
            ax.bar(x, v, 0.8, color=col, label=lab.replace("\n", " ") if j == 0 else None)
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([(len(kinds) - 1) / 2, len(kinds) + 1 + (len(kinds) - 1) / 2])
    ax.set_xticklabels(["p50", "p99"])
    ax.set_ylabel("ms")
    ax.set_title(f"name lookup of {lk['name']} (n={lk['sandbox_a']['n']} each, "
                 f"upstream TTL {lk['upstream_ttl_s']} s)", fontsize=9)
    ax.legend(fontsize=7)

    m = res["machine"]
    fig.suptitle(f"withruntime egress bench — {m['nproc']} CPUs, {m['ram_gib']} GiB, kernel "
                 f"{m['kernel']}, {m['runsc']}, {res['started_at']}, "
                 f"commit {res['commit']['sha'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/withruntime"))
    ap.add_argument("--agent", default=os.path.join(ROOT, "build/withruntime-agent"))
    ap.add_argument("--image-state-dir", default="/var/lib/withruntime-test",
                    help="where the image is (built there if missing); the daemons' own "
                    "temporary state directories link its `images`")
    ap.add_argument("--mib", type=int, default=256, help="download size (default 256)")
    ap.add_argument("--reps", type=int, default=5, help="downloads of each kind (default 5)")
    ap.add_argument("--setup-n", type=int, default=30, help="small GETs each way (default 30)")
    ap.add_argument("--lookup-n", type=int, default=300,
                    help="name lookups of each kind, inside and direct (default 300)")
    ap.add_argument("--create-n", type=int, default=20,
                    help="create/exec/delete cycles per variant (default 20)")
    ap.add_argument("--memory-mib", type=int, default=1024)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (namespaces, runsc, the daemon)")
    for p in (args.bin, args.agent):
        if not os.access(p, os.X_OK):
            raise SystemExit(f"bench: {p} is not built (make)")

    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    t_start = time.monotonic()
    rootfs = os.path.join(args.image_state_dir, "images", "default", "rootfs")
    if not os.path.isfile(os.path.join(rootfs, "usr/bin/curl")):
        log(f"image build in {args.image_state_dir}")
        subprocess.run([args.bin, "--state-dir", args.image_state_dir, "image", "build"],
                       check=True, stdin=subprocess.DEVNULL)
    rootfs = os.path.realpath(rootfs)

    workdir = tempfile.mkdtemp(prefix="wr-egress-bench-")
    net = fakenet.FakeNet(workdir)
    on = off = gw = None
    stop_now = []

    def on_term(signum, _frame):
        stop_now.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        log("fake internet")
        net.start()
        on = NsDaemon(args, net, "on")
        on.start()
        off = NsDaemon(args, net, "off")
        off.start()
        log(f"daemons: --egress on pid {on.proc.pid}, --egress off pid {off.proc.pid}")
        curl = Curl(net, rootfs)
        sid = on.create(memory_mib=args.memory_mib, network=ALLOW)
        with open(os.path.join(on.state_dir, "ca", "ca.pem"), "rb") as f:
            on.write_file(sid, SANDBOX_CA, f.read())
        version = on.exec(sid, "curl --version | head -1")["stdout"].strip()
        log("gateway server (the baseline without the proxy)")
        gw = GatewayServer(on, sid, workdir).start()
        log(f"gateway server pid {gw.pid} on {gw.addr} ports {gw.ports} ({gw.ifname})")
        download = measure_downloads(args, on, curl, sid, gw)
        setup = measure_setup(args, on, curl, sid, gw)
        gw.stop()
        results = {
            "download": download,
            "setup": setup,
            "lookup": measure_lookup(args, on, net, sid),
        }
        on.delete(sid)
        results["create"] = measure_create(args, on, off)
        res = {
            "started_at": started,
            "seconds": round(time.monotonic() - t_start, 1),
            "commit": base.git_commit(),
            "machine": base.machine_info("systrap"),
            "config": {"download_mib": args.mib, "reps": args.reps, "setup_n": args.setup_n,
                       "lookup_n": args.lookup_n,
                       "create_n": args.create_n, "memory_mib": args.memory_mib,
                       "host": HOST, "policy": ALLOW, "rootfs": rootfs, "curl": version,
                       "direct_path": "nsenter --net=<host ns> + chroot into the image "
                                      "rootfs: the image's curl, --resolve, --cacert",
                       "gateway_path": "the sandbox's curl, --resolve to a server (the fake "
                                       "internet's handler) on the slot's gateway address in "
                                       "the daemon's gateway namespace, two nft accept rules "
                                       "before the redirect to the proxy; --cacert its CA"},
            "results": results,
        }
        jpath = base.write_json(args.out, "egress.json", res)
        ppath = os.path.join(args.out, "egress.png")
        drew = chart(res, ppath)
        print(json.dumps(res, indent=2))
        log(summary(res))
        log(f"wrote {jpath}" + (f" and {ppath}" if drew else "") +
            f" in {res['seconds']:.0f} s")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if gw is not None:  # before the daemons: its rules are in their namespace
            try:
                gw.stop()
            except Exception as e:
                log(f"stopping the gateway server: {e}")
        for d in (on, off):
            if d is not None:
                try:
                    d.stop()
                except Exception as e:
                    log(f"stopping a daemon: {e}")
        try:
            net.stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    if stop_now:
        sys.exit(128 + stop_now[0])


if __name__ == "__main__":
    main()
