"""Host files a sandbox can make grow: the agent's stderr is agent.log in the sandbox's host
directory, and a command can make the agent write lines at will (each `kill -STOP 1` makes it
log that it continued its namespace's init). The agent rate-limits its own lines, and the
daemon cuts the file past `serve --max-agent-log-kib` whatever wrote it.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from test_admission import limited  # noqa: E402,F401 - the fixture

# Makes the agent log as fast as it can for `secs` seconds; prints how many stops it sent.
STORM = ("n=0; end=$(( $(date +%s) + {secs} )); "
         "while [ $(date +%s) -lt $end ]; do "
         "for i in 1 2 3 4 5 6 7 8 9 10; do kill -STOP 1; kill -CONT 1; done; n=$((n+10)); "
         "done; echo $n")


def agent_log(d, sid):
    return os.path.join(d.state_dir, "sandboxes", sid, "agent.log")


def start_storm(d, sid, secs):
    r = d.req("POST", f"/v1/sandboxes/{sid}/exec",
              {"command": STORM.format(secs=secs), "background": True})
    assert r.status == 201, r
    return r.json()["id"]


def wait_storm(d, sid, cid, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        r = d.req("POST", f"/v1/sandboxes/{sid}/commands/{cid}/wait", {"timeout_seconds": 5})
        c = r.json()
        if c["state"] != "running":
            out = d.req("GET", f"/v1/sandboxes/{sid}/commands/{cid}/output").json()
            assert c["exit_code"] == 0, (c, out)
            return int(out["stdout"].strip())
        assert time.monotonic() < deadline, c


def assert_healthy(d, sid):
    d.assert_alive()
    r = d.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["echo", "ok"]})
    assert r.status == 200 and r.json()["stdout"] == "ok\n", r
    assert d.sandbox(sid)["state"] == "running"


def test_the_agent_rate_limits_its_own_lines(limited):
    d = limited(driver="gvisor")
    sid = d.req("POST", "/v1/sandboxes", {"memory_mib": 256, "disk_mib": 256}).json()["id"]
    before = os.path.getsize(agent_log(d, sid))
    t0 = time.monotonic()
    stops = wait_storm(d, sid, start_storm(d, sid, 6))
    elapsed = time.monotonic() - t0
    with open(agent_log(d, sid), "rb") as f:
        f.seek(before)
        lines = f.read().splitlines()
    continued = [x for x in lines if b"event=agent.pidns_continue" in x]
    # positive control: the agent saw (and logged) stops, and far more were sent than logged
    assert len(continued) >= 20, lines[-5:]
    assert stops > 3 * len(continued), (stops, len(continued))
    # a burst of 50, then 5 a second (+1 for a token refilled while the tail was read)
    assert len(lines) <= 50 + 5 * (elapsed + 1), (len(lines), elapsed)
    assert any(b"event=log.suppressed lines=" in x for x in lines), lines[-5:]
    assert_healthy(d, sid)


def test_the_daemon_cuts_agent_log_past_its_cap(limited):
    cap = 8 << 10
    d = limited("--max-agent-log-kib", "8", driver="gvisor")
    sid = d.req("POST", "/v1/sandboxes", {"memory_mib": 256, "disk_mib": 256}).json()["id"]
    path = agent_log(d, sid)
    cid = start_storm(d, sid, 20)
    # At 5 lines a second (~100 bytes each) after a burst of 50, the file passes 8 KiB within
    # seconds; the daemon looks every 2 s. Watch it while the storm lasts.
    biggest, cut = 0, False
    deadline = time.monotonic() + 120
    while True:
        size = os.path.getsize(path)
        biggest = max(biggest, size)
        with open(path, "rb") as f:
            cut = cut or b"event=log.truncated" in f.read()
        c = d.req("GET", f"/v1/sandboxes/{sid}/commands/{cid}").json()
        if c["state"] != "running":
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert cut, "the log was never cut"
    assert b"event=sandbox.log_cut" in d.log_bytes()
    # the cap, plus what 2 s between looks can add at the agent's rate (and its burst)
    assert biggest <= cap + (8 << 10), biggest
    assert os.path.getsize(path) <= cap + (8 << 10)
    assert_healthy(d, sid)
