"""A fake internet for the egress tests: two network namespaces and the servers in one of them.

    fn = FakeNet(tmpdir)
    try:
        fn.start()
        ... run the daemon with `nsenter --net=<fn.host_ns>`, tell it --dns fn.dns and
        ... that fn.public_ranges is public, trust fn.ca_pem in the sandbox ...
    finally:
        fn.stop()

Layout (nothing else is touched in the host's own namespace than the two named namespaces):

    host ns wrt-h-<pid>-<n>                internet ns wrt-i-<pid>-<n>
      lo                                     lo
      veth0 198.51.100.1/24  <---veth--->    veth0 198.51.100.10 .11 .12 .13 .14 .53 /24
      route 169.254.169.254/32 dev veth0           169.254.169.254/32
                                             fakeinet_server.py (DNS, HTTP, HTTPS, index)

No default route in either namespace: 1.1.1.1 (or any other address) is unreachable
(ENETUNREACH), so no bug can send traffic anywhere real. IPv6 is off in both.

Hosts (HOSTS): pypi.org .10, files.pythonhosted.org .11, api.github.test .12, evil.test .13,
example.test .14 (HTTP :80 and HTTPS :443 and :8443 with a certificate from the test CA;
example.test's also names *.example.test, for names set with set_dns), the resolver
198.51.100.53 (:53 UDP and TCP), and the metadata service metadata.test = 169.254.169.254
(HTTP :80 only). A server's identity is its address, as on the real internet: a connection to
198.51.100.13 gets evil.test's certificate and answer whatever its SNI or Host header says.

Notes for a test that runs the daemon in host_ns:
  - the daemon's TCP listener (127.0.0.1:port inside host_ns) is not reachable from the test
    process, which stays in the host's own namespace; its Unix socket (--socket) is.
  - run_in_host_ns() enters the network namespace only: /etc/resolv.conf is still the host's,
    so a program there that resolves names with the system resolver must be run with
    run_with_fake_resolver() (a private mount namespace whose /etc/resolv.conf names the fake
    DNS only). client_env() strips proxies, PIP_* and CA bundle variables and trusts ca_pem.
  - dns_queries() and requests() read JSON-lines logs the server writes before it answers:
    once a client has its answer, the log has the line. reset_logs() starts them afresh.
"""

import base64
import contextlib
import hashlib
import io
import ipaddress
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "fakeinet_server.py")

HOST_ADDR = "198.51.100.1"
DNS_ADDR = "198.51.100.53"
PUBLIC_RANGES = "198.51.100.0/24"
METADATA_ADDR = "169.254.169.254"
HOSTS = {  # name -> address: HTTP :80 and HTTPS :443 and :8443 each
    "pypi.org": "198.51.100.10",
    "files.pythonhosted.org": "198.51.100.11",
    "api.github.test": "198.51.100.12",
    "evil.test": "198.51.100.13",
    "example.test": "198.51.100.14",
}
METADATA_NAME = "metadata.test"  # HTTP :80 only, at METADATA_ADDR
HTTPS_PORTS = (443, 8443)
ALT_NAMES = {"example.test": ["*.example.test"]}  # more subjectAltNames for a host's leaf

WHEEL_NAME = "wr_hello-1.0-py3-none-any.whl"
WHEEL_MODULE = 'def greet():\n    return "hello from the fake index"\n'

PREFIX = "wrt-"
_counter = [0]
_counter_lock = threading.Lock()


def _run(argv, timeout=30):
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): "
                           f"{r.stderr.decode(errors='replace').strip()}")
    return r


def _record_hash(data):
    d = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(d).rstrip(b"=").decode()


