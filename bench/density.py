#!/usr/bin/env python3
"""Density: N sandboxes of the seed's default shape (2 vCPU, 4096 MiB, 10 GiB disk), created
20 at a time on a daemon with its default admission limits, then every one asked to exec; how
long it took and what it cost the host (issue 24: admission counted limits, and refused the
ninth such create on a 24 GiB host).

A daemon of its own (`--pool 0`; `--max-running` and `--max-loop-devices` raised only when N is
over the defaults' 100 and 256) on
a fresh state directory under /var/tmp that links a built image's directory. Reports the
creates' and execs' times, any refusal (a 503 `capacity` answer is counted, not fatal), the
host's MemAvailable before and with all N running, the sum of the sandboxes' cgroup memory
(`GET …/stats`), and the state directory's disk use. Writes bench/results/density.json.

With `--memory-mib M` (`--disk-mib D`) the sandboxes ask for M (D) MiB instead of 4096 (10240):
the issue's second target is 500 idle sandboxes of 512 MiB. With `--with-loop K` it also runs the README's pattern K times,
one after another, through the Python SDK: `with Sandbox.create(timeout_seconds=900,
on_lease_end="stop") as sbx: sbx.exec(...)`, each leaving a stopped sandbox behind (as users'
code does; they are kept 7 days), and counts refusals (before issue 24 the 16th was refused:
stopped sandboxes' disks counted their whole quota).

    python3 bench/density.py [--n 100] [--wave 20] [--memory-mib 4096] [--disk-mib 10240]
                             [--with-loop 0]
                             [--images /var/lib/withruntime/images]
"""

import argparse
import datetime
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import pool  # noqa: E402  (bench/pool.py: its daemon)
import run as base  # noqa: E402  (bench/run.py: stats, percentiles, machine, Unix calls)

SHAPE = {"cpus": 2, "memory_mib": 4096, "disk_mib": 10240}


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return None


def du_mib(path):
    r = subprocess.run(["du", "-sm", "--one-file-system", path], capture_output=True, text=True)
    return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout else None


class DensityDaemon(pool.PoolDaemon):
    """bench/pool.py's daemon with no pool and the default admission limits (raised only past
    what they hold), answering (status, JSON) so that refusals are counted."""

    stop_timeout = 300

    def __init__(self, args, images):
        super().__init__(args, images, 0, name="density")

    def serve_args(self):
        if self.args.n > 100:  # the defaults hold 100 running, 256 loop devices
            return ["--max-running", str(self.args.n),
                    "--max-loop-devices", str(self.args.n + 64)]
        return []

    def call(self, method, path, body=None, timeout=300):
        """(status, decoded JSON) of one call on the Unix socket, as root (the admin); a GET
        that fails raises."""
        status, doc = base.unix_call(self.sock, method, path, body, timeout)
        if status >= 300 and method == "GET":
            raise RuntimeError(f"{method} {path} -> {status}: {doc}")
        return status, doc


