"""Host files a sandbox can make grow: the agent's stderr is agent.log in the sandbox's host
directory, and a command can make the agent write lines at will (each `kill -STOP 1` makes it
log that it continued its namespace's init). The agent rate-limits its own lines, and the
daemon, the file's only writer (the agent's stderr is a pipe to it), holds it to
`serve --max-agent-log-kib` at every write. (A flood far past the cap: test_failures.py.)
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from test_admission import limited  # noqa: E402,F401 - the fixture

# Makes the agent log as fast as it can: 2,000 stops of its namespace's init; the agent
# continues it each time and would write a line for each (thousands a second).
ROUND = "for i in $(seq 2000); do kill -STOP 1; done"


def agent_log(d, sid):
    return os.path.join(d.state_dir, "sandboxes", sid, "agent.log")


def storm_round(d, sid):
    r = d.req("POST", f"/v1/sandboxes/{sid}/exec", {"command": ROUND, "timeout_seconds": 120},
              timeout=180)
    assert r.status == 200 and r.json()["exit_code"] == 0, r


def assert_healthy(d, sid):
    d.assert_alive()
    r = d.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["echo", "ok"]})
    assert r.status == 200 and r.json()["stdout"] == "ok\n", r
    assert d.sandbox(sid)["state"] == "running"


def test_the_agent_rate_limits_its_own_lines(limited):
    d = limited(driver="gvisor")
    sid = d.req("POST", "/v1/sandboxes", {"memory_mib": 256, "disk_mib": 256}).json()["id"]
    path = agent_log(d, sid)
    before = os.path.getsize(path)
    t0 = time.monotonic()
    # Rounds until the agent has had to drop lines (a positive control: it saw more stops than
    # it may log); on an idle host the first round does it.
    for _ in range(30):
        storm_round(d, sid)
        with open(path, "rb") as f:
            f.seek(before)
            if b"event=log.suppressed" in f.read():
                break
    elapsed = time.monotonic() - t0
    with open(path, "rb") as f:
        f.seek(before)
        lines = f.read().splitlines()
    dropped = sum(int(x.rsplit(b"lines=", 1)[1]) for x in lines if b"event=log.suppressed" in x)
    assert dropped > 0, lines[-5:]
    continued = [x for x in lines if b"event=agent.pidns_continue" in x]
    assert len(continued) >= 45, len(continued)  # the burst (less the summaries) went through
    # a burst of 50, then 5 a second (+1 for a token refilled while the file was read)
    assert len(lines) <= 50 + 5 * elapsed + 1, (len(lines), elapsed)
    assert_healthy(d, sid)


def test_the_daemon_holds_agent_log_to_its_cap(limited):
    cap = 2 << 10
    d = limited("--max-agent-log-kib", "2", driver="gvisor")
    sid = d.req("POST", "/v1/sandboxes", {"memory_mib": 256, "disk_mib": 256}).json()["id"]
    path = agent_log(d, sid)
    # The agent's burst of 50 lines (~4 KiB) alone passes 2 KiB; then it writes ~400 bytes a
    # second at most. Storm and watch until the file has been cut, and a round more.
    biggest, cut_at = 0, None
    deadline = time.monotonic() + 180
    rounds_after = 0
    while cut_at is None or rounds_after < 2:
        rounds_after += cut_at is not None
        storm_round(d, sid)
        size = os.path.getsize(path)
        biggest = max(biggest, size)
        with open(path, "rb") as f:
            if cut_at is None and b"event=log.truncated" in f.read():
                cut_at = time.monotonic()
        assert time.monotonic() < deadline, (biggest, d.log_tail(20))
    assert b"event=sandbox.log_cut" in d.log_bytes()
    # the cap itself: the file is cut before a write would pass it
    assert biggest <= cap, biggest
    assert os.path.getsize(path) <= cap
    assert_healthy(d, sid)
