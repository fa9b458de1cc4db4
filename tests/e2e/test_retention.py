"""Retention and prune: stopped (and failed) sandboxes are kept until deleted, until they have
been stopped for `serve --stopped-retention`, or until `withruntime sandbox prune` (POST
/v1/sandboxes/prune) removes those older than an age. Running sandboxes are never touched.

Daemons of the tests' own: the fake driver for the rules, gVisor for one real sandbox.
"""

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from conftest import WR_BIN  # noqa: E402
from test_admission import ids, limited  # noqa: E402,F401 - limited is a fixture
from test_failures import agent_pid, create  # noqa: E402


def prune(d, older_than=None, expect=200):
    body = {} if older_than is None else {"older_than_seconds": older_than}
    r = d.req("POST", "/v1/sandboxes/prune", body)
    assert r.status == expect, r
    return r.json()


def stop(d, sid):
    r = d.req("POST", f"/v1/sandboxes/{sid}/stop")
    assert r.status == 200 and r.json()["state"] == "stopped", r


def test_prune_removes_only_stopped_ones_older_than_the_age(limited):
    d = limited()
    old, new, running = (create(d, memory_mib=128).json()["id"] for _ in range(3))
    stop(d, old)
    time.sleep(6)  # `old` has been stopped 6 s; `new` is stopped just before the prune
    stop(d, new)
    res = prune(d, 5)
    assert res == {"deleted": [old], "errors": [], "older_than_seconds": 5}, res
    assert ids(d) == sorted([new, running])
    assert d.req("GET", f"/v1/sandboxes/{old}").status == 404
    assert b"reason=\"pruned\"" in d.log_bytes() or b"reason=pruned" in d.log_bytes()
    # without an age: every stopped one, never a running one
    res = prune(d)
    assert res["deleted"] == [new] and res["errors"] == [], res
    assert ids(d) == [running]
    assert d.sandbox(running)["state"] == "running"
    assert prune(d, 0)["deleted"] == []


def test_prune_removes_failed_sandboxes_too(limited):
    d = limited()
    sid = create(d, memory_mib=128).json()["id"]
    os.kill(agent_pid(d, sid), signal.SIGKILL)
    d.wait_state(sid, "failed")
    deadline = time.monotonic() + 30
    while True:  # its clean-up runs first; a busy sandbox is left alone
        res = prune(d, 0)
        if res["deleted"]:
            break
        assert time.monotonic() < deadline, res
        time.sleep(0.1)
    assert res["deleted"] == [sid], res
    assert ids(d) == []


def test_prune_rejects_bad_ages(limited):
    d = limited()
    for body in ({"older_than_seconds": -1}, {"older_than_seconds": "1d"},
                 {"older_than": 5}, {"older_than_seconds": 3153600001}):
        r = d.req("POST", "/v1/sandboxes/prune", body)
        assert r.status == 400 and r.json()["error"]["code"] == "invalid_request", (body, r)


def cli(d, *args):
    return subprocess.run([WR_BIN, "sandbox", *args], env=d.cli_env(), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_cli_prune(limited):
    d = limited()
    a = create(d, memory_mib=128).json()["id"]
    b = create(d, memory_mib=128).json()["id"]
    stop(d, a)
    r = cli(d, "prune", "--older-than", "1h")
    assert r.returncode == 0 and r.stdout == "", r
    r = cli(d, "prune", "--older-than", "0s")
    assert r.returncode == 0 and r.stdout == f"{a}\n", r
    assert ids(d) == [b]
    stop(d, b)
    r = cli(d, "prune", "--json")
    assert r.returncode == 0, r
    assert '"deleted": [\n    "' + b in r.stdout, r.stdout
    r = cli(d, "prune", "--older-than", "soon")
    assert r.returncode == 2 and "--older-than" in r.stderr, r
    r = cli(d, "prune", "--help")
    assert r.returncode == 0 and "withruntime sandbox prune --older-than 1d" in r.stdout, r
    assert "prune" in cli(d, "--help").stdout


def test_retention_deletes_a_stopped_sandbox_by_itself(limited):
    d = limited("--stopped-retention", "2s")
    kept = create(d, memory_mib=128).json()["id"]
    sid = create(d, memory_mib=128).json()["id"]
    stop(d, sid)
    deadline = time.monotonic() + 60
    while d.req("GET", f"/v1/sandboxes/{sid}").status != 404:
        assert time.monotonic() < deadline, d.sandbox(sid)
        time.sleep(0.2)
    log = d.log_bytes()
    assert f"event=retention.ended sandbox={sid}".encode() in log, d.log_tail()
    assert b'reason="retention_ended"' in log, d.log_tail()
    # the running one is untouched, however long it runs
    assert d.sandbox(kept)["state"] == "running"


def test_serve_takes_retention_as_a_duration(tmp_path):
    for bad in ("7 days", "-1", "1w", "", "99999999999d"):
        r = subprocess.run([WR_BIN, "serve", "--state-dir", str(tmp_path), "--stopped-retention",
                            bad], capture_output=True, timeout=30)
        assert r.returncode == 2 and b"--stopped-retention" in r.stderr, (bad, r)
    r = subprocess.run([WR_BIN, "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert "--stopped-retention DURATION" in r.stdout and "default 7d" in r.stdout, r.stdout


def test_prune_with_gvisor(limited):
    d = limited(driver="gvisor")
    sid = create(d, memory_mib=256, disk_mib=256).json()["id"]
    other = create(d, memory_mib=256, disk_mib=256).json()["id"]
    r = d.req("POST", f"/v1/sandboxes/{sid}/exec", {"command": "echo kept > f.txt"})
    assert r.json()["exit_code"] == 0, r
    stop(d, sid)
    assert os.path.exists(os.path.join(d.state_dir, "sandboxes", sid, "layer.img"))
    assert prune(d)["deleted"] == [sid]
    assert not os.path.exists(os.path.join(d.state_dir, "sandboxes", sid))
    r = d.req("POST", f"/v1/sandboxes/{other}/exec", {"argv": ["echo", "ok"]})
    assert r.json()["stdout"] == "ok\n", r