def build_wheel(path):
    """Writes the wr-hello 1.0 pure-Python wheel to path (deterministic bytes)."""
    di = "wr_hello-1.0.dist-info"
    files = [
        ("wr_hello.py", WHEEL_MODULE.encode()),
        (f"{di}/METADATA", b"Metadata-Version: 2.1\nName: wr-hello\nVersion: 1.0\n"
                           b"Summary: A package only the fake index has\n"),
        (f"{di}/WHEEL", b"Wheel-Version: 1.0\nGenerator: withruntime-fakenet\n"
                        b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files)
    record += f"{di}/RECORD,,\n"
    files.append((f"{di}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            zi = zipfile.ZipInfo(n, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            z.writestr(zi, d)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return path


def _is_address(name):
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def make_certs(d, names, alt=None):
    """A test CA and one leaf per name (EC P-256, subjectAltName DNS:name, or IP:name for an
    address, plus DNS:each of alt[name] if given). Returns (ca_pem, {name: (cert, key)})."""
    ca_cnf = os.path.join(d, "ca.cnf")
    with open(ca_cnf, "w") as f:
        f.write("[req]\ndistinguished_name = dn\nx509_extensions = v3_ca\nprompt = no\n"
                "[dn]\nCN = withruntime fakenet test CA\n"
                "[v3_ca]\nbasicConstraints = critical, CA:TRUE\n"
                "keyUsage = critical, keyCertSign, cRLSign\n"
                "subjectKeyIdentifier = hash\n")
    ca_key, ca_pem = os.path.join(d, "ca.key"), os.path.join(d, "ca.pem")
    _run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
          "-nodes", "-keyout", ca_key, "-out", ca_pem, "-days", "30", "-config", ca_cnf])
    leaves = {}
    for i, name in enumerate(names):
        base = os.path.join(d, name)
        ext = base + ".ext"
        san = f"{'IP' if _is_address(name) else 'DNS'}:{name}"
        san += "".join(f", DNS:{a}" for a in (alt or {}).get(name, []))
        with open(ext, "w") as f:
            f.write("[v3]\nbasicConstraints = critical, CA:FALSE\n"
                    "keyUsage = critical, digitalSignature\n"
                    "extendedKeyUsage = serverAuth\n"
                    f"subjectAltName = {san}\n"
                    "subjectKeyIdentifier = hash\n"
                    "authorityKeyIdentifier = keyid:always\n")
        _run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt",
              "ec_paramgen_curve:P-256", "-nodes", "-keyout", base + ".key",
              "-out", base + ".csr", "-subj", f"/CN={name}"])
        _run(["openssl", "x509", "-req", "-in", base + ".csr", "-CA", ca_pem, "-CAkey", ca_key,
              "-set_serial", str(1000 + i), "-days", "30", "-extfile", ext,
              "-extensions", "v3", "-out", base + ".pem"])
        leaves[name] = (base + ".pem", base + ".key")
    return ca_pem, leaves


def _pid_alive(pid):
    return os.path.exists(f"/proc/{pid}")


def _kill_in_netns(ino):
    """SIGKILLs, by PID, every process whose network namespace is the one with inode ino."""
    me = os.getpid()
    want = f"net:[{ino}]"
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            if os.readlink(f"/proc/{d}/ns/net") == want:
                os.kill(int(d), signal.SIGKILL)
        except OSError:
            pass


def cleanup_stale():
    """Deletes the wrt-h-/wrt-i- namespaces (and kills what runs in them) that a test process
    which no longer exists left."""
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return
    for n in names:
        m = re.fullmatch(r"wrt-[hi]-(\d+)-\d+", n)
        if m and not _pid_alive(int(m.group(1))):
            try:
                _kill_in_netns(os.stat(f"/run/netns/{n}").st_ino)
            except OSError:
                pass
            subprocess.run(["ip", "netns", "del", n], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=30)


CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT")


def kill_server(proc, timeout=10):
    """Stops a server started with pipes (a subprocess.Popen) by its PID: SIGKILL if it still
    runs, its pipes closed, waited for. False if it did not exit within timeout."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for f in (proc.stdin, proc.stdout):
        try:
            if f:
                f.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def client_env(ca_pem, base=None, **extra):
    """An environment for a client talking to the fake internet: no proxy, no pip
    configuration (PIP_*), and ca_pem as the only trust for OpenSSL, requests, curl and pip."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith("PIP_") and "proxy" not in k.lower()
           and not k.endswith(("CA_BUNDLE", "CA_CERTS", "CA_CERTS_FILE", "SSL_CERT_DIR",
                               "SSL_CERT_FILE", "SSL_CAINFO"))}
    for k in CA_ENV:
        env[k] = ca_pem
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


