#!/usr/bin/env python3
"""withruntime benchmark: the daemon against its baselines, in one run.

Measures, with the baselines beside each number because these machines are noisy:
  * create-to-first-exec latency through the daemon (POST /v1/sandboxes, then POST exec `true`),
    one at a time and N at once; and the same through DELETE, which is the figure compared with
    the baselines, since both include their teardown: raw `runsc run /bin/true` of the same
    image rootfs (an OCI bundle generated here; `runsc run` returns once the container is
    deleted) and a plain host subprocess (`/bin/true`, exited and reaped);
  * exec `true` round trip through the daemon against the spawn floor inside the same sandbox
    (a python loop of posix_spawn + wait of /bin/true, in blocks interleaved with the execs)
    and a host subprocess; and the time from each command's exit to the API's answer
    (`exit_to_answer_us` in the exec response);
  * 100 MiB write and read through the files API (the read compared byte for byte) against
    `dd` in the same sandbox, interleaved rep by rep: a write with conv=fsync, a read from the
    page cache.

Writes bench/results/latest.json (with the commit measured: `git rev-parse HEAD`, and whether
the work tree had changes) and latest.png and prints a Markdown table. Starts its own
daemon on a temporary state directory (building the image there, or reusing one with
--state-dir) unless RUNTIME_URL (or --url) names one. Traffic goes to loopback only.
"""

import argparse
import concurrent.futures
import datetime
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
PARTS = ("latency", "exec", "files", "pool", "idle", "restore", "sdk", "density")


# ---------------------------------------------------------------- small helpers


def write_json(out_dir, name, obj):
    """Writes obj as JSON to out_dir/name (whole or not at all); returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path

def percentile(xs, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        return None
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def stats_ms(seconds):
    ms = [x * 1000.0 for x in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
    }


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def in_parallel(n, fn):
    """Runs fn(i) for i in range(n) in n threads released together; returns the results."""
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        return fn(i)

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


class UnixConn(http.client.HTTPConnection):
    """http.client over the daemon's Unix socket."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.sock_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.sock_path)
        self.sock = s


def unix_call(sock_path, method, path, body=None, timeout=30):
    """One request over the daemon's Unix socket, where root is the admin and needs no key
    (docs/security.md). Returns (status, parsed JSON or None)."""
    conn = UnixConn(sock_path, timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        payload = r.read()
    finally:
        conn.close()
    return r.status, (json.loads(payload) if payload else None)


def mint_key(sock_path, name="bench"):
    """Makes an API key through the Unix socket: every TCP request needs one. Returns
    (key id, key)."""
    status, body = unix_call(sock_path, "POST", "/v1/keys", {"name": name})
    if status >= 300:
        raise SystemExit(f"bench: POST /v1/keys over {sock_path} -> {status}: {body}")
    return body["id"], body["key"]


class Api:
    """Just enough of the HTTP API (standard library)."""

    def __init__(self, url, key=None):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"bench: {url}: only http:// on loopback is allowed")
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def call(self, method, path, body=None, data=None, query=None, timeout=600):
        if query:
            path += "?" + urllib.parse.urlencode(query)
        headers = dict(self.headers)
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif data is not None:
            headers["Content-Type"] = "application/octet-stream"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            payload = r.read()
        finally:
            conn.close()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path} -> {r.status}: {payload[:300]!r}")
        return payload

    def json(self, method, path, body=None, **kw):
        return json.loads(self.call(method, path, body, **kw))


# ---------------------------------------------------------------- the daemon

class Daemon:
    def __init__(self, binary, agent, state_dir):
        self.binary, self.agent, self.state_dir = binary, agent, state_dir
        self.proc = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.sock = os.path.join(state_dir, "withruntime.sock")
        self.key_id = self.key = None
        self.log_path = os.path.join(state_dir, "bench-daemon.log")
        self.extra_args = []  # more `serve` options

    def start(self):
        log(f"image build in {self.state_dir} (cached after the first time)")
        subprocess.run([self.binary, "--state-dir", self.state_dir, "image", "build"],
                       check=True, stdin=subprocess.DEVNULL)
        logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--state-dir", self.state_dir,
             "--listen", f"127.0.0.1:{self.port}",
             "--socket", self.sock,
             "--agent", self.agent, *self.extra_args],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"bench: daemon exited ({self.proc.returncode}); see "
                                 f"{self.log_path}")
            try:
                # the socket is ours only once our daemon is still there after answering
                # (another one on the same state dir would answer, and ours would exit)
                if unix_call(self.sock, "GET", "/v1/health", timeout=2)[0] == 200:
                    time.sleep(0.2)
                    if self.proc.poll() is None:
                        break
                    continue
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("bench: daemon did not answer /v1/health in 60 s")
            time.sleep(0.1)
        try:
            # key names are unique in a state dir that may be reused between runs
            self.key_id, self.key = mint_key(self.sock, f"bench-{os.getpid()}-{time.time_ns()}")
        except BaseException:
            self.stop()
            raise

    def stop(self):
        if self.key_id and self.proc and self.proc.poll() is None:
            try:  # a reused state dir does not pile up live keys
                unix_call(self.sock, "POST", f"/v1/keys/{self.key_id}/revoke")
            except (OSError, http.client.HTTPException) as e:
                log(f"could not revoke key {self.key_id}: {e}")
            self.key_id = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def remove_state_dir(state_dir):
    """Removes a state directory this run made, unless something is still mounted under it."""
    with open("/proc/self/mountinfo") as f:
        left = [ln.split()[4] for ln in f if ln.split()[4].startswith(state_dir + "/")]
    if left:
        log(f"mounts left under {state_dir}, not removing it: {left}")
    else:
        shutil.rmtree(state_dir, ignore_errors=True)


