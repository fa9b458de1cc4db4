"""Admission control: creates and starts the host has no room for are refused with 503
`capacity`, `Retry-After` and a message naming what is short and what frees it
(docs/lifecycle.md, "Admission"). Room is what sandboxes use, not their limits: the seed's
default shape (2 vCPU, 4096 MiB, 10 GiB) fits many times over on a host where the sum of its
limits does not.

Each test runs a daemon of its own with small limits: the fake driver where no real sandbox is
needed (counts, memory, disk), gVisor for a real sandbox, a loop device and a real disk image.
"""

import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from conftest import WR_AGENT, WR_BIN  # noqa: E402
from test_failures import DaemonBroken, FakeDaemon, create, exec_ok  # noqa: E402

HOST_MIB = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)


class LimitedDaemon(FakeDaemon):
    """A daemon of the test's own with extra `serve` flags; driver "fake" or "gvisor"."""

    def __init__(self, flags, driver="fake"):
        super().__init__(WR_AGENT)
        self.flags = list(flags)
        self.driver = driver

    def driver_args(self):
        return super().driver_args() if self.driver == "fake" else ["--driver", self.driver]

    def serve_argv(self):
        return super().serve_argv() + self.flags

    def assert_alive(self):
        assert self.proc.poll() is None, f"the daemon died:\n{self.log_tail()}"
        r = self.req("GET", "/v1/health", validate=False)
        assert r.status == 200 and r.json()["driver"] == self.driver, r


@pytest.fixture
def limited():
    """Starts a daemon with the given flags; stops and checks it after the test."""
    made = []

    def make(*flags, driver="fake"):
        d = LimitedDaemon(flags, driver)
        made.append(d)
        d.start()
        return d

    yield make
    problems = []
    for d in made:
        try:
            d.assert_alive()
            d.delete_all()
            d.assert_nothing_left()
        except AssertionError as e:
            problems.append(f"{e}\n{d.log_tail(30)}")
        problems += d.finish()
        shutil.rmtree(d.tmp, ignore_errors=True)
        shutil.rmtree(d.logdir, ignore_errors=True)
    if problems:
        raise DaemonBroken("\n".join(problems))


def refused(r, *words):
    """Checks a 503 `capacity` answer with a Retry-After whose message has every one of words;
    returns the message."""
    assert r.status == 503, r
    err = r.json()["error"]
    assert err["code"] == "capacity", r
    assert r.headers.get("retry-after", "").isdigit(), r.headers
    assert int(r.headers["retry-after"]) >= 1, r.headers
    for w in words:
        assert w in err["message"], (w, err["message"])
    return err["message"]


def ids(d):
    return sorted(sb["id"] for sb in d.req("GET", "/v1/sandboxes").json()["sandboxes"])


def free_mib(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // (1 << 20)


# ---- counts ----


def test_running_sandboxes_are_capped_and_a_stop_makes_room(limited):
    d = limited("--max-running", "2")
    a = create(d, memory_mib=128).json()["id"]
    create(d, memory_mib=128)
    refused(create(d, 503, memory_mib=128),
            "too many running sandboxes: 2 are running or starting", "--max-running 2")
    assert len(ids(d)) == 2  # nothing was made for the refused one
    assert d.req("POST", f"/v1/sandboxes/{a}/stop").status == 200
    c = create(d, memory_mib=128).json()["id"]
    # the stopped one cannot start while two others run
    refused(d.req("POST", f"/v1/sandboxes/{a}/start"), "--max-running 2")
    assert d.sandbox(a)["state"] == "stopped"
    assert d.req("DELETE", f"/v1/sandboxes/{c}").status == 200
    assert d.req("POST", f"/v1/sandboxes/{a}/start").json()["state"] == "running"


def test_concurrent_creates_never_overshoot(limited):
    d = limited("--max-running", "3")
    answers = []
    lock = threading.Lock()

    def one():
        r = d.req("POST", "/v1/sandboxes", {"memory_mib": 128}, timeout=60)
        with lock:
            answers.append(r)

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status for r in answers)
    assert statuses == [201] * 3 + [503] * 7, [(r.status, r.body[:200]) for r in answers]
    for r in answers:
        if r.status == 503:
            refused(r, "--max-running 3")
    assert len(ids(d)) == 3
    # counted as refused (before anything was made), not as failed creates
    text = d.admin.request("GET", "/metrics", validate=False).body.decode()
    assert 'withruntime_sandbox_creates_total{result="refused"} 7\n' in text, text
    assert 'withruntime_sandbox_creates_total{result="failed"} 0\n' in text, text