def with_loop(d, k):
    """The README's `with Sandbox.create(...)` block k times in a row on daemon d; returns
    {runs, refused, first_refusal, s}. The stopped sandboxes are deleted afterwards."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from withruntime import Client, Sandbox, WithruntimeError  # noqa: E402

    client = Client(f"unix:{d.sock}")
    refused, first, t0 = 0, None, time.perf_counter()
    for i in range(k):
        try:
            with Sandbox.create(timeout_seconds=900, on_lease_end="stop", client=client) as sbx:
                sbx.exec("python3 -c 'print(6 * 7)'")
        except WithruntimeError as e:
            refused += 1
            first = first or f"run {i + 1}: {e}"
    took = time.perf_counter() - t0
    for sbx in Sandbox.list(client=client):
        sbx.delete()
    client.close()
    return {"runs": k, "refused": refused, "first_refusal": first, "s": round(took, 1)}


def measure(args, images):
    """Creates args.n default-shape sandboxes args.wave at a time, then execs in each; returns
    {config, results} (bench/run.py's `density`). args: bin, agent, n, wave, and optionally
    memory_mib and with_loop."""
    shape = dict(SHAPE, memory_mib=getattr(args, "memory_mib", None) or SHAPE["memory_mib"],
                 disk_mib=getattr(args, "disk_mib", None) or SHAPE["disk_mib"])
    loop_k = getattr(args, "with_loop", 0) or 0
    before = mem_available_mib()
    with DensityDaemon(args, images) as d:
        loop = with_loop(d, loop_k) if loop_k else None
        made, refusals, create_s = [], [], []

        def one(_i):
            t0 = time.perf_counter()
            status, doc = d.call("POST", "/v1/sandboxes", shape)
            return status, doc, time.perf_counter() - t0

        t_all = time.perf_counter()
        while len(made) + len(refusals) < args.n:
            k = min(args.wave, args.n - len(made) - len(refusals))
            base.log(f"density: creating {k} at once ({len(made)} running)")
            for status, doc, dt in base.in_parallel(k, one):
                if status == 201:
                    made.append(doc["id"])
                    create_s.append(dt)
                else:
                    refusals.append({"status": status, "error": (doc or {}).get("error")})
        created_in = time.perf_counter() - t_all

        def exec_one(i):
            t0 = time.perf_counter()
            status, doc = d.call("POST", f"/v1/sandboxes/{made[i]}/exec",
                                 {"argv": ["echo", made[i]]})
            ok = status == 200 and doc["stdout"].strip() == made[i]
            return ok, time.perf_counter() - t0

        exec_s, exec_failed = [], 0
        for lo in range(0, len(made), args.wave):
            for ok, dt in base.in_parallel(min(args.wave, len(made) - lo),
                                           lambda j, lo=lo: exec_one(lo + j)):
                exec_s.append(dt)
                exec_failed += not ok
        total_s = time.perf_counter() - t_all
        with_all = mem_available_mib()
        cgroup = 0
        for sid in made:
            cgroup += d.call("GET", f"/v1/sandboxes/{sid}/stats")[1]["memory_bytes"]
        disk = du_mib(os.path.join(d.state, "sandboxes"))
        base.log(f"density: deleting {len(made)}")
        for sid in made:
            d.call("DELETE", f"/v1/sandboxes/{sid}")
    n = len(made)
    return {
        "config": {"n": args.n, "wave": args.wave, "shape": shape, "with_loop": loop_k},
        "results": {
            "with_loop": loop,
            "created": n,
            "refused": len(refusals),
            "refusals": refusals[:5],
            "exec_failed": exec_failed,
            "create_s": round(created_in, 2),
            "create_and_exec_all_s": round(total_s, 2),
            "create": base.stats_ms(create_s) if create_s else None,
            "exec": base.stats_ms(exec_s) if exec_s else None,
            "host_mem_available_mib_before": before,
            "host_mem_available_mib_with_all": with_all,
            "host_mem_used_mib_per_sandbox":
                round((before - with_all) / n, 1) if n and before and with_all else None,
            "cgroup_memory_mib_per_sandbox": round(cgroup / n / (1 << 20), 1) if n else None,
            "state_disk_mib_per_sandbox": round(disk / n, 2) if n and disk is not None else None,
        },
    }


def markdown(r):
    if not r:
        return []
    x, c = r["results"], r["config"]
    shape = c.get("shape") or SHAPE
    loop = x.get("with_loop")
    return [
        "",
        f"| {c['n']} sandboxes of {shape['cpus']} vCPU, {shape['memory_mib']} MiB, "
        f"{shape['disk_mib'] // 1024} GiB, {c['wave']} at a time | this run |",
        "|---|---|",
        f"| created / refused (503 capacity) / exec failed | {x['created']} / {x['refused']} / "
        f"{x['exec_failed']} |",
        f"| all created, s; created and each answered an exec, s | {x['create_s']}; "
        f"{x['create_and_exec_all_s']} |",
        f"| create, ms (p50 / p99) | {base.p50_99(x['create']) if x['create'] else '—'} |",
        f"| host memory per sandbox (MemAvailable drop), MiB; its cgroup's, MiB | "
        f"{x['host_mem_used_mib_per_sandbox']}; {x['cgroup_memory_mib_per_sandbox']} |",
        f"| state directory disk per sandbox, MiB | {x['state_disk_mib_per_sandbox']} |",
    ] + ([f"| the README's `with Sandbox.create(...)` block {loop['runs']} times in a row "
          f"(each leaves a stopped sandbox) | {loop['refused']} refused, {loop['s']} s |"]
         if loop else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "withruntime"))
    ap.add_argument("--agent", default=os.path.join(ROOT, "build", "withruntime-agent"))
    ap.add_argument("--images", default="/var/lib/withruntime/images",
                    help="a built images directory to link (default: the default daemon's)")
    ap.add_argument("--n", type=int, default=100, help="sandboxes in all (default 100)")
    ap.add_argument("--wave", type=int, default=20, help="creates at once (default 20)")
    ap.add_argument("--memory-mib", type=int, default=SHAPE["memory_mib"],
                    help="each sandbox's memory_mib (default 4096, the seed's)")
    ap.add_argument("--disk-mib", type=int, default=SHAPE["disk_mib"],
                    help="each sandbox's disk_mib (default 10240, the seed's)")
    ap.add_argument("--with-loop", type=int, default=0,
                    help="also run the README's with-block pattern this many times (default 0)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root")
    images = os.path.realpath(args.images)
    if not base.find_rootfs(os.path.dirname(images)):
        raise SystemExit(f"bench: no built image under {images} (withruntime image build)")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    res = dict({"started_at": started, "commit": base.git_commit(),
                "machine": base.machine_info("systrap")}, **measure(args, images))
    path = base.write_json(args.out, "density.json", res)
    print("\n".join(markdown(res)))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
