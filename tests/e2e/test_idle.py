"""Idle sandboxes are frozen and cost no CPU; the next request thaws them (docs/lifecycle.md
"Frozen"; issue 11, point 3).

A gVisor daemon of the module's own with `--freeze-after 1`, so a sandbox idle for a second is
frozen (the cgroup v1 freezer). Waits poll with a deadline; "never frozen" is checked by polling
`frozen` over several freeze periods (the condition is the absence of a freeze, so a slow host
can only make it pass later, never wrongly fail).
"""

import os
import shutil
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import conftest  # noqa: E402

FREEZE_AFTER = 1  # seconds
FREEZER = "/sys/fs/cgroup/freezer/withruntime"
T = 60  # seconds: the longest any wait here may take


class FreezingDaemon(conftest.OwnStateDaemon):
    """A gVisor daemon with a state directory of its own (sharing the session's image) that
    freezes sandboxes idle for FREEZE_AFTER seconds."""

    prefix = "wr-freeze-"

    def serve_argv(self):
        return super().serve_argv() + ["--freeze-after", str(FREEZE_AFTER)]


def finish(d):
    leftovers, status = d.stop()
    shutil.rmtree(d.state_dir, ignore_errors=True)  # `images` is a symlink: removed, not followed
    log = d.log_bytes()
    bad = [m.decode() for m in conftest.SANITIZER_MARKS if m in log]
    assert not bad, f"sanitizer reports in the daemon log:\n{d.log_tail(200)}"
    assert not leftovers, f"sandboxes left by the tests: {leftovers}"
    assert status == 0, f"daemon did not exit cleanly on SIGTERM: {status}\n{d.log_tail()}"
    shutil.rmtree(d.logdir, ignore_errors=True)


@pytest.fixture(scope="module")
def fd(daemon):
    d = FreezingDaemon(daemon)
    d.start()
    yield d
    finish(d)


@pytest.fixture
def c(fd):
    yield fd.client
    fd.delete_all()
    assert fd.proc.poll() is None, f"the daemon died:\n{fd.log_tail()}"


def freezer_state(sid):
    try:
        with open(f"{FREEZER}/{sid}/freezer.state") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def create(c, **fields):
    fields.setdefault("memory_mib", 128)
    return c.create(**fields)["id"]


def wait_frozen(c, sid, want=True, timeout=T):
    deadline = time.monotonic() + timeout
    while True:
        sb = c.get(sid)
        if sb["frozen"] == want:
            return sb
        assert time.monotonic() < deadline, f"{sid} never became frozen={want}: {sb}"
        time.sleep(0.1)


def never_frozen(c, sid, periods=5):
    """Polls for periods x FREEZE_AFTER seconds (plus a probe's slack): frozen stays false."""
    end = time.monotonic() + periods * FREEZE_AFTER + 2
    while time.monotonic() < end:
        sb = c.get(sid)
        assert sb["state"] == "running" and sb["frozen"] is False, sb
        assert freezer_state(sid) == "THAWED", freezer_state(sid)
        time.sleep(0.1)


def test_an_idle_sandbox_is_frozen_and_an_exec_thaws_it(c):
    sid = create(c)
    sb = wait_frozen(c, sid)
    assert sb["state"] == "running"
    assert freezer_state(sid) == "FROZEN"
    r = c.exec(sid, "echo thawed; cat /etc/hostname >/dev/null")
    assert r["exit_code"] == 0 and r["stdout"] == "thawed\n", r
    # awake right after, and asleep again once idle
    assert freezer_state(sid) == "THAWED"
    wait_frozen(c, sid)
    assert freezer_state(sid) == "FROZEN"
    # many calls in a row on a sandbox that keeps freezing between them all answer
    for i in range(3):
        wait_frozen(c, sid)
        assert c.exec(sid, f"echo {i}")["stdout"] == f"{i}\n"


def test_a_running_background_command_keeps_it_awake(c):
    sid = create(c)
    wait_frozen(c, sid)
    cmd = c.exec(sid, "sleep 1000", background=True, expect=201)
    # 201 answers as soon as the command is sent; the thaw its frame asked for may still be on
    # the freezer's worker (the sanitizer build saw `frozen: true` here once), so awake first
    wait_frozen(c, sid, want=False)
    got = c.expect(200, "GET", f"/v1/sandboxes/{sid}/commands/{cmd['id']}").json()
    assert got["state"] == "running", got
    never_frozen(c, sid)
    c.expect(200, "POST", f"/v1/sandboxes/{sid}/commands/{cmd['id']}/signal", {"signal": "KILL"})
    wait_frozen(c, sid)


