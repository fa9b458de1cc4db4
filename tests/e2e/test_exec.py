"""Running commands: exit codes, stdio, cwd, env, argv, encodings, output caps, timeouts."""

import base64
import json
import os
import time

import pytest

from wrclient import output


def test_exit_codes(client, sandbox):
    assert client.exec(sandbox, "true")["exit_code"] == 0
    r = client.exec(sandbox, "exit 3")
    assert r["exit_code"] == 3
    assert r["signal"] is None
    assert r["timed_out"] is False
    assert r["oom_killed"] is False
    assert client.exec(sandbox, "exit 255")["exit_code"] == 255


def test_exit_to_answer_is_reported(client, sandbox):
    """exit_to_answer_us: from the command's exit (the agent reaped it) to the answer, in
    microseconds: within the command's whole duration, and short for a command whose pipes
    close with it."""
    for _ in range(3):
        r = client.exec(sandbox, "true")
        us = r["exit_to_answer_us"]
        assert isinstance(us, int) and 0 <= us <= (r["duration_ms"] + 1) * 1000, r
    # a background child that keeps the pipes open: EXIT waits its 100 ms for them
    r = client.exec(sandbox, "sleep 2 & true")
    assert r["exit_to_answer_us"] >= 90_000, r


def test_command_not_found_in_shell_is_127(client, sandbox):
    r = client.exec(sandbox, "no-such-command-xyz")
    assert r["exit_code"] == 127
    assert "no-such-command-xyz" in r["stderr"]


def test_stdout_and_stderr_kept_apart(client, sandbox):
    r = client.exec(sandbox, "echo to-out; echo to-err >&2; echo more-out; echo more-err >&2")
    assert r["stdout"] == "to-out\nmore-out\n"
    assert r["stderr"] == "to-err\nmore-err\n"
    assert r["stdout_encoding"] == r["stderr_encoding"] == "utf-8"
    assert r["stdout_truncated"] is False and r["stderr_truncated"] is False
    assert r["duration_ms"] >= 0


def test_python_runs(client, sandbox):
    r = client.exec(sandbox, "python3 -c 'print(6 * 7)'")
    assert r["stdout"] == "42\n", r
    assert r["exit_code"] == 0


def test_stdin_text(client, sandbox):
    r = client.exec(sandbox, "cat; echo; echo done", stdin="line one\nline two ü")
    assert r["stdout"] == "line one\nline two ü\ndone\n"


def test_stdin_base64_binary(client, sandbox):
    data = bytes(range(256)) * 4
    r = client.exec(sandbox, "cat", stdin_base64=base64.b64encode(data).decode())
    assert r["stdout_encoding"] == "base64"
    assert output(r) == data


def test_no_stdin_is_dev_null(client, sandbox):
    # Without stdin, `cat` must see EOF at once rather than wait.
    r = client.exec(sandbox, "cat; echo eof", timeout_seconds=30)
    assert r["timed_out"] is False
    assert r["stdout"] == "eof\n"
    r = client.exec(sandbox, "readlink /proc/self/fd/0 || true")
    assert r["stdout"].strip() == "/dev/null"


def test_cwd_default_and_explicit(client, sandbox):
    assert client.exec(sandbox, "pwd")["stdout"] == "/workspace\n"
    assert client.exec(sandbox, "pwd", cwd="/tmp")["stdout"] == "/tmp\n"
    client.exec(sandbox, "mkdir -p /workspace/sub/dir")
    assert client.exec(sandbox, "pwd", cwd="/workspace/sub/dir")["stdout"] == \
        "/workspace/sub/dir\n"


def test_bad_cwd_is_exec_failed(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": "pwd", "cwd": "/no/such/dir"})
    assert r.status == 422, r
    code, message, _ = r.error
    assert code == "exec_failed"
    assert message


def test_argv_form(client, sandbox):
    r = client.exec(sandbox, argv=["printf", "%s|", "a b", "$HOME", "'q'", "*"])
    assert r["exit_code"] == 0
    # no shell: spaces, $ and globs reach the program untouched
    assert r["stdout"] == "a b|$HOME|'q'|*|"
    r = client.exec(sandbox, argv=["/bin/sh", "-c", "exit 5"])
    assert r["exit_code"] == 5


def test_argv_not_found_is_exec_failed(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"argv": ["no-such-program-xyz"]})
    assert r.status == 422, r
    assert r.error[0] == "exec_failed"


