"""A daemon that survives a crash (issue 3; docs/lifecycle.md "Daemon restarts").

These tests `kill -9` a daemon, so they run one of their own: its own state directory beside the
session's, its own port and socket, the session's image (its `images` is a symlink to the
session's, so no second build), the same binaries (WR_BIN, WR_AGENT).

After a crash the next daemon on the same state directory must account for every sandbox: each
is stopped cleanly (reason `daemon_restart`, files kept) or adopted still running, a lease that
ended meanwhile takes effect, and a later DELETE leaves nothing on the host.
"""

import calendar
import concurrent.futures
import glob
import os
import shutil
import signal
import tempfile
import time

import pytest

import conftest

N_SANDBOXES = 10


def epoch(ts):
    """Seconds since the epoch of an RFC 3339 UTC timestamp of the API."""
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))


def mount_points(pid="self"):
    """Mount points in a process's mount namespace."""
    with open(f"/proc/{pid}/mountinfo") as f:
        return [ln.split(" ")[4] for ln in f.read().splitlines()]


def mounts_under(path, pid="self"):
    return [m for m in mount_points(pid) if m == path or m.startswith(path + "/")]


def host_processes_naming(word):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if word in cmd:
            out.append(f"{d}: {cmd[:200]}")
    return out


def loop_devices_backed_under(path):
    out = []
    for f in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(f) as fh:
                backing = fh.read().strip()
        except OSError:
            continue
        if backing.startswith(path + "/"):
            out.append(f"{f.split('/')[3]} -> {backing}")
    return out


def host_traces(d, sid, *, files_too=True):
    """Whatever of sandbox sid is on the host: mounts, loop devices, processes, cgroups, runsc
    state, its directory."""
    sb_dir = os.path.join(os.path.realpath(d.state_dir), "sandboxes", sid)
    found = [f"mount {m}" for m in mounts_under(sb_dir)]
    found += [f"loop device {x}" for x in loop_devices_backed_under(sb_dir)]
    if d.proc is not None and d.proc.poll() is None:
        found += [f"mount (daemon's namespace) {m}" for m in mounts_under(sb_dir, d.proc.pid)]
    found += [f"process {p}" for p in host_processes_naming(sid)]
    found += [f"cgroup {p}" for p in glob.glob(f"/sys/fs/cgroup/*/withruntime/{sid}")]
    found += [f"runsc state {p}" for p in glob.glob(os.path.join(d.state_dir, "runsc", f"*{sid}*"))]
    if files_too and os.path.lexists(sb_dir):
        found.append(f"directory {sb_dir}")
    return found


@pytest.fixture(scope="module")
def own_daemon(daemon):
    """A daemon of this module's own (the session's `daemon` fixture builds the image)."""
    parent = os.path.dirname(os.path.abspath(daemon.state_dir))
    state = tempfile.mkdtemp(prefix="wr-restart-", dir=parent)
    os.symlink(os.path.join(os.path.abspath(daemon.state_dir), "images"),
               os.path.join(state, "images"))
    d = conftest.Daemon(state_dir=state)
    d.start()
    yield d
    leftovers, status = d.stop()
    log = d.log_bytes()
    bad = [m.decode() for m in conftest.SANITIZER_MARKS if m in log]
    mounted = mounts_under(state)
    if not mounted:
        shutil.rmtree(state, ignore_errors=True)  # `images` is a symlink: removed, not followed
    assert not mounted, f"mounts left under {state}: {mounted}"
    assert not leftovers, f"sandboxes left by the tests (deleted now): {leftovers}"
    assert not bad, f"sanitizer reports in {d.log_path}:\n{d.log_tail(200)}"
    assert status == 0, f"daemon did not exit cleanly on SIGTERM: {status}\n{d.log_tail()}"
    shutil.rmtree(d.logdir, ignore_errors=True)


def crash(d):
    """kill -9 the daemon and reap it."""
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(timeout=30)
    assert d.proc.returncode == -signal.SIGKILL


def restart(d):
    d.start(clean=False)


def get(d, sid, expect=200):
    return d.client.expect(expect, "GET", f"/v1/sandboxes/{sid}").json()


def events(d, sid):
    return [(e["state"], e["reason"]) for e in
            d.client.expect(200, "GET", f"/v1/sandboxes/{sid}/events").json()["events"]]


def make(d, i):
    c = d.client
    sb = c.create(memory_mib=256, metadata={"n": str(i)})
    sid = sb["id"]
    c.write_file(sid, "note.txt", f"sandbox {i}\n".encode())
    c.exec(sid, f"mkdir -p /srv/data && echo {sid} > /srv/data/id && sleep 1000 > /dev/null 2>&1 &")
    return sid


