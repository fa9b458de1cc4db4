"""120 create/delete cycles (WR_CHURN_CYCLES) leave nothing behind on the host.

Counted before and after: mounts (in the daemon's mount namespace) that mention the state
directory; processes below the daemon; the daemon's open fds; and the entries of every directory
directly in the state directory (sandbox dirs, runsc state, ...). And for every sandbox id the
test made: no cgroup directory, mount, host process command line or state-dir file that names
it. (Only what is this daemon's is compared: another daemon may run on the same host.) DELETE answers only once the sandbox is gone (api/openapi.yaml), so everything but
process reaping is checked right after the last DELETE.
"""

import glob
import os
import time

import pytest

CYCLES = int(os.environ.get("WR_CHURN_CYCLES", "120"))
IMAGE_DIRS = {"images", "image"}


def mounts(pid):
    """Mount lines as the daemon sees them (its mount namespace may be its own)."""
    with open(f"/proc/{pid}/mountinfo") as f:
        return f.read().splitlines()


def cgroup_dirs():
    out = []
    for parent in glob.glob("/sys/fs/cgroup/*/withruntime") + glob.glob(
            "/sys/fs/cgroup/withruntime"):
        for root, dirs, _ in os.walk(parent):
            out.extend(os.path.join(root, d) for d in dirs)
    return sorted(out)


def state_entries(state_dir):
    out = {}
    for name in sorted(os.listdir(state_dir)):
        p = os.path.join(state_dir, name)
        if os.path.isdir(p) and not os.path.islink(p) and name not in IMAGE_DIRS:
            out[name] = sorted(os.listdir(p))
    return out


def processes(daemon):
    procs = []
    for pid in daemon.descendants():
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            state = stat[stat.rindex(")") + 2]
        except (OSError, ValueError):
            continue
        procs.append((comm, state))
    return sorted(procs)


def host_cmdlines():
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return out


def fd_count(daemon):
    return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))


def snapshot(daemon):
    """What belongs to this daemon alone (other daemons may run on the same host)."""
    return {
        "mounts": sorted(ln.split(" ", 4)[4] for ln in mounts(daemon.proc.pid)
                         if daemon.state_dir in ln),
        "state": state_entries(daemon.state_dir),
    }


def traces(sid, daemon):
    """Every place a sandbox id could linger on the host."""
    found = [f"cgroup {p}" for p in cgroup_dirs() if sid in p]
    found += [f"mount {ln}" for ln in mounts(daemon.proc.pid) if sid in ln]
    found += [f"process {c}" for c in host_cmdlines() if sid in c]
    for root, dirs, files in os.walk(daemon.state_dir):
        if os.path.relpath(root, daemon.state_dir).split(os.sep)[0] in IMAGE_DIRS:
            dirs[:] = []
            continue
        found += [f"file {os.path.join(root, n)}" for n in dirs + files if sid in n]
    return found


def cycle(client, i, ids):
    sb = client.create(memory_mib=256, metadata={"cycle": str(i)})
    ids.append(sb["id"])
    assert sb["state"] == "running"
    if i % 25 == 0:
        r = client.exec(sb["id"], f"echo cycle-{i}")
        assert r["stdout"] == f"cycle-{i}\n"
    assert client.delete(sb["id"])["deleted"] is True


@pytest.mark.slow
def test_create_delete_cycles_leave_nothing(client, daemon):
    ids = []
    # warm up: whatever the daemon sets up lazily on first use is there before counting
    for i in range(3):
        cycle(client, i, ids)
    ids_before = [s["id"] for s in client.list()]
    before = snapshot(daemon)
    procs_before = processes(daemon)
    fds_before = fd_count(daemon)

    # while a sandbox exists the probes do see it: they can fail
    sid = client.create(memory_mib=256)["id"]
    t = traces(sid, daemon)
    assert any(x.startswith("cgroup") for x in t), t
    assert any(x.startswith("process") for x in t), t
    assert any(x.startswith("file") for x in t), t
    assert snapshot(daemon) != before
    assert len(processes(daemon)) > len(procs_before)
    client.delete(sid)
    ids.append(sid)

    for i in range(CYCLES):
        cycle(client, i, ids)

    after = snapshot(daemon)
    assert after["mounts"] == before["mounts"]
    assert after["state"] == before["state"]
    assert [s["id"] for s in client.list()] == ids_before
    left = [x for sid in ids for x in traces(sid, daemon)]
    assert not left, left[:20]

    # processes: give the reaper a moment to collect exits it has been told of
    deadline = time.monotonic() + 5
    while processes(daemon) != procs_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes(daemon) == procs_before
    assert fd_count(daemon) <= fds_before + 4, (fds_before, fd_count(daemon))