def test_env_sandbox_and_exec_level(client, make_sandbox):
    sid = make_sandbox(memory_mib=512, env={"A": "from-sandbox", "B": "sandbox-b"})["id"]
    r = client.exec(sid, 'printf "%s|%s|%s" "$A" "$B" "$C"')
    assert r["stdout"] == "from-sandbox|sandbox-b|"
    r = client.exec(sid, 'printf "%s|%s|%s" "$A" "$B" "$C"', env={"B": "exec-b", "C": "exec-c"})
    assert r["stdout"] == "from-sandbox|exec-b|exec-c"
    # exec-level env does not stick to the sandbox
    r = client.exec(sid, 'printf "%s|%s" "$B" "$C"')
    assert r["stdout"] == "sandbox-b|"
    # argv form gets the same environment
    r = client.exec(sid, argv=["printenv", "A"])
    assert r["stdout"] == "from-sandbox\n"
    # a usable PATH is there without being asked for
    r = client.exec(sid, argv=["sh", "-c", "command -v python3"])
    assert r["exit_code"] == 0 and r["stdout"].strip().endswith("/python3")


def test_non_utf8_output_is_base64(client, sandbox):
    r = client.exec(sandbox, r"printf '\377\376abc\000'; printf '\200x' >&2")
    assert r["stdout_encoding"] == "base64"
    assert output(r, "stdout") == b"\xff\xfeabc\x00"
    assert r["stderr_encoding"] == "base64"
    assert output(r, "stderr") == b"\x80x"


def test_utf8_output_is_text(client, sandbox):
    r = client.exec(sandbox, "printf 'héllo ✓ \\000end'")
    assert r["stdout_encoding"] == "utf-8"
    assert r["stdout"] == "héllo ✓ \x00end"


def test_output_cap(client, sandbox):
    r = client.exec(sandbox, "head -c 3000000 /dev/zero; head -c 5 /dev/zero >&2; echo done >&2",
                    max_output_bytes=1000)
    assert r["exit_code"] == 0
    assert output(r, "stdout") == b"\0" * 1000
    assert r["stdout_truncated"] is True
    # the cap is per stream: stderr was small and is complete
    assert output(r, "stderr") == b"\0" * 5 + b"done\n"
    assert r["stderr_truncated"] is False


def test_output_cap_keeps_draining(client, sandbox):
    # The command writes far past the cap and must still run to its end.
    r = client.exec(sandbox, "head -c 5000000 /dev/urandom; echo finished >&2",
                    max_output_bytes=10, timeout_seconds=120)
    assert r["timed_out"] is False
    assert r["exit_code"] == 0
    assert len(output(r)) == 10 and r["stdout_truncated"] is True
    assert r["stderr"] == "finished\n"


def test_default_output_cap_is_1mib(client, sandbox):
    r = client.exec(sandbox, "head -c 1048577 /dev/zero")
    assert len(output(r)) == 1048576
    assert r["stdout_truncated"] is True
    r = client.exec(sandbox, "head -c 1048576 /dev/zero")
    assert len(output(r)) == 1048576
    assert r["stdout_truncated"] is False


def test_large_output_byte_exact(client, sandbox):
    r = client.exec(sandbox, "head -c 3000000 /dev/urandom > /tmp/big; sha256sum /tmp/big")
    digest = r["stdout"].split()[0]
    r = client.exec(sandbox, "cat /tmp/big", max_output_bytes=4000000)
    data = output(r)
    assert len(data) == 3000000 and r["stdout_truncated"] is False
    import hashlib
    assert hashlib.sha256(data).hexdigest() == digest


def test_killed_by_signal(client, sandbox):
    r = client.exec(sandbox, "kill -9 $$")
    assert r["exit_code"] == -1
    assert r["signal"] == 9
    assert r["timed_out"] is False


