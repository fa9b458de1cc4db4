#!/usr/bin/env python3
"""withruntime idle benchmark: what idle sandboxes cost the host, frozen and awake, in one run.

Under gVisor's systrap platform an idle sandbox polls (~2 % of a core each), so the daemon
freezes a sandbox idle for `serve --freeze-after` seconds (docs/lifecycle.md "Frozen"). This
measures, with two daemons of its own started here one after the other (each on a temporary
state directory under /var/tmp that links the image of --image-state-dir, talked to over its
Unix socket as root, the admin):

  * host CPU of N idle sandboxes together (N = --counts, default 20, 50, 200), over a
    --window second window (default 10): the sum of their cgroups' cpuacct.usage, the daemon's
    own CPU (/proc/PID/stat), and the host's busy time (/proc/stat, which includes whatever
    else runs on the machine); as a share of one core;
  * exec `true` round trip (p50 / p99 of --exec-n) on one active sandbox beside them, against
    the same on an empty host (only the active sandbox) measured first by the same daemon;

for the frozen daemon (`--freeze-after 1`) and the awake baseline (`--freeze-after 0`). The
awake baseline stops at --awake-max sandboxes (default 50): 200 awake idle sandboxes would
take about four cores, more than this 2-core host has, and the per-sandbox figure is linear.

Writes bench/results/idle.json (with the commit measured) and prints a summary with ratios.
Cleans up (sandboxes, daemons by PID, state directories) on any exit.
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run as base  # noqa: E402  (bench/run.py: write_json, percentile, stats_ms, ...)
from egress import UnixApi  # noqa: E402

log = base.log
ROOT = base.ROOT
CLK_TCK = os.sysconf("SC_CLK_TCK")
CPUACCT = "/sys/fs/cgroup/cpuacct/withruntime"
MEMCG = "/sys/fs/cgroup/memory/withruntime"


class IdleDaemon:
    """`withruntime serve` on a fresh state directory linking the built image."""

    def __init__(self, args, freeze_after):
        self.args = args
        self.freeze_after = freeze_after
        self.state_dir = tempfile.mkdtemp(prefix=f"wr-idle-bench-{freeze_after}-",
                                          dir="/var/tmp")
        os.symlink(os.path.join(os.path.abspath(args.image_state_dir), "images"),
                   os.path.join(self.state_dir, "images"))
        self.sock = os.path.join(self.state_dir, "withruntime.sock")
        self.log_path = os.path.join(self.state_dir, "daemon.log")
        self.api = UnixApi(self.sock)
        self.proc = None
        self.live = set()
        self.lock = threading.Lock()

    def start(self):
        argv = [self.args.bin, "serve", "--state-dir", self.state_dir, "--listen", "none",
                "--socket", self.sock, "--agent", self.args.agent,
                "--freeze-after", str(self.freeze_after),
                "--max-running", str(max(self.args.counts) + 10),
                "--max-sandboxes", str(max(self.args.counts) + 100)]
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited at start-up ({self.proc.returncode})")
            try:
                self.api.call("GET", "/v1/health", timeout=2)
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("daemon did not answer /v1/health in 60 s")
            time.sleep(0.1)

    def create(self):
        sb = self.api.call("POST", "/v1/sandboxes",
                           {"memory_mib": self.args.memory_mib, "cpus": 1, "disk_mib": 256,
                            "timeout_seconds": 7200})
        with self.lock:
            self.live.add(sb["id"])
        return sb["id"]

    def delete(self, sid):
        try:
            self.api.call("DELETE", f"/v1/sandboxes/{sid}", timeout=120)
        except (OSError, RuntimeError) as e:
            log(f"delete {sid}: {e}")
        with self.lock:
            self.live.discard(sid)

    def cpu_seconds(self):
        """The daemon process's own CPU time so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self):
        for sid in list(self.live):
            self.delete(sid)
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.state_dir, ignore_errors=True)  # `images` is a symlink


def ratio(a, b):
    return round(a / b, 2) if a and b else None


