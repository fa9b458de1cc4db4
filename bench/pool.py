#!/usr/bin/env python3
"""Warm starts: create -> first exec with the warm pool and without, one at a time and 20 at
once, beside raw `runsc run /bin/true` in the same run (issue 11, points 1 and 2).

Two daemons of its own, one after the other, on fresh state directories that link an image
already built (bench/run.py's, or --images): `--pool 0` (every create cold) and `--pool N`
(N = the burst size; the bench waits until all N are ready before each burst, and until one is
ready before each single create). Both on their Unix sockets, as root (the admin; no key), with
the default admission limits (20 of the pool's default shape fit: admission counts use).
Writes bench/results/pool.json; prints ratios and percentiles.

    python3 bench/pool.py [--n 20] [--burst 20] [--images /var/lib/withruntime/images]
"""

import argparse
import datetime
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import run as base  # noqa: E402  (bench/run.py: stats, percentiles, runsc baseline, machine)
from egress import UnixApi  # noqa: E402


class PoolDaemon:
    """`withruntime serve` on a fresh state directory under /var/tmp that links a built
    image's directory, on its Unix socket only, with a warm pool of `pool` (bench/density.py
    uses it too)."""

    stop_timeout = 120  # seconds for SIGTERM to end it, its sandboxes with it

    def __init__(self, args, images, pool, name="pool"):
        self.args, self.pool = args, pool
        self.state = tempfile.mkdtemp(prefix=f"wr-bench-{name}{pool}-", dir="/var/tmp")
        os.makedirs(os.path.join(self.state, "sandboxes"))
        os.symlink(images, os.path.join(self.state, "images"))
        self.sock = os.path.join(self.state, "withruntime.sock")
        self.api = UnixApi(self.sock)
        self.proc = None

    def __enter__(self):
        log = open(os.path.join(self.state, "daemon.log"), "wb")
        self.proc = subprocess.Popen(
            [self.args.bin, "serve", "--state-dir", self.state, "--listen", "none", "--socket",
             self.sock, "--agent", self.args.agent, "--pool", str(self.pool),
             *self.serve_args()],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                self.api.call("GET", "/v1/health", timeout=2)
                return self
            except (OSError, RuntimeError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"bench: the daemon did not start; {self.state}/daemon.log")
                time.sleep(0.1)

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=self.stop_timeout)
        base.remove_state_dir(self.state)

    def serve_args(self):
        """More `serve` options."""
        return ["--max-running", "200"]

    def wait_ready(self, n):
        deadline = time.monotonic() + 300
        while self.api.call("GET", "/v1/health")["pool"]["ready"] < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: the pool never had {n} ready")
            time.sleep(0.05)

    def create_first_exec(self, _i=0):
        t0 = time.perf_counter()
        sid = self.api.call("POST", "/v1/sandboxes", {})["id"]
        created = time.perf_counter() - t0
        r = self.api.call("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["true"]})
        dt = time.perf_counter() - t0
        if r["exit_code"] != 0:
            raise RuntimeError(f"exec true: {r}")
        return dt, sid, created

    def delete(self, ids):
        for sid in ids:
            self.api.call("DELETE", f"/v1/sandboxes/{sid}")


def singles(d, n, warm):
    times, creates = [], []
    for _ in range(n):
        if warm:
            d.wait_ready(1)
        dt, sid, created = d.create_first_exec()
        times.append(dt)
        creates.append(created)
        d.delete([sid])
    return dict(base.stats_ms(times), create_only=base.stats_ms(creates))


def burst(d, k, warm):
    """k creates -> first exec at once; then, as the floor the host sets, k execs at once on
    those same sandboxes, running."""
    if warm:
        d.wait_ready(k)
    out = base.in_parallel(k, d.create_first_exec)
    ids = [sid for _, sid, _ in out]

    def again(i):
        t0 = time.perf_counter()
        d.api.call("POST", f"/v1/sandboxes/{ids[i]}/exec", {"argv": ["true"]})
        return time.perf_counter() - t0

    floor = base.in_parallel(k, again)
    d.delete(ids)
    return dict(base.stats_ms([dt for dt, _, _ in out]),
                create_only=base.stats_ms([c for _, _, c in out]),
                exec_burst_on_running=base.stats_ms(floor))


def measure(args, images, rootfs, workdir):
    """Cold and warm, single and burst, beside raw runsc; returns {results, ratios}
    (bench/run.py's `pool`). args: bin, agent, n, burst, platform."""
    raw = base.Bench(None, rootfs, argparse.Namespace(platform=args.platform), workdir)
    base.log(f"raw runsc run /bin/true, {args.n} one at a time")
    runsc = base.stats_ms([raw.runsc_run(i) for i in range(args.n)])
    with PoolDaemon(args, images, 0) as cold_d:
        base.log("cold creates (--pool 0)")
        cold_d.create_first_exec()  # warm-up of the host's caches, not counted
        cold_d.delete([s["id"] for s in cold_d.api.call("GET", "/v1/sandboxes")["sandboxes"]])
        cold = singles(cold_d, args.n, False)
        base.log(f"cold burst of {args.burst}")
        cold_burst = burst(cold_d, args.burst, False)
    with PoolDaemon(args, images, args.burst) as warm_d:
        base.log(f"warm creates (--pool {args.burst})")
        warm = singles(warm_d, args.n, True)
        base.log(f"warm burst of {args.burst}")
        warm_burst = burst(warm_d, args.burst, True)
    return {
        "config": {"n": args.n, "burst": args.burst},
        "results": {
            "runsc_run_true": runsc,
            "cold_single": cold, "warm_single": warm,
            "cold_burst": cold_burst, "warm_burst": warm_burst,
        },
        "ratios": {
            "warm_single_p50_over_cold_p50": base.ratio(warm["p50_ms"], cold["p50_ms"]),
            "warm_single_p50_over_runsc_p50": base.ratio(warm["p50_ms"], runsc["p50_ms"]),
            "warm_burst_p99_over_warm_single_p50":
                base.ratio(warm_burst["p99_ms"], warm["p50_ms"]),
            "cold_burst_p99_over_cold_single_p50":
                base.ratio(cold_burst["p99_ms"], cold["p50_ms"]),
            "warm_burst_p99_over_exec_burst_p99 (the host's floor)":
                base.ratio(warm_burst["p99_ms"], warm_burst["exec_burst_on_running"]["p99_ms"]),
        },
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "withruntime"))
    ap.add_argument("--agent", default=os.path.join(ROOT, "build", "withruntime-agent"))
    ap.add_argument("--images", default="/var/lib/withruntime/images",
                    help="a built images directory to link (default: the default daemon's)")
    ap.add_argument("--n", type=int, default=20, help="single creates of each kind")
    ap.add_argument("--burst", type=int, default=20, help="creates at once")
    ap.add_argument("--platform", default="systrap")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root")
    images = os.path.realpath(args.images)
    rootfs = base.find_rootfs(os.path.dirname(images))
    if not rootfs:
        raise SystemExit(f"bench: no built image under {images} (withruntime image build)")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    workdir = tempfile.mkdtemp(prefix="wr-bench-pool-")
    try:
        res = dict({"started_at": started, "commit": base.git_commit(),
                    "machine": base.machine_info(args.platform)},
                   **measure(args, images, rootfs, workdir))
        path = base.write_json(args.out, "pool.json", res)
        for k, v in res["results"].items():
            line = f"{k:24s} p50 {v['p50_ms']:8.1f} ms   p99 {v['p99_ms']:8.1f} ms   (n={v['n']})"
            if "create_only" in v:
                line += (f"   create alone p50 {v['create_only']['p50_ms']:.1f} / p99 "
                         f"{v['create_only']['p99_ms']:.1f} ms")
            if "exec_burst_on_running" in v:
                e = v["exec_burst_on_running"]
                line += f"   then {args.burst} execs at once p50 {e['p50_ms']:.1f} / p99 " \
                        f"{e['p99_ms']:.1f} ms"
            print(line)
        for k, v in res["ratios"].items():
            print(f"{k:40s} {v}")
        print(f"-> {path}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
