"""SDK tests: one real daemon for the session, real gVisor sandboxes, the SDK from python/.

Environment:
  WR_BIN              the withruntime binary (default build/withruntime; while that is not
                      built, the dev daemon /tmp/wrd if it exists)
  WR_AGENT            the agent binary (default build/withruntime-agent)
  WR_TEST_STATE_DIR   the daemon's state directory (default /var/lib/withruntime-test); only one
                      daemon may use a state directory at a time

The image is built into the state directory before the daemon starts (cached). The SDK under
test finds the daemon through RUNTIME_URL, as a user's program would.

Every test has a time limit (pytest-timeout, DEFAULT_TIMEOUT unless marked
`@pytest.mark.timeout(N)`), so a hung test fails alone and its fixtures still tear down. A
sandbox a test leaves behind (a `with` block with on_lease_end="stop" leaves a stopped one: the
test must delete it) fails the run, naming the sandbox and the test.
"""

import http.client
import json
import os
import socket
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest
import pytest_timeout  # noqa: F401 - required: tests/sdk/requirements.txt

# Agno reports runs to its own service unless told not to; tests talk to loopback only.
os.environ["AGNO_TELEMETRY"] = "false"

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

from stubhttp import free_port  # noqa: E402

DEV_BIN = "/tmp/wrd"
DEFAULT_TIMEOUT = 300


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT))


def _binary():
    if os.environ.get("WR_BIN"):
        return os.path.abspath(os.environ["WR_BIN"]), False
    built = os.path.join(ROOT, "build", "withruntime")
    if not os.access(built, os.X_OK) and os.access(DEV_BIN, os.X_OK):
        return DEV_BIN, True
    return built, False


WR_BIN, WR_BIN_IS_DEV = _binary()
WR_AGENT = os.path.abspath(
    os.environ.get("WR_AGENT", os.path.join(ROOT, "build", "withruntime-agent")))
STATE_DIR = os.path.abspath(os.environ.get("WR_TEST_STATE_DIR", "/var/lib/withruntime-test"))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        self.sock = s


