"""Failure paths, driven by the fake driver, fault points and a hostile agent.

These tests run daemons of their own (`serve --driver fake`) in temporary state directories,
with WR_FAULTS_FILE pointing at a file the tests write (src/common/fault.h), so that every
error branch the real world rarely takes runs here: a start that fails at each driver step, a
cleanup that fails, an operation deferred while a failed sandbox is cleaned up, a busy or full
database, and an agent that lies (tests/e2e/hostile_agent.py). After every test the daemon must
still be alive and answer /v1/health; at the end it must exit cleanly on SIGTERM with no
sanitizer report in its log (WR_BIN may be the ASan/UBSan build).

The image is the session's (WR_TEST_STATE_DIR, built if missing), shared by a symlink: sandboxes
only read it.
"""

import http.client
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from conftest import SANITIZER_MARKS, STATE_DIR, WR_AGENT, Daemon  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
T = 30  # client timeout for anything that should be quick: a hang fails, never blocks the run


class DaemonBroken(Exception):
    """What the fixtures raise when the daemon died, hung or left something behind. Not an
    AssertionError: pytest's xfail(raises=...) would take a teardown failure of that type, in
    an xfail test's teardown, for the expected failure and hide it."""


class FakeDaemon(Daemon):
    """A daemon with the fake driver, its own state directory and a fault file."""

    def __init__(self, agent, extra_args=()):
        self.extra_args = list(extra_args)
        self.tmp = tempfile.mkdtemp(prefix="wr-fail-")
        state = os.path.join(self.tmp, "state")
        os.makedirs(os.path.join(state, "sandboxes"))
        super().__init__(state_dir=state)
        self.agent = agent
        self.faults_path = os.path.join(self.tmp, "faults")
        self.set_faults("")
        images = os.path.join(STATE_DIR, "images")
        if not os.path.isdir(os.path.join(images, "default")):
            Daemon(STATE_DIR).build_image()
        os.symlink(images, os.path.join(state, "images"))

    def build_image(self):
        pass  # shared with the session's state directory (see __init__)

    def set_faults(self, spec):
        """Arms fault points (fault.h syntax); the daemon re-reads the file when it changes. The
        file is replaced whole, with a fresh mtime, so the change is always seen."""
        tmp = self.faults_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(spec + "\n")
        os.rename(tmp, self.faults_path)
        time.sleep(0.02)  # the mtime check has nanosecond resolution, but be safe on coarse fs

    def driver_args(self):
        """The fake driver, with freezing off: it can freeze (SIGSTOP) since the memory pressure
        tests (test_pressure.py) needed it, and these daemons' tests are about other things."""
        return ["--driver", "fake", "--freeze-after", "0"]

    def serve_argv(self):
        return super().serve_argv() + self.driver_args() + self.extra_args

    def serve_env(self):
        env = dict(os.environ, WR_FAULTS_FILE=self.faults_path)
        env.pop("WR_FAULTS", None)
        return env

    # ---- what a test checks ----

    def req(self, method, path, body=None, **kw):
        kw.setdefault("timeout", T)
        return self.client.request(method, path, body, **kw)

    def sandbox(self, sid):
        r = self.req("GET", f"/v1/sandboxes/{sid}")
        return r.json() if r.status == 200 else None

    def wait_state(self, sid, state, timeout=15):
        deadline = time.monotonic() + timeout
        while True:
            sb = self.sandbox(sid)
            if sb and sb["state"] == state:
                return sb
            assert time.monotonic() < deadline, f"{sid} never became {state}: {sb}"
            time.sleep(0.02)

    def mounts(self):
        with open("/proc/self/mountinfo") as f:
            return [line for line in f if self.tmp in line]

    def assert_alive(self):
        assert self.proc.poll() is None, f"the daemon died:\n{self.log_tail()}"
        # Not checked against the spec: its enum of drivers does not list "fake".
        r = self.req("GET", "/v1/health", validate=False)
        assert r.status == 200 and r.json()["driver"] == "fake", r

    def assert_nothing_left(self):
        """No sandbox, no sandbox directory, no mount, no process below the daemon (the agent's
        namespace is reaped by the daemon within moments of its kill)."""
        r = self.req("GET", "/v1/sandboxes")
        assert r.json()["sandboxes"] == [], r
        assert os.listdir(os.path.join(self.state_dir, "sandboxes")) == []
        assert self.mounts() == []
        deadline = time.monotonic() + 5
        while self.descendants():
            assert time.monotonic() < deadline, f"processes left: {self.descendants()}"
            time.sleep(0.02)

    def finish(self):
        """Stops the daemon; returns the problems found (sanitizer reports, unclean exit)."""
        problems = []
        leftovers, status = self.stop()
        if leftovers:
            problems.append(f"sandboxes left by the tests: {leftovers}")
        log = self.log_bytes()
        bad = [m.decode() for m in SANITIZER_MARKS if m in log]
        if bad:
            problems.append(f"sanitizer reports {bad} in {self.log_path}:\n{self.log_tail(200)}")
        if status != 0:
            problems.append(f"daemon did not exit cleanly on SIGTERM: {status}\n{self.log_tail()}")
        if self.mounts():
            problems.append(f"mounts left: {self.mounts()}")
        return problems


