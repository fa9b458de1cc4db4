#!/usr/bin/env python3
"""withruntime under hostile load: the daemon's memory, CPU and fds, and exec latency, phase by
phase, beside an idle baseline taken in the same run (issue 8, points 9 and 12).

Starts its own daemon (build/withruntime serve, loopback, a free port; a fresh temporary state
directory unless --state-dir names one), makes two sandboxes, A (the hostile one) and B (the
one that measures), and runs:

  idle      nothing; B's `exec true` and GET /v1/health measured back to back
  slow      20 slow readers of a 1 TB sparse file in A (raw sockets, SO_RCVBUF 4 KiB, each
            taking ~64 KiB/s)
  cancel    one reader that takes the same file as fast as it can, then disconnects mid-read:
            how long until A's CPU (GET .../stats cpu_usec) and the daemon's are idle again
  uploads   8 parallel uploads to A of the largest body the daemon accepts (found from its 413)
  idle_conns 2,000 idle TCP connections held open
  slowloris 2,000 connections sending a request line and half a header, then a byte a second:
            the header deadline (serve --header-timeout, 10 s) closes them; reports when
  over_cap  6,000 idle connections, past the connection cap (serve --max-connections, 4096):
            the idle-longest are closed for new ones, and the daemon's fds stay at the cap
  flood_*   fairness: A floods output through the daemon (64 x `yes`) in several ways while
            B's `exec true` latency is measured; the ratio to idle is the figure of point 9
            (target <= 2x). flood_devnull (64 x `yes > /dev/null`: CPU only, no output through
            the daemon) is the control that separates CPU contention from output handling.

Through every phase a sampler reads the daemon's VmRSS, utime+stime and open fds from /proc
every 100 ms, the sandboxes' cpuacct.usage, and the host's /proc/stat. Each phase is followed by
a settle period (the daemon trims its heap every 5 s) and the RSS then is reported as "after".

Writes bench/results/hostile.json (+ hostile.png) and prints a Markdown table.
"""

import argparse
import datetime
import json
import os
import re
import resource
import selectors
import signal
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as base  # noqa: E402  (bench/run.py: Api, Daemon, stats_ms, machine_info, ...)

log = base.log
ROOT = base.ROOT
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = 64 * 1024


# ---------------------------------------------------------------- sampling /proc

class QuietRun:
    """Three quiet 100 ms intervals in a row mean idle, from the start of the first of them:
    .at is that moment, in seconds after t0 (None until then)."""

    NEED = 3

    def __init__(self, t0):
        self.t0 = t0
        self.count = 0
        self.since = None
        self.at = None

    def feed(self, quiet, now):
        if self.at is not None:
            return
        if not quiet:
            self.count = 0
            return
        self.count += 1
        if self.count == 1:
            self.since = now
        if self.count == self.NEED:
            self.at = self.since - self.t0


def proc_cpu_s(pid):
    """utime+stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK  # fields 14 and 15


def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def proc_nfds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def host_cpu_s():
    """(busy, total) seconds of all CPUs since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    total = sum(v[:8])
    idle = v[3] + v[4]
    return (total - idle) / CLK_TCK, total / CLK_TCK


def cgroup_cpu_s(sid):
    try:
        with open(f"/sys/fs/cgroup/cpuacct/withruntime/{sid}/cpuacct.usage") as f:
            return int(f.read()) / 1e9
    except (OSError, ValueError):
        return None


class Sampler(threading.Thread):
    """Samples the daemon (and the sandboxes' cgroups, the host, this process) every 100 ms."""

    def __init__(self, pid, sandboxes):
        super().__init__(daemon=True)
        self.pid, self.sandboxes = pid, dict(sandboxes)
        self.samples = []
        self.stop_ev = threading.Event()
        self.t0 = time.monotonic()

    def sample(self):
        busy, total = host_cpu_s()
        return {"t": time.monotonic(), "rss_kib": proc_rss_kib(self.pid),
                "cpu_s": proc_cpu_s(self.pid), "fds": proc_nfds(self.pid),
                "host_busy_s": busy, "host_total_s": total, "bench_cpu_s": proc_cpu_s("self"),
                "sb": {k: cgroup_cpu_s(v) for k, v in self.sandboxes.items()}}

    def run(self):
        while not self.stop_ev.is_set():
            try:
                self.samples.append(self.sample())
            except OSError:  # the daemon went away
                return
            self.stop_ev.wait(0.1)

    def window(self, t0, t1):
        return [s for s in self.samples if t0 <= s["t"] <= t1]

    def at(self, t):
        """The last sample at or before t."""
        best = self.samples[0]
        for s in self.samples:
            if s["t"] > t:
                break
            best = s
        return best

    def summary(self, t0, t1):
        return self.summary_of([(t0, t1)])

    def summary_of(self, windows):
        """Peaks over the windows' samples; rates as the sum of each window's deltas over the
        sum of their lengths."""
        rss, fds, dt, host_total = [], [], 0.0, 0.0
        d = {"cpu_s": 0.0, "host_busy_s": 0.0, "bench_cpu_s": 0.0}
        sb = {k: 0.0 for k in self.sandboxes}
        for t0, t1 in windows:
            w = self.window(t0, t1)
            if len(w) < 2:
                w = [self.at(t0), self.at(t1)]
            a, b = w[0], w[-1]
            rss += [s["rss_kib"] for s in w]
            fds += [s["fds"] for s in w]
            dt += b["t"] - a["t"]
            host_total += b["host_total_s"] - a["host_total_s"]
            for k in d:
                d[k] += b[k] - a[k]
            for k in sb:
                if sb[k] is not None and a["sb"].get(k) is not None and \
                        b["sb"].get(k) is not None:
                    sb[k] += b["sb"][k] - a["sb"][k]
                else:
                    sb[k] = None
        dt, host_total = max(dt, 1e-6), max(host_total, 1e-6)
        return {
            "seconds": round(sum(t1 - t0 for t0, t1 in windows), 1),
            "rss_peak_mib": round(max(rss) / 1024, 1),
            "rss_mean_mib": round(sum(rss) / len(rss) / 1024, 1),
            "cpu_pct": round(100 * d["cpu_s"] / dt, 1),
            "fds_peak": max(fds),
            "host_busy_pct": round(100 * d["host_busy_s"] / host_total, 1),
            "bench_cpu_pct": round(100 * d["bench_cpu_s"] / dt, 1),
            "sandbox_cpu_pct": {k: round(100 * v / dt, 1) for k, v in sb.items()
                                if v is not None},
        }


