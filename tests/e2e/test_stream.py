"""Streaming exec: NDJSON lines as output is produced, then one final record."""

import uuid

from wrclient import chunk_bytes


def collect(events, kind):
    return b"".join(chunk_bytes(e) for e in events if e["type"] == kind)


def test_stream_basic(client, sandbox):
    with client.stream(sandbox, {"command": "echo out1; echo err1 >&2; echo out2; exit 4"}) as s:
        assert s.status == 200
        assert s.headers["content-type"].startswith("application/x-ndjson")
        events = s.read_all()
    assert events, "no lines"
    assert events[-1]["type"] == "exit"
    assert [e["type"] for e in events].count("exit") == 1
    assert all(e["type"] in ("stdout", "stderr") for e in events[:-1])
    assert collect(events, "stdout") == b"out1\nout2\n"
    assert collect(events, "stderr") == b"err1\n"
    ex = events[-1]
    assert ex["exit_code"] == 4 and ex["signal"] is None and ex["timed_out"] is False
    assert 0 <= ex["exit_to_answer_us"] <= (ex["duration_ms"] + 1) * 1000, ex
    assert ex["stdout_truncated"] is False and ex["stderr_truncated"] is False


def test_stream_delivers_before_exit(client, sandbox):
    # prints, sleeps 2 s, prints again: the first line must be a separate, earlier event
    with client.stream(sandbox, {"command": "echo first; sleep 2; echo second"}) as s:
        first = s.next_event()
        assert first is not None and first["type"] == "stdout"
        assert chunk_bytes(first) == b"first\n"
        rest = s.read_all()[1:]
    assert collect(rest, "stdout") == b"second\n"
    assert rest[-1]["type"] == "exit" and rest[-1]["exit_code"] == 0


def test_stream_is_incremental(client, sandbox):
    # The command prints, then waits until the test has *received* that line and answered by
    # creating a flag file (through another exec). A daemon that held output back until the
    # command ended would only deliver the first line after the wait gave up.
    flag = f"/tmp/go-{uuid.uuid4().hex}"
    cmd = (f"echo ready; i=0; while [ ! -e {flag} ] && [ $i -lt 300 ]; do sleep 0.1; "
           f"i=$((i+1)); done; if [ -e {flag} ]; then echo released; else echo gave-up; fi")
    with client.stream(sandbox, {"command": cmd, "timeout_seconds": 120}) as s:
        first = s.next_event()
        assert first is not None and first["type"] == "stdout"
        assert chunk_bytes(first) == b"ready\n"
        r = client.exec(sandbox, f"touch {flag}")
        assert r["exit_code"] == 0
        rest = s.read_all()[1:]
    assert collect(rest, "stdout") == b"released\n"
    assert rest[-1]["type"] == "exit" and rest[-1]["exit_code"] == 0


def test_stream_binary_and_stdin(client, sandbox):
    data = bytes(range(256)) * 10
    import base64
    with client.stream(sandbox, {"command": "cat",
                                 "stdin_base64": base64.b64encode(data).decode()}) as s:
        events = s.read_all()
    assert collect(events, "stdout") == data
    assert events[-1]["type"] == "exit"


def test_stream_large_output(client, sandbox):
    with client.stream(sandbox, {"command": "head -c 2000000 /dev/zero | tr '\\0' 'x'",
                                 "max_output_bytes": 4000000}) as s:
        events = s.read_all()
    assert collect(events, "stdout") == b"x" * 2000000
    assert events[-1]["type"] == "exit" and events[-1]["stdout_truncated"] is False


def test_stream_output_cap(client, sandbox):
    with client.stream(sandbox, {"command": "head -c 3000000 /dev/zero",
                                 "max_output_bytes": 1000}) as s:
        events = s.read_all()
    assert collect(events, "stdout") == b"\0" * 1000
    assert events[-1]["type"] == "exit"
    assert events[-1]["stdout_truncated"] is True
    assert events[-1]["exit_code"] == 0
    # the stream says where it was cut, once, after the last output it sent
    cuts = [i for i, e in enumerate(events) if e["type"] == "truncated"]
    assert [events[i] for i in cuts] == [
        {"type": "truncated", "stream": "stdout", "max_output_bytes": 1000}], events
    assert all(e["type"] != "stdout" for e in events[cuts[0]:]), events
    # a cut inside a character: the stream still holds exactly the cap's bytes, all before it
    with client.stream(sandbox, {"command": "yes é | head -c 300000",
                                 "max_output_bytes": 1000}) as s:
        events = s.read_all()
    cut = [i for i, e in enumerate(events) if e["type"] == "truncated"]
    assert len(cut) == 1 and all(e["type"] != "stdout" for e in events[cut[0]:]), events
    assert collect(events, "stdout") == ("é\n" * 400).encode()[:1000]


def test_stream_may_ask_for_more_than_a_whole_answer(client, sandbox):
    """A stream holds nothing in the daemon: its cap may pass the 16 MiB of a whole answer."""
    with client.stream(sandbox, {"command": "head -c 20000000 /dev/zero",
                                 "max_output_bytes": 64 << 20}) as s:
        events = s.read_all()
    assert len(collect(events, "stdout")) == 20000000
    assert events[-1]["stdout_truncated"] is False
    assert not [e for e in events if e["type"] == "truncated"]
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": "true", "max_output_bytes": 64 << 20})
    assert r.status == 400 and '"stream": true' in r.error[1], r


def test_stream_timeout(client, sandbox):
    with client.stream(sandbox, {"command": "echo started; sleep 1000",
                                 "timeout_seconds": 1}) as s:
        events = s.read_all()
    assert collect(events, "stdout") == b"started\n"
    ex = events[-1]
    assert ex["type"] == "exit" and ex["timed_out"] is True and ex["exit_code"] == -1


def test_stream_cannot_start(client, sandbox):
    with client.stream(sandbox, {"argv": ["no-such-program-xyz"]}) as s:
        assert s.status == 200
        events = s.read_all()
    assert len(events) == 1, events
    assert events[0]["type"] == "error"
    assert events[0]["code"] == "exec_failed"


def test_stream_bad_request_is_plain_error(client, sandbox):
    with client.stream(sandbox, {"command": "true", "argv": ["true"]}) as s:
        assert s.status == 400
    with client.stream("sb-aaaaaaaaaaaaaaaaaaaaa", {"command": "true"}) as s:
        assert s.status == 404