def _daemon(agent, extra_args=()):
    yield from serve_checked(FakeDaemon(agent, extra_args))


def serve_checked(d):
    """Runs d (a FakeDaemon or a subclass) for a fixture: starts it, yields it, then stops it
    and fails with every problem FakeDaemon.finish finds."""
    try:
        d.start()
    except Exception:
        d.stop()
        raise
    yield d
    problems = d.finish()
    if problems:
        raise DaemonBroken("\n".join(problems))
    shutil.rmtree(d.tmp, ignore_errors=True)
    shutil.rmtree(d.logdir, ignore_errors=True)


def after_test(d):
    """Per-test checks: alive, answering, and (once the test's sandboxes are deleted) nothing
    left behind."""
    try:
        d.assert_alive()
        d.delete_all()
        d.assert_nothing_left()
    except AssertionError as e:
        raise DaemonBroken(f"after the test: {e}\n{d.log_tail(30)}") from e


@pytest.fixture(scope="module")
def fake():
    """A fake-driver daemon running the real withruntime-agent."""
    yield from _daemon(WR_AGENT)


HOSTILE_DEADLINE = 3


@pytest.fixture(scope="module")
def hostile():
    """A fake-driver daemon whose 'agent' is hostile_agent.py (its mode: set_mode)."""
    tmp = tempfile.mkdtemp(prefix="wr-hostile-")
    agent = os.path.join(tmp, "hostile_agent.py")
    shutil.copy(os.path.join(HERE, "hostile_agent.py"), agent)
    os.chmod(agent, 0o755)
    # a short deadline, so that an agent that never answers a file request is caught quickly
    for d in _daemon(agent, ["--agent-deadline", str(HOSTILE_DEADLINE)]):
        d.mode_path = os.path.join(tmp, "hostile.mode")
        yield d
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def fk(fake):
    """The fake daemon, checked after the test: alive, answering, faults cleared, and (once the
    test's sandboxes are deleted) nothing left behind."""
    fake.set_faults("")
    yield fake
    fake.set_faults("")
    after_test(fake)


@pytest.fixture
def hs(hostile):
    def set_mode(mode):
        with open(hostile.mode_path, "w") as f:
            f.write(mode)

    hostile.set_mode = set_mode
    hostile.set_faults("")
    set_mode("good")
    yield hostile
    after_test(hostile)


@pytest.fixture
def lone_hostile():
    """Makes a hostile daemon of the test's own, which the test itself stops and checks (for a
    test whose daemon is expected to be left in a bad state)."""
    made = []

    def make(mode):
        tmp = tempfile.mkdtemp(prefix="wr-hostile-")
        agent = os.path.join(tmp, "hostile_agent.py")
        shutil.copy(os.path.join(HERE, "hostile_agent.py"), agent)
        os.chmod(agent, 0o755)
        with open(os.path.join(tmp, "hostile.mode"), "w") as f:
            f.write(mode)
        d = FakeDaemon(agent)
        made.append((d, tmp))
        d.start()
        return d

    yield make
    for d, tmp in made:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        for path in (tmp, d.tmp, d.logdir):  # the failure message carries the log's tail
            shutil.rmtree(path, ignore_errors=True)