# ---------------------------------------------------------------- raw HTTP

class Raw:
    """Requests over raw sockets, for what http.client cannot do: small receive buffers,
    paced reads, leaving mid-response, bodies sent from a generator, idle connections."""

    def __init__(self, api):
        self.host, self.port = api.host, api.port
        self.auth = api.headers.get("Authorization")

    def connect(self, rcvbuf=None, timeout=10):
        s = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect((self.host, self.port))
        return s

    def head(self, method, path, query=None, length=None, ctype=None):
        if query:
            path += "?" + urllib.parse.urlencode(query)
        h = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if self.auth:
            h.append(f"Authorization: {self.auth}")
        if length is not None:
            h.append(f"Content-Length: {length}")
        if ctype:
            h.append(f"Content-Type: {ctype}")
        return ("\r\n".join(h) + "\r\n\r\n").encode()

    def request(self, method, path, query=None, body=None, rcvbuf=None):
        s = self.connect(rcvbuf)
        if isinstance(body, (dict, list)):
            data = json.dumps(body).encode()
            s.sendall(self.head(method, path, query, len(data), "application/json") + data)
        else:
            s.sendall(self.head(method, path, query))
        return s


def read_status(s, timeout):
    """Reads until the end of a response head; returns (status, head bytes, rest)."""
    s.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf and len(buf) < 65536:
        d = s.recv(4096)
        if not d:
            break
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return (int(m.group(1)) if m else None), head, rest


# ---------------------------------------------------------------- the bench

