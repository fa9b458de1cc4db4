"""Background commands and stats through the SDK, against the real daemon."""

import pytest

from withruntime import Command, Conflict, NotFound


def test_background_command_output_arrives_in_pieces(sandbox):
    sandbox.exec("mkfifo /workspace/go")
    # It prints, then blocks on the FIFO until the test writes to it: a second piece of output
    # can only come after the first was read.
    cmd = sandbox.exec_background("echo first; read line < /workspace/go; echo $line; exit 5")
    assert isinstance(cmd, Command)
    assert cmd.state == "running" and cmd.exit_code is None
    out = cmd.output()
    for _ in range(300):
        if out.stdout:
            break
        cmd.wait(0.1)
        out = cmd.output()
    assert out.stdout == "first\n" and cmd.refresh().state == "running"
    sandbox.exec("echo second > /workspace/go")
    assert cmd.wait(30).state == "exited" and cmd.exit_code == 5
    rest = cmd.output(out.stdout_next_offset, out.stderr_next_offset)
    assert rest.stdout == "second\n" and rest.stdout_next_offset == len("first\nsecond\n")


def test_wait_signal_and_list(sandbox):
    sleeper = sandbox.exec_background(["sleep", "1000"])
    quick = sandbox.exec_background("printf 'a\\0b'; echo err >&2; exit 4")
    assert quick.wait(30).state == "exited"
    assert quick.exit_code == 4
    out = quick.output()
    assert out.stdout_bytes == b"a\0b" and out.stderr == "err\n"
    assert out.stdout_next_offset == 3 and out.stderr_next_offset == 4
    # Reading from the offsets it gave gets nothing new.
    again = quick.output(out.stdout_next_offset, out.stderr_next_offset)
    assert again.stdout_bytes == b"" and again.stderr_bytes == b""

    # A wait that times out leaves it running.
    assert sleeper.wait(0.2).state == "running"
    ids = [c.id for c in sandbox.commands()]
    assert sleeper.id in ids and quick.id in ids and ids.index(sleeper.id) < ids.index(quick.id)
    assert sandbox.command(sleeper.id).state == "running"

    sleeper.send_signal("TERM")
    done = sleeper.wait(30)
    assert done.state == "exited" and done.exit_code == -1 and done.signal == 15
    with pytest.raises(Conflict):
        sleeper.kill()
    assert "sleep 1000" not in sandbox.exec("ps -eo args").stdout


def test_unknown_command_and_start_failure(sandbox):
    with pytest.raises(NotFound):
        sandbox.command("cmd-999999")
    bad = sandbox.exec_background(["no-such-program-xyz"])
    bad.wait(30)
    assert bad.state == "failed" and "command not found" in (bad.error or "")


def test_stats_measure_the_sandbox(sandbox):
    before = sandbox.stats()
    sandbox.exec("python3 -c 'sum(range(3_000_000))'")
    after = sandbox.stats()
    assert after["id"] == sandbox.id and after["state"] == "running"
    assert after["cpu_usec"] > before["cpu_usec"]
    assert after["memory_bytes"] > 0 and after["pids"] > 0 and after["oom_kills"] == 0