def test_kill9_with_ten_sandboxes_then_restart(own_daemon):
    d = own_daemon
    c = d.client
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda i: make(d, i), range(N_SANDBOXES)))
    for sid in ids:
        assert get(d, sid)["state"] == "running"
    # the probes see a running sandbox's mounts, processes and cgroups: they can fail
    seen = {t.split(" ")[0] for t in host_traces(d, ids[0])}
    assert {"mount", "process", "cgroup", "directory"} <= seen, seen
    assert "sleep 1000" in c.exec(ids[0], "ps -eo args")["stdout"]

    crash(d)
    restart(d)

    listed = {s["id"]: s for s in c.list()}
    assert set(ids) <= set(listed), f"sandboxes lost in the crash: {set(ids) - set(listed)}"
    for i, sid in enumerate(ids):
        sb = get(d, sid)
        assert sb["metadata"] == {"n": str(i)}
        if sb["state"] == "stopped":
            # stopped cleanly (docs/lifecycle.md): nothing of it runs or stays mounted
            assert sb["state_reason"] == "daemon_restart", sb
            assert ("stopped", "daemon_restart") in events(d, sid)
            assert host_traces(d, sid, files_too=False) == [], sid
            again = c.expect(200, "POST", f"/v1/sandboxes/{sid}/start").json()
            assert again["state"] == "running"
            # a fresh start: what ran before the crash does not run now
            ps = c.exec(sid, "ps -eo args")["stdout"]
            assert "ps -eo args" in ps and "sleep 1000" not in ps, ps
        else:
            assert sb["state"] == "running", f"neither stopped nor adopted: {sb}"
        # its files are there and it is usable
        assert c.read_file(sid, "note.txt") == f"sandbox {i}\n".encode()
        r = c.exec(sid, "cat /srv/data/id; echo usable")
        assert r["stdout"] == f"{sid}\nusable\n", r

    for sid in ids:
        assert c.delete(sid)["deleted"] is True
        assert get(d, sid, expect=404)
        assert host_traces(d, sid) == [], f"{sid} left traces after DELETE"
    assert os.listdir(os.path.join(d.state_dir, "sandboxes")) == []


def test_lease_that_ended_while_the_daemon_was_down(own_daemon):
    d = own_daemon
    c = d.client
    gone = c.create(memory_mib=256, timeout_seconds=600, on_lease_end="delete")["id"]
    kept = c.create(memory_mib=256, timeout_seconds=600, on_lease_end="stop")["id"]
    c.write_file(kept, "kept.txt", b"kept\n")
    # short leases only now, so they cannot end while the daemon is still up (however slow the
    # creates were); the positive control: both are running with their leases still ahead
    ends = []
    for sid in (gone, kept):
        sb = c.expect(200, "POST", f"/v1/sandboxes/{sid}/timeout", {"timeout_seconds": 2}).json()
        assert sb["state"] == "running", sb
        ends.append(epoch(sb["lease_ends_at"]))
    assert time.time() < min(ends), "a lease ended before the crash"
    crash(d)
    # wait on the condition (both leases over by the clock), not for a fixed time
    # (lease_ends_at is rounded up to the second, so past it the lease is surely over)
    while time.time() <= max(ends):
        time.sleep(0.1)
    restart(d)

    # the delete took effect as the daemon started
    r = c.request("GET", f"/v1/sandboxes/{gone}")
    assert r.status == 404 and r.error[0] == "not_found", r
    assert gone not in {s["id"] for s in c.list()}
    assert host_traces(d, gone) == []

    # the stop too: stopped because of its lease, files kept
    sb = get(d, kept)
    assert sb["state"] == "stopped" and sb["state_reason"] == "lease_ended", sb
    c.expect(200, "POST", f"/v1/sandboxes/{kept}/timeout", {"timeout_seconds": 600})
    c.expect(200, "POST", f"/v1/sandboxes/{kept}/start")
    assert c.read_file(kept, "kept.txt") == b"kept\n"
    c.delete(kept)
    assert host_traces(d, kept) == []


def test_a_stop_right_after_an_answer_keeps_its_audit_entry(own_daemon):
    """The audit trail is written just after the answers it records, in batches: a SIGTERM
    straight after an answer still writes its entry, and a read of the trail sees every
    request already answered."""
    d = own_daemon
    c = d.client
    sid = c.create(memory_mib=256)["id"]
    try:
        c.write_file(sid, "a.txt", b"a")
        trail = d.admin.expect(200, "GET", "/v1/audit", query={"limit": "5"}).json()["entries"]
        assert [(e["method"], e["route"], e["sandbox_id"]) for e in trail[:1]] == \
            [("PUT", "/v1/sandboxes/{id}/files/content", sid)], trail
        c.write_file(sid, "b.txt", b"b")
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=60) == 0, d.log_tail()
        restart(d)
        trail = d.admin.expect(200, "GET", "/v1/audit", query={"limit": "5"}).json()["entries"]
        assert [(e["route"], e["sandbox_id"], e["status"]) for e in trail[:2]] == \
            [("/v1/sandboxes/{id}/files/content", sid, 200)] * 2, trail
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")