class Daemon:
    def __init__(self):
        self.bin = WR_BIN
        self.bin_is_dev = WR_BIN_IS_DEV
        self.state_dir = STATE_DIR
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket_path = os.path.join(STATE_DIR, "withruntime.sock")
        self.logdir = tempfile.mkdtemp(prefix="wr-sdk-")
        self.log_path = os.path.join(self.logdir, "daemon.log")
        self.proc = None
        self.key = None

    def build_image(self):
        if WR_BIN_IS_DEV:
            if os.path.isdir(os.path.join(self.state_dir, "images", "default")):
                return
            cmd = [WR_BIN, "image", self.state_dir]
        else:
            cmd = [WR_BIN, "--state-dir", self.state_dir, "image", "build"]
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"image build failed ({r.returncode}):\n"
                               f"{r.stdout.decode(errors='replace')[-3000:]}\n"
                               f"{r.stderr.decode(errors='replace')[-3000:]}")

    def admin_request(self, method, path, body=None, timeout=10):
        """A request as the admin: root on the daemon's Unix socket, without a key."""
        conn = _UnixConnection(self.socket_path, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def health(self):
        return self.admin_request("GET", "/v1/health", timeout=2)[0]

    def tests_key(self):
        """The tests' API key, kept in the state directory (shared with tests/e2e) so that runs
        reuse it instead of piling up keys; made anew when the saved one no longer works."""
        path = os.path.join(self.state_dir, "e2e-tests.key")
        try:
            with open(path) as f:
                key = f.read().strip()
            req = urllib.request.Request(self.url + "/v1/sandboxes",
                                         headers={"Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                if r.status == 200:
                    return key
        except (OSError, urllib.error.HTTPError):
            pass
        status, body = self.admin_request("POST", "/v1/keys",
                                          {"name": f"sdk-tests-{time.time_ns()}"})
        assert status == 201, body
        key = json.loads(body)["key"]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        return key

    def start(self):
        for p in (WR_BIN, WR_AGENT):
            if not os.access(p, os.X_OK):
                raise RuntimeError(f"{p} is not built (run make)")
        os.makedirs(self.state_dir, exist_ok=True)
        try:
            taken = self.health() is not None
        except OSError:
            taken = False
        if taken:  # its socket would answer our health checks, and our daemon would not start
            raise RuntimeError(f"another daemon is using {self.state_dir}: stop it, or give "
                               f"WR_TEST_STATE_DIR a directory of this run's own")
        self.build_image()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [WR_BIN, "serve", "--state-dir", self.state_dir,
                 "--listen", f"127.0.0.1:{self.port}", "--agent", WR_AGENT],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode} at start-up "
                                   f"(is another daemon using {self.state_dir}?):\n"
                                   f"{self.log_tail()}")
            try:
                if self.health() == 200:
                    self.key = self.tests_key()
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not answer /v1/health in 60 s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, n=60):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().splitlines()[-n:]
        except OSError:
            return ""
        return b"\n".join(lines).decode(errors="replace")

    def sandbox_ids(self):
        """The ids of the sandboxes the daemon has (an empty set if it cannot say)."""
        try:
            import withruntime
            client = withruntime.Client(f"unix:{self.socket_path}")  # the admin: every sandbox
            return {s.id for s in withruntime.Sandbox.list(client=client)}
        except Exception:  # noqa: BLE001 - a broken daemon is reported elsewhere
            return set()

    def stop(self):
        """Deletes the sandboxes the tests left, then SIGTERM, SIGKILL after 10 s. Returns the
        ids it deleted."""
        left = []
        if self.proc is None or self.proc.poll() is not None:
            return left
        try:
            import withruntime
            client = withruntime.Client(f"unix:{self.socket_path}")  # the admin: every sandbox
            for sbx in withruntime.Sandbox.list(client=client):
                left.append(sbx.id)
                try:
                    sbx.delete()
                except withruntime.WithruntimeError as e:
                    print(f"conftest: could not delete {sbx.id}: {e}", file=sys.stderr)
        except Exception as e:  # the daemon may be broken; still stop it
            print(f"conftest: could not delete leftovers: {e}", file=sys.stderr)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return left


# sandbox id -> the test that created it and left it (see `no_leaks`)
_LEFT_BY = {}


@pytest.fixture(scope="session")
def daemon(request):
    d = Daemon()
    saved = {k: os.environ.get(k) for k in ("RUNTIME_URL", "RUNTIME_API_KEY")}
    left = []
    try:
        d.start()
        os.environ["RUNTIME_URL"] = d.url
        os.environ["RUNTIME_API_KEY"] = d.key
        yield d
    finally:
        left = d.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if request.session.testsfailed == 0:  # keep the daemon's log only when something failed
            shutil.rmtree(d.logdir, ignore_errors=True)
    assert not left, "sandboxes left by the tests (deleted now): " + ", ".join(
        f"{sid} (left by {_LEFT_BY.get(sid, 'a fixture or an unknown test')})" for sid in left)


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Notes the sandboxes a test that uses the session's daemon created and did not delete
    (after its own fixtures' clean-up), for the session fixture to name at the end."""
    if "daemon" not in request.fixturenames:
        yield
        return
    d = request.getfixturevalue("daemon")
    before = d.sandbox_ids()
    yield
    for sid in d.sandbox_ids() - before:
        _LEFT_BY.setdefault(sid, request.node.nodeid)


@pytest.fixture
def sandbox(daemon):
    """A small running sandbox, deleted after the test."""
    from withruntime import NotFound, Sandbox

    sbx = Sandbox.create(memory_mib=512, on_lease_end="delete")
    yield sbx
    try:
        sbx.delete()
    except NotFound:
        pass


@pytest.fixture
def new_sandboxes(daemon):
    """Returns a function listing the sandboxes created since the test began, and deletes
    them afterwards: for code (like the seed's examples) that creates its own."""
    from withruntime import NotFound, Sandbox

    before = {s.id for s in Sandbox.list()}

    def created():
        return [s for s in Sandbox.list() if s.id not in before]

    yield created
    for s in created():
        try:
            s.delete()
        except NotFound:
            pass