def create(d, expect=201, **fields):
    r = d.req("POST", "/v1/sandboxes", fields or {})
    assert r.status == expect, r
    return r


def exec_ok(d, sid, *argv):
    r = d.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": list(argv)})
    assert r.status == 200, r
    return r.json()


def agent_pid(d, sid):
    with open(os.path.join(d.state_dir, "sandboxes", sid, "fake.pid")) as f:
        return int(f.read().split()[0])


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


# ---- the fake driver itself (positive controls for everything below) ----


def test_fake_driver_runs_the_real_agent(fk):
    sid = create(fk).json()["id"]
    res = exec_ok(fk, sid, "sh", "-c", "echo hi > f.txt && pwd && cat f.txt && cat /proc/1/comm")
    # The commands run in the agent's nested pid namespace, whose init is its holder.
    assert res["stdout"] == "/workspace\nhi\nwr-ns-init\n", res
    r = fk.req("GET", f"/v1/sandboxes/{sid}/files/content", query={"path": "/workspace/f.txt"})
    assert (r.status, r.body) == (200, b"hi\n")
    # Writes land in the sandbox's own upper layer, nowhere else.
    upper = os.path.join(fk.state_dir, "sandboxes", sid, "upper", "workspace", "f.txt")
    assert open(upper, "rb").read() == b"hi\n"
    st = fk.req("GET", f"/v1/sandboxes/{sid}/stats").json()
    assert st["pids"] >= 2 and st["memory_bytes"] > 0 and st["oom_kills"] == 0, st
    # stop and start keep the files; the old agent's namespace is gone.
    pid = agent_pid(fk, sid)
    assert fk.req("POST", f"/v1/sandboxes/{sid}/stop", {}).json()["state"] == "stopped"
    assert gone(pid), f"the agent {pid} outlived stop"
    assert fk.mounts() == []
    assert fk.req("POST", f"/v1/sandboxes/{sid}/start", {}).json()["state"] == "running"
    assert exec_ok(fk, sid, "cat", "f.txt")["stdout"] == "hi\n"
    assert fk.req("DELETE", f"/v1/sandboxes/{sid}").status == 200


# ---- a start that fails at each step ----


@pytest.mark.parametrize("step", ["dir", "overlay", "socketpair", "spawn"])
def test_create_fails_at_each_driver_step(fk, step):
    fk.set_faults(f"fake.start.{step}=EIO:1")
    r = create(fk, expect=500)
    code, msg, _ = r.error
    assert code == "internal", r
    # The API names the step and the sandbox; the driver's words (host paths) are in the log.
    assert f"at step {step}" in msg and "daemon log" in msg and fk.tmp not in msg, msg
    assert f"fault injected at fake.start.{step}".encode() in fk.log_bytes()
    # Nothing is left: no sandbox, no directory, no mount, no process.
    fk.assert_nothing_left()
    # The point fired once: the next create works, and its sandbox runs commands.
    sid = create(fk).json()["id"]
    assert exec_ok(fk, sid, "echo", "ok")["stdout"] == "ok\n"


def test_create_fails_on_a_full_disk(fk):
    fk.set_faults("fake.start.dir=ENOSPC:1")
    _, msg, _ = create(fk, expect=500).error
    assert "No space left on device" in msg, msg
    fk.assert_nothing_left()


def test_start_fails_and_keeps_the_files(fk):
    sid = create(fk).json()["id"]
    exec_ok(fk, sid, "sh", "-c", "echo kept > k.txt")
    assert fk.req("POST", f"/v1/sandboxes/{sid}/stop", {}).status == 200
    fk.set_faults("fake.start.spawn=EIO:1")
    r = fk.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 500 and "at step spawn" in r.error[1], r
    fk.wait_state(sid, "failed")
    assert fk.mounts() == []
    r = fk.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 200, r
    assert exec_ok(fk, sid, "cat", "k.txt")["stdout"] == "kept\n"


# ---- cleanups that fail ----


