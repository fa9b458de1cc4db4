"""API errors never show host paths or runsc's output; the daemon's log keeps the detail.

A gVisor daemon of its own (state directory in a temporary directory, fault file, a copy of the
agent it can break), so that starts fail for real (a corrupt disk image, an agent binary runsc
cannot exec) and at each step's fault point (src/common/fault.h, gvisor.start.<step>).
"""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from conftest import WR_AGENT  # noqa: E402
from test_failures import FakeDaemon, serve_checked  # noqa: E402

# What runsc writes when it fails (its log lines and error wording): none may reach a client.
RUNSC_WORDS = ("runsc", "gofer", "sentry", "container", "urpc", "level=", ".go:")


class GvisorDaemon(FakeDaemon):
    """FakeDaemon's state directory, shared image and fault file, with the gvisor driver and a
    copy of the agent."""

    def __init__(self):
        super().__init__(WR_AGENT)
        self.agent = os.path.join(self.tmp, "withruntime-agent")
        shutil.copy(WR_AGENT, self.agent)

    def driver_args(self):
        return []  # gvisor, the default

    def assert_alive(self):
        assert self.proc.poll() is None, f"the daemon died:\n{self.log_tail()}"
        assert self.req("GET", "/v1/health").status == 200


@pytest.fixture(scope="module")
def gv():
    yield from serve_checked(GvisorDaemon())


@pytest.fixture
def g(gv):
    gv.set_faults("")
    yield gv
    gv.set_faults("")
    gv.assert_alive()
    gv.delete_all()


def assert_clean(d, text, what):
    """text (an API message or state_detail) names no host path and quotes no runsc output."""
    assert text, f"{what}: empty"
    for host in (d.tmp, d.state_dir, os.path.realpath(d.state_dir), "/var/lib", "/tmp/",
                 "layer.img", "agent.log", "config.json"):
        assert host not in text, f"{what} shows the host path {host!r}: {text!r}"
    for word in RUNSC_WORDS:
        assert word not in text.lower(), f"{what} quotes runsc ({word!r}): {text!r}"
    assert "daemon log" in text, f"{what} does not say where the detail is: {text!r}"


def stopped_sandbox(d):
    r = d.req("POST", "/v1/sandboxes", {"memory_mib": 256})
    assert r.status == 201, r
    sid = r.json()["id"]
    r = d.req("POST", f"/v1/sandboxes/{sid}/stop", {})
    assert r.status == 200 and r.json()["state"] == "stopped", r
    return sid


def failed_start(d, sid, log_has):
    """Starts sid, expecting a failure; checks the answer and the state detail."""
    log_before = len(d.log_bytes())
    r = d.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 500, r
    code, msg, _ = r.error
    assert code == "internal" and sid in msg, r
    assert_clean(d, msg, "the start's error")
    sb = d.wait_state(sid, "failed", timeout=60)
    assert sb["state_reason"] == "start_failed", sb
    assert_clean(d, sb["state_detail"], "state_detail")
    r = d.req("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
    assert r.status == 409, r
    assert_clean(d, r.error[1], "an exec's conflict")
    log = d.log_bytes()[log_before:].decode(errors="replace")
    assert log_has in log, f"the daemon log lacks {log_has!r}:\n{log[-3000:]}"
    return msg


@pytest.mark.timeout(300)
@pytest.mark.parametrize("step", ["disk", "overlay", "bundle", "cgroup", "spawn", "wait"])
def test_start_failing_at_a_step_names_the_step_not_the_host(g, step):
    sid = stopped_sandbox(g)
    g.set_faults(f"gvisor.start.{step}=EIO:1")
    msg = failed_start(g, sid, f"fault injected at gvisor.start.{step}")
    assert f"at step {step}" in msg and "Input/output error" in msg, msg
    # the fault fired once: the next start works
    r = g.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 200 and r.json()["state"] == "running", r


@pytest.mark.timeout(300)
def test_create_failing_names_no_host_path(g):
    g.set_faults("gvisor.start.disk=ENOSPC:1")
    r = g.req("POST", "/v1/sandboxes", {"memory_mib": 256})
    assert r.status == 500, r
    assert_clean(g, r.error[1], "the create's error")
    assert "at step disk" in r.error[1] and "No space left on device" in r.error[1], r


@pytest.mark.timeout(300)
def test_corrupt_disk_image_names_no_host_path(g):
    sid = stopped_sandbox(g)
    image = os.path.join(g.state_dir, "sandboxes", sid, "layer.img")
    assert os.path.isfile(image)
    with open(image, "r+b") as f:  # wipe the superblock: the image no longer mounts
        f.write(b"\0" * (1 << 20))
    failed_start(g, sid, image)


@pytest.mark.timeout(300)
def test_agent_runsc_cannot_exec_names_no_runsc_output(g):
    sid = stopped_sandbox(g)
    good = g.agent + ".good"
    shutil.copy(g.agent, good)
    try:
        with open(g.agent, "wb") as f:  # still executable, but no program runsc can start
            f.write(b"\x7fELF not really\n")
        failed_start(g, sid, sid)
    finally:
        os.replace(good, g.agent)
    r = g.req("POST", f"/v1/sandboxes/{sid}/start", {})
    assert r.status == 200 and r.json()["state"] == "running", r