class Hostile:
    def __init__(self, api, daemon, args):
        self.api, self.daemon, self.args = api, daemon, args
        self.raw = Raw(api)
        self.live = set()
        self.results = {}
        self.phases = []  # (name, t0, t1, t_after)

    # -- sandboxes

    def create(self, name, cpus=None):
        sb = self.api.json("POST", "/v1/sandboxes", {"memory_mib": self.args.memory_mib,
                                                     "cpus": cpus or self.args.cpus,
                                                     "metadata": {"bench": f"hostile-{name}"}})
        self.live.add(sb["id"])
        return sb["id"]

    def sh(self, sid, command, timeout=60):
        r = self.api.json("POST", f"/v1/sandboxes/{sid}/exec",
                          {"command": command, "timeout_seconds": timeout})
        if r["exit_code"] != 0:
            raise RuntimeError(f"{command!r} in {sid}: {r}")
        return r

    def cleanup(self):
        for sid in list(self.live):
            try:
                self.api.call("DELETE", f"/v1/sandboxes/{sid}", timeout=120)
                self.live.discard(sid)
            except Exception as e:  # keep cleaning the rest
                log(f"could not delete {sid}: {e}")

    # -- probing B

    def probe_once(self, lat_exec, lat_health, errors):
        t0 = time.perf_counter()
        try:
            r = self.api.json("POST", f"/v1/sandboxes/{self.b}/exec", {"argv": ["true"]},
                              timeout=60)
            if r["exit_code"] != 0:
                raise RuntimeError(f"exit {r['exit_code']}")
            lat_exec.append(time.perf_counter() - t0)
        except Exception as e:
            errors.append(f"exec: {e}"[:200])
        t0 = time.perf_counter()
        try:
            self.api.call("GET", "/v1/health", timeout=60)
            lat_health.append(time.perf_counter() - t0)
        except Exception as e:
            errors.append(f"health: {e}"[:200])

    def phase(self, name, start=None, stop=None, min_s=None, min_exec=None, max_s=None,
              settle=None, busy=None):
        """Runs one phase: start() the load, probe B back to back until min_s seconds and
        min_exec samples and busy() is false (at most max_s), stop(ctx) the load, then
        settle. Returns the phase's record (its load's own numbers under "load")."""
        a = self.args
        min_s = a.phase_seconds if min_s is None else min_s
        min_exec = a.min_exec if min_exec is None else min_exec
        max_s = max_s or 4 * min_s + 20
        settle = a.settle if settle is None else settle
        log(f"phase {name}")
        t0 = time.monotonic()
        ctx = start() if start else None
        lat_e, lat_h, errors = [], [], []
        while True:
            el = time.monotonic() - t0
            if el >= max_s or (el >= min_s and len(lat_e) >= min_exec
                               and not (busy and busy())):
                break
            self.probe_once(lat_e, lat_h, errors)
            time.sleep(a.probe_gap)
        t1 = time.monotonic()
        load = stop(ctx) if stop else None
        time.sleep(settle)
        t2 = time.monotonic()
        rec = self.sampler.summary(t0, t1)
        after = self.sampler.at(t2)
        rec["rss_after_mib"] = round(after["rss_kib"] / 1024, 1)
        rec["fds_after"] = after["fds"]
        rec["settle_s"] = settle
        rec["exec_true"] = base.stats_ms(lat_e) if lat_e else None
        rec["health"] = base.stats_ms(lat_h) if lat_h else None
        rec["probe_errors"] = errors[:10]
        rec["probe_error_count"] = len(errors)
        if load is not None:
            rec["load"] = load
        self.phases.append((name, t0, t1, t2))
        self.results[name] = rec
        e = rec["exec_true"]
        log(f"  {name}: rss peak {rec['rss_peak_mib']} MiB, after {rec['rss_after_mib']} MiB, "
            f"cpu {rec['cpu_pct']}%, fds {rec['fds_peak']}, exec p50 "
            f"{e['p50_ms'] if e else '-'} ms" + (f", load {load}" if load else ""))
        return rec

    def fair_phase(self, name, load):
        """Fairness: rounds of an idle block then a load block (load() starts A's flood and
        returns (ctx, finish); finish stops it and waits until A is idle), B probed in each, so
        the idle figures beside the flood's are taken minutes, not seconds, apart on a shared
        machine. Resource figures are over the load blocks only."""
        a = self.args
        rounds = a.rounds
        m = -(-a.min_exec // rounds)
        per = a.phase_seconds / rounds
        log(f"phase {name} ({rounds} rounds of idle then flood, {m}+ probes each)")
        lat = {"idle": ([], [], []), "load": ([], [], [])}
        wins = {"idle": [], "load": []}
        loads = []

        def block(kind):
            t0 = time.monotonic()
            e, hh, errs = lat[kind]
            n0 = len(e)
            while len(e) - n0 < m or time.monotonic() - t0 < per:
                self.probe_once(e, hh, errs)
                time.sleep(a.probe_gap)
                if time.monotonic() - t0 > 4 * per + 20:
                    break
            wins[kind].append((t0, time.monotonic()))

        t_begin = time.monotonic()
        for _ in range(rounds):
            self.wait_sandbox_idle(self.a)
            block("idle")
            ctx, fin = load()
            time.sleep(a.ramp)
            block("load")
            loads.append(fin(ctx))
        time.sleep(a.settle)
        t2 = time.monotonic()
        rec = self.sampler.summary_of(wins["load"])
        after = self.sampler.at(t2)
        rec["rss_after_mib"] = round(after["rss_kib"] / 1024, 1)
        rec["fds_after"] = after["fds"]
        rec["settle_s"] = a.settle
        rec["rounds"] = rounds
        e, hh, errs = lat["load"]
        rec["exec_true"] = base.stats_ms(e) if e else None
        rec["health"] = base.stats_ms(hh) if hh else None
        ie, ih, ierrs = lat["idle"]
        rec["interleaved_idle"] = self.sampler.summary_of(wins["idle"])
        rec["interleaved_idle"]["exec_true"] = base.stats_ms(ie) if ie else None
        rec["interleaved_idle"]["health"] = base.stats_ms(ih) if ih else None
        rec["probe_errors"] = (errs + ierrs)[:10]
        rec["probe_error_count"] = len(errs) + len(ierrs)
        merged = {}
        for ld in loads:
            for k, v in (ld or {}).items():
                merged.setdefault(k, []).append(v)
        rec["load"] = {k: (round(sum(v) / len(v), 1) if all(isinstance(x, (int, float))
                                                             for x in v) else v[0])
                       for k, v in merged.items()}
        self.phases.append((name, t_begin, wins["load"][-1][1], t2))
        self.results[name] = rec
        ex, ix = rec["exec_true"], rec["interleaved_idle"]["exec_true"]
        log(f"  {name}: B exec p50 {ex['p50_ms'] if ex else '-'} ms under load, "
            f"{ix['p50_ms'] if ix else '-'} ms idle between; daemon cpu {rec['cpu_pct']}%, "
            f"A {rec['sandbox_cpu_pct'].get('A')}%, load {rec['load']}")
        return rec

    def wait_sandbox_idle(self, sid, limit=15):
        """Waits (up to limit s) until sid's CPU over 0.5 s is under the idle threshold;
        returns whether it is."""
        t_end = time.monotonic() + limit
        prev = cgroup_cpu_s(sid)
        while time.monotonic() < t_end:
            time.sleep(0.5)
            cur = cgroup_cpu_s(sid)
            if prev is None or cur is None or (cur - prev) / 0.5 < self.idle_threshold:
                return True
            prev = cur
        if limit > 5:
            log(f"  {sid} still busy after {limit} s")
        return False

    # -- phase (a): slow readers

    def slow_readers(self):
        n, rate = self.args.slow_readers, self.args.slow_rate_kib * 1024
        stop = threading.Event()
        got = [0] * n
        status = [None] * n
        ended = [None] * n

        def reader(i):
            try:
                s = self.raw.request("GET", f"/v1/sandboxes/{self.a}/files/content",
                                     {"path": "/workspace/huge"}, rcvbuf=4096)
            except OSError as e:
                ended[i] = f"connect: {e}"
                return
            with s:
                try:
                    status[i], _, rest = read_status(s, 30)
                    got[i] = len(rest)
                    t0 = time.monotonic()
                    s.settimeout(5)
                    while not stop.is_set():
                        allowed = rate * (time.monotonic() - t0) - got[i]
                        if allowed < 4096:
                            time.sleep(min(0.05, (4096 - allowed) / rate))
                            continue
                        d = s.recv(min(int(allowed), 16384))
                        if not d:
                            ended[i] = "closed by the daemon"
                            return
                        got[i] += len(d)
                except OSError as e:
                    ended[i] = str(e)

        threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(n)]
        t0 = time.monotonic()
        for t in threads:
            t.start()

        def finish(_):
            dur = time.monotonic() - t0
            stop.set()
            for t in threads:
                t.join(10)
            return {"readers": n, "target_kib_s": self.args.slow_rate_kib,
                    "status": sorted(set(str(x) for x in status)),
                    "mean_kib_s": round(sum(got) / n / dur / 1024, 1),
                    "min_kib_s": round(min(got) / dur / 1024, 1),
                    "ended_early": [e for e in ended if e][:5]}
        return None, finish

    # -- phase (b): a fast reader that leaves mid-read

    def cancel_mid_read(self):
        """Reads fast for a while, disconnects, then times the fall of A's CPU (API stats) and
        the daemon's CPU back to idle, and the daemon's files.read_cancelled log line."""
        log_pos = os.path.getsize(self.daemon.log_path)
        s = self.raw.request("GET", f"/v1/sandboxes/{self.a}/files/content",
                             {"path": "/workspace/huge"})
        st, _, rest = read_status(s, 30)
        got = len(rest)
        t0 = time.monotonic()
        s.settimeout(5)
        while time.monotonic() - t0 < self.args.fast_read_seconds:
            d = s.recv(1 << 20)
            if not d:
                break
            got += len(d)
        read_s = time.monotonic() - t0
        s.close()
        t_close = time.monotonic()
        # poll stats every 100 ms
        stat = self.api.json("GET", f"/v1/sandboxes/{self.a}/stats")
        prev_t, prev_c, prev_d = time.monotonic(), stat["cpu_usec"], proc_cpu_s(self.dpid)
        sb_quiet, d_quiet = QuietRun(t_close), QuietRun(t_close)
        logged_at = None
        thr = self.idle_threshold
        while time.monotonic() - t_close < 30 and (sb_quiet.at is None or d_quiet.at is None
                                                   or logged_at is None):
            time.sleep(0.1)
            stat = self.api.json("GET", f"/v1/sandboxes/{self.a}/stats")
            now, c, dc = time.monotonic(), stat["cpu_usec"], proc_cpu_s(self.dpid)
            dt = now - prev_t
            sb_quiet.feed((c - prev_c) / 1e6 / dt < thr, now)
            d_quiet.feed((dc - prev_d) / dt < max(thr, 0.05), now)
            if logged_at is None:
                with open(self.daemon.log_path, "rb") as f:
                    f.seek(log_pos)
                    if b"files.read_cancelled" in f.read():
                        logged_at = now - t_close
            prev_t, prev_c, prev_d = now, c, dc

        def r(x):
            return None if x is None else round(max(x, 0.0), 2)
        return {"status": st, "read_mib": round(got / 2**20, 1),
                "read_mib_s": round(got / 2**20 / read_s, 1),
                "sandbox_cpu_idle_within_s": r(sb_quiet.at),
                "daemon_cpu_idle_within_s": r(d_quiet.at),
                "read_cancelled_logged_within_s": r(logged_at),
                "idle_threshold_pct_of_a_core": round(100 * thr, 1)}

    # -- phase (c): parallel maximal uploads

    def upload_limit(self):
        """The largest upload the daemon accepts: from the number in its 413 to a declared
        Content-Length of 1 TiB, else from docs/api.md; checked (limit+1 -> 413)."""
        def ask(length):
            s = self.raw.connect()
            with s:
                s.sendall(self.raw.head("PUT", f"/v1/sandboxes/{self.a}/files/content",
                                        {"path": "/workspace/limit-probe"}, length,
                                        "application/octet-stream"))
                try:
                    st, head, rest = read_status(s, 3)
                except socket.timeout:
                    return None, b""  # waiting for the body: accepted so far
                try:
                    s.settimeout(1)
                    while len(rest) < 4096:
                        d = s.recv(4096)
                        if not d:
                            break
                        rest += d
                except OSError:
                    pass
                return st, rest
        st, body = ask(1 << 40)
        limit, source = None, None
        m = re.search(rb"limit[^0-9]{0,40}(\d{4,})", body)
        if st == 413 and m:
            limit, source = int(m.group(1)), "the daemon's 413"
        else:
            try:
                with open(os.path.join(ROOT, "docs/api.md")) as f:
                    m = re.search(r"file upload:\s*(\d+)\s*(MiB|GiB)", f.read())
                if m:
                    limit = int(m.group(1)) << (20 if m.group(2) == "MiB" else 30)
                    source = "docs/api.md"
            except OSError:
                pass
        if limit is None:
            raise RuntimeError(f"cannot find the upload limit (413 answer {st}: {body[:200]!r})")
        over, _ = ask(limit + 1)
        return limit, source, over

    def uploads(self):
        limit, source, over = self.upload_limit()
        size = min(limit, self.args.upload_bytes) if self.args.upload_bytes else limit
        n = self.args.uploads
        log(f"  upload limit {limit} bytes (from {source}; limit+1 -> {over}); {n} x {size}")
        chunk = os.urandom(1 << 20)
        res = [None] * n

        def up(i):
            t0 = time.monotonic()
            try:
                s = self.raw.connect(timeout=120)
                with s:
                    s.sendall(self.raw.head("PUT", f"/v1/sandboxes/{self.a}/files/content",
                                            {"path": f"/workspace/up{i}.bin"}, size,
                                            "application/octet-stream"))
                    left = size
                    while left:
                        k = min(left, len(chunk))
                        s.sendall(chunk[:k] if k < len(chunk) else chunk)
                        left -= k
                    st, _, _ = read_status(s, 120)
                res[i] = (st, time.monotonic() - t0)
            except OSError as e:
                res[i] = (f"error: {e}", time.monotonic() - t0)

        threads = [threading.Thread(target=up, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()

        def finish(_):
            for t in threads:
                t.join(300)
            secs = [r[1] for r in res if r]
            ok = sum(1 for r in res if r and r[0] == 200)
            try:
                self.sh(self.a, "rm -f /workspace/up*.bin")
            except Exception as e:
                log(f"  rm of the uploads failed: {e}")
            return {"uploads": n, "bytes_each": size, "limit_bytes": limit,
                    "limit_from": source, "limit_plus_1_status": over,
                    "status": sorted(set(str(r[0]) for r in res if r)), "ok": ok,
                    "max_seconds": round(max(secs), 1) if secs else None,
                    "total_mib_s": round(ok * size / 2**20 / max(secs), 1) if secs else None}

        # the phase lasts as long as the uploads (probing meanwhile)
        self._uploads_threads = threads
        return None, finish

    # -- phase (d): idle connections

    def idle_conns(self, n=None):
        n = n or self.args.idle_conns
        socks, errors = [], []
        for _ in range(n):
            try:
                socks.append(self.raw.connect(timeout=5))
            except OSError as e:
                errors.append(str(e))
                if len(errors) > 20:
                    break

        def finish(_):
            closed = sum(self._closed(s) for s in socks)
            for s in socks:
                s.close()
            return {"asked": n, "opened": len(socks), "closed_by_daemon_during_phase": closed,
                    "connect_errors": errors[:3]}
        return None, finish

    def _closed(self, s):
        """Whether the daemon closed s (its end read, or a reset)."""
        s.setblocking(False)  # (with a timeout set, nothing to read would raise a timeout)
        try:
            return s.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def slowloris(self):
        n = self.args.slowloris
        t0 = time.monotonic()
        socks, errors = [], []
        for _ in range(n):
            try:
                s = self.raw.connect(timeout=5)
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                socks.append(s)
            except OSError as e:
                errors.append(str(e))
                if len(errors) > 20:
                    break
        closed_at = {}
        stop = threading.Event()

        def drip():
            while not stop.wait(1.0):
                for i, s in enumerate(socks):
                    if i in closed_at:
                        continue
                    if self._closed(s):
                        closed_at[i] = time.monotonic() - t0
                        continue
                    try:
                        s.send(b"a", socket.MSG_DONTWAIT)
                    except OSError:
                        closed_at[i] = time.monotonic() - t0
        t = threading.Thread(target=drip, daemon=True)
        t.start()
        self._slowloris_left = lambda: len(closed_at) < len(socks)

        def finish(_):
            stop.set()
            t.join()
            for s in socks:
                s.close()
            at = sorted(closed_at.values())
            return {"asked": n, "opened": len(socks), "connect_errors": errors[:3],
                    "closed_by_daemon": len(at),
                    "first_closed_s": round(at[0], 1) if at else None,
                    "last_closed_s": round(at[-1], 1) if at else None}
        return None, finish

    def over_cap(self):
        return self.idle_conns(self.args.over_cap)

    # -- phase (e): floods

    FLOOD = "for i in $(seq 64); do yes & done; wait"
    FLOOD_NULL = "for i in $(seq 64); do yes > /dev/null & done; wait"

    def flood_background(self, cmd):
        c = self.api.json("POST", f"/v1/sandboxes/{self.a}/exec",
                          {"command": cmd, "background": True, "timeout_seconds": 600})
        t0 = time.monotonic()

        def finish(_):
            dt = time.monotonic() - t0
            info = self.api.json("GET", f"/v1/sandboxes/{self.a}/commands/{c['id']}")
            try:
                self.api.call("POST", f"/v1/sandboxes/{self.a}/commands/{c['id']}/signal",
                              {"signal": "KILL"})
                self.api.call("POST", f"/v1/sandboxes/{self.a}/commands/{c['id']}/wait",
                              {"timeout_seconds": 30})
            except RuntimeError as e:
                log(f"  stopping the flood: {e}")
            self.wait_sandbox_idle(self.a)
            return {"output_mib_s": round(info.get("stdout_bytes", 0) / 2**20 / dt, 1)}
        return None, finish

    KILL_YES = ("for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = yes ] && "
                "kill -9 ${p#/proc/}; done; true")

    def flood_capped(self):
        """A foreground exec whose output passes its cap at once (the rest is drained and
        dropped). The bench then leaves; if the command is still running 3 s later (a caller
        that leaves a non-streamed exec does not cancel it), its `yes` processes are killed
        from another exec."""
        s = self.raw.request("POST", f"/v1/sandboxes/{self.a}/exec",
                             body={"command": self.FLOOD, "max_output_bytes": 1 << 20,
                                   "timeout_seconds": 120})

        def finish(_):
            s.close()
            left = not self.wait_sandbox_idle(self.a, limit=3)
            if left:
                self.sh(self.a, self.KILL_YES)
                self.wait_sandbox_idle(self.a)
            return {"still_running_3s_after_disconnect": left}
        return None, finish

    def flood_stream(self):
        """64 streamed execs of `yes`, read by one thread here as fast as it can."""
        n = 64
        socks = [self.raw.request("POST", f"/v1/sandboxes/{self.a}/exec",
                                  body={"argv": ["yes"], "stream": True, "timeout_seconds": 120})
                 for _ in range(n)]
        stop = threading.Event()
        total = [0]

        def pump():
            sel = selectors.DefaultSelector()
            for s in socks:
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
            buf = bytearray(1 << 18)
            while not stop.is_set():
                for key, _ in sel.select(0.2):
                    try:
                        k = key.fileobj.recv_into(buf)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        k = 0
                    if not k:
                        sel.unregister(key.fileobj)
                    total[0] += k
            sel.close()

        th = threading.Thread(target=pump, daemon=True)
        th.start()
        t0 = time.monotonic()

        def finish(_):
            dt = time.monotonic() - t0
            stop.set()
            th.join(10)
            for s in socks:
                s.close()
            self.wait_sandbox_idle(self.a)
            return {"streams": n, "read_mib_s": round(total[0] / 2**20 / dt, 1)}
        return None, finish


def two(load):
    """start() for Hostile.phase from a (ctx, finish) pair: keeps finish for stop()."""
    holder = {}

    def start():
        ctx, fin = load()
        holder["fin"] = fin
        return ctx

    def stop(ctx):
        return holder["fin"](ctx)
    return start, stop


# ---------------------------------------------------------------- report

def fmt_ms(s):
    return "—" if not s else f"{s['p50_ms']:.1f} / {s['p90_ms']:.1f} / {s['p99_ms']:.1f}"


def note(name, rec):
    ld = rec.get("load") or {}
    if name == "slow":
        return (f"{ld['readers']} readers got {ld['mean_kib_s']} KiB/s each (min "
                f"{ld['min_kib_s']}; HTTP {','.join(ld['status'])})"
                + (f"; ended early: {ld['ended_early']}" if ld["ended_early"] else ""))
    if name == "cancel":
        return (f"read {ld['read_mib']} MiB at {ld['read_mib_s']} MiB/s, then left: A's CPU idle "
                f"within {ld['sandbox_cpu_idle_within_s']} s, the daemon's within "
                f"{ld['daemon_cpu_idle_within_s']} s, `files.read_cancelled` logged within "
                f"{ld['read_cancelled_logged_within_s']} s")
    if name == "uploads":
        return (f"{ld['uploads']} × {ld['bytes_each'] / 2**20:.0f} MiB (the limit: "
                f"{ld['limit_bytes'] / 2**20:.0f} MiB from {ld['limit_from']}; limit+1 → "
                f"{ld['limit_plus_1_status']}): {ld['ok']} ok "
                f"({','.join(ld['status'])}), slowest {ld['max_seconds']} s, "
                f"{ld['total_mib_s']} MiB/s in all")
    if name in ("idle_conns", "over_cap"):
        return (f"{ld['opened']} of {ld['asked']} open; {ld['closed_by_daemon_during_phase']} "
                f"closed by the daemon during the phase; daemon fds peak {rec['fds_peak']}")
    if name == "slowloris":
        return (f"{ld['opened']} of {ld['asked']} open; {ld['closed_by_daemon']} closed by the "
                f"header deadline, {ld['first_closed_s']}-{ld['last_closed_s']} s after the "
                "first was opened")
    if name.startswith("flood"):
        parts = [f"A {rec['sandbox_cpu_pct'].get('A', '?')}% / B "
                 f"{rec['sandbox_cpu_pct'].get('B', '?')}% CPU"]
        if "output_mib_s" in ld:
            parts.append(f"{ld['output_mib_s']} MiB/s of output")
        if "read_mib_s" in ld:
            parts.append(f"{ld['streams']:.0f} streams read at {ld['read_mib_s']} MiB/s")
        if ld.get("still_running_3s_after_disconnect"):
            parts.append("the exec went on after its caller left (killed from another exec)")
        return "; ".join(parts)
    return ""


def markdown(res):
    m = res["machine"]
    idle = res["phases"]["idle"]
    lines = [
        f"withruntime under hostile load, {res['started_at']}, commit "
        f"{res['commit']['sha'][:12]}"
        + (" (with uncommitted changes)" if res["commit"]["dirty"] else ""),
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, kernel "
        f"{m['kernel']}, {m['runsc']}. Sandboxes: {res['config']['cpus']} CPUs "
        f"(A: {res['config']['a_cpus'] or res['config']['cpus']}), "
        f"{res['config']['memory_mib']} MiB each. Host load average at start: "
        f"{res['loadavg_at_start']}.",
        "",
        "| phase | s | daemon RSS peak, MiB (Δ idle) | RSS after settle | daemon CPU % | "
        "fds peak | host busy % | B `exec true` ms p50 / p90 / p99 | health ms p50 / p99 | "
        "notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rec in res["phases"].items():
        h = rec["health"]
        hs = "—" if not h else f"{h['p50_ms']:.1f} / {h['p99_ms']:.1f}"
        d = rec["rss_peak_mib"] - idle["rss_peak_mib"]
        errs = f" ({rec['probe_error_count']} probe errors)" if rec["probe_error_count"] else ""
        lines.append(
            f"| {name} | {rec['seconds']} | {rec['rss_peak_mib']} ({d:+.1f}) | "
            f"{rec['rss_after_mib']} | {rec['cpu_pct']} | {rec['fds_peak']} | "
            f"{rec['host_busy_pct']} | {fmt_ms(rec['exec_true'])} | {hs} | "
            f"{note(name, rec)}{errs} |")
    lines += ["", "Fairness (issue 8, point 9): B's `exec true` while A floods, against B's "
              "`exec true` with A idle in blocks interleaved with the flood's (rounds of idle "
              "then flood; the ratio to the idle phase at the start is in the JSON); target "
              "≤ 2×.", "",
              "| A floods by | B idle between, ms p50 / p90 / p99 | B under flood | × p50 | "
              "× p90 | × p99 | daemon CPU % | A / B CPU % | within 2× (p50) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, f in res["fairness"].items():
        rec = res["phases"][name]
        sc = rec["sandbox_cpu_pct"]
        lines.append(f"| {f['how']} | {fmt_ms(f['idle_between'])} | {fmt_ms(f['under_flood'])} "
                     f"| {f['ratio_p50']}× | {f['ratio_p90']}× | {f['ratio_p99']}× | "
                     f"{rec['cpu_pct']} | {sc.get('A', '?')} / {sc.get('B', '?')} | "
                     f"{'yes' if f['within_2x'] else 'NO'} |")
    return "\n".join(lines)


def chart(res, samples, phases, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed; no chart")
        return False
    t0 = samples[0]["t"]
    ts = [s["t"] - t0 for s in samples]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(13, 9), sharex=True)
    ax1.plot(ts, [s["rss_kib"] / 1024 for s in samples], color="#3b6fb6")
    ax1.set_ylabel("daemon RSS, MiB")
    cpu = [0.0] + [100 * (b["cpu_s"] - a["cpu_s"]) / max(b["t"] - a["t"], 1e-6)
                   for a, b in zip(samples, samples[1:])]
    # smooth over 5 samples (0.5 s)
    sm = [sum(cpu[max(0, i - 4):i + 1]) / len(cpu[max(0, i - 4):i + 1]) for i in range(len(cpu))]
    ax2.plot(ts, sm, color="#e08a2c", label="daemon")
    for k, col in (("A", "#b03030"), ("B", "#6a9f4a")):
        v = [0.0] + [100 * ((b["sb"].get(k) or 0) - (a["sb"].get(k) or 0)) /
                     max(b["t"] - a["t"], 1e-6) for a, b in zip(samples, samples[1:])]
        v = [sum(v[max(0, i - 4):i + 1]) / len(v[max(0, i - 4):i + 1]) for i in range(len(v))]
        ax2.plot(ts, v, color=col, label=f"sandbox {k}", linewidth=0.8)
    ax2.set_ylabel("CPU, % of a core")
    ax2.legend(fontsize=8)
    ax3.plot(ts, [s["fds"] for s in samples], color="#555555")
    ax3.set_ylabel("daemon fds")
    ax3.set_xlabel("seconds")
    for ax in (ax1, ax2, ax3):
        for k, (name, a, b, c) in enumerate(phases):
            ax.axvspan(a - t0, b - t0, color="#dddddd" if k % 2 else "#eeeeee", zorder=0)
            if ax is ax1:
                ax.text((a + b) / 2 - t0, 0.98, name, transform=ax.get_xaxis_transform(),
                        ha="center", va="top", fontsize=7, rotation=90)
    m = res["machine"]
    fig.suptitle(f"withruntime under hostile load — commit {res['commit']['sha'][:12]}, "
                 f"{m['nproc']} CPUs, {m['ram_gib']} GiB, {res['started_at']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main

ALL = ["idle", "slow", "cancel", "uploads", "idle_conns", "slowloris", "over_cap",
       "flood_background", "flood_capped", "flood_stream", "flood_devnull"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-dir", help="state dir for the daemon started here (default: a "
                    "fresh temporary one under /var/tmp, where the image is built first)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/withruntime"))
    ap.add_argument("--agent", default=os.path.join(ROOT, "build/withruntime-agent"))
    ap.add_argument("--phases", default=",".join(ALL),
                    help=f"comma-separated subset of {','.join(ALL)} (idle always runs)")
    ap.add_argument("--phase-seconds", type=float, default=10, help="each phase at least")
    ap.add_argument("--min-exec", type=int, default=60,
                    help="B's exec samples per phase at least (default 60)")
    ap.add_argument("--probe-gap", type=float, default=0.05, help="pause between probes, s")
    ap.add_argument("--settle", type=float, default=6, help="seconds after each phase before "
                    "the 'after' RSS (the daemon trims its heap every 5 s)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="fairness: rounds of idle then flood per variant (default 4)")
    ap.add_argument("--ramp", type=float, default=1.0,
                    help="fairness: seconds for a flood to reach full speed before probing")
    ap.add_argument("--slow-readers", type=int, default=20)
    ap.add_argument("--slow-rate-kib", type=int, default=64)
    ap.add_argument("--fast-read-seconds", type=float, default=3)
    ap.add_argument("--uploads", type=int, default=8)
    ap.add_argument("--upload-bytes", type=int, help="cap each upload below the daemon's limit")
    ap.add_argument("--idle-conns", type=int, default=2000)
    ap.add_argument("--slowloris", type=int, default=2000)
    ap.add_argument("--over-cap", type=int, default=6000,
                    help="idle connections opened past the daemon's cap (4096 by default)")
    ap.add_argument("--cpus", type=int, default=2, help="each sandbox's cpus")
    ap.add_argument("--a-cpus", type=int, help="the hostile sandbox A's cpus (default --cpus)")
    ap.add_argument("--memory-mib", type=int, default=2048,
                    help="each sandbox's memory (2048: its process cap, memory_mib / 16, fits 64 floods)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = ap.parse_args()
    phases = [p for p in args.phases.split(",") if p and p != "idle"]
    unknown = set(phases) - set(ALL)
    if unknown:
        raise SystemExit(f"hostile: unknown phases {sorted(unknown)}")
    if os.geteuid() != 0:
        raise SystemExit("hostile: run as root (runsc and the daemon need it)")

    # room for 2,000 connections and the rest; the daemon inherits it and raises its own
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = max(args.idle_conns, args.slowloris, args.over_cap)
    want = min(hard, max(soft, most + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < most + 100:
        log(f"RLIMIT_NOFILE hard limit {hard}: fewer idle connections than asked")

    def on_term(signum, _frame):
        raise SystemExit(f"hostile: signal {signum}, cleaning up")
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    own_state = None
    daemon = h = sampler = None
    t_start = time.monotonic()
    try:
        state_dir = args.state_dir
        if not state_dir:
            state_dir = own_state = tempfile.mkdtemp(prefix="wr-hostile-state-", dir="/var/tmp")
        os.makedirs(state_dir, exist_ok=True)
        daemon = base.Daemon(args.bin, args.agent, state_dir)
        daemon.start()
        api = base.Api(daemon.url, daemon.key)
        h = Hostile(api, daemon, args)
        h.dpid = daemon.proc.pid
        log(f"daemon pid {h.dpid} at {daemon.url}; sandboxes A and B")
        h.a, h.b = h.create("A", args.a_cpus), h.create("B")
        h.sh(h.a, "truncate -s 1T /workspace/huge")
        for _ in range(5):
            h.probe_once([], [], [])
        sampler = h.sampler = Sampler(h.dpid, {"A": h.a, "B": h.b})
        sampler.start()
        time.sleep(1)

        # idle, and the idle CPU of a sandbox (threshold for "back to idle")
        rec = h.phase("idle")
        h.idle_threshold = max(2 * max(rec["sandbox_cpu_pct"].get("A", 0), 0) / 100, 0.05)

        for p in phases:
            if p == "slow":
                h.phase("slow", *two(h.slow_readers), min_exec=0)
            elif p == "cancel":
                h.phase("cancel", start=h.cancel_mid_read, stop=lambda ld: ld, min_s=0,
                        min_exec=0)
            elif p == "uploads":
                start, stop = two(h.uploads)
                # probing lasts until every upload has ended
                h.phase("uploads", start=start, stop=stop, min_s=1, min_exec=0, max_s=300,
                        busy=lambda: any(t.is_alive() for t in h._uploads_threads))
            elif p == "idle_conns":
                h.phase("idle_conns", *two(h.idle_conns))
            elif p == "slowloris":
                # probing lasts until the header deadline has closed every one
                h.phase("slowloris", *two(h.slowloris), max_s=60,
                        busy=lambda: h._slowloris_left())
            elif p == "over_cap":
                h.phase("over_cap", *two(h.over_cap))
            elif p == "flood_background":
                h.fair_phase(p, lambda: h.flood_background(Hostile.FLOOD))
            elif p == "flood_capped":
                h.fair_phase(p, h.flood_capped)
            elif p == "flood_stream":
                h.fair_phase(p, h.flood_stream)
            elif p == "flood_devnull":
                h.fair_phase(p, lambda: h.flood_background(Hostile.FLOOD_NULL))
        sampler.stop_ev.set()
        sampler.join()

        idle = h.results["idle"]["exec_true"]
        hows = {"flood_background": "a background command, 64 × `yes` (tail kept, rest dropped "
                "by the daemon)",
                "flood_capped": "a foreground exec, 64 × `yes`, output capped at 1 MiB (rest "
                "drained and dropped)",
                "flood_stream": "64 streamed execs of `yes`, read by the bench",
                "flood_devnull": "control: 64 × `yes > /dev/null` (CPU only, no output)"}
        fairness = {}
        for name, rec in h.results.items():
            e = rec["exec_true"]
            if not name.startswith("flood") or not e:
                continue
            ie = rec["interleaved_idle"]["exec_true"]
            f = {"how": hows[name], "under_flood": e, "idle_between": ie}
            for q in ("p50", "p90", "p99"):
                f[f"ratio_{q}"] = round(e[f"{q}_ms"] / ie[f"{q}_ms"], 2)
                f[f"ratio_{q}_vs_idle_phase"] = round(e[f"{q}_ms"] / idle[f"{q}_ms"], 2)
            f["within_2x"] = f["ratio_p50"] <= 2
            fairness[name] = f
        res = {"started_at": started, "commit": base.git_commit(),
               "machine": base.machine_info("systrap"),
               "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
               "config": {k: v for k, v in vars(args).items() if k not in ("bin", "agent")},
               "wall_seconds": round(time.monotonic() - t_start, 1),
               "phases": h.results, "fairness": fairness}
        jpath = base.write_json(args.out, "hostile.json", res)
        ppath = os.path.join(args.out, "hostile.png")
        drew = chart(res, sampler.samples, h.phases, ppath)
        print(markdown(res))
        print()
        print(f"wrote {jpath}" + (f" and {ppath}" if drew else "")
              + f"; {res['wall_seconds']} s in all")
    finally:
        if sampler:
            sampler.stop_ev.set()
        if h:
            h.cleanup()
        if daemon:
            daemon.stop()
        if own_state:
            base.remove_state_dir(own_state)


if __name__ == "__main__":
    main()