class FakeNet:
    def __init__(self, tmpdir):
        self.dir = os.path.join(os.path.abspath(str(tmpdir)), "fakenet")
        with _counter_lock:
            _counter[0] += 1
            n = _counter[0]
        self.host_name = f"{PREFIX}h-{os.getpid()}-{n}"
        self.inet_name = f"{PREFIX}i-{os.getpid()}-{n}"
        self.host_ns = f"/run/netns/{self.host_name}"
        self.inet_ns = f"/run/netns/{self.inet_name}"
        self.host_addr = HOST_ADDR
        self.dns = DNS_ADDR
        self.public_ranges = PUBLIC_RANGES
        self.metadata_addr = METADATA_ADDR
        self.hosts = dict(HOSTS)
        self.hosts[METADATA_NAME] = METADATA_ADDR
        self.ca_pem = os.path.join(self.dir, "ca.pem")
        self.wheel_path = os.path.join(self.dir, WHEEL_NAME)
        self.wheel_sha256 = None
        self.dns_log = os.path.join(self.dir, "dns.jsonl")
        self.http_log = os.path.join(self.dir, "http.jsonl")
        self.server_log = os.path.join(self.dir, "server.stderr")
        self.resolv_dir = os.path.join(self.dir, "etc")
        self.proc = None
        self._made_ns = []
        self._ctl_lock = threading.Lock()
        self._marks = {self.dns_log: 0, self.http_log: 0}

    # ------------------------------------------------------------ set-up

    def start(self):
        """Builds the namespaces, CA, certificates, the wheel and the servers, and waits until
        they answer from the host namespace. On failure it cleans up (stop()) and raises."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        if os.geteuid() != 0:
            raise RuntimeError("FakeNet needs root (ip netns)")
        os.makedirs(self.dir, exist_ok=True)
        cleanup_stale()
        build_wheel(self.wheel_path)
        with open(self.wheel_path, "rb") as f:
            self.wheel_sha256 = hashlib.sha256(f.read()).hexdigest()
        ca_pem, leaves = make_certs(self.dir, list(HOSTS), ALT_NAMES)
        assert ca_pem == self.ca_pem
        self._write_resolver_files()
        self._make_namespaces()

        cfg = {
            "dns_addr": DNS_ADDR,
            "dns_table": dict(self.hosts),
            "dns_log": self.dns_log,
            "http_log": self.http_log,
            "wheel": self.wheel_path,
            "servers": {name: {"addr": addr, "cert": leaves[name][0], "key": leaves[name][1]}
                        for name, addr in HOSTS.items()},
        }
        cfg["servers"][METADATA_NAME] = {"addr": METADATA_ADDR}
        cfg_path = os.path.join(self.dir, "server.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=1)
        for p in (self.dns_log, self.http_log):
            open(p, "w").close()

        err = open(self.server_log, "ab")
        try:
            self.proc = subprocess.Popen(
                ["nsenter", f"--net={self.inet_ns}", "--", sys.executable, SERVER, cfg_path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                start_new_session=True)
        finally:
            err.close()
        line = self._read_line(15)
        if line != "ready":
            raise RuntimeError(f"fake internet server did not start ({line!r}):\n"
                               f"{self._server_tail()}")
        self._probe()

    def _ip(self, *args):
        return _run(["ip", *args])

    def _make_namespaces(self):
        h, i = self.host_name, self.inet_name
        for n in (h, i):
            self._ip("netns", "add", n)
            self._made_ns.append(n)
        for n in (h, i):
            # no IPv6 at all: nothing but the IPv4 below is reachable
            for conf in ("all", "default"):
                _run(["nsenter", f"--net=/run/netns/{n}", "--", "sysctl", "-q", "-w",
                      f"net.ipv6.conf.{conf}.disable_ipv6=1"])
            self._ip("-n", n, "link", "set", "lo", "up")
        # created inside the host ns, the peer moved straight into the internet ns: the
        # host's own namespace never holds either end
        self._ip("-n", h, "link", "add", "veth0", "type", "veth", "peer", "name", "veth0",
                 "netns", i)
        self._ip("-n", h, "addr", "add", f"{HOST_ADDR}/24", "dev", "veth0")
        for addr in sorted(set(HOSTS.values()) | {DNS_ADDR}):
            self._ip("-n", i, "addr", "add", f"{addr}/24", "dev", "veth0")
        self._ip("-n", i, "addr", "add", f"{METADATA_ADDR}/32", "dev", "veth0")
        self._ip("-n", h, "link", "set", "veth0", "up")
        self._ip("-n", i, "link", "set", "veth0", "up")
        self._ip("-n", h, "route", "add", f"{METADATA_ADDR}/32", "dev", "veth0")

    def _write_resolver_files(self):
        os.makedirs(self.resolv_dir, exist_ok=True)
        with open(os.path.join(self.resolv_dir, "resolv.conf"), "w") as f:
            f.write(f"nameserver {DNS_ADDR}\noptions timeout:2 attempts:2\n")
        with open(os.path.join(self.resolv_dir, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n")
        with open(os.path.join(self.resolv_dir, "nsswitch.conf"), "w") as f:
            f.write("hosts: files dns\n")

    def _probe(self):
        """Every server answers from the host namespace: a DNS query for each name over UDP,
        a TCP connection to :53 and to every :80 and :443. The probe's own log lines are then
        dropped (the marks start after them)."""
        targets = [(DNS_ADDR, 53)]
        for name, addr in HOSTS.items():
            targets += [(addr, 80)] + [(addr, p) for p in HTTPS_PORTS]
        targets.append((METADATA_ADDR, 80))
        code = PROBE_CODE % {"dns": DNS_ADDR, "names": list(self.hosts), "tcp": targets}
        r = self.run_in_host_ns([sys.executable, "-c", code], timeout=30)
        if r.returncode != 0 or r.stdout.strip() != "ok":
            raise RuntimeError(f"fake internet does not answer from the host namespace:\n"
                               f"{r.stdout}{r.stderr}\n{self._server_tail()}")
        self.reset_logs()

    # ------------------------------------------------------------ tear-down

    def stop(self):
        """Kills the server and anything left in the two namespaces (by PID), deletes the
        namespaces. Idempotent; safe after a start() that failed halfway."""
        procs, self.proc = self.proc, None
        if procs is not None:
            kill_server(procs)
        errors = []
        for n in list(self._made_ns):
            path = f"/run/netns/{n}"
            try:
                ino = os.stat(path).st_ino
            except OSError:
                ino = None
            # processes a test started in the namespace (e.g. a daemon) and did not stop:
            # killed before the namespace goes and again after (one may have been entering)
            if ino is not None:
                _kill_in_netns(ino)
            r = subprocess.run(["ip", "netns", "del", n], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=30)
            if ino is not None:
                _kill_in_netns(ino)
            if r.returncode != 0 and os.path.exists(path):
                errors.append(f"ip netns del {n}: {r.stderr.strip()}")
            else:
                self._made_ns.remove(n)
        if errors:
            raise RuntimeError("; ".join(errors))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------ queries

    def addr(self, name):
        """The fake address of a host (case-insensitive); KeyError if it has none."""
        return self.hosts[name.lower().rstrip(".")]

    def _read_jsonl(self, path):
        try:
            with open(path, "rb") as f:
                f.seek(self._marks[path])
                data = f.read()
        except OSError:
            return []
        out = []
        for line in data.split(b"\n"):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
        return out

    def dns_records(self):
        """Every DNS query since start (or reset_logs()): {"name", "type", "proto", "client"}."""
        return self._read_jsonl(self.dns_log)

    def dns_queries(self):
        """Every name the fake DNS was asked (lower case, no trailing dot), in order."""
        return [r["name"] for r in self.dns_records()]

    def requests(self, host=None):
        """Requests the fake web servers got, in order: {"host", "addr", "scheme", "port",
        "method", "path", "headers" (lower-case names), "sni", "client", "body"}. host: only
        those to this server (its name, e.g. "pypi.org" or "metadata.test", or its address)."""
        recs = self._read_jsonl(self.http_log)
        if host is not None:
            h = host.lower()
            recs = [r for r in recs if r["host"] == h or r["addr"] == h]
        return recs

    def reset_logs(self):
        """dns_queries() and requests() start from now."""
        for p in self._marks:
            try:
                self._marks[p] = os.path.getsize(p)
            except OSError:
                self._marks[p] = 0

    # ------------------------------------------------------------ control

    def _read_line(self, timeout):
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"fake internet server: no answer in {timeout} s:\n"
                                   f"{self._server_tail()}")
            r, _, _ = select.select([fd], [], [], left)
            if r:
                b = os.read(fd, 1)
                if not b:
                    raise RuntimeError(f"fake internet server exited "
                                       f"({self.proc.poll()}):\n{self._server_tail()}")
                buf += b
        return buf.decode().strip()

    def set_dns(self, name, addr, ttl=None):
        """The fake DNS answers addr for name from now on (addr None: NXDOMAIN), with a TTL of
        ttl seconds (default 5, as for every name). In effect when this returns."""
        if self.proc is None:
            raise RuntimeError("FakeNet is not started")
        op = {"op": "set_dns", "name": name, "addr": addr}
        if ttl is not None:
            op["ttl"] = ttl
        req = json.dumps(op) + "\n"
        with self._ctl_lock:
            self.proc.stdin.write(req.encode())
            self.proc.stdin.flush()
            ans = self._read_line(10)
        if ans != "ok":
            raise RuntimeError(f"set_dns({name!r}, {addr!r}): {ans}")

    def _server_tail(self, n=30):
        try:
            with open(self.server_log, "rb") as f:
                lines = f.read().splitlines()[-n:]
            return b"\n".join(lines).decode(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------ running things

    def client_env(self, **extra):
        """client_env(self.ca_pem, **extra): see the module's client_env."""
        return client_env(self.ca_pem, **extra)

    def run_in_host_ns(self, argv, **kw):
        """subprocess.run(argv) in the daemon's host namespace (network only; the file
        system is this one's, so /etc/resolv.conf is still the host's: do not resolve names
        with it, use run_with_fake_resolver). Defaults: capture_output, text, timeout 60."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(["nsenter", f"--net={self.host_ns}", "--", *argv], **kw)

    def host_ns_argv(self, argv, resolver=False):
        """The command line that runs argv in the host namespace; resolver: also in a private
        mount namespace whose /etc/resolv.conf names only the fake DNS (and /etc/hosts and
        /etc/nsswitch.conf are minimal), so the system resolver asks the fake DNS."""
        ns = ["nsenter", f"--net={self.host_ns}", "--"]
        if not resolver:
            return ns + list(argv)
        d = self.resolv_dir
        script = ('set -e; for f in resolv.conf hosts nsswitch.conf; do '
                  'mount --bind "$0/$f" "/etc/$f"; done; exec "$@"')
        return ns + ["unshare", "--mount", "--propagation", "private", "--",
                     "sh", "-c", script, d, *argv]

    def run_with_fake_resolver(self, argv, **kw):
        """run_in_host_ns, with the system resolver (getaddrinfo) pointed at the fake DNS."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(self.host_ns_argv(argv, resolver=True), **kw)


PROBE_CODE = r"""
import os, socket, struct, sys, time
dns, names, tcp = %(dns)r, %(names)r, %(tcp)r
def q(name):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    qid = int.from_bytes(os.urandom(2), "big")
    qn = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    s.sendto(struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qn + b"\0\1\0\1", (dns, 53))
    r = s.recv(512)
    assert r[:2] == qid.to_bytes(2, "big") and r[3] & 15 == 0, (name, r)
deadline = time.monotonic() + 10
while True:
    try:
        for n in names:
            q(n)
        for a in tcp:
            socket.create_connection(a, timeout=2).close()
        break
    except (OSError, AssertionError) as e:
        if time.monotonic() > deadline:
            sys.exit(repr(e))
        time.sleep(0.1)
print("ok")
"""


@contextlib.contextmanager
def started():
    """A FakeNet in a fresh temporary directory, started, and stopped when the block ends (a
    module fixture's body: `with fakenet.started() as n: yield n`)."""
    n = FakeNet(tempfile.mkdtemp(prefix="wr-fakenet-"))
    try:
        n.start()
        yield n
    finally:
        n.stop()
