"""An external API fuzzer that reads the spec: schemathesis, run against the session's daemon on
127.0.0.1, 25 examples per operation (every phase: examples, coverage, fuzzing, stateful), with
all of its checks but ignored_auth (who may call is walked route by route in test_keys.py). Two
runs: the routes a key may call, over TCP with the tests' key; and the admin's routes (keys, the
audit trail, secrets), through a loopback port that leads to the Unix socket. It passes when every answer is one api/openapi.yaml allows: valid requests
accepted, invalid ones refused with 4xx, no 5xx, JSON that matches its schema, and a JSON 405
for a method the spec does not declare.

It cannot pile up sandboxes: the hooks (fuzz_hooks.py) delete each sandbox it creates when it
creates the next, and point well-formed ids at one sandbox this test made, so at most two exist
at once; the test deletes what is left. Requests go to the daemon's loopback address only.
"""

import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest
import yaml

import apispec
import conftest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = 25


def host_spec(path, keep_security=True):
    """api/openapi.yaml with this host's limits put in (`x-maximum-is-host-cpus`: the daemon
    takes 1..the host's online CPUs)."""
    with open(apispec.SPEC_PATH) as f:
        doc = yaml.safe_load(f)
    cpus = os.sysconf("SC_NPROCESSORS_ONLN")
    marked = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("x-maximum-is-host-cpus"):
                node["maximum"] = cpus
                marked.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    assert marked, "no x-maximum-is-host-cpus in the spec"
    if not keep_security:
        doc.pop("security")
        doc["components"].pop("securitySchemes")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


def schemathesis_cmd():
    exe = shutil.which("schemathesis") or shutil.which("st")
    if exe is None:
        exe = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    assert os.access(exe, os.X_OK), "schemathesis is not installed (tests/requirements.txt)"
    return [exe]


ADMIN_PATHS = "^/(v1/(keys|audit|secrets)|metrics$)"  # /metrics: the admin's or a metrics key's
# A session's connect is a WebSocket handshake, answered 101 with the connection no longer HTTP,
# which an HTTP fuzzer cannot follow; test_sessions.py walks its handshake, its refusals and
# hostile frames.
WEBSOCKET_PATHS = "/sessions/[^/]+/connect$"


class UnixForwarder:
    """A loopback TCP port that carries each connection to the daemon's Unix socket, so a TCP
    client (the fuzzer) reaches it as root on the socket: the admin, without a key."""

    def __init__(self, sock_path):
        self.sock_path = sock_path
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.done = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.done:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            u = socket.socket(socket.AF_UNIX)
            try:
                u.connect(self.sock_path)
            except OSError:
                c.close()
                continue
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.done = True
        self.srv.close()


def run_schemathesis(url, key, tmp_path, shared, command, extra, keep_keys=()):
    spec = tmp_path / "openapi.yaml"
    # The admin is root on the Unix socket, without a key, which OpenAPI cannot say: for the
    # admin's run the spec's bearer scheme is left out (else the fuzzer sends keys of its own).
    host_spec(spec, keep_security=bool(key))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update({
        "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
        "WR_FUZZ_URL": url, "WR_FUZZ_KEY": key, "WR_FUZZ_KEEP_KEYS": ",".join(keep_keys), "WR_FUZZ_SANDBOX": shared, "WR_FUZZ_COMMAND": command,
        "SCHEMATHESIS_HOOKS": "fuzz_hooks",
        "PYTHONPATH": HERE + os.pathsep + env.get("PYTHONPATH", ""),
    })
    cmd = schemathesis_cmd() + [
        "--config-file", os.path.join(HERE, "schemathesis.toml"), "--no-color",
        "run", str(spec), "--url", url,
        "--max-examples", str(EXAMPLES), "--workers", "1", "--seed", "1",
        "--generation-database", "none", "--request-timeout", "120",
        # every check but ignored_auth: who may call is walked route by route in test_keys.py
        # (a fuzzer sending wrong keys would, rightly, get its client slowed down with 429s)
        "--checks", "all", "--exclude-checks", "ignored_auth",
        # no NUL in generated strings: the spec's note 3 excludes it from every string (JSON
        # cannot carry it here), which JSON Schema cannot say once for all fields
        "--generation-allow-x00", "false",
    ] + extra
    p = subprocess.run(cmd, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=840)
    out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
    # the whole report is kept: a failing case's body can be megabytes, and the failures come
    # before it
    report = f"/tmp/wr-schemathesis-report-{tmp_path.name}.txt"
    with open(report, "w") as f:
        f.write(out)
    shown = "\n".join(line[:300] for line in out.splitlines())
    assert p.returncode == 0, f"schemathesis (exit {p.returncode}; all of it in {report}):\n" \
        f"{shown[:20000]}"


def shared_sandbox(client, make_sandbox):
    shared = make_sandbox(memory_mib=256, timeout_seconds=3600, on_lease_end="stop")["id"]
    r = client.request("POST", f"/v1/sandboxes/{shared}/exec",
                       {"command": "sleep 100000", "background": True})
    assert r.status == 201, r
    return shared, r.json()["id"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(client, daemon, make_sandbox, tmp_path):
    """Every route a key may call, over TCP with the tests' key."""
    assert daemon.url.startswith("http://127.0.0.1:")
    shared, command = shared_sandbox(client, make_sandbox)
    try:
        run_schemathesis(daemon.url, daemon.key, tmp_path, shared, command,
                         ["-H", f"Authorization: Bearer {daemon.key}",
                          "--exclude-path-regex", f"{ADMIN_PATHS}|{WEBSOCKET_PATHS}"])
    finally:
        # what the fuzzer left (its last sandbox); the shared one is make_sandbox's
        # (not checked against the spec: this is cleanup, and must not stop half-way)
        listed = client.request("GET", "/v1/sandboxes", validate=False).json()["sandboxes"]
        for sb in listed:
            if sb["id"] != shared:
                client.request("DELETE", f"/v1/sandboxes/{sb['id']}", validate=False)
    assert client.health()["status"] == "ok"


@pytest.fixture
def own_daemon():
    """A daemon of the admin fuzz run's own (the fake driver: these routes make no sandbox):
    whatever it revokes or changes, the session's keys stay as they are."""
    from test_failures import FakeDaemon, serve_checked

    yield from serve_checked(FakeDaemon(conftest.WR_AGENT))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_schemathesis_admin_routes(own_daemon, tmp_path):
    """The admin's routes (keys, the audit trail, secrets), as root on the Unix socket."""
    fwd = UnixForwarder(own_daemon.socket_path)
    try:
        run_schemathesis(fwd.url, "", tmp_path, "", "", ["--include-path-regex", ADMIN_PATHS])
    finally:
        fwd.close()
    # its own test key may be revoked by now: the admin (root on the socket) asks
    assert own_daemon.proc.poll() is None, own_daemon.log_tail()
    r = own_daemon.admin.request("GET", "/v1/health", validate=False)
    assert r.status == 200, r