def test_stop_fails_then_delete_works(fk):
    sid = create(fk).json()["id"]
    fk.set_faults("fake.stop=EIO")
    r = fk.req("POST", f"/v1/sandboxes/{sid}/stop", {})
    assert r.status == 500 and "stop failed" in r.error[1] and "daemon log" in r.error[1], r
    assert fk.sandbox(sid)["state"] == "failed"
    fk.set_faults("")
    assert fk.req("DELETE", f"/v1/sandboxes/{sid}").status == 200
    fk.assert_nothing_left()


def test_delete_fails_then_delete_works(fk):
    sid = create(fk).json()["id"]
    fk.set_faults("fake.destroy=EIO")
    r = fk.req("DELETE", f"/v1/sandboxes/{sid}")
    assert r.status == 500 and "delete failed" in r.error[1] and "daemon log" in r.error[1], r
    assert fk.sandbox(sid)["state"] == "failed"
    fk.set_faults("")
    assert fk.req("DELETE", f"/v1/sandboxes/{sid}").status == 200
    fk.assert_nothing_left()


def test_create_fails_and_its_cleanup_fails(fk):
    fk.set_faults("fake.start.spawn=EIO:1,fake.destroy=EIO:1")
    r = create(fk, expect=500)
    assert "at step spawn" in r.error[1], r
    # The sandbox could not be removed: it stays, failed, for a later delete.
    sbs = fk.req("GET", "/v1/sandboxes").json()["sandboxes"]
    assert [s["state"] for s in sbs] == ["failed"], sbs
    assert fk.req("DELETE", f"/v1/sandboxes/{sbs[0]['id']}").status == 200
    fk.assert_nothing_left()


def test_a_stopping_sandbox_says_why(fk):
    """While a stop is under way, GET shows the reason it will be stopped with, not nothing."""
    sid = create(fk).json()["id"]
    fk.set_faults("fake.stop=delay1500:1")
    stopper = threading.Thread(target=fk.req, args=("POST", f"/v1/sandboxes/{sid}/stop", {}))
    stopper.start()
    try:
        sb = fk.wait_state(sid, "stopping", timeout=10)
        assert sb.get("state_reason") == "user", sb
    finally:
        stopper.join(T)
    sb = fk.wait_state(sid, "stopped")
    assert sb.get("state_reason") == "user", sb
    assert fk.req("DELETE", f"/v1/sandboxes/{sid}").status == 200


# ---- operations deferred while a failed sandbox is cleaned up ----


def lose_agent(d, sid, slow_cleanup_ms=1500):
    """Kills the sandbox's agent from outside, with the cleanup that follows made slow; returns
    once the daemon has marked the sandbox failed (its cleanup is then in flight)."""
    d.set_faults(f"fake.stop=delay{slow_cleanup_ms}:1")
    os.kill(agent_pid(d, sid), signal.SIGKILL)
    sb = d.wait_state(sid, "failed", timeout=5)
    assert sb.get("state_reason") == "agent_died", sb


def test_delete_deferred_during_cleanup(fk):
    sid = create(fk).json()["id"]
    lose_agent(fk, sid)
    # Without the deferral this would be 409 (busy); with it, it waits for the cleanup.
    t0 = time.monotonic()
    r = fk.req("DELETE", f"/v1/sandboxes/{sid}")
    assert r.status == 200, r
    assert time.monotonic() - t0 > 0.5, "the delete did not wait for the cleanup"
    fk.assert_nothing_left()


def test_start_deferred_during_cleanup(fk):
    sid = create(fk).json()["id"]
    exec_ok(fk, sid, "sh", "-c", "echo still > s.txt")
    lose_agent(fk, sid)
    t0 = time.monotonic()
    r = fk.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 200 and r.json()["state"] == "running", r
    assert time.monotonic() - t0 > 0.5, "the start did not wait for the cleanup"
    assert exec_ok(fk, sid, "cat", "s.txt")["stdout"] == "still\n"


def test_deferred_start_that_fails(fk):
    sid = create(fk).json()["id"]
    lose_agent(fk, sid)
    fk.set_faults("fake.stop=delay1000:1,fake.start.overlay=EIO:1")
    r = fk.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 500 and "at step overlay" in r.error[1], r
    assert fk.sandbox(sid)["state"] == "failed"
    assert fk.mounts() == []


