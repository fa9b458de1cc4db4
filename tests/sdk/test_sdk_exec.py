"""Commands through the SDK: results, output encodings, limits, streaming, threads."""

import threading

import pytest

from withruntime import ExecFailed, ExecResult, Sandbox


def test_exit_code_and_output(sandbox):
    r = sandbox.exec("echo out; echo err >&2; exit 3")
    assert isinstance(r, ExecResult)
    assert r.exit_code == 3
    assert r.stdout == "out\n" and r.stderr == "err\n"
    assert r.stdout_bytes == b"out\n" and r.stderr_bytes == b"err\n"
    assert not r.ok
    assert r.signal is None and not r.timed_out
    assert not r.stdout_truncated and not r.stderr_truncated
    assert isinstance(r.duration_ms, int) and r.duration_ms >= 0
    assert sandbox.exec("true").ok


def test_runs_in_the_sandbox_not_on_the_host(sandbox):
    r = sandbox.exec("cat /etc/hostname; pwd")
    assert r.stdout.splitlines() == ["sandbox", "/workspace"]


def test_argv_cwd_env_stdin(sandbox):
    sandbox.files.mkdir("sub/dir")
    r = sandbox.exec(["python3", "-c", "import os,sys; print(os.getcwd(), os.environ['X'], "
                      "sys.stdin.read())"], cwd="sub/dir", env={"X": "ex"}, stdin="from stdin")
    assert r.stdout == "/workspace/sub/dir ex from stdin\n"
    # argv is not a shell
    assert sandbox.exec(["echo", "$HOME", "a;b"]).stdout == "$HOME a;b\n"


def test_binary_stdin_and_output(sandbox):
    data = bytes(range(256))
    r = sandbox.exec("cat", stdin=data)
    assert r.stdout_bytes == data
    r = sandbox.exec(r"printf '\377\376ok'")
    assert r.stdout_bytes == b"\xff\xfeok"
    assert r.stdout == "\ufffd\ufffdok"


def test_output_limit_truncates(sandbox):
    r = sandbox.exec("head -c 5000 /dev/zero | tr '\\0' a; echo tail >&2", max_output_bytes=100)
    assert r.stdout == "a" * 100
    assert r.stdout_truncated and not r.stderr_truncated
    assert r.stderr == "tail\n"


def test_timeout_kills(sandbox):
    r = sandbox.exec("echo started; sleep 30; echo never", timeout_seconds=1)
    assert r.timed_out
    assert r.exit_code == -1 and r.signal == 9
    assert r.stdout == "started\n"


def test_signal_reported(sandbox):
    r = sandbox.exec("kill -TERM $$")
    assert r.exit_code == -1 and r.signal == 15 and not r.timed_out


def test_command_that_cannot_start(sandbox):
    with pytest.raises(ExecFailed) as ei:
        sandbox.exec(["no-such-program-xyz"])
    assert "no-such-program-xyz" in ei.value.message
    assert ei.value.status == 422
    with pytest.raises(ExecFailed) as ei:
        sandbox.exec("true", cwd="/no/such/dir")
    assert "/no/such/dir" in ei.value.message


def test_bad_arguments_are_caught_before_sending(sandbox):
    with pytest.raises(TypeError):
        sandbox.exec([])
    with pytest.raises(TypeError):
        sandbox.exec(b"echo hi")


def test_stream_yields_output_as_it_is_produced(sandbox):
    # The command prints, then waits for a file that the test makes only after it has seen
    # the first line: a stream that buffered until the end would never see it.
    events = sandbox.exec_stream(
        "echo first; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo second; "
        "echo done >&2", timeout_seconds=60)
    first = next(events)
    assert (first.type, first.data, first.text) == ("stdout", b"first\n", "first\n")
    sandbox.files.write("/workspace/go", "")
    rest = list(events)
    assert rest[-1].type == "exit"
    out = b"".join(e.data for e in rest if e.type == "stdout")
    err = b"".join(e.data for e in rest if e.type == "stderr")
    assert (out, err) == (b"second\n", b"done\n")
    result = rest[-1].result
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout == "first\nsecond\n" and result.stderr == "done\n"


def test_stream_binary_and_exit_status(sandbox):
    events = list(sandbox.exec_stream(r"printf '\377'; exit 7"))
    assert b"".join(e.data for e in events if e.type == "stdout") == b"\xff"
    assert events[-1].result.exit_code == 7
    assert events[-1].result.stdout_bytes == b"\xff"


def test_stream_error_raises(sandbox):
    with pytest.raises(ExecFailed) as ei:
        list(sandbox.exec_stream(["no-such-program-xyz"]))
    assert "no-such-program-xyz" in ei.value.message


def test_stream_can_be_left_early(sandbox):
    events = sandbox.exec_stream("for i in $(seq 1 5); do echo $i; done; sleep 30",
                                 timeout_seconds=60)
    for ev in events:
        assert ev.type == "stdout" and ev.data.startswith(b"1\n")
        break
    events.close()
    # the sandbox still answers
    assert sandbox.exec("echo ok").stdout == "ok\n"


def test_threads_share_a_sandbox(sandbox):
    errors = []

    def worker(n):
        try:
            for i in range(4):
                r = sandbox.exec(f"echo {n}-{i} > t{n}-{i}.txt && cat t{n}-{i}.txt")
                if r.stdout != f"{n}-{i}\n":
                    errors.append(f"worker {n}: {r!r}")
                if sandbox.files.read(f"t{n}-{i}.txt") != f"{n}-{i}\n".encode():
                    errors.append(f"worker {n}: file t{n}-{i}.txt wrong")
        except Exception as e:
            errors.append(f"worker {n}: {e!r}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len([f for f in sandbox.files.list() if f.name.startswith("t")]) == 32


def test_sandboxes_are_separate(sandbox):
    other = Sandbox.create(memory_mib=256, on_lease_end="delete")
    try:
        sandbox.files.write("mine.txt", "1")
        assert not other.files.exists("mine.txt")
        assert other.exec("ls /workspace").stdout == ""
    finally:
        other.delete()