def test_kept_sandboxes_are_capped_but_starting_a_kept_one_is_not(limited):
    d = limited("--max-sandboxes", "2")
    a = create(d, memory_mib=128).json()["id"]
    b = create(d, memory_mib=128).json()["id"]
    for sid in (a, b):
        assert d.req("POST", f"/v1/sandboxes/{sid}/stop").status == 200
    refused(create(d, 503, memory_mib=128), "the daemon keeps 2", "--max-sandboxes",
            "withruntime sandbox prune")
    assert d.req("POST", f"/v1/sandboxes/{a}/start").json()["state"] == "running"
    assert d.req("DELETE", f"/v1/sandboxes/{b}").status == 200
    create(d, memory_mib=128)


# ---- memory ----


def test_total_memory_is_capped_at_host_memory_times_the_overcommit(limited):
    d = limited("--memory-overcommit", "0.1")
    budget = int(HOST_MIB * 0.1)
    first = budget - 100
    assert first >= 128, HOST_MIB
    a = create(d, memory_mib=first).json()["id"]
    refused(create(d, 503, memory_mib=200),
            f"not enough memory: running sandboxes have {first} MiB and this one asks 200 MiB",
            f"the limit is {budget} MiB (host memory {HOST_MIB} MiB x --memory-overcommit 0.1)")
    assert d.req("DELETE", f"/v1/sandboxes/{a}").status == 200
    create(d, memory_mib=200)