SIGNALS_SEEN = r"""
import json, signal
# python itself ignores SIGPIPE and SIGXFSZ and catches SIGINT (only if it was not ignored)
own = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP}
odd = {}
for n in range(1, signal.NSIG):
    try:
        h = signal.getsignal(n)
    except ValueError:
        continue
    if 32 <= n < signal.SIGRTMIN:
        continue  # glibc's own (its threads' cancel and setxid)
    if n not in own and h not in (signal.SIG_DFL, signal.default_int_handler):
        odd[n] = str(h)
print(json.dumps({"odd": odd, "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}))
"""


def test_a_command_starts_with_every_signal_at_its_default(client, sandbox):
    """The agent (PID 1) catches or ignores nearly every signal for itself; none of that
    reaches a command: nothing ignored or blocked, as after a login shell's exec."""
    r = client.exec(sandbox, argv=["python3", "-c", SIGNALS_SEEN])
    assert r["exit_code"] == 0, r
    assert json.loads(r["stdout"]) == {"odd": {}, "blocked": []}, r["stdout"]
    # SIGPIPE (which python hides): `yes` dies of it rather than seeing EPIPE
    r = client.exec(sandbox, argv=["bash", "-c", "yes | head -1 >/dev/null; echo ${PIPESTATUS[0]}"])
    assert r["stdout"] == "141\n", r
    # and TERM ends a command that did not catch it
    r = client.exec(sandbox, "sleep 30 & kill -TERM $!; wait $!; echo $?")
    assert r["stdout"] == "143\n", r


def test_timeout_kills_whole_tree(client, sandbox):
    r = client.exec(sandbox, "sh -c 'sleep 1000 & sleep 1000'", timeout_seconds=2)
    assert r["timed_out"] is True
    assert r["exit_code"] == -1
    assert r["signal"] == 9
    # Nothing of that tree is left: no `sleep` process anywhere in the sandbox.
    procs = client.exec(sandbox, "for f in /proc/[0-9]*/comm; do "
                        "echo \"${f#/proc/} $(cat $f 2>/dev/null)\"; done")
    lines = procs["stdout"].splitlines()
    assert len(lines) >= 2  # at least the agent and this shell: the listing worked
    comms = [ln.split(" ", 1)[1] for ln in lines if " " in ln]
    assert "sleep" not in comms, procs["stdout"]


SLEEPERS = ("sleep 1001", "sleep 1002")
# Processes that left the command's session and lost their parent before the timeout: a
# shell that ignores SIGTERM, started by `setsid -f` (which forks and exits), and a process
# double-forked in a new session.
ESCAPERS = ("setsid -f sh -c 'trap \"\" TERM; sleep 1001; true'; "
            "setsid sh -c '(sleep 1002 &)'; ")


def sleepers(client, sid):
    """The command lines of the sandbox's processes that are one of SLEEPERS."""
    r = client.exec(sid, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; "
                    "echo; done")
    lines = [ln.strip() for ln in r["stdout"].splitlines()]
    assert any("/proc/" in ln for ln in lines), r["stdout"]  # the listing saw itself
    return sorted(ln for ln in lines if ln in SLEEPERS)


def test_timeout_kills_what_escaped_its_session(client, sandbox):
    # Positive control: a command that ends by itself leaves such processes running, as a
    # shell would (docs/api.md), so the listing below can see them.
    r = client.exec(sandbox, ESCAPERS + "true", timeout_seconds=30)
    assert r["timed_out"] is False and r["exit_code"] == 0, r
    deadline = time.monotonic() + 10
    while sleepers(client, sandbox) != sorted(SLEEPERS) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sleepers(client, sandbox) == sorted(SLEEPERS)
    client.exec(sandbox, "pkill -KILL -f '^sleep 100[12]$'; true")
    deadline = time.monotonic() + 10
    while sleepers(client, sandbox) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sleepers(client, sandbox) == []

    # The same, then a timeout while the command still runs: everything it started goes.
    r = client.exec(sandbox, ESCAPERS + "sleep 60", timeout_seconds=2)
    assert r["timed_out"] is True and r["signal"] == 9, r
    assert sleepers(client, sandbox) == []