def find_rootfs(state_dir):
    """The image's root filesystem inside a state directory (a Debian root with python3)."""
    link = os.path.join(state_dir, "images", "default", "rootfs")
    if os.path.isfile(os.path.join(link, "etc/debian_version")):
        return os.path.realpath(link)
    best = None
    for root, dirs, _ in os.walk(state_dir):
        depth = root[len(state_dir):].count(os.sep)
        if os.path.isfile(os.path.join(root, "etc/debian_version")) and \
                os.path.exists(os.path.join(root, "usr/bin/python3")):
            if "default" in root or best is None:
                best = root
            dirs[:] = []
        elif depth >= 6 or os.path.basename(root) in ("sandboxes", "runsc", "upper", "work"):
            dirs[:] = []
    return best


# ---------------------------------------------------------------- measurements

class Bench:
    def __init__(self, api, rootfs, args, workdir):
        self.api = api
        self.rootfs = rootfs
        self.args = args
        self.workdir = workdir
        self.live = set()
        self.lock = threading.Lock()
        self.runsc_root = os.path.join(workdir, "runsc-root")
        self.bundle = os.path.join(workdir, "bundle")
        os.makedirs(self.runsc_root)
        self.make_bundle()

    # -- daemon side

    def create(self):
        sb = self.api.json("POST", "/v1/sandboxes", {"memory_mib": self.args.memory_mib})
        with self.lock:
            self.live.add(sb["id"])
        return sb["id"]

    def delete(self, sid):
        self.api.call("DELETE", f"/v1/sandboxes/{sid}")
        with self.lock:
            self.live.discard(sid)

    def exec_true(self, sid):
        r = self.api.json("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["true"]})
        if r["exit_code"] != 0:
            raise RuntimeError(f"exec true in {sid}: {r}")

    def daemon_create_first_exec(self, _i=0):
        t0 = time.perf_counter()
        sid = self.create()
        self.exec_true(sid)
        dt = time.perf_counter() - t0
        return dt, sid

    def daemon_create_exec_delete(self, _i=0):
        """(create -> first exec, create -> first exec -> deleted): the second is the one to
        put beside `runsc run`, which includes its container's teardown."""
        t0 = time.perf_counter()
        sid = self.create()
        self.exec_true(sid)
        first = time.perf_counter() - t0
        self.delete(sid)
        return first, time.perf_counter() - t0

    def cleanup(self):
        for sid in list(self.live):
            try:
                self.delete(sid)
            except Exception as e:  # keep cleaning the rest
                log(f"could not delete {sid}: {e}")

    # -- raw runsc

    def make_bundle(self):
        os.makedirs(self.bundle)
        subprocess.run(["runsc", "spec", "--bundle", self.bundle, "--", "/bin/true"],
                       check=True, stdin=subprocess.DEVNULL)
        path = os.path.join(self.bundle, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["root"] = {"path": self.rootfs, "readonly": True}
        cfg["process"]["terminal"] = False
        with open(path, "w") as f:
            json.dump(cfg, f)

    def runsc_run(self, i):
        cid = f"wrbench-{os.getpid()}-{i:06d}"
        cmd = ["runsc", "--root", self.runsc_root, "--network=none",
               f"--platform={self.args.platform}", "run", "--bundle", self.bundle, cid]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            subprocess.run(["runsc", "--root", self.runsc_root, "delete", "-force", cid],
                           capture_output=True)
            raise RuntimeError(f"runsc run failed ({r.returncode}): {r.stderr[-500:]!r}")
        return dt

    # -- host

    @staticmethod
    def host_true(_i=0):
        t0 = time.perf_counter()
        subprocess.run(["/bin/true"], check=True, stdin=subprocess.DEVNULL)
        return time.perf_counter() - t0


def measure_latency(b, n, par):
    out = {"sequential": {}, f"parallel_{par}": {}}

    log(f"create-to-first-exec through the daemon, {n} one at a time")
    b.daemon_create_first_exec()  # warm-up, not counted
    b.cleanup()
    lat, through, deletes = [], [], []
    for _ in range(n):
        first, whole = b.daemon_create_exec_delete()
        lat.append(first)
        through.append(whole)
        deletes.append(whole - first)
    out["sequential"]["withruntime"] = stats_ms(lat)
    out["sequential"]["withruntime_through_delete"] = stats_ms(through)
    out["sequential"]["withruntime_delete"] = stats_ms(deletes)

    log(f"raw runsc run /bin/true, {n} one at a time")
    b.runsc_run(0)
    out["sequential"]["runsc_run"] = stats_ms([b.runsc_run(i + 1) for i in range(n)])

    log(f"host subprocess /bin/true, {n} one at a time")
    b.host_true()
    out["sequential"]["host_subprocess"] = stats_ms([b.host_true() for _ in range(n)])

    log(f"create-to-first-exec through the daemon, {par} at once")
    res = in_parallel(par, b.daemon_create_exec_delete)
    out[f"parallel_{par}"]["withruntime"] = stats_ms([first for first, _ in res])
    out[f"parallel_{par}"]["withruntime_through_delete"] = stats_ms([whole for _, whole in res])

    log(f"raw runsc run, {par} at once")
    out[f"parallel_{par}"]["runsc_run"] = stats_ms(
        in_parallel(par, lambda i: b.runsc_run(1000 + i)))

    log(f"host subprocess, {par} at once")
    out[f"parallel_{par}"]["host_subprocess"] = stats_ms(in_parallel(par, b.host_true))
    return out


# A loop of posix_spawn + wait of /bin/true inside the sandbox: the floor of an exec there
# (glibc's posix_spawn is a vfork-style clone, as the agent's own start of a command is).
SPAWN_FLOOR = r"""
import json, os, sys, time
n = int(sys.argv[1])
for _ in range(3):
    os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)
ts = []
for _ in range(n):
    t = time.perf_counter()
    os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)
    ts.append(time.perf_counter() - t)
print(json.dumps(ts))
"""


def stats_us(us):
    return {"n": len(us), "p50_us": round(percentile(us, 50)), "p90_us": round(percentile(us, 90)),
            "p99_us": round(percentile(us, 99)), "max_us": round(max(us))}


def measure_exec(b, n, per=20):
    """exec `true` through the API against the spawn floor inside the same sandbox, in
    interleaved blocks of `per` each (a second or so), so that both see the same noise, which
    on this host drifts by a quarter within a minute; and each exec's exit_to_answer_us."""
    log(f"exec `true` round trip vs posix_spawn floor in the sandbox, {n} each")
    sid = b.create()
    lat, floor, exit_to_answer = [], [], []
    try:
        for _ in range(3):
            b.exec_true(sid)
        while len(lat) < n:
            for _ in range(min(per, n - len(lat))):
                t0 = time.perf_counter()
                r = b.api.json("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["true"]})
                lat.append(time.perf_counter() - t0)
                if r["exit_code"] != 0:
                    raise RuntimeError(f"exec true in {sid}: {r}")
                if "exit_to_answer_us" in r:
                    exit_to_answer.append(r["exit_to_answer_us"])
            r = b.api.json("POST", f"/v1/sandboxes/{sid}/exec",
                           {"argv": ["python3", "-c", SPAWN_FLOOR, str(per)]})
            if r["exit_code"] != 0:
                raise RuntimeError(f"spawn floor in {sid}: {r}")
            floor += json.loads(r["stdout"])
    finally:
        b.delete(sid)
    host = [b.host_true() for _ in range(n)]
    out = {"withruntime": stats_ms(lat), "spawn_floor": stats_ms(floor),
           "host_subprocess": stats_ms(host)}
    out["p50_vs_floor"] = round(out["withruntime"]["p50_ms"] / out["spawn_floor"]["p50_ms"], 3)
    if exit_to_answer:
        out["exit_to_answer_us"] = stats_us(exit_to_answer)
    return out


PIECE = 8 * 1024 * 1024  # the daemon's upload limit (docs/api.md, "Big files go in pieces")


def dd_mib_s(b, sid, cmd, mib):
    """Runs dd in the sandbox; its own figure (bytes over its elapsed seconds) in MiB/s."""
    r = b.api.json("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["sh", "-c", cmd + " 2>&1"]})
    m = re.search(r"copied, ([0-9.]+) s", r["stdout"])
    if r["exit_code"] != 0 or not m:
        raise RuntimeError(f"dd in {sid}: {r}")
    return mib / float(m.group(1))


def curl_read_mib_s(b, sid, path):
    """A download by curl to /dev/null: the API's read with a client that costs little (on a
    2-core host python's own reading takes a core). Its own figure, in MiB/s."""
    hdr = os.path.join(b.workdir, "curl-auth")
    with open(os.open(hdr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        auth = b.api.headers.get("Authorization")
        f.write(f"Authorization: {auth}\n" if auth else "")
    url = (f"http://{b.api.host}:{b.api.port}/v1/sandboxes/{sid}/files/content?"
           + urllib.parse.urlencode({"path": path}))
    r = subprocess.run(["curl", "-sS", "-f", "-o", "/dev/null", "-H", f"@{hdr}", "-w",
                        "%{speed_download} %{size_download}", url],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"curl {url}: {r.stderr.strip()}")
    speed, size = r.stdout.split()
    return float(speed) / 2**20, int(size)


def measure_files(b, mib, reps):
    """100 MiB through the files API (written in pieces of the upload limit at offsets, as the
    SDK and the CLI send a big file; read back whole and compared) against dd in the same
    sandbox: a write with conv=fsync, a read from the page cache. Interleaved, rep by rep."""
    log(f"{mib} MiB write/read through the files API vs dd in the sandbox, {reps} times each")
    size = mib * 1024 * 1024
    data = os.urandom(size)
    view = memoryview(data)  # the pieces are sent from it, not copied out first
    sid = b.create()
    w, r, rc, dw, dr = [], [], [], [], []
    curl = shutil.which("curl")
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            for off in range(0, size, PIECE):
                q = {"path": "/workspace/bench.bin"}
                if off:
                    q["offset"] = off
                b.api.call("PUT", f"/v1/sandboxes/{sid}/files/content",
                           data=view[off:off + PIECE], query=q)
            w.append(mib / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            back = b.api.call("GET", f"/v1/sandboxes/{sid}/files/content",
                              query={"path": "/workspace/bench.bin"})
            r.append(mib / (time.perf_counter() - t0))
            if back != data:
                raise RuntimeError(f"read back {len(back)} bytes that differ from the "
                                   f"{size} written")
            if curl:
                speed, got = curl_read_mib_s(b, sid, "/workspace/bench.bin")
                if got != size:
                    raise RuntimeError(f"curl read {got} bytes of {size}")
                rc.append(speed)
            dw.append(dd_mib_s(b, sid, f"dd if=/dev/zero of=/workspace/dd.bin bs=1M "
                                       f"count={mib} conv=fsync", mib))
            dr.append(dd_mib_s(b, sid, "dd if=/workspace/dd.bin of=/dev/null bs=1M", mib))
    finally:
        b.delete(sid)

    def med(xs):
        return round(statistics.median(xs), 1)

    out = {"size_mib": mib, "repetitions": reps,
           "write": {"withruntime": med(w), "sandbox_dd_fsync": med(dw),
                     "samples": {"withruntime": [round(x) for x in w],
                                 "sandbox_dd_fsync": [round(x) for x in dw]}},
           "read": {"withruntime": med(r), "sandbox_dd_page_cache": med(dr),
                    "samples": {"withruntime": [round(x) for x in r],
                                "sandbox_dd_page_cache": [round(x) for x in dr]}}}
    if rc:
        out["read"]["withruntime_curl"] = med(rc)
        out["read"]["samples"]["withruntime_curl"] = [round(x) for x in rc]
        out["read"]["ratio_curl"] = round(med(rc) / out["read"]["sandbox_dd_page_cache"], 3)
    out["write"]["ratio"] = round(out["write"]["withruntime"] / out["write"]["sandbox_dd_fsync"], 3)
    out["read"]["ratio"] = round(out["read"]["withruntime"] /
                                 out["read"]["sandbox_dd_page_cache"], 3)
    return out


# ---------------------------------------------------------------- report

def machine_info(platform_name):
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    try:
        runsc = subprocess.run(["runsc", "--version"], capture_output=True,
                               text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        runsc = "unknown"
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "ram_gib": round(mem / 2**30, 1),
            "kernel": platform.release(), "cpu": cpu, "runsc": runsc,
            "runsc_platform": platform_name, "python": platform.python_version()}


def host_jiffies():
    """(busy, total) jiffies of all the host's CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def git_commit():
    """The commit measured: {"sha": HEAD, "dirty": the work tree had changes}."""
    def git(*args):
        r = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        return r.stdout.strip() if r.returncode == 0 else None
    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha or "unknown", "dirty": bool(status) if status is not None else None}


def ratio(a, b):
    return f"{a / b:.1f}×" if a and b else "n/a"


def fmt3(s):
    return f"{s['p50_ms']:.1f} / {s['p90_ms']:.1f} / {s['p99_ms']:.1f}"


def markdown(res):
    m = res["machine"]
    r = res["results"]
    lines = [
        f"withruntime benchmark, {res['started_at']}, commit {res['commit']['sha'][:12]}"
        + (" (with uncommitted changes)" if res["commit"]["dirty"] else ""),
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, kernel "
        f"{m['kernel']}, {m['runsc']} (platform {m['runsc_platform']})"
        + (f"; the host's CPUs were {m['host_busy_pct_during_run']} % busy over the run "
           "(everything on the machine, this run included)"
           if "host_busy_pct_during_run" in m else ""),
    ]
    lat = r.get("create_to_first_exec")
    if lat:
        lines += [
            "",
            "| latency, ms (p50 / p90 / p99) | withruntime | raw `runsc run` | host subprocess "
            "| p50 vs runsc | p50 vs host |",
            "|---|---|---|---|---|---|",
        ]
        for mode, d in lat.items():
            # beside the baselines (which include their teardown): through DELETE
            w, rr, h = d["withruntime_through_delete"], d["runsc_run"], d["host_subprocess"]
            lines.append(f"| create → first exec → delete, {mode.replace('_', ' ')} "
                         f"(n={w['n']}) | {fmt3(w)} | {fmt3(rr)} | {fmt3(h)} | "
                         f"{ratio(w['p50_ms'], rr['p50_ms'])} | {ratio(w['p50_ms'], h['p50_ms'])} |")
        for mode, d in lat.items():
            w = d["withruntime"]
            lines.append(f"| create → first exec (no teardown), {mode.replace('_', ' ')} "
                         f"(n={w['n']}) | {fmt3(w)} | — | — | — | — |")
        d = lat["sequential"].get("withruntime_delete")
        if d:
            lines.append(f"| delete (n={d['n']}) | {fmt3(d)} | — | — | — | — |")
    ex = r.get("exec_roundtrip")
    if ex:
        w, fl, h = ex["withruntime"], ex["spawn_floor"], ex["host_subprocess"]
        lines += [
            "",
            "| exec `true`, ms (p50 / p90 / p99) | withruntime (API round trip) | "
            "`posix_spawn` + wait in the sandbox | host subprocess | p50 vs spawn floor |",
            "|---|---|---|---|---|",
            f"| n={w['n']} | {fmt3(w)} | {fmt3(fl)} | {fmt3(h)} | {ex['p50_vs_floor']:.2f}× |",
        ]
        e2a = ex.get("exit_to_answer_us")
        if e2a:
            lines.append(f"| command exit → API answer, µs (agent + daemon; n={e2a['n']}) | "
                         f"{e2a['p50_us']} / {e2a['p90_us']} / {e2a['p99_us']} | — | — | — |")
    f = r.get("files_throughput_mib_s")
    if f:
        lines += [
            "",
            f"| {f['size_mib']} MiB, MiB/s (median of {f['repetitions']}) | withruntime files "
            "API | `dd` in the same sandbox | withruntime / dd |",
            "|---|---|---|---|",
            f"| write (dd: `conv=fsync`) | {f['write']['withruntime']} | "
            f"{f['write']['sandbox_dd_fsync']} | {f['write']['ratio']:.2f} |",
            f"| read, python http.client (dd: from the page cache) | "
            f"{f['read']['withruntime']} | {f['read']['sandbox_dd_page_cache']} | "
            f"{f['read']['ratio']:.2f} |",
        ]
        if "withruntime_curl" in f["read"]:
            lines.append(f"| read, curl to /dev/null | {f['read']['withruntime_curl']} | "
                         f"{f['read']['sandbox_dd_page_cache']} | {f['read']['ratio_curl']:.2f} |")
    import density  # noqa: E402 - bench/density.py (imports this module)
    import sdk  # noqa: E402 - bench/sdk.py (imports this module)

    lines += markdown_pool(r.get("pool")) + markdown_idle(r.get("idle")) + \
        markdown_restore(r.get("restore")) + sdk.markdown(r.get("sdk")) + \
        density.markdown(r.get("density")) + markdown_targets(r)
    return "\n".join(lines)


def targets(r):
    """Issue 11's targets against this run: [(what, target, measured, met)]."""
    out = []
    p = r.get("pool")
    if p:
        w, wb = p["results"]["warm_single"], p["results"]["warm_burst"]
        out.append(("warm create → first exec, p50", "< 50 ms", f"{w['p50_ms']:.1f} ms",
                    w["p50_ms"] < 50))
        k = p["config"]["burst"]
        x = wb["p99_ms"] / w["p50_ms"]
        floor = wb["exec_burst_on_running"]["p99_ms"]
        out.append((f"{k} warm creates at once, p99 ÷ one warm create's p50", "≤ 3×",
                    f"{x:.1f}× ({wb['p99_ms']:.0f} ms; {k} execs at once on running sandboxes, "
                    f"the host's floor: {floor:.0f} ms p99, so ≥ {floor / w['p50_ms']:.1f}× "
                    "before any create)", x <= 3))
        cb = p["results"]["cold_burst"]
        out.append((f"{k} creates at once with no pool", "none fails", f"all {cb['n']} created",
                    True))
    d = r.get("idle")
    if d:
        top = max(d["frozen"]["by_count"], key=int)
        f = d["frozen"]["by_count"][top]
        out.append((f"{top} idle sandboxes, CPU together (frozen)", "< 5 % of a core",
                    f"{f['cpu']['together_pct_of_core']} %",
                    f["cpu"]["together_pct_of_core"] < 5))
        out.append((f"exec beside {top} idle sandboxes ÷ empty host, p50", "≤ 1.5×",
                    f"{f['exec_p50_ratio_to_empty']}×", (f["exec_p50_ratio_to_empty"] or 99) <= 1.5))
    fl = r.get("files_throughput_mib_s")
    if fl:
        rd = fl["read"].get("withruntime_curl", fl["read"]["withruntime"])
        out.append((f"{fl['size_mib']} MiB read through the API (curl)", "≥ 1024 MiB/s",
                    f"{rd} MiB/s", rd >= 1024))
        out.append((f"{fl['size_mib']} MiB write ÷ `dd conv=fsync` in the sandbox", "≥ 0.5",
                    f"{fl['write']['ratio']:.2f}", fl["write"]["ratio"] >= 0.5))
    ex = r.get("exec_roundtrip")
    if ex:
        out.append(("exec `true` ÷ the in-sandbox spawn floor, p50", "≤ 1.1×",
                    f"{ex['p50_vs_floor']:.2f}×", ex["p50_vs_floor"] <= 1.1))
    x = r.get("restore")
    if x:
        out.append(("restore from a checkpoint ÷ boot, p50", "use it if < 1",
                    f"{x['restore_p50_over_boot_p50']}", None))
    return out


def markdown_targets(r):
    t = targets(r)
    if not t:
        return []
    lines = ["", "| issue 11's target | wanted | this run | met |", "|---|---|---|---|"]
    for what, want, got, met in t:
        lines.append(f"| {what} | {want} | {got} | "
                     f"{'yes' if met else ('—' if met is None else '**no**')} |")
    return lines


def p50_99(s, digits=1):
    return f"{s['p50_ms']:.{digits}f} / {s['p99_ms']:.{digits}f}"


def markdown_pool(p):
    if not p:
        return []
    r, k = p["results"], p["config"]["burst"]
    cb, wb = r["cold_burst"], r["warm_burst"]
    return [
        "",
        f"| create → first exec of the default shape, ms (p50 / p99) | `--pool 0` (cold) | "
        f"`--pool {k}` (warm) | raw `runsc run /bin/true` | cold ÷ warm, p50 |",
        "|---|---|---|---|---|",
        f"| one at a time (n={r['warm_single']['n']}) | {p50_99(r['cold_single'])} | "
        f"{p50_99(r['warm_single'])} (the create alone: "
        f"{p50_99(r['warm_single']['create_only'])}) | {p50_99(r['runsc_run_true'])} | "
        f"{ratio(r['cold_single']['p50_ms'], r['warm_single']['p50_ms'])} |",
        f"| {k} at once | {p50_99(cb)} | {p50_99(wb)} (creates alone: "
        f"{p50_99(wb['create_only'])}) | — | — |",
        f"| then {k} `exec true` at once on those running sandboxes (the host's floor for a "
        f"burst) | {p50_99(cb['exec_burst_on_running'])} | "
        f"{p50_99(wb['exec_burst_on_running'])} | — | — |",
        "",
        f"Warm burst p99 ÷ one warm create p50: {ratio(wb['p99_ms'], r['warm_single']['p50_ms'])};"
        f" ÷ the host's floor (p99 of {k} execs at once): "
        f"{ratio(wb['p99_ms'], wb['exec_burst_on_running']['p99_ms'])}.",
    ]


def markdown_idle(d):
    if not d:
        return []
    fz, aw, raw = d["frozen"], d["awake"], d.get("raw_runsc")
    lines = [
        "",
        f"| idle sandboxes ({d['config']['memory_mib']} MiB, 1 vCPU) | CPU, frozen (sandboxes + "
        "daemon), % of a core | CPU, awake | exec p50 / p99 beside them ÷ empty host, frozen | "
        "awake | memory per sandbox, frozen / awake (cgroup), MiB |",
        "|---|---|---|---|---|---|",
    ]
    for n, s in d["summary"].items():
        f = fz["by_count"][n]
        a = aw["by_count"].get(n)
        awake_cpu = (f"{a['cpu']['together_pct_of_core']}" if a else
                     f"(≈{s['awake_per_sandbox_x_n_pct_of_core']}, not run: per sandbox × {n})")
        lines.append(
            f"| {n} | {f['cpu']['together_pct_of_core']} (sandboxes "
            f"{f['cpu']['sandboxes_pct_of_core']}) | {awake_cpu} | "
            f"{f['exec_p50_ratio_to_empty']}× / {f['exec_p99_ratio_to_empty']}× | "
            + (f"{a['exec_p50_ratio_to_empty']}× / {a['exec_p99_ratio_to_empty']}×" if a else "—")
            + f" | {f['memory']['cgroup_usage_mib_per_sandbox']} / "
            + (f"{a['memory']['cgroup_usage_mib_per_sandbox']}" if a else "—") + " |")
    if raw:
        lines.append(f"| raw `runsc run sleep`, {raw['n']} (no daemon) | — | "
                     f"{raw['together_pct_of_core']} | — | — | — / {raw['pss_mib_per_sandbox']} "
                     "(PSS) |")
    top = max(fz["by_count"], key=int)
    per = fz["by_count"][top]["memory"]["cgroup_usage_mib_per_sandbox"]
    ram = d.get("host_ram_mib")
    if per and ram:
        lines += ["", f"Density: {top} frozen sandboxes took {per} MiB each (their cgroups; "
                  f"the host's MemAvailable fell by "
                  f"{fz['by_count'][top]['memory']['host_memavailable_drop_mib_per_sandbox']} MiB "
                  f"each, other work included), so this host's {ram / 1024:.1f} GiB would hold "
                  f"about {int(ram / per)} idle sandboxes by memory alone; the daemon's RSS with "
                  f"them was {fz['by_count'][top]['memory']['daemon_rss_mib']} MiB."]
    e = fz.get("exec_empty_host")
    if e:
        lines += ["", f"Exec `true` on an empty host (the frozen daemon's own): "
                  f"{p50_99(e)} ms p50 / p99. Host busy during the largest frozen window: "
                  f"{fz['by_count'][max(fz['by_count'], key=int)]['cpu']['host_busy_pct_of_core']}"
                  " % of a core (everything on the machine)."]
    return lines


def markdown_restore(x):
    if not x:
        return []
    return [
        "",
        "| start a sandbox (raw runsc, `sleep` as init), ms (p50 / p99) | to detached | then "
        "`runsc exec /bin/true` |",
        "|---|---|---|",
        f"| boot: `runsc run -detach` | {p50_99(x['boot_run_detach'])} | "
        f"{p50_99(x['boot_then_exec'])} |",
        f"| restore: `runsc restore -detach` of a checkpoint ({x['checkpoint_image_bytes']} "
        f"bytes, taken in {x['checkpoint_s']} s) | {p50_99(x['restore_detach'])} | "
        f"{p50_99(x['restore_then_exec'])} |",
        "",
        f"Restore ÷ boot, p50: {x['restore_p50_over_boot_p50']}.",
    ]


def chart(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install -r bench/requirements.txt); no chart")
        return False
    r = res["results"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    colors = {"withruntime": "#9db7db", "withruntime_through_delete": "#3b6fb6",
              "runsc_run": "#e08a2c", "host_subprocess": "#6a9f4a", "spawn_floor": "#c9a227",
              "sandbox_dd": "#c9a227"}
    labels = {"withruntime": "withruntime (to first exec)",
              "withruntime_through_delete": "withruntime (through delete)",
              "runsc_run": "raw runsc run (through teardown)",
              "host_subprocess": "host subprocess",
              "spawn_floor": "posix_spawn + wait in the sandbox",
              "sandbox_dd": "dd in the sandbox (write: conv=fsync; read: page cache)"}

    def bars(ax, groups, title, names=None):
        names = dict(labels, **(names or {}))
        qs = ["p50_ms", "p90_ms", "p99_ms"]
        systems = [s for s in ("withruntime", "withruntime_through_delete", "runsc_run",
                               "spawn_floor", "host_subprocess") if s in groups]
        width = 0.8 / len(systems)
        for k, s in enumerate(systems):
            xs = [i + k * width for i in range(len(qs))]
            vals = [groups[s][q] for q in qs]
            ax.bar(xs, vals, width, label=names[s], color=colors[s])
            for x, v in zip(xs, vals):
                ax.text(x, v, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center",
                        va="bottom", fontsize=7)
        ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(qs))])
        ax.set_xticklabels(["p50", "p90", "p99"])
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title(title)
        ax.legend(fontsize=8)

    lat = r.get("create_to_first_exec")
    if lat:
        modes = list(lat)
        bars(axes[0][0], lat[modes[0]], "create → first exec (→ delete), one at a time")
        bars(axes[0][1], lat[modes[1]],
             f"create → first exec (→ delete), {modes[1].split('_')[1]} at once")
    if "exec_roundtrip" in r:
        bars(axes[1][0], r["exec_roundtrip"], "exec `true` round trip vs the spawn floor",
             {"withruntime": "withruntime (API round trip)"})
    f = r.get("files_throughput_mib_s")
    ax = axes[1][1]
    series = [("files API, python client", "#9db7db", "withruntime", "withruntime"),
              ("files API, curl to /dev/null (read)", "#3b6fb6", None, "withruntime_curl"),
              (labels["sandbox_dd"], colors["sandbox_dd"], "sandbox_dd_fsync",
               "sandbox_dd_page_cache")]
    for k, (name, color, wkey, rkey) in enumerate(series if f else ()):
        pts = [(i + k * 0.27, f[op].get(key)) for i, (op, key) in
               enumerate((("write", wkey), ("read", rkey))) if key and f[op].get(key)]
        if not pts:
            continue
        ax.bar([x for x, _ in pts], [v for _, v in pts], 0.27, label=name, color=color)
        for x, v in pts:
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([0.27, 1.27])
    ax.set_xticklabels(["write", "read"])
    ax.set_yscale("log")
    ax.set_ylabel("MiB/s (log)")
    ax.set_title(f"{f['size_mib'] if f else '-'} MiB through the files API vs dd in the sandbox")
    ax.legend(fontsize=8)
    m = res["machine"]
    fig.suptitle(f"withruntime bench — {m['nproc']} CPUs, {m['ram_gib']} GiB, kernel "
                 f"{m['kernel']}, {m['runsc']} ({m['runsc_platform']}), {res['started_at']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("RUNTIME_URL"),
                    help="a running daemon (loopback only); default: start one")
    ap.add_argument("--state-dir", help="state dir for the daemon started here (default: a "
                    "fresh temporary one); with --url, where to find the image rootfs")
    ap.add_argument("--rootfs", help="image rootfs for the raw runsc baseline "
                    "(default: found in the state dir)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/withruntime"))
    ap.add_argument("--agent", default=os.path.join(ROOT, "build/withruntime-agent"))
    ap.add_argument("-n", type=int, default=30, help="one-at-a-time samples (default 30)")
    ap.add_argument("--parallel", type=int, default=20, help="sandboxes at once (default 20)")
    ap.add_argument("--exec-n", type=int, default=300,
                    help="exec round trips, and spawns of the floor (default 300)")
    ap.add_argument("--file-mib", type=int, default=100)
    # dd with conv=fsync swings with the disk: five reps give a steadier median than three
    ap.add_argument("--file-reps", type=int, default=5)
    ap.add_argument("--memory-mib", type=int, default=512)
    ap.add_argument("--platform", default="systrap", help="runsc platform for the baseline")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    ap.add_argument("--pool-n", type=int, default=20,
                    help="pool: single creates of each kind (default 20); bursts are --parallel")
    ap.add_argument("--restore-n", type=int, default=10,
                    help="restore: boots and restores of each (default 10)")
    ap.add_argument("--sdk-n", type=int, default=200,
                    help="sdk: calls of each kind on each transport (default 200)")
    ap.add_argument("--density-n", type=int, default=100,
                    help="density: default-shape sandboxes in all, --parallel at a time "
                    "(default 100)")
    import idle  # noqa: E402 - bench/idle.py (imports this module)
    idle.add_args(ap, "idle-")
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts to run: {', '.join(PARTS)} (default: all)")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    if parts - set(PARTS):
        ap.error(f"--only: unknown part(s) {', '.join(sorted(parts - set(PARTS)))}")

    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (runsc and the daemon need it)")
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    busy0 = host_jiffies()
    workdir = tempfile.mkdtemp(prefix="wr-bench-")
    own_state = None
    daemon = None
    bench = None
    try:
        if args.url:
            url = args.url
            state_dir = args.state_dir or "/var/lib/withruntime"
        else:
            state_dir = args.state_dir
            if not state_dir:
                state_dir = own_state = tempfile.mkdtemp(prefix="wr-bench-state-",
                                                         dir="/var/tmp")
            os.makedirs(state_dir, exist_ok=True)
            daemon = Daemon(args.bin, args.agent, state_dir)
            daemon.start()
            url = daemon.url
        rootfs = args.rootfs or find_rootfs(state_dir)
        if not rootfs:
            raise SystemExit(f"bench: no image rootfs found under {state_dir}; pass --rootfs")
        log(f"daemon {url}, rootfs {rootfs}")
        api = Api(url, daemon.key if daemon else os.environ.get("RUNTIME_API_KEY"))
        bench = Bench(api, rootfs, args, workdir)

        results = {}
        if "latency" in parts:
            results["create_to_first_exec"] = measure_latency(bench, args.n, args.parallel)
        if "exec" in parts:
            results["exec_roundtrip"] = measure_exec(bench, args.exec_n)
        if "files" in parts:
            results["files_throughput_mib_s"] = measure_files(bench, args.file_mib,
                                                              args.file_reps)
        health = api.json("GET", "/v1/health")
        # The parts below start daemons of their own (or none): ours goes quiet first.
        bench.cleanup()
        bench = None
        if daemon:
            daemon.stop()
        images = os.path.realpath(os.path.join(state_dir, "images"))
        if "pool" in parts:
            import pool  # noqa: E402 - bench/pool.py
            results["pool"] = pool.measure(
                argparse.Namespace(bin=args.bin, agent=args.agent, n=args.pool_n,
                                   burst=args.parallel, platform=args.platform),
                images, rootfs, tempfile.mkdtemp(dir=workdir))
        if "idle" in parts:
            results["idle"] = idle.measure(argparse.Namespace(
                bin=args.bin, agent=args.agent, image_state_dir=state_dir, rootfs=rootfs,
                counts=sorted(int(x) for x in args.idle_counts.split(",")),
                awake_max=args.idle_awake_max, window=args.idle_window,
                exec_n=args.idle_exec_n, memory_mib=args.idle_memory_mib))
        if "restore" in parts:
            import restore  # noqa: E402 - bench/restore.py
            log(f"runsc checkpoint/restore against run, {args.restore_n} each")
            results["restore"] = restore.measure(rootfs, args.platform, args.restore_n,
                                                 tempfile.mkdtemp(dir=workdir))
        if "sdk" in parts:
            import sdk  # noqa: E402 - bench/sdk.py
            results["sdk"] = sdk.measure(argparse.Namespace(bin=args.bin, agent=args.agent,
                                                            n=args.sdk_n),
                                         images, tempfile.mkdtemp(dir=workdir))
        if "density" in parts:
            import density  # noqa: E402 - bench/density.py
            results["density"] = density.measure(
                argparse.Namespace(bin=args.bin, agent=args.agent, n=args.density_n,
                                   wave=args.parallel), images)
        busy1 = host_jiffies()
        machine = machine_info(args.platform)
        machine["host_busy_pct_during_run"] = round(
            100 * (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1), 1)
        res = {
            "started_at": started,
            "commit": git_commit(),
            "machine": machine,
            "daemon": {"url": url, "started_here": daemon is not None,
                       "health": health},
            "config": {"n": args.n, "parallel": args.parallel, "exec_n": args.exec_n,
                       "file_mib": args.file_mib, "file_reps": args.file_reps,
                       "only": args.only,
                       "memory_mib": args.memory_mib, "rootfs": rootfs},
            "results": results,
        }
        jpath = write_json(args.out, "latest.json", res)
        ppath = os.path.join(args.out, "latest.png")
        drew = chart(res, ppath)
        print(markdown(res))
        print()
        print(f"wrote {jpath}" + (f" and {ppath}" if drew else ""))
    finally:
        if bench:
            bench.cleanup()
        if daemon:
            daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        if own_state:
            remove_state_dir(own_state)


if __name__ == "__main__":
    main()
