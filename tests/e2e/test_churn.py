"""200 create/delete cycles leave nothing behind on the host.

Counted before and after: mounts (in the daemon's mount namespace) that mention the state
directory, and all of them; processes below the daemon; the daemon's open fds; cgroup
directories under every `withruntime` cgroup parent; and the entries of every directory directly
in the state directory (sandbox dirs, runsc state, ...). DELETE answers only once the sandbox is gone (api/openapi.yaml), so everything but
process reaping is checked right after the last DELETE.
"""

import glob
import os
import time

import pytest

CYCLES = int(os.environ.get("WR_CHURN_CYCLES", "200"))
IMAGE_DIRS = {"images", "image"}


def mounts(pid, state_dir):
    """Mounts as the daemon sees them (its mount namespace may be its own)."""
    with open(f"/proc/{pid}/mountinfo") as f:
        lines = f.read().splitlines()
    return len(lines), sorted(ln.split(" ", 4)[4] for ln in lines if state_dir in ln)


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


def fd_count(daemon):
    return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))


def snapshot(daemon):
    total_mounts, state_mounts = mounts(daemon.proc.pid, daemon.state_dir)
    return {
        "mounts": state_mounts,
        "total_mounts": total_mounts,
        "cgroups": cgroup_dirs(),
        "state": state_entries(daemon.state_dir),
    }


def cycle(client, i):
    sb = client.create(memory_mib=256, metadata={"cycle": str(i)})
    assert sb["state"] == "running"
    if i % 25 == 0:
        r = client.exec(sb["id"], f"echo cycle-{i}")
        assert r["stdout"] == f"cycle-{i}\n"
    assert client.delete(sb["id"])["deleted"] is True


@pytest.mark.slow
def test_create_delete_cycles_leave_nothing(client, daemon):
    # warm up: whatever the daemon sets up lazily on first use is there before counting
    for i in range(3):
        cycle(client, i)
    ids_before = [s["id"] for s in client.list()]
    before = snapshot(daemon)
    procs_before = processes(daemon)
    fds_before = fd_count(daemon)

    # while a sandbox exists the counters do move: the probes can see a sandbox at all
    sb = client.create(memory_mib=256)
    during = snapshot(daemon)
    assert during != before, "the leak probes see no trace of a running sandbox"
    assert len(processes(daemon)) > len(procs_before)
    client.delete(sb["id"])

    for i in range(CYCLES):
        cycle(client, i)

    after = snapshot(daemon)
    assert after["mounts"] == before["mounts"]
    assert after["total_mounts"] == before["total_mounts"]
    assert after["cgroups"] == before["cgroups"]
    assert after["state"] == before["state"]
    assert [s["id"] for s in client.list()] == ids_before

    # processes: give the reaper a moment to collect exits it has been told of
    deadline = time.monotonic() + 5
    while processes(daemon) != procs_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes(daemon) == procs_before
    assert fd_count(daemon) <= fds_before + 4, (fds_before, fd_count(daemon))