def test_second_deferral_is_refused(fk):
    sid = create(fk).json()["id"]
    lose_agent(fk, sid, slow_cleanup_ms=2500)

    first = {}
    t = threading.Thread(target=lambda: first.update(r=fk.req("DELETE", f"/v1/sandboxes/{sid}")))
    t.start()
    time.sleep(0.3)
    r = fk.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 409, r
    t.join(T)
    assert first["r"].status == 200, first


# ---- the database ----


@pytest.mark.parametrize("fault", ["store.put=EBUSY", "store.put=ENOSPC"])
def test_create_with_a_failing_database(fk, fault):
    fk.set_faults(fault)
    r = fk.req("POST", "/v1/sandboxes", {})
    # A sandbox the daemon cannot record would be lost at the next restart: refuse it clearly.
    assert r.status >= 500, r
    msg = r.error[1]
    assert "database is locked" in msg or "database or disk is full" in msg, msg
    fk.set_faults("")
    fk.assert_alive()


def test_event_history_failing_does_not_break_create(fk):
    fk.set_faults("store.event=EBUSY")
    sid = create(fk).json()["id"]
    r = fk.req("GET", f"/v1/sandboxes/{sid}/events")
    fk.set_faults("")
    assert r.status in (200, 500), r
    assert exec_ok(fk, sid, "true")["exit_code"] == 0


def test_events_listing_fails_cleanly(fk):
    sid = create(fk).json()["id"]
    fk.set_faults("store.events=EBUSY")
    r = fk.req("GET", f"/v1/sandboxes/{sid}/events")
    assert r.status == 500 and "database is locked" in r.error[1], r


def test_a_failed_send_to_the_agent_is_answered(fk):
    sid = create(fk).json()["id"]
    # EXEC only: the watchdog's PING may be sent in between and must not take the fault.
    fk.set_faults("agentconn.send.EXEC=EIO:1")
    r = fk.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["true"]})
    assert r.status in (409, 500, 503), r
    fk.set_faults("")
    assert exec_ok(fk, sid, "true")["exit_code"] == 0


# ---- a hostile agent ----


def hostile_sandbox(d, mode):
    d.set_mode(mode)
    return create(d).json()["id"]


def test_hostile_good_mode_is_a_control(hs):
    sid = hostile_sandbox(hs, "good")
    assert exec_ok(hs, sid, "anything")["exit_code"] == 0


@pytest.mark.parametrize("mode,why", [("bad_version", "version"), ("hello_twice", "HELLO")])
def test_hostile_hello(hs, mode, why):
    hs.set_mode(mode)
    r = hs.req("POST", "/v1/sandboxes", {})
    if mode == "bad_version":
        assert r.status == 500 and why in r.error[1], r
        hs.assert_nothing_left()
    else:
        # The second HELLO may arrive after the first was taken: either the create fails, or
        # the sandbox is failed right after.
        if r.status == 201:
            sid = r.json()["id"]
            hs.wait_state(sid, "failed")
        else:
            assert r.status == 500 and why in r.error[1], r


@pytest.mark.parametrize("mode,reason", [
    ("oversized", "malformed frame header"),
    ("garbage", "malformed frame header"),
    ("daemon_type", "only the daemon sends"),
    ("close_mid", "closed the control channel"),
])
def test_hostile_frames_fail_the_sandbox(hs, mode, reason):
    sid = hostile_sandbox(hs, mode)
    r = hs.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["x"]})
    assert r.status == 500 and r.error[0] == "sandbox_failed", r
    assert reason in r.error[1], r
    sb = hs.wait_state(sid, "failed")
    assert sb.get("state_reason") == "agent_died", sb
    # A failed sandbox is refused, not hung on.
    r = hs.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["x"]})
    assert r.status == 409, r


