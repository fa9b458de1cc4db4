#!/usr/bin/env python3
"""Boot or restore: is starting a sandbox from a `runsc checkpoint` image cheaper than booting
it? (issue 11, point 1: "if restoring from a checkpoint image is cheaper than booting, use it").

Raw runsc, no daemon: a bundle of the image's rootfs (root read-only, `--network=none`, the
platform of --platform) whose process is `sleep` (an idle init, like the agent's). One container
is started and checkpointed once (`runsc checkpoint --image-path`); then, --n times, interleaved:

  * boot:    `runsc run -detach` of the bundle, then `runsc exec /bin/true` in it;
  * restore: `runsc restore -detach --image-path` of the checkpoint, then `runsc exec /bin/true`.

Each step is timed apart (the `exec` shows the container answers); each container is deleted
before the next. `runsc run`/`restore` return once the sandbox is up, so they compare the same
thing. Part of `bench/run.py` (`--only restore`); alone:

    python3 bench/restore.py [--rootfs DIR] [--n 10]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run as base  # noqa: E402


class Raw:
    """runsc with a root directory and a bundle of its own under workdir."""

    def __init__(self, rootfs, platform, workdir, argv=("/bin/sleep", "1000000")):
        self.root = os.path.join(workdir, "runsc-root")
        self.bundle = os.path.join(workdir, "bundle-" + os.path.basename(argv[0]))
        self.workdir = workdir
        self.flags = ["runsc", "--root", self.root, "--network=none", f"--platform={platform}"]
        self.started = set()
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.bundle)
        subprocess.run(["runsc", "spec", "--bundle", self.bundle, "--", *argv], check=True,
                       stdin=subprocess.DEVNULL)
        path = os.path.join(self.bundle, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["root"] = {"path": rootfs, "readonly": True}
        cfg["process"]["terminal"] = False
        with open(path, "w") as f:
            json.dump(cfg, f)

    def runsc(self, *argv):
        """Runs runsc; its stdout/stderr go to a file (a detached sandbox inherits them, so a
        pipe would never reach EOF). Returns the seconds it took."""
        err = os.path.join(self.workdir, "runsc.err")
        with open(err, "w+b") as ef:
            t = time.perf_counter()
            r = subprocess.run(self.flags + list(argv), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=ef)
            dt = time.perf_counter() - t
            if r.returncode != 0:
                ef.seek(0)
                raise RuntimeError(f"runsc {' '.join(argv)}: {ef.read()[-800:]!r}")
        return dt

    def run_detached(self, cid):
        self.started.add(cid)
        return self.runsc("run", "--bundle", self.bundle, "-detach", cid)

    def restore_detached(self, cid, image):
        self.started.add(cid)
        return self.runsc("restore", "--image-path", image, "--bundle", self.bundle,
                          "-detach", cid)

    def delete(self, cid):
        subprocess.run(self.flags + ["delete", "-force", cid], stdin=subprocess.DEVNULL,
                       capture_output=True)
        self.started.discard(cid)

    def cleanup(self):
        for cid in list(self.started):
            self.delete(cid)


def measure(rootfs, platform, n, workdir):
    raw = Raw(rootfs, platform, workdir)
    image = os.path.join(workdir, "checkpoint")
    tag = f"wrck-{os.getpid()}"
    try:
        raw.run_detached(f"{tag}-base")
        raw.runsc("exec", f"{tag}-base", "/bin/true")
        checkpoint_s = raw.runsc("checkpoint", "--image-path", image, f"{tag}-base")
        raw.delete(f"{tag}-base")
        size = sum(os.path.getsize(os.path.join(d, f))
                   for d, _, fs in os.walk(image) for f in fs)
        boot, boot_exec, rest, rest_exec = [], [], [], []
        for i in range(n):
            cid = f"{tag}-b{i}"
            boot.append(raw.run_detached(cid))
            boot_exec.append(raw.runsc("exec", cid, "/bin/true"))
            raw.delete(cid)
            cid = f"{tag}-r{i}"
            rest.append(raw.restore_detached(cid, image))
            rest_exec.append(raw.runsc("exec", cid, "/bin/true"))
            raw.delete(cid)
        out = {
            "checkpoint_s": round(checkpoint_s, 3),
            "checkpoint_image_bytes": size,
            "boot_run_detach": base.stats_ms(boot),
            "boot_then_exec": base.stats_ms(boot_exec),
            "restore_detach": base.stats_ms(rest),
            "restore_then_exec": base.stats_ms(rest_exec),
        }
        out["restore_p50_over_boot_p50"] = round(
            out["restore_detach"]["p50_ms"] / out["boot_run_detach"]["p50_ms"], 2)
        return out
    finally:
        raw.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rootfs", help="image rootfs (default: the default daemon's)")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--platform", default="systrap")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root")
    rootfs = args.rootfs or base.find_rootfs("/var/lib/withruntime")
    if not rootfs:
        raise SystemExit("bench: no image rootfs; pass --rootfs")
    workdir = tempfile.mkdtemp(prefix="wr-bench-restore-")
    try:
        print(json.dumps(measure(rootfs, args.platform, args.n, workdir), indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
