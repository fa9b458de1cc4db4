"""Memory pressure (docs/lifecycle.md, "Memory pressure"): while the host is short of memory the
daemon freezes every idle sandbox at once, not after --freeze-after, says so in the sandbox's
events, and leaves busy ones alone; a request thaws a frozen one as ever.

A fake-driver daemon of the module's own (no gVisor: the fake driver freezes with SIGSTOP) with
--freeze-after 3600, so any freeze seen here is the pressure's. The pressure is faked with the
fault point daemon.memory_pressure (src/daemon/pressure.h), which makes the host read as having
no memory available; the daemon checks once a second. Waits poll with a deadline; "not frozen"
is checked by polling over two checks, as test_idle.py does (the condition is an absence).
"""
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from conftest import WR_AGENT  # noqa: E402
from test_failures import (FakeDaemon, after_test, agent_pid, create, exec_ok,  # noqa: E402
                           serve_checked)

T = 15  # deadline for what takes a second or two: a hang fails, never blocks the run
CHECK_EVERY = 1.0  # the daemon's pressure check (PRESSURE_EVERY_MS)


@pytest.fixture(scope="module")
def pressured():
    yield from serve_checked(FakeDaemon(WR_AGENT, ["--freeze-after", "3600"]))


@pytest.fixture
def pd(pressured):
    pressured.set_faults("")
    yield pressured
    pressured.set_faults("")
    after_test(pressured)


def poll(what, cond, timeout=T):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def proc_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def frozen(d, sid):
    sb = d.sandbox(sid)
    assert sb and sb["state"] == "running", sb
    return sb["frozen"]


def test_under_pressure_idle_sandboxes_freeze_at_once_and_busy_ones_do_not(pd):
    idle = create(pd).json()["id"]
    busy = create(pd).json()["id"]
    pd.wait_state(idle, "running")
    pd.wait_state(busy, "running")
    # busy: a background command runs in it
    r = pd.req("POST", f"/v1/sandboxes/{busy}/exec",
               {"argv": ["sleep", "60"], "background": True})
    assert r.status == 201, r
    assert not frozen(pd, idle) and not frozen(pd, busy), "nothing freezes without pressure"

    pd.set_faults("daemon.memory_pressure=ENOMEM")
    poll(f"{idle} frozen under pressure", lambda: frozen(pd, idle))
    assert proc_state(agent_pid(pd, idle)) == "T", "its agent is stopped: it allocates nothing"
    events = pd.req("GET", f"/v1/sandboxes/{idle}/events").json()["events"]
    assert {"type": "frozen", "state": "running", "reason": "memory_pressure"} in [
        {k: e[k] for k in ("type", "state", "reason")} for e in events], events
    assert b"event=host.memory_pressure " in pd.log_bytes()
    until = time.monotonic() + 2 * CHECK_EVERY + 0.5
    while time.monotonic() < until:
        assert not frozen(pd, busy), "a sandbox running a command is never frozen"
        time.sleep(0.05)
    assert all(e["type"] == "state" for e in
               pd.req("GET", f"/v1/sandboxes/{busy}/events").json()["events"])

    # The pressure ends; a request thaws the frozen one, and it stays awake (--freeze-after 3600).
    pd.set_faults("")
    poll("the pressure's end logged", lambda: b"event=host.memory_pressure_ended" in pd.log_bytes())
    out = exec_ok(pd, idle, "echo", "awake")
    assert out["exit_code"] == 0 and out["stdout"] == "awake\n", out
    assert not frozen(pd, idle)