def test_an_agent_that_dies_with_frames_unread_reads_as_closed(hs):
    # The agent exits with the daemon's stdin frames still queued to it: the daemon reads
    # ECONNRESET rather than EOF, and a user still hears that the agent closed the channel.
    sid = hostile_sandbox(hs, "close_unread")
    r = hs.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["x"], "stdin": "z" * 1000})
    assert r.status == 500 and r.error[0] == "sandbox_failed", r
    assert "agent closed the control channel" in r.error[1], r
    sb = hs.wait_state(sid, "failed")
    assert sb.get("state_reason") == "agent_died", sb


def test_hostile_exit_after_hello(hs):
    sid = hostile_sandbox(hs, "exit_after_hello")
    hs.wait_state(sid, "failed", timeout=10)
    r = hs.req("GET", f"/v1/sandboxes/{sid}/files/list", query={"path": "/"})
    assert r.status == 409, r


@pytest.mark.slow
def test_hostile_silence_after_hello(hs):
    """No answer to anything, not even PING: the watchdog fails the sandbox (20 s) and the
    request in flight is answered then."""
    sid = hostile_sandbox(hs, "silent")
    t0 = time.monotonic()
    r = hs.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["x"]}, timeout=60)
    assert r.status == 500 and r.error[0] == "sandbox_failed", r
    assert time.monotonic() - t0 < 45
    sb = hs.wait_state(sid, "failed")
    assert sb.get("state_reason") == "agent_unresponsive", sb


def wrong_terminal_frame(make, method, path, query=None, body=None):
    """Sends one request to a wrong_type agent on a daemon of its own, then stops that daemon:
    fails with every problem seen (no answer, an answer that is not an error, a sanitizer
    report or an unclean exit at shutdown)."""
    d = make("wrong_type")
    sid = create(d).json()["id"]
    problems = []
    try:
        r = d.req(method, f"/v1/sandboxes/{sid}/{path}", body, query=query, timeout=10)
        if r.status != 500 or r.error[0] != "sandbox_failed":
            problems.append(f"answered {r.status} {r.error}, not 500 sandbox_failed")
    except TimeoutError:
        problems.append("the request was never answered")
    if d.req("DELETE", f"/v1/sandboxes/{sid}").status != 200:
        problems.append("the sandbox could not be deleted afterwards")
    problems += d.finish()
    if problems:
        pytest.fail("\n".join(problems))


def test_hostile_wrong_terminal_frame_for_exec(lone_hostile):
    wrong_terminal_frame(lone_hostile, "POST", "exec", body={"argv": ["x"]})


@pytest.mark.parametrize("op", ["content", "list"])
def test_hostile_wrong_terminal_frame_for_files(lone_hostile, op):
    wrong_terminal_frame(lone_hostile, "GET", f"files/{op}", query={"path": "/x"})


def test_hostile_data_beyond_the_requested_length(hs):
    """The agent announces 10 bytes and sends 4 MiB without waiting for credit: the caller
    gets at most the 10 bytes it asked for, in a body that is visibly cut off (no last chunk),
    and the sandbox is failed for the protocol violation."""
    sid = hostile_sandbox(hs, "data_overrun")
    conn = http.client.HTTPConnection("127.0.0.1", hs.port, timeout=T)
    try:
        conn.request("GET", f"/v1/sandboxes/{sid}/files/content?path=/f&length=10",
                     headers={"Authorization": f"Bearer {hs.key}"})
        resp = conn.getresponse()
        assert resp.status == 200
        with pytest.raises(http.client.IncompleteRead) as e:
            resp.read()
        assert len(e.value.partial) <= 10
    finally:
        conn.close()
    sb = hs.wait_state(sid, "failed")
    assert "more FILE_READ output than the daemon allowed" in sb.get("state_detail", ""), sb


def test_hostile_million_directory_entries(hs):
    sid = hostile_sandbox(hs, "million_entries")
    r = hs.req("GET", f"/v1/sandboxes/{sid}/files/list", query={"path": "/"}, timeout=120,
               validate=False)
    # A listing the daemon builds in memory is bounded: the first 100,000 entries, sorted,
    # marked truncated; and the sandbox stays usable.
    assert r.status == 200, r
    listing = r.json()
    assert listing.get("truncated") is True and len(listing["entries"]) == 100_000, \
        (listing.get("truncated"), len(listing["entries"]))
    names = [e["name"] for e in listing["entries"]]
    assert names == sorted(names)
    assert hs.req("GET", f"/v1/sandboxes/{sid}").json()["state"] == "running"