def test_a_leftover_process_keeps_it_awake(c):
    sid = create(c)
    r = c.exec(sid, "sh -c 'sleep 1000 >/dev/null 2>&1 &'")
    assert r["exit_code"] == 0, r
    never_frozen(c, sid)
    c.exec(sid, "pkill -KILL sleep; true")
    wait_frozen(c, sid)


def test_files_on_a_frozen_sandbox(c):
    sid = create(c)
    wait_frozen(c, sid)
    c.write_file(sid, "/workspace/a.txt", b"written while frozen")
    wait_frozen(c, sid)
    assert c.read_file(sid, "/workspace/a.txt") == b"written while frozen"
    wait_frozen(c, sid)
    names = [e["name"] for e in
             c.files("GET", sid, "list", 200, path="/workspace").json()["entries"]]
    assert "a.txt" in names


def test_stop_start_and_delete_of_a_frozen_sandbox(c):
    sid = create(c)
    c.write_file(sid, "/workspace/keep", b"kept")
    wait_frozen(c, sid)
    t0 = time.monotonic()
    sb = c.expect(200, "POST", f"/v1/sandboxes/{sid}/stop").json()
    assert sb["state"] == "stopped" and sb["frozen"] is False, sb
    assert time.monotonic() - t0 < 10, "stop of a frozen sandbox was slow"
    assert freezer_state(sid) is None, "its cgroups are gone"
    sb = c.expect(200, "POST", f"/v1/sandboxes/{sid}/start").json()
    assert sb["state"] == "running"
    assert c.read_file(sid, "/workspace/keep") == b"kept"
    wait_frozen(c, sid)
    t0 = time.monotonic()
    c.delete(sid)
    assert time.monotonic() - t0 < 10, "delete of a frozen sandbox was slow"
    assert c.request("GET", f"/v1/sandboxes/{sid}").status == 404
    assert freezer_state(sid) is None


def test_the_lease_of_a_frozen_sandbox_ends_on_time(c):
    sid = create(c, timeout_seconds=6, on_lease_end="stop")
    wait_frozen(c, sid)
    deadline = time.monotonic() + 6 + 5
    while True:
        sb = c.get(sid)
        if sb["state"] == "stopped":
            break
        assert time.monotonic() < deadline, f"the lease never ended: {sb}"
        time.sleep(0.1)
    assert sb["state_reason"] == "lease_ended" and sb["frozen"] is False, sb
    assert freezer_state(sid) is None


@pytest.mark.slow  # over 20 s by design (the watchdog's limit): the normal build's run only
@pytest.mark.timeout(120)
def test_the_watchdog_leaves_a_frozen_sandbox_alone(c):
    """The watchdog fails a sandbox whose agent has not answered for 20 s; a frozen one cannot
    answer, so it is not pinged: it stays running (and asleep) well past that."""
    sid = create(c)
    wait_frozen(c, sid)
    end = time.monotonic() + 26
    while time.monotonic() < end:
        sb = c.get(sid)
        assert sb["state"] == "running", sb
        time.sleep(0.5)
    assert c.get(sid)["frozen"] is True
    assert c.exec(sid, "echo awake")["stdout"] == "awake\n"


def test_stats_of_a_frozen_sandbox_leave_it_frozen(c):
    sid = create(c)
    wait_frozen(c, sid)
    r = c.request("GET", f"/v1/sandboxes/{sid}/stats")
    assert r.status == 200, r
    # reading the host's counters needs no agent: still frozen, and it costs no CPU meanwhile
    assert c.get(sid)["frozen"] is True
    with open(f"/sys/fs/cgroup/cpuacct/withruntime/{sid}/cpuacct.usage") as f:
        before = int(f.read())
    time.sleep(2)
    with open(f"/sys/fs/cgroup/cpuacct/withruntime/{sid}/cpuacct.usage") as f:
        after = int(f.read())
    if c.get(sid)["frozen"]:
        assert after - before < 1_000_000, f"a frozen sandbox used {after - before} ns of CPU"