def in_batches(n, fn, width=8):
    """fn() n times, width at once; returns the results."""
    out, errors = [], []
    lock = threading.Lock()
    todo = list(range(n))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
            try:
                r = fn()
                with lock:
                    out.append(r)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def cgroup_sum(ids, path_fmt):
    """The sum of one integer file over the sandboxes' cgroups (path_fmt % id); missing ones
    (a sandbox gone meanwhile) count 0."""
    total = 0
    for sid in ids:
        try:
            with open(path_fmt % sid) as f:
                total += int(f.read())
        except OSError:
            pass
    return total


def cgroup_cpu_ns(ids):
    return cgroup_sum(ids, CPUACCT + "/%s/cpuacct.usage")


def host_busy():
    """(busy, total) jiffies from /proc/stat's cpu line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def mem_available():
    """The host's MemAvailable, bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def cgroup_mem_bytes(ids):
    """The sum of the sandboxes' memory cgroups' usage (their processes' memory plus the page
    cache they brought in)."""
    return cgroup_sum(ids, MEMCG + "/%s/memory.usage_in_bytes")


def pss_bytes(pids):
    """The sum of the processes' proportional set sizes (shared pages split among sharers)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def memory(ids, daemon_pid, mem_before):
    """Density: host memory per idle sandbox, three ways."""
    n = max(len(ids), 1)
    used = mem_before - mem_available()
    cg = cgroup_mem_bytes(ids)
    rss = 0
    try:
        with open(f"/proc/{daemon_pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"host_memavailable_drop_mib_per_sandbox": round(used / n / 2**20, 2),
            "cgroup_usage_mib_per_sandbox": round(cg / n / 2**20, 2),
            "daemon_rss_mib": round(rss / 2**20, 1)}


def cpu_window(d, ids, seconds):
    """CPU over a window: the idle sandboxes' cgroups, the daemon, the host; % of one core."""
    c0, d0, (b0, t0) = cgroup_cpu_ns(ids), d.cpu_seconds(), host_busy()
    w0 = time.monotonic()
    time.sleep(seconds)
    c1, d1, (b1, t1) = cgroup_cpu_ns(ids), d.cpu_seconds(), host_busy()
    wall = time.monotonic() - w0
    ncpu = os.cpu_count() or 1
    sandboxes = (c1 - c0) / 1e9 / wall * 100
    daemon = (d1 - d0) / wall * 100
    return {
        "window_s": round(wall, 2),
        "sandboxes_pct_of_core": round(sandboxes, 3),
        "daemon_pct_of_core": round(daemon, 3),
        "together_pct_of_core": round(sandboxes + daemon, 3),
        "per_sandbox_pct_of_core": round(sandboxes / max(len(ids), 1), 4),
        "host_busy_pct_of_core": round((b1 - b0) / max(t1 - t0, 1) * ncpu * 100, 2),
    }