def test_timeout_fractional(client, sandbox):
    r = client.exec(sandbox, "sleep 30", timeout_seconds=0.5)
    assert r["timed_out"] is True
    r = client.exec(sandbox, "echo quick", timeout_seconds=30)
    assert r["timed_out"] is False and r["stdout"] == "quick\n"


def test_sandbox_keeps_state_between_execs(client, sandbox):
    client.exec(sandbox, "echo persisted > /workspace/state.txt")
    assert client.exec(sandbox, "cat /workspace/state.txt")["stdout"] == "persisted\n"


# Forks a child that exits at once and is never waited for (a zombie while this process lives),
# prints both PIDs, and sleeps. Started with `&`, this process is itself an orphan once the
# exec's shell ends.
ZOMBIE_MAKER = r"""
import os, time
pid = os.fork()
if pid == 0:
    os._exit(0)
print(os.getpid(), pid, flush=True)
time.sleep(600)
"""


def proc_states(client, sid, pids):
    """{pid: state letter} of those PIDs still in the sandbox's /proc."""
    r = client.exec(sid, "for p in " + " ".join(pids) +
                    "; do cat /proc/$p/stat 2>/dev/null; echo; done")
    out = {}
    for ln in r["stdout"].splitlines():
        if ")" in ln:
            out[ln.split(" ", 1)[0]] = ln.rsplit(")", 1)[1].split()[0]
    return out


def wait_until(pred, what, limit=30):
    deadline = time.monotonic() + limit
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, \
            f"gave up after {limit} s waiting for {what() if callable(what) else what}"
        time.sleep(0.2)


def test_orphans_are_reaped(client, sandbox):
    # The agent's side of the commands' pid namespace is their init: an orphan, and a zombie
    # whose parent dies, must be reaped there rather than linger as zombies.
    tag = f"/tmp/zombie-maker-{os.getpid()}"
    client.exec(sandbox, f'python3 -c "$ZM" > {tag} 2>&1 &', env={"ZM": ZOMBIE_MAKER})
    pids = wait_until(lambda: client.exec(sandbox, f"cat {tag}")["stdout"].split(),
                      "the zombie maker to start")
    assert len(pids) == 2, pids
    parent, child = pids
    # positive control: the probe sees the unreaped child as a zombie, its parent alive
    states = wait_until(lambda: (lambda s: s if s.get(child) == "Z" else None)(
        proc_states(client, sandbox, pids)), "the child to be a zombie")
    assert states[parent] in ("S", "R"), states
    # the parent dies: both are orphans now, and both go away (not a "Z" left behind)
    client.exec(sandbox, f"kill -9 {parent}")
    left = {}

    def reaped():
        left.clear()
        left.update(proc_states(client, sandbox, pids))
        return not left

    wait_until(reaped, lambda: f"PIDs {pids} to be reaped (still there: {left})")
    r = client.exec(sandbox, "cat /proc/[0-9]*/stat 2>/dev/null")
    states = [ln.rsplit(")", 1)[1].split()[0] for ln in r["stdout"].splitlines() if ")" in ln]
    assert states, r
    assert "Z" not in states, r["stdout"]


@pytest.mark.parametrize("n", [1, 64 * 1024, 300 * 1024])
def test_stdin_sizes(client, sandbox, n):
    data = os.urandom(n)
    r = client.exec(sandbox, "cat", stdin_base64=base64.b64encode(data).decode(),
                    max_output_bytes=n)
    assert output(r) == data


def test_memory_limit_is_per_process_enomem(client, make_sandbox):
    # RLIMIT_AS = memory_mib: one greedy process gets MemoryError, the sandbox carries on
    sid = make_sandbox(memory_mib=256)["id"]
    r = client.exec(sid, "python3 -c 'x = bytearray(1024 * 1024 * 1024)'")
    assert r["exit_code"] == 1, r
    assert "MemoryError" in r["stderr"]
    assert r["oom_killed"] is False
    assert client.get(sid)["state"] == "running"
    r = client.exec(sid, "python3 -c 'x = bytearray(64 * 1024 * 1024); print(len(x))'")
    assert r["stdout"] == f"{64 * 1024 * 1024}\n", r
