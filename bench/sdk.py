#!/usr/bin/env python3
"""The python SDK's own cost per call: its `Client` keeping connections open between calls
(the default, `max_idle=8`) against a new connection per call (`max_idle=0`), over the local
Unix socket and over TLS on loopback.

A daemon of its own on a fresh state directory that links an image already built (bench/run.py's,
or --images), serving TLS on 127.0.0.1 with a CA and certificate made here by `openssl`. For each
transport, in interleaved blocks of 20 (the host drifts): `client.health()` (the HTTP round trip
alone) and `sbx.exec(["true"])` on one running sandbox, each with a kept connection and with a
new one per call. Part of `bench/run.py` (`--only sdk`); alone:

    python3 bench/sdk.py [--n 200] [--images /var/lib/withruntime/images]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import fakenet  # noqa: E402  (the tests' CA and certificates)
import run as base  # noqa: E402  (bench/run.py: stats, the daemon, machine)
import withruntime  # noqa: E402  (the tree's SDK)

BLOCK = 20


def make_pki(d):
    """A CA and a server certificate for IP 127.0.0.1 signed by it (tests/e2e/fakenet.py's)."""
    ca, leaves = fakenet.make_certs(d, ["127.0.0.1"])
    cert, key = leaves["127.0.0.1"]
    return {"ca.pem": ca, "srv.pem": cert, "srv.key": key}


class TLSDaemon(base.Daemon):
    """bench/run.py's daemon, its TCP listener speaking TLS."""

    def __init__(self, binary, agent, state_dir, pki):
        super().__init__(binary, agent, state_dir)
        self.extra_args = ["--tls-cert", pki["srv.pem"], "--tls-key", pki["srv.key"]]
        self.url = f"https://127.0.0.1:{self.port}"


def clients(url, key=None, ca_file=None):
    """{"kept": client, "fresh": client} for one daemon URL."""
    return {kind: withruntime.Client(url, key, ca_file=ca_file, max_idle=k)
            for kind, k in (("kept", 8), ("fresh", 0))}


def measure_transport(cl, sid, n):
    """health() and exec(["true"]) with each client, in interleaved blocks."""
    sbx = {kind: withruntime.Sandbox.connect(sid, client=c) for kind, c in cl.items()}
    for kind in cl:  # warm-up, not counted (and the kept client's connection is made)
        cl[kind].health()
        sbx[kind].exec(["true"])
    times = {(what, kind): [] for what in ("health", "exec") for kind in cl}
    while len(times[("exec", "fresh")]) < n:
        k = min(BLOCK, n - len(times[("exec", "fresh")]))
        for kind in cl:
            for what, call in (("health", cl[kind].health),
                               ("exec", lambda: sbx[kind].exec(["true"]))):
                for _ in range(k):
                    t0 = time.perf_counter()
                    r = call()
                    times[(what, kind)].append(time.perf_counter() - t0)
                    if what == "exec" and r.exit_code != 0:
                        raise RuntimeError(f"exec true in {sid}: {r}")
    out = {}
    for what in ("health", "exec"):
        kept, fresh = base.stats_ms(times[(what, "kept")]), base.stats_ms(times[(what, "fresh")])
        out[what] = {"kept": kept, "fresh": fresh,
                     "fresh_p50_over_kept_p50": round(fresh["p50_ms"] / kept["p50_ms"], 3)}
    for c in cl.values():
        c.close()
    return out


def measure(args, images, workdir):
    state = tempfile.mkdtemp(prefix="wr-bench-sdk-", dir="/var/tmp")
    os.symlink(images, os.path.join(state, "images"))
    pki = make_pki(workdir)
    d = TLSDaemon(args.bin, args.agent, state, pki)
    out = {"config": {"n": args.n, "block": BLOCK}, "results": {}}
    sid = None
    try:
        d.start()
        # the key's own sandbox: the key sees it over TLS, and root on the socket sees all
        owner = withruntime.Client(d.url, d.key, ca_file=pki["ca.pem"])
        sid = withruntime.Sandbox.create(memory_mib=512, on_lease_end="delete", client=owner).id
        for name, cl in (("unix_socket", clients(f"unix:{d.sock}")),
                         ("tls_loopback", clients(d.url, d.key, pki["ca.pem"]))):
            base.log(f"python SDK over {name.replace('_', ' ')}: kept connection or a new one "
                     f"per call, {args.n} calls each")
            out["results"][name] = measure_transport(cl, sid, args.n)
    finally:
        if sid:
            try:
                withruntime.Sandbox.connect(sid, client=withruntime.Client(
                    f"unix:{d.sock}")).delete()
            except withruntime.WithruntimeError as e:
                base.log(f"could not delete {sid}: {e}")
        d.stop()
        base.remove_state_dir(state)
    return out


def markdown(s):
    if not s:
        return []
    lines = ["", "| python SDK, ms (p50 / p99) | kept connection (default) | a new connection per "
             "call | new ÷ kept, p50 |", "|---|---|---|---|"]
    for name, r in s["results"].items():
        for what, label in (("health", "`client.health()`"), ("exec", "`sbx.exec([\"true\"])`")):
            x = r[what]
            lines.append(f"| {label}, {name.replace('_', ' ')} (n={x['kept']['n']}) | "
                         f"{base.p50_99(x['kept'], 2)} | {base.p50_99(x['fresh'], 2)} | "
                         f"{x['fresh_p50_over_kept_p50']:.2f}× |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/withruntime"))
    ap.add_argument("--agent", default=os.path.join(ROOT, "build/withruntime-agent"))
    ap.add_argument("--images", default="/var/lib/withruntime/images")
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="wr-bench-sdk-pki-")
    try:
        res = measure(args, os.path.realpath(args.images), workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(res, indent=1))
    print("\n".join(markdown(res)))


if __name__ == "__main__":
    main()
