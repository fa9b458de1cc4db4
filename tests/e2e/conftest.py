"""End-to-end fixtures: one real daemon for the session, real gVisor sandboxes.

Environment:
  WR_BIN              the withruntime binary (default build/withruntime)
  WR_AGENT            the agent binary (default build/withruntime-agent)
  WR_TEST_STATE_DIR   the daemon's state directory (default /var/lib/withruntime-test)

The image is built into the state directory before the daemon starts (`image build`, cached).

Every test has a time limit (pytest-timeout, DEFAULT_TIMEOUT unless the test is marked
`@pytest.mark.timeout(N)`): a hung test fails alone, and its fixtures still tear down. A sandbox
a test leaves behind fails the run: the session fixture lists the daemon's sandboxes at the end
and names each one left, with the test that created it.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import pytest_timeout  # noqa: F401 - required: tests/requirements.txt

sys.path.insert(0, os.path.dirname(__file__))

import wrclient  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WR_BIN = os.path.abspath(os.environ.get("WR_BIN", os.path.join(ROOT, "build/withruntime")))
WR_AGENT = os.path.abspath(
    os.environ.get("WR_AGENT", os.path.join(ROOT, "build/withruntime-agent")))
STATE_DIR = os.environ.get("WR_TEST_STATE_DIR", "/var/lib/withruntime-test")

# Seconds per test (setup and teardown included) unless marked otherwise. The slowest tests
# (the process cap, a fork bomb, ten sandboxes through a crash) take about a minute on 2 cores.
DEFAULT_TIMEOUT = 300

SANITIZER_MARKS = (b"ERROR: AddressSanitizer", b"ERROR: LeakSanitizer", b"runtime error:",
                   b"ERROR: ThreadSanitizer")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running (still part of the default run)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT))


def low_fd_limit():
    """The daemon starts with the soft fd limit most hosts give a service (1024, systemd's
    default), as it would in production: raising it is the daemon's job."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))