def test_freeze_after_zero_never_freezes(daemon):
    d = FreezingDaemon(daemon)
    d.serve_argv = lambda: conftest.Daemon.serve_argv(d) + ["--freeze-after", "0"]
    d.start()
    try:
        sid = create(d.client)
        end = time.monotonic() + 4
        while time.monotonic() < end:
            assert d.client.get(sid)["frozen"] is False
            time.sleep(0.2)
        assert freezer_state(sid) == "THAWED"
        d.client.delete(sid)
    finally:
        finish(d)


@pytest.mark.timeout(180)
def test_a_restart_stops_frozen_sandboxes_cleanly(daemon):
    """The daemon killed with sandboxes frozen: the next one stops them (thawing first), files
    kept, and they start again. And SIGTERM with a frozen sandbox stops it cleanly too."""
    d = FreezingDaemon(daemon)
    d.start()
    try:
        sid = create(d.client)
        d.client.write_file(sid, "/workspace/f", b"before")
        wait_frozen(d.client, sid)
        assert freezer_state(sid) == "FROZEN"
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        assert freezer_state(sid) == "FROZEN", "still frozen with no daemon"
        d.start(clean=False)
        deadline = time.monotonic() + T
        while True:
            sb = d.client.get(sid)
            if sb["state"] == "stopped":
                break
            assert time.monotonic() < deadline, f"never stopped: {sb}"
            time.sleep(0.1)
        assert sb["state_reason"] == "daemon_restart" and sb["frozen"] is False, sb
        assert freezer_state(sid) is None, "its cgroups are gone"
        d.client.expect(200, "POST", f"/v1/sandboxes/{sid}/start")
        assert d.client.read_file(sid, "/workspace/f") == b"before"
        wait_frozen(d.client, sid)
        # SIGTERM with it frozen: the daemon stops it on the way out, and exits 0 (finish)
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=30) == 0, d.log_tail()
        assert freezer_state(sid) is None, "stopped on shutdown, cgroups gone"
        d.start(clean=False)
        sb = d.client.get(sid)
        assert sb["state"] == "stopped" and sb["state_reason"] == "daemon_shutdown", sb
        d.client.delete(sid)
    finally:
        finish(d)


def test_a_frozen_hour_is_billed_for_its_memory_only(daemon):
    """Metering treats frozen time as costing no CPU: the meter's clock (`serve --meter-clock`,
    moved by the test) passes an hour while the sandbox is frozen; the charge is that hour's
    memory plus the CPU its cgroup measured (its boot), without the 2.5 %-per-vCPU floor an
    awake hour pays (test_money: an idle awake hour of 2 vCPU / 4 GiB is 31,250)."""
    hour = 3600 * 1000
    base = 1_780_272_000_000  # 2026-06-01T00:00:00Z, far from the real clock's day
    d = FreezingDaemon(daemon)
    clock = os.path.join(d.state_dir, "meter-clock")

    def set_clock(ms):
        with open(clock + ".tmp", "w") as f:
            f.write(f"{ms}\n")
        os.rename(clock + ".tmp", clock)

    set_clock(base)
    argv = d.serve_argv
    d.serve_argv = lambda: argv() + ["--meter-clock", clock]
    d.start()
    try:
        c = d.client
        sid = create(c, cpus=2, memory_mib=4096)
        wait_frozen(c, sid)
        set_clock(base + hour)
        deadline = time.monotonic() + T
        while True:  # the meter charges the hour on its next pass (~1 s)
            r = c.request("GET", "/v1/usage", query={"from": "2026-06-01", "to": "2026-06-02"})
            assert r.status == 200, r
            rows = [row for row in r.json()["rows"] if row["sandbox_id"] == sid]
            if rows and rows[0]["memory_mib_ms"] >= 4096 * hour:
                break
            assert time.monotonic() < deadline, f"the hour was never charged: {r.json()}"
            time.sleep(0.2)
        assert c.get(sid)["frozen"] is True, "still asleep: nothing but the meter ran"
        row = rows[0]
        assert row["memory_mib_ms"] == 4096 * hour, row
        floor_usec = 2 * hour * 1000 * 25 // 1000  # what an awake hour pays at least
        assert row["cpu_usec"] < floor_usec // 10, row  # its boot, measured: a second or so
        price = row["cpu_usec"] * 25000 // 3_600_000_000 + 4096 * hour * 7500 // (1024 * 3_600_000)
        assert row["cost_micros"] == price and 30_000 <= price < 31_250, row
        c.delete(sid)
    finally:
        finish(d)
