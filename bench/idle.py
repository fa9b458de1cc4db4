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
                "--max-sandboxes", str(max(self.args.counts) + 100),
                "--memory-overcommit", "8"]
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


def cgroup_cpu_ns(ids):
    total = 0
    for sid in ids:
        try:
            with open(f"{CPUACCT}/{sid}/cpuacct.usage") as f:
                total += int(f.read())
        except OSError:
            pass
    return total


def host_busy():
    """(busy, total) jiffies from /proc/stat's cpu line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


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
            frozen_after = settle(d, set(idle), freeze_after > 0, timeout=0)
            lat = exec_latency(d, active, args.exec_n)
            out["by_count"][str(n)] = {"frozen_before": frozen, "frozen_after": frozen_after,
                                       "cpu": cpu, "exec_beside": lat,
                                       "exec_p50_ratio_to_empty": ratio(
                                           lat["p50_ms"], out["exec_empty_host"]["p50_ms"]),
                                       "exec_p99_ratio_to_empty": ratio(
                                           lat["p99_ms"], out["exec_empty_host"]["p99_ms"])}
            log(f"freeze-after {freeze_after}: {n} idle ({frozen} frozen): sandboxes "
                f"{cpu['sandboxes_pct_of_core']} % of a core, daemon "
                f"{cpu['daemon_pct_of_core']} %; exec beside p50 {lat['p50_ms']} ms "
                f"p99 {lat['p99_ms']} ms")
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


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image-state-dir", default="/var/lib/withruntime",
                    help="a state directory with the built image (withruntime image build)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/withruntime"))
    ap.add_argument("--agent", default=os.path.join(ROOT, "build/withruntime-agent"))
    ap.add_argument("--counts", default="20,50,200",
                    help="idle sandbox counts, ascending (default 20,50,200)")
    ap.add_argument("--awake-max", type=int, default=50,
                    help="the awake baseline's largest count (default 50)")
    ap.add_argument("--window", type=float, default=10.0, help="CPU window, s (default 10)")
    ap.add_argument("--exec-n", type=int, default=50, help="execs per latency (default 50)")
    ap.add_argument("--memory-mib", type=int, default=128)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = ap.parse_args()
    args.counts = sorted(int(x) for x in args.counts.split(","))
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (runsc and the daemon need it)")
    if not os.path.isdir(os.path.join(args.image_state_dir, "images", "default")):
        raise SystemExit(f"bench: no built image in {args.image_state_dir} "
                         "(run withruntime --state-dir DIR image build)")
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    frozen = run_mode(args, 1, args.counts)
    awake = run_mode(args, 0, [n for n in args.counts if n <= args.awake_max])
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
            "exec_p50_ratio_frozen_neighbours": f["exec_p50_ratio_to_empty"],
            "exec_p99_ratio_frozen_neighbours": f["exec_p99_ratio_to_empty"],
            "exec_p50_ratio_awake_neighbours": a["exec_p50_ratio_to_empty"] if a else None,
            "exec_p99_ratio_awake_neighbours": a["exec_p99_ratio_to_empty"] if a else None,
            "target_cpu_under_5pct": f["cpu"]["together_pct_of_core"] < 5.0,
            "target_exec_within_1_5x": (f["exec_p50_ratio_to_empty"] or 99) <= 1.5,
        }
    res = {
        "started_at": started,
        "commit": base.git_commit(),
        "machine": base.machine_info("systrap"),
        "config": {"counts": args.counts, "awake_max": args.awake_max, "window_s": args.window,
                   "exec_n": args.exec_n, "memory_mib": args.memory_mib},
        "frozen": frozen,
        "awake": awake,
        "summary": summary,
    }
    path = base.write_json(args.out, "idle.json", res)
    print(json.dumps(summary, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