def daemons_end(pid, ours):
    """The daemon's end of our TCP connection `ours` (a socket whose peer is ours' own
    address), copied out of process `pid` with pidfd_getfd(2): to read its socket options.
    The copy is closed by the caller; closing it leaves the daemon's connection as it is."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    sys_pidfd_getfd = 438  # the same number on every architecture Linux has
    want = ours.getsockname()
    pidfd = os.pidfd_open(pid)
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = libc.syscall(sys_pidfd_getfd, pidfd, int(name), 0)
            if fd < 0:
                continue
            s = socket.socket(fileno=fd)
            try:
                if s.family in (socket.AF_INET, socket.AF_INET6) and s.getpeername() == want:
                    return s
            except OSError:
                pass
            s.close()
    finally:
        os.close(pidfd)
    raise AssertionError(f"no socket of process {pid} is connected to {want}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, state_dir=None):
        """state_dir: the session's (WR_TEST_STATE_DIR) unless a test runs a daemon of its own."""
        self.state_dir = state_dir or STATE_DIR
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket_path = os.path.join(self.state_dir, "withruntime.sock")
        self.bin = WR_BIN
        self.agent = WR_AGENT
        self.logdir = tempfile.mkdtemp(prefix="wr-e2e-")
        self.log_path = os.path.join(self.logdir, "daemon.log")
        self.proc = None
        # The tests' client: a key of its own (made at start), over TCP, as a user's program
        # would be. The admin: root on the Unix socket, without a key.
        self.client = wrclient.Client("127.0.0.1", self.port)
        self.admin = wrclient.Client(unix_path=self.socket_path)
        self.key = None

    def cli_env(self, **extra):
        env = dict(os.environ)
        env["RUNTIME_API_KEY"] = self.key
        env["RUNTIME_URL"] = self.url
        env.update(extra)
        return env

    def make_key(self, **fields):
        """A new API key (the admin makes it); the key's record with its "key"."""
        fields.setdefault("name", f"e2e-{os.getpid()}-{time.monotonic_ns()}")
        r = self.admin.request("POST", "/v1/keys", fields)
        assert r.status == 201, r
        return r.json()

    def _tests_key(self):
        """The tests' key: kept in the state directory, so restarts and later runs reuse it
        instead of piling up keys; made anew when the saved one no longer works."""
        path = os.path.join(self.state_dir, "e2e-tests.key")
        try:
            with open(path) as f:
                key = f.read().strip()
            if self.client.with_key(key).request("GET", "/v1/sandboxes", validate=False,
                                                  timeout=30).status == 200:
                return key
        except OSError:
            pass
        key = self.make_key(name=f"e2e-tests-{time.time_ns()}")["key"]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        return key

    def build_image(self):
        r = subprocess.run([self.bin, "--state-dir", self.state_dir, "image", "build"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"image build failed ({r.returncode}):\n"
                               f"{r.stdout.decode(errors='replace')[-3000:]}\n"
                               f"{r.stderr.decode(errors='replace')[-3000:]}")

    def serve_argv(self):
        """The daemon's command line (a subclass may add to it)."""
        # No warm pool: the tests count sandboxes, loop devices and namespaces, and a refill
        # between two counts would be one more; test_pool.py runs a daemon with one.
        return [self.bin, "serve", "--state-dir", self.state_dir,
                "--listen", f"127.0.0.1:{self.port}", "--socket", self.socket_path,
                "--agent", self.agent, "--pool", "0"]

    def serve_env(self):
        """The daemon's environment; None: this process's own."""
        return None

    def start(self, clean=True):
        """Starts the daemon and waits for /v1/health. clean: delete the sandboxes an earlier run
        left (a test that restarts a daemon on purpose passes False). The log is appended to, so
        a restart keeps the earlier run's lines."""
        for p in (self.bin, self.agent):
            if not os.access(p, os.X_OK):
                raise RuntimeError(f"{p} is not built (run make)")
        os.makedirs(self.state_dir, exist_ok=True)
        try:
            taken = self.admin.request("GET", "/v1/health", timeout=2, validate=False)
        except OSError:
            taken = None
        if taken is not None:  # its socket would answer our health checks instead of ours
            raise RuntimeError(f"another daemon is using {self.state_dir}: stop it, or give "
                               f"WR_TEST_STATE_DIR a directory of this run's own")
        self.build_image()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.serve_argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=self.serve_env(), preexec_fn=low_fd_limit)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode} at start-up:\n"
                                   f"{self.log_tail()}")
            try:
                r = self.admin.request("GET", "/v1/health", timeout=2, validate=False)
                if r.status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not answer /v1/health in 60 s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)
        self.key = self._tests_key()
        _KEYS_BY_PORT[self.port] = self.key
        if self.client.unix_path is None:  # a subclass talking to the Unix socket is the admin
            self.client.key = self.key
        if not clean:
            return
        # sandboxes an earlier, interrupted session left in this state directory
        stale = self.delete_all()
        if stale:
            print(f"conftest: deleted {len(stale)} sandboxes left by an earlier run",
                  file=sys.stderr)

    def delete_all(self):
        """Deletes every sandbox and secret the daemon has (without checking answers against the spec:
        this is cleanup). Returns their ids."""
        ids = []
        try:  # every sandbox, whichever key made it: the admin's view
            r = self.admin.request("GET", "/v1/sandboxes", validate=False)
            for sb in r.json()["sandboxes"]:
                ids.append(sb["id"])
                self.admin.request("DELETE", f"/v1/sandboxes/{sb['id']}", validate=False)
        except Exception as e:  # the daemon may be broken; the caller still stops it
            print(f"conftest: could not delete sandboxes: {e}", file=sys.stderr)
        try:  # and the secrets tests (the fuzzer among them) left
            r = self.admin.request("GET", "/v1/secrets", validate=False)
            for sec in r.json()["secrets"] if r.status == 200 else []:
                self.admin.request("DELETE", f"/v1/secrets/{sec['name']}", validate=False)
        except Exception as e:
            print(f"conftest: could not delete secrets: {e}", file=sys.stderr)
        return ids

    def log_bytes(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()
        except OSError:
            return b""

    def log_tail(self, n=60):
        return b"\n".join(self.log_bytes().splitlines()[-n:]).decode(errors="replace")

    def stop(self):
        """Deletes what the tests left, then SIGTERM (SIGKILL after 10 s). Returns the leftover
        sandbox ids and the daemon's exit status."""
        leftovers = []
        if self.proc is None:
            return leftovers, None
        if self.proc.poll() is None:
            leftovers = self.delete_all()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return leftovers, "killed after SIGTERM + 10 s"
        return leftovers, self.proc.returncode

    def helpers(self):
        """{"__net": pid, "__signer": pid}: the daemon's own helper processes, its children that
        run the egress proxy and hold the CA key (src/net/netproc.h), while they run."""
        out = {}
        for pid in self._children().get(self.proc.pid, []):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[1] in (b"__net", b"__signer"):
                out[argv[1].decode()] = pid
        return out

    @staticmethod
    def _children():
        children = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat.rsplit(b")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        return children

    def descendants(self):
        """PIDs of every process below the daemon but its own helpers (helpers()), which live
        as long as it does: what sandboxes and commands left."""
        children = self._children()
        own = set(self.helpers().values())
        out, todo = [], [p for p in children.get(self.proc.pid, []) if p not in own]
        out += todo
        while todo:
            p = todo.pop()
            for c in children.get(p, []):
                out.append(c)
                todo.append(c)
        return out


class OwnStateDaemon(Daemon):
    """A daemon with a state directory of its own, next to the session's, that shares the
    session's built image (through an `images` symlink)."""

    prefix = "wr-own-"

    def __init__(self, session):
        parent = os.path.dirname(os.path.abspath(session.state_dir))
        state = tempfile.mkdtemp(prefix=self.prefix, dir=parent)
        os.symlink(os.path.join(os.path.abspath(session.state_dir), "images"),
                   os.path.join(state, "images"))
        super().__init__(state_dir=state)

    def build_image(self):
        pass  # the session's, through the symlink


_DAEMON = None

# port -> the key of the daemon listening there (for tests that write requests by hand)
_KEYS_BY_PORT = {}


def auth_header(port):
    """The "Authorization: Bearer ..." line (with its CRLF) for the daemon on port."""
    return f"Authorization: Bearer {_KEYS_BY_PORT[port]}\r\n"

# sandbox id -> the test during which it was created and which left it (see `no_leaks`)
_LEFT_BY = {}


@pytest.fixture(scope="session")
def daemon(request):
    global _DAEMON
    d = Daemon()
    _DAEMON = d
    d.start()
    yield d
    leftovers, status = d.stop()
    log = d.log_bytes()
    bad = [m.decode() for m in SANITIZER_MARKS if m in log]
    assert not leftovers, "sandboxes left by the tests (deleted now): " + ", ".join(
        f"{sid} (left by {_LEFT_BY.get(sid, 'a fixture or an unknown test')})"
        for sid in leftovers)
    assert not bad, f"sanitizer reports in the daemon log ({d.log_path}):\n{d.log_tail(200)}"
    assert status == 0, (f"daemon did not exit cleanly on SIGTERM: {status}\n"
                         f"{d.log_tail()}")
    if request.session.testsfailed == 0:  # keep the log only when something failed
        shutil.rmtree(d.logdir, ignore_errors=True)
        _DAEMON = None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _DAEMON is not None:
        terminalreporter.write_line(f"daemon log: {_DAEMON.log_path}")
        if exitstatus != 0:
            terminalreporter.write_line("---- daemon log (tail) ----")
            terminalreporter.write_line(_DAEMON.log_tail(80))


@pytest.fixture(scope="session")
def client(daemon):
    return daemon.client


def _sandbox_ids(d):
    try:
        r = d.admin.request("GET", "/v1/sandboxes", validate=False, timeout=30)
        return {sb["id"] for sb in r.json()["sandboxes"]}
    except Exception:  # noqa: BLE001 - a broken daemon is reported elsewhere
        return set()


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Notes the sandboxes a test that uses the session's daemon created and did not delete
    (after its own fixtures' clean-up), for the session fixture to name at the end."""
    if "daemon" not in request.fixturenames:
        yield
        return
    d = request.getfixturevalue("daemon")
    before = _sandbox_ids(d)
    yield
    for sid in _sandbox_ids(d) - before:
        _LEFT_BY.setdefault(sid, request.node.nodeid)


class SandboxFactory:
    """Creates sandboxes and deletes the ones a test did not delete itself."""

    def __init__(self, client):
        self.client = client
        self.ids = []

    def __call__(self, **fields):
        # noted for clean-up before the answer is checked against the spec, so a sandbox whose
        # description breaks the spec is still deleted
        r = self.client.request("POST", "/v1/sandboxes", fields, validate=False)
        if r.status == 201:
            self.ids.append(r.json()["id"])
        self.client.spec.validate_response("POST", r.path, r.status, r.headers, r.body)
        assert r.status == 201, f"expected 201: {r!r}"
        return r.json()

    def cleanup(self):
        for sid in self.ids:
            r = self.client.request("DELETE", f"/v1/sandboxes/{sid}", validate=False)
            assert r.status in (200, 404), r


@pytest.fixture
def make_sandbox(client):
    f = SandboxFactory(client)
    yield f
    f.cleanup()


@pytest.fixture(scope="module")
def sandbox(client):
    """One running sandbox shared by a module's tests; its id."""
    f = SandboxFactory(client)
    sb = f(memory_mib=1024)
    yield sb["id"]
    f.cleanup()