def exec_latency(d, sid, n):
    d.api.call("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})  # warm (and thaw)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        r = d.api.call("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
        times.append(time.perf_counter() - t)
        assert r["exit_code"] == 0, r
    return base.stats_ms(times)


def settle(d, ids, want_frozen, timeout):
    """Waits until every sandbox in ids is frozen (or, for the awake daemon, a few seconds for
    their start-up work to end). Returns how many are frozen."""
    deadline = time.monotonic() + timeout
    if not want_frozen:
        time.sleep(5)
        return 0
    while True:
        listed = d.api.call("GET", "/v1/sandboxes")["sandboxes"]
        frozen = sum(1 for sb in listed if sb["id"] in ids and sb.get("frozen"))
        if frozen == len(ids) or time.monotonic() > deadline:
            return frozen
        time.sleep(0.5)


def run_mode(args, freeze_after, counts):
    d = IdleDaemon(args, freeze_after)
    out = {"freeze_after_s": freeze_after, "by_count": {}}
    try:
        d.start()
        active = d.create()
        mem_before = mem_available()
        out["exec_empty_host"] = exec_latency(d, active, args.exec_n)
        log(f"freeze-after {freeze_after}: exec on an empty host "
            f"p50 {out['exec_empty_host']['p50_ms']} ms")
        idle = []
        for n in counts:
            t = time.monotonic()
            idle += in_batches(n - len(idle), d.create)
            log(f"freeze-after {freeze_after}: {n} idle sandboxes created "
                f"({time.monotonic() - t:.0f} s)")
            frozen = settle(d, set(idle), freeze_after > 0, timeout=120)
            cpu = cpu_window(d, idle, args.window)
            mem = memory(idle, d.proc.pid, mem_before)
            frozen_after = settle(d, set(idle), freeze_after > 0, timeout=0)
            lat = exec_latency(d, active, args.exec_n)
            out["by_count"][str(n)] = {"frozen_before": frozen, "frozen_after": frozen_after,
                                       "cpu": cpu, "memory": mem, "exec_beside": lat,
                                       "exec_p50_ratio_to_empty": ratio(
                                           lat["p50_ms"], out["exec_empty_host"]["p50_ms"]),
                                       "exec_p99_ratio_to_empty": ratio(
                                           lat["p99_ms"], out["exec_empty_host"]["p99_ms"])}
            log(f"freeze-after {freeze_after}: {n} idle ({frozen} frozen): sandboxes "
                f"{cpu['sandboxes_pct_of_core']} % of a core, daemon "
                f"{cpu['daemon_pct_of_core']} %; exec beside p50 {lat['p50_ms']} ms "
                f"p99 {lat['p99_ms']} ms; memory per sandbox "
                f"{mem['cgroup_usage_mib_per_sandbox']} MiB (cgroups), "
                f"{mem['host_memavailable_drop_mib_per_sandbox']} MiB (host)")
    finally:
        ids = list(d.live)
        lock = threading.Lock()

        def delete_one():
            with lock:
                sid = ids.pop()
            d.delete(sid)

        try:
            in_batches(len(ids), delete_one)
        except Exception as e:  # noqa: BLE001 - stop() retries what is left
            log(f"cleanup: {e}")
        d.stop()
    return out


def tree_pids(marker):
    """The processes whose command line holds marker, and all their descendants."""
    parent, match = {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker in f.read():
                    match.add(int(name))
        except (OSError, ValueError, IndexError):
            pass
    grew = True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in match and pid not in match:
                match.add(pid)
                grew = True
    return match


def pids_cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, ValueError, IndexError):
            pass
    return total


def raw_runsc_idle(rootfs, n, window, platform="systrap"):
    """The baseline: n raw `runsc run -detach sleep` containers of the same rootfs (no daemon,
    no agent, no freezing): their CPU over the window and their memory (PSS)."""
    import restore  # noqa: E402 - bench/restore.py: runsc with a bundle of its own
    workdir = tempfile.mkdtemp(prefix="wr-bench-rawidle-")
    raw = restore.Raw(rootfs, platform, workdir)
    try:
        mem_before = mem_available()
        in_batches(n, lambda: raw.run_detached(f"wridle-{os.getpid()}-{time.monotonic_ns()}"),
                   width=4)
        time.sleep(5)
        pids = tree_pids(f"--root={raw.root}".encode())
        c0, w0 = pids_cpu_seconds(pids), time.monotonic()
        time.sleep(window)
        c1, wall = pids_cpu_seconds(pids), time.monotonic() - w0
        pct = (c1 - c0) / wall * 100
        out = {"n": n, "window_s": round(wall, 2), "processes": len(pids),
               "together_pct_of_core": round(pct, 2),
               "per_sandbox_pct_of_core": round(pct / n, 3),
               "pss_mib_per_sandbox": round(pss_bytes(pids) / n / 2**20, 2),
               "host_memavailable_drop_mib_per_sandbox":
                   round((mem_before - mem_available()) / n / 2**20, 2)}
        log(f"raw runsc: {n} idle `sleep` containers: {out['together_pct_of_core']} % of a core, "
            f"{out['pss_mib_per_sandbox']} MiB PSS each")
        return out
    finally:
        raw.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def measure(args):
    """Both daemons and the raw runsc baseline; returns the results (bench/run.py's `idle`)."""
    frozen = run_mode(args, 1, args.counts)
    awake = run_mode(args, 0, [n for n in args.counts if n <= args.awake_max])
    raw = None
    if args.rootfs:
        raw = raw_runsc_idle(args.rootfs, min(args.counts), args.window)
    summary = {}
    for n in args.counts:
        f = frozen["by_count"][str(n)]
        a = awake["by_count"].get(str(n))
        summary[str(n)] = {
            "frozen_together_pct_of_core": f["cpu"]["together_pct_of_core"],
            "awake_together_pct_of_core": a["cpu"]["together_pct_of_core"] if a else None,
            "awake_per_sandbox_x_n_pct_of_core": round(
                awake["by_count"][str(max(int(k) for k in awake["by_count"]))]["cpu"]
                ["per_sandbox_pct_of_core"] * n, 2) if awake["by_count"] else None,
            "raw_runsc_per_sandbox_x_n_pct_of_core":
                round(raw["per_sandbox_pct_of_core"] * n, 2) if raw else None,
            "exec_p50_ratio_frozen_neighbours": f["exec_p50_ratio_to_empty"],
            "exec_p99_ratio_frozen_neighbours": f["exec_p99_ratio_to_empty"],
            "exec_p50_ratio_awake_neighbours": a["exec_p50_ratio_to_empty"] if a else None,
            "exec_p99_ratio_awake_neighbours": a["exec_p99_ratio_to_empty"] if a else None,
            "memory_mib_per_sandbox_frozen": f["memory"]["cgroup_usage_mib_per_sandbox"],
            "memory_mib_per_sandbox_awake":
                a["memory"]["cgroup_usage_mib_per_sandbox"] if a else None,
            "target_cpu_under_5pct": f["cpu"]["together_pct_of_core"] < 5.0,
            "target_exec_within_1_5x": (f["exec_p50_ratio_to_empty"] or 99) <= 1.5,
        }
    with open("/proc/meminfo") as f:
        ram_mib = int(f.readline().split()[1]) // 1024  # MemTotal
    return {"host_ram_mib": ram_mib, "config": {"counts": args.counts, "awake_max": args.awake_max,
                       "window_s": args.window, "exec_n": args.exec_n,
                       "memory_mib": args.memory_mib},
            "frozen": frozen, "awake": awake, "raw_runsc": raw, "summary": summary}


def add_args(ap, prefix=""):
    """The idle bench's knobs (bench/run.py adds them with prefix "idle-")."""
    ap.add_argument(f"--{prefix}counts", default="20,50,200",
                    help="idle sandbox counts, ascending (default 20,50,200)")
    ap.add_argument(f"--{prefix}awake-max", type=int, default=50,
                    help="the awake baseline's largest count (default 50)")
    ap.add_argument(f"--{prefix}window", type=float, default=10.0,
                    help="CPU window, s (default 10)")
    ap.add_argument(f"--{prefix}exec-n", type=int, default=50,
                    help="execs per latency (default 50)")
    ap.add_argument(f"--{prefix}memory-mib", type=int, default=128,
                    help="idle sandboxes' memory_mib (default 128)")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image-state-dir", default="/var/lib/withruntime",
                    help="a state directory with the built image (withruntime image build)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/withruntime"))
    ap.add_argument("--agent", default=os.path.join(ROOT, "build/withruntime-agent"))
    add_args(ap)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = ap.parse_args()
    args.counts = sorted(int(x) for x in args.counts.split(","))
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (runsc and the daemon need it)")
    if not os.path.isdir(os.path.join(args.image_state_dir, "images", "default")):
        raise SystemExit(f"bench: no built image in {args.image_state_dir} "
                         "(run withruntime --state-dir DIR image build)")
    args.rootfs = base.find_rootfs(args.image_state_dir)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    res = dict({"started_at": started, "commit": base.git_commit(),
                "machine": base.machine_info("systrap")}, **measure(args))
    path = base.write_json(args.out, "idle.json", res)
    print(json.dumps(res["summary"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