def test_cli_exits_6_with_the_message_when_there_is_no_room(limited):
    d = limited("--memory-overcommit", "0.1")
    budget = int(HOST_MIB * 0.1)
    r = subprocess.run([WR_BIN, "sandbox", "create", "--memory", str(budget + 1)],
                       env=d.cli_env(), capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 6, r
    assert r.stdout == "", r
    assert "not enough memory: running sandboxes have 0 MiB and this one asks" in r.stderr, r
    assert "--memory-overcommit 0.1" in r.stderr, r
    assert ids(d) == []


def test_memory_of_stopped_sandboxes_is_not_counted_until_they_start(limited):
    d = limited("--memory-overcommit", "0.1")
    budget = int(HOST_MIB * 0.1)
    a = create(d, memory_mib=budget - 100).json()["id"]
    assert d.req("POST", f"/v1/sandboxes/{a}/stop").status == 200
    b = create(d, memory_mib=budget - 100).json()["id"]
    refused(d.req("POST", f"/v1/sandboxes/{a}/start"), "not enough memory",
            f"running sandboxes have {budget - 100} MiB")
    assert d.sandbox(a)["state"] == "stopped"
    assert d.req("POST", f"/v1/sandboxes/{b}/stop").status == 200
    assert d.req("POST", f"/v1/sandboxes/{a}/start").json()["state"] == "running"


# ---- disk ----


def test_running_disks_are_capped_at_free_space_less_the_reserve(limited, tmp_path):
    # About 10 GiB promised-able: (free - reserve) x 0.1 ~ 1000 MiB, so one 600 MiB disk fits
    # and a second does not, whatever other processes write meanwhile (up to ~4 GiB).
    free = free_mib(tmp_path)
    reserve = free - 10000
    assert reserve > 0, f"needs 10 GB free on {tmp_path}"
    d = limited("--disk-overcommit", "0.1", "--disk-reserve-mib", str(reserve))
    a = create(d, memory_mib=128, disk_mib=600).json()["id"]
    msg = refused(create(d, 503, memory_mib=128, disk_mib=600),
                  "not enough disk: running sandboxes' disks total 600 MiB and this one asks "
                  "600 MiB", f"MiB free - {reserve} MiB reserve) x --disk-overcommit 0.1",
                  "ask a smaller disk_mib")
    assert "/" not in msg.replace("MiB free - ", ""), msg  # no host path in an API error
    # a stopped sandbox counts what its files hold, not its disk_mib
    assert d.req("POST", f"/v1/sandboxes/{a}/stop").status == 200
    b = create(d, memory_mib=128, disk_mib=600).json()["id"]
    # ... but starting it again makes its disk_mib a running one's
    refused(d.req("POST", f"/v1/sandboxes/{a}/start"), "not enough disk")
    assert d.sandbox(a)["state"] == "stopped"
    assert d.req("DELETE", f"/v1/sandboxes/{b}").status == 200
    assert d.req("POST", f"/v1/sandboxes/{a}/start").json()["state"] == "running"


def test_stopped_default_shape_sandboxes_do_not_block_a_create(limited, tmp_path):
    # Room for three running 10 GiB disks: (free - reserve) x 1 ~ 30 GiB. Counted by their
    # limits, the fourth create after three stopped ones was refused; stopped ones hold
    # what their files hold, so as many as kept may be stopped.
    free = free_mib(tmp_path)
    reserve = free - 30000
    assert reserve > 0, f"needs 30 GB free on {tmp_path}"
    d = limited("--disk-overcommit", "1", "--disk-reserve-mib", str(reserve))
    for _ in range(6):
        sid = create(d).json()["id"]  # the default shape: 2 vCPU, 4096 MiB, 10 GiB
        assert d.sandbox(sid)["disk_mib"] == 10240
        assert d.req("POST", f"/v1/sandboxes/{sid}/stop").status == 200
    sid = create(d).json()["id"]
    assert exec_ok(d, sid, "echo", "hi")["stdout"] == "hi\n"
    assert len(ids(d)) == 7


# ---- single requests bigger than the host ----


def test_one_sandbox_bigger_than_the_host_is_refused(limited):
    d = limited()
    if HOST_MIB < 65536:
        refused(create(d, 503, memory_mib=65536),
                f"memory_mib 65536 is more than this host's memory ({HOST_MIB} MiB)")
    free = free_mib(d.state_dir)
    assert free < 1048576 - 2048, "this host has more than 1 TiB free: pick a bigger disk_mib"
    refused(create(d, 503, disk_mib=1048576),
            "disk_mib 1048576 is more than the state directory's filesystem can hold",
            "MiB free, 2048 MiB of it kept in reserve")
    assert ids(d) == []


def test_serve_rejects_bad_limits(tmp_path):
    import subprocess

    from conftest import WR_BIN
    for flag, value in (("--max-running", "0"), ("--memory-overcommit", "-1"),
                        ("--disk-overcommit", "abc"), ("--max-loop-devices", "1x")):
        r = subprocess.run([WR_BIN, "serve", "--state-dir", str(tmp_path), flag, value],
                           capture_output=True, timeout=30)
        assert r.returncode == 2, (flag, r)
        assert flag.encode() in r.stderr, r.stderr
    r = subprocess.run([WR_BIN, "serve", "--help"], capture_output=True, timeout=30)
    for flag in (b"--max-running", b"--max-sandboxes", b"--memory-overcommit",
                 b"--disk-overcommit", b"--disk-reserve-mib", b"--max-loop-devices"):
        assert flag in r.stdout, flag


# ---- with gVisor: a real sandbox, its loop device and its disk image ----


def test_gvisor_limits_with_real_sandboxes(limited):
    d = limited("--max-running", "1", driver="gvisor")
    # bigger than the host: refused before anything is made (no 1 TiB sparse image)
    refused(create(d, 503, disk_mib=1048576), "disk_mib 1048576 is more than")
    assert os.listdir(os.path.join(d.state_dir, "sandboxes")) == []
    a = create(d, memory_mib=256, disk_mib=256).json()["id"]
    r = d.req("POST", f"/v1/sandboxes/{a}/exec", {"argv": ["echo", "hi"]})
    assert r.json()["stdout"] == "hi\n", r
    refused(create(d, 503, memory_mib=256, disk_mib=256), "--max-running 1")
    assert ids(d) == [a]
    assert d.req("DELETE", f"/v1/sandboxes/{a}").status == 200
    b = create(d, memory_mib=256, disk_mib=256).json()["id"]
    assert d.req("DELETE", f"/v1/sandboxes/{b}").status == 200


def test_gvisor_loop_devices_are_capped(limited):
    # Each running gvisor sandbox holds one loop device, and the count is the host's (other
    # processes may hold some): with a cap of 1, a second sandbox is always refused, whether
    # the first got the one device or was refused itself.
    d = limited("--max-loop-devices", "1", driver="gvisor")
    first = d.req("POST", "/v1/sandboxes", {"memory_mib": 256, "disk_mib": 256})
    if first.status == 201:
        r = d.req("POST", f"/v1/sandboxes/{first.json()['id']}/exec", {"argv": ["true"]})
        assert r.json()["exit_code"] == 0, r
    else:
        refused(first, "--max-loop-devices")
    msg = refused(create(d, 503, memory_mib=256, disk_mib=256), "no loop device for its disk",
                  "bound on this host", "the limit is 1 (--max-loop-devices)")
    if first.status == 201:
        assert "0 are bound" not in msg, msg


def test_twenty_default_shape_sandboxes_at_once_all_run(limited):
    # (~3 s here for the 20, idle host)
    # The seed's default shape, 20 at once, with the daemon's default limits: counted by
    # their limits (80 GiB of memory, 200 GiB of disk) they were refused past the eighth on a
    # 24 GiB host; each idle one uses ~17.5 MiB and ~1 MiB of disk.
    d = limited(driver="gvisor")

    def one(_):
        r = d.req("POST", "/v1/sandboxes", {"cpus": 2, "memory_mib": 4096, "disk_mib": 10240},
                  timeout=180)
        if r.status != 201:
            return r
        sid = r.json()["id"]
        return d.req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["echo", sid]}, timeout=60)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(one, range(20)))
    bad = [(r.status, r.body[:300]) for r in answers if r.status != 200]
    assert not bad, bad
    made = ids(d)
    assert len(made) == 20
    assert sorted(r.json()["stdout"].strip() for r in answers) == made