# ---- an agent that cannot isolate its commands refuses to start ----


def test_agent_without_cap_sys_admin_refuses_to_start(fk):
    """Without CAP_SYS_ADMIN the agent cannot put commands in their own pid namespace; rather
    than run them beside itself (where `kill -9 1` or ptrace reach it) it says so and exits."""
    fk.set_faults("fake.agent.no_sys_admin=EPERM:1")
    r = create(fk, expect=500)
    code, msg, _ = r.error
    assert code == "internal" and "refuses to run" in msg and "CAP_SYS_ADMIN" in msg, r
    fk.assert_nothing_left()
    # the same on a start: the sandbox is failed, saying why
    sid = create(fk).json()["id"]
    assert fk.req("POST", f"/v1/sandboxes/{sid}/stop", {}).status == 200
    fk.set_faults("fake.agent.no_sys_admin=EPERM:1")
    r = fk.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 500 and "refuses to run" in r.error[1], r
    sb = fk.wait_state(sid, "failed")
    assert sb["state_reason"] == "start_failed", sb
    assert "agent refused to start" in sb["state_detail"], sb
    assert "unshare(CLONE_NEWPID)" in sb["state_detail"], sb
    assert b"agent.no_isolation" in open(
        os.path.join(fk.state_dir, "sandboxes", sid, "agent.log"), "rb").read()
    # with the capability back, it starts and runs commands out of the agent's reach
    r = fk.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 200, r
    assert exec_ok(fk, sid, "sh", "-c", "kill -0 1 && cat /proc/1/cmdline")["stdout"] == \
        "wr-ns-init\0"


def test_an_agent_flooding_its_stderr_leaves_at_most_the_cap(hs):
    """agent.log, the agent's stderr on the host, is held to serve --max-agent-log-kib (1 MiB by
    default) at every write: the agent gets a pipe, and the daemon writes the file. An agent
    writing 32 MiB leaves at most the cap, its newest lines behind the truncation marker, and
    the sandbox goes on working."""
    cap = 1 << 20
    hs.set_mode("stderr_flood")
    sid = create(hs).json()["id"]
    path = os.path.join(hs.state_dir, "sandboxes", sid, "agent.log")
    biggest, deadline = 0, time.monotonic() + 60
    while True:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            biggest = max(biggest, size)
            f.seek(max(0, size - 64))
            if f.read().endswith(b"flood done\n"):
                break
        assert time.monotonic() < deadline, (biggest, size)
        time.sleep(0.005)
    with open(path, "rb") as f:
        text = f.read()
    assert biggest <= cap and len(text) <= cap, (biggest, len(text))
    assert text.startswith(b"ts=") and b"event=log.truncated" in text.split(b"\n")[0], text[:200]
    assert text.count(b"event=log.truncated") == 1 and text.endswith(b"x\nflood done\n")
    assert b"event=sandbox.log_cut" in hs.log_bytes()
    assert exec_ok(hs, sid, "true")["exit_code"] == 0
    assert hs.req("GET", f"/v1/sandboxes/{sid}").json()["state"] == "running"


@pytest.mark.parametrize("op", ["content", "list", "stat"])
def test_hostile_agent_that_never_answers_a_file_request(hs, op):
    """An agent that answers pings but never a file request: the request is answered once the
    deadline passes (not left hanging), and the sandbox is failed as unresponsive."""
    sid = hostile_sandbox(hs, "no_files")
    t0 = time.monotonic()
    r = hs.req("GET", f"/v1/sandboxes/{sid}/files/{op}", query={"path": "/x"}, timeout=60)
    waited = time.monotonic() - t0
    assert r.status == 500 and r.error[0] == "sandbox_failed", r
    assert "did not answer" in r.error[1], r
    assert waited >= HOSTILE_DEADLINE - 0.5, waited  # not before the deadline
    sb = hs.wait_state(sid, "failed")
    assert sb.get("state_reason") == "agent_unresponsive", sb
