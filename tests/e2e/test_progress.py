"""Progress where work is long (issue 13, point 4): `image build` shows a bar, the stage and the
time left on a terminal and plain lines elsewhere; `sandbox run` shows a spinner while the
sandbox starts, on a terminal only.

The image builds here run a stand-in `mmdebstrap` (first on PATH) that prints the real one's
stage lines and makes a tiny root: the progress is what is tested, not Debian. Terminals are
pseudo-terminals the test opens.
"""

import os
import pty
import re
import select
import shutil
import subprocess
import tempfile

import pytest

import conftest

FAKE_MMDEBSTRAP = r"""#!/bin/sh
# argv: --variant=... --include=... --customize-hook=... -- SUITE TARGET SOURCES
for a; do last2=$prev; prev=$a; done
target=$last2
say() { echo "$1"; sleep 0.4; }
say "I: chroot architecture amd64 is equal to the host's architecture"
say "I: running apt-get update..."
say "I: downloading packages with apt..."
say "I: extracting archives..."
say "I: installing essential packages..."
say "I: installing remaining packages inside the chroot..."
mkdir -p "$target/etc" "$target/workspace" && echo 12.0 > "$target/etc/debian_version"
say "I: running --customize-hook in shell: sh -c 'mkdir -p ...'"
say "I: cleaning package lists and apt cache..."
echo "I: success in 3.2 seconds"
"""


@pytest.fixture
def fake_env(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "mmdebstrap"
    fake.write_text(FAKE_MMDEBSTRAP)
    fake.chmod(0o755)
    state = tempfile.mkdtemp(prefix="wr-progress-", dir="/var/tmp")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    yield state, env
    shutil.rmtree(state, ignore_errors=True)


def in_pty(argv, env, timeout=60):
    """Runs argv with stdin, stdout and stderr on a new pseudo-terminal; returns (exit status,
    everything it wrote)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                         start_new_session=True)
    os.close(slave)
    out = b""
    try:
        while True:
            r, _, _ = select.select([master], [], [], timeout)
            assert r, f"no output for {timeout} s: {out[-500:]!r}"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        status = p.wait(timeout=timeout)
    return status, out.decode(errors="replace")


def test_image_build_shows_plain_lines_when_not_a_terminal(fake_env):
    state, env = fake_env
    r = subprocess.run([conftest.WR_BIN, "--state-dir", state, "image", "build"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if re.match(r"withruntime: image default: \d+%", ln)]
    percents = [int(re.search(r": (\d+)%", ln).group(1)) for ln in lines]
    assert percents == sorted(percents) and len(set(percents)) == len(percents), lines
    assert percents[0] == 0 and percents[-1] == 100, lines
    stages = " ".join(lines)
    for words in ("downloading packages", "installing the base system", "done"):
        assert words in stages, lines
    assert "\r" not in r.stderr and "\033[" not in r.stderr, "no terminal codes in a pipe"
    assert "I: extracting archives..." in r.stderr, "mmdebstrap's own lines stay in the log"
    # the build's time is kept for the next estimate
    builds = os.path.join(state, "images", "default", "builds")
    (build,) = os.listdir(builds)
    import json
    with open(os.path.join(builds, build, "image.json")) as f:
        assert json.load(f)["build_ms"] >= 3000


def test_image_build_draws_a_bar_with_the_time_left_on_a_terminal(fake_env):
    state, env = fake_env
    first = subprocess.run([conftest.WR_BIN, "--state-dir", state, "image", "build"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    status, out = in_pty([conftest.WR_BIN, "--state-dir", state, "image", "build", "--force"],
                         env)
    assert status == 0, out
    frames = out.split("\r\x1b[K")
    bars = [f for f in frames if re.match(r"image default \[[#.]{24}\] +\d+% ", f)]
    assert len(bars) >= 5, out  # redrawn in place, several times
    assert any(re.search(r"about \d+ s left", f) for f in bars), \
        "the last build's time gives an estimate from the start"
    assert "I: extracting archives" not in out, "mmdebstrap's lines go to the build log"
    with open(os.path.join(state, "images", "default.build.log")) as f:
        assert "I: extracting archives..." in f.read()
    assert "[########################] 100% done" in out
    assert out.rstrip().endswith(f"image default is built in {state}/images/default"), out[-300:]


def test_image_build_on_a_built_image_says_so(fake_env):
    state, env = fake_env
    assert subprocess.run([conftest.WR_BIN, "--state-dir", state, "image", "build"], env=env,
                          capture_output=True, timeout=120).returncode == 0
    status, out = in_pty([conftest.WR_BIN, "--state-dir", state, "image", "build"], env)
    assert status == 0 and "already built" in out and "[" not in out.split("already")[0], out


def test_sandbox_run_spins_on_a_terminal_only(daemon):
    env = daemon.cli_env()
    argv = [conftest.WR_BIN, "sandbox", "run", "--memory", "256", "--", "echo", "hello"]
    status, out = in_pty(argv, env)
    assert status == 0, out
    assert re.search(r"\r\x1b\[K[|/\\-] starting a sandbox \d+\.\d s", out), out
    # the spinner's line is erased before the command's output
    assert out.endswith("\r\x1b[Khello\r\n"), repr(out[-80:])
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "hello\n", r
    assert "starting a sandbox" not in r.stderr and "\r" not in r.stderr, r.stderr
