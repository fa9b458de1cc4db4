"""Background commands: exec {"background": true} and /commands."""

import base64
import time
import uuid

import pytest


def start(client, sid, **body):
    r = client.request("POST", f"/v1/sandboxes/{sid}/exec", dict(body, background=True))
    assert r.status == 201, r
    return r.json()


def cmd_path(sid, cid, tail=""):
    return f"/v1/sandboxes/{sid}/commands/{cid}{tail}"


def wait(client, sid, cid, timeout=60):
    return client.expect(200, "POST", cmd_path(sid, cid, "/wait"),
                         {"timeout_seconds": timeout}).json()


def output(client, sid, cid, **offsets):
    return client.expect(200, "GET", cmd_path(sid, cid, "/output"), query=offsets).json()


def raw(o, stream):
    s = o[stream]
    return base64.b64decode(s) if o[f"{stream}_encoding"] == "base64" else s.encode()


def test_background_runs_and_keeps_output(client, sandbox):
    flag = f"/tmp/flag-{uuid.uuid4().hex}"
    c = start(client, sandbox,
              command=f"echo out; echo err >&2; while [ ! -e {flag} ]; do sleep 0.1; done; "
                      f"echo more; exit 3")
    assert c["state"] == "running"
    assert c["sandbox_id"] == sandbox
    assert c["argv"][-1].startswith("echo out")
    assert c["exit_code"] is None and c["ended_at"] is None
    cid = c["id"]

    # still running while it waits for the flag; a short wait says so
    w = client.expect(200, "POST", cmd_path(sandbox, cid, "/wait"),
                      {"timeout_seconds": 0.5}).json()
    assert w["state"] == "running"
    listed = client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/commands").json()["commands"]
    assert cid in [x["id"] for x in listed]

    client.exec(sandbox, f"touch {flag}")
    done = wait(client, sandbox, cid)
    assert done["state"] == "exited"
    assert done["exit_code"] == 3 and done["signal"] is None
    assert done["ended_at"] is not None
    assert done["stdout_bytes"] == len("out\nmore\n") and done["stderr_bytes"] == 4

    o = output(client, sandbox, cid)
    assert raw(o, "stdout") == b"out\nmore\n" and raw(o, "stderr") == b"err\n"
    assert o["stdout_next_offset"] == 9 and o["stderr_next_offset"] == 4
    o = output(client, sandbox, cid, stdout_offset=4, stderr_offset=4)
    assert raw(o, "stdout") == b"more\n" and raw(o, "stderr") == b""
    o = output(client, sandbox, cid, stdout_offset=1000)
    assert o["stdout"] == "" and o["stdout_next_offset"] == 9
    # GET of the command agrees with wait
    got = client.expect(200, "GET", cmd_path(sandbox, cid)).json()
    assert got == done


def test_background_signal(client, sandbox):
    c = start(client, sandbox, command="sleep 1000 & sleep 1000")
    r = client.expect(200, "POST", cmd_path(sandbox, c["id"], "/signal"), {"signal": "TERM"})
    assert r.json()["id"] == c["id"]
    done = wait(client, sandbox, c["id"])
    assert done["state"] == "exited"
    assert done["exit_code"] == -1 and done["signal"] == 15
    # the whole tree got it: the orphaned `sleep` ends too (it may still be dying when sh's
    # exit is reported, so allow it a bounded moment; a missed one would live 1000 s)
    deadline = time.monotonic() + 10
    while True:
        r = client.exec(sandbox, "cat /proc/[0-9]*/comm")
        assert "wr-ns-init" in r["stdout"].split(), r
        if "sleep" not in r["stdout"].split() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "sleep" not in r["stdout"].split(), r["stdout"]
    # a finished command cannot be signalled
    r = client.request("POST", cmd_path(sandbox, c["id"], "/signal"), {"signal": 9})
    assert r.status == 409 and r.error[0] == "conflict"


def test_background_timeout(client, sandbox):
    c = start(client, sandbox, argv=["sleep", "1000"], timeout_seconds=1)
    done = wait(client, sandbox, c["id"])
    assert done["state"] == "exited" and done["timed_out"] is True and done["exit_code"] == -1


def test_background_binary_output_and_cap(client, sandbox):
    """A background command keeps the tail of its output: the last max_output_bytes."""
    c = start(client, sandbox, command=r"head -c 5000 /dev/zero; printf '\377\376'",
              max_output_bytes=100)
    done = wait(client, sandbox, c["id"])
    assert done["stdout_truncated"] is True
    assert done["stdout_bytes"] == 5002
    o = output(client, sandbox, c["id"])
    assert o["stdout_encoding"] == "base64"
    assert raw(o, "stdout") == b"\0" * 98 + b"\xff\xfe"
    assert o["stdout_offset"] == 4902 and o["stdout_next_offset"] == 5002
    # asking from an offset that is still kept gives just the rest
    o = output(client, sandbox, c["id"], stdout_offset=5000)
    assert raw(o, "stdout") == b"\xff\xfe" and o["stdout_offset"] == 5000


def test_background_tail_is_bounded(client, sandbox):
    """3 MiB of numbered lines: the command keeps the last MiB (the server maximum for a
    background command), ending with the last line, and says where it starts."""
    c = start(client, sandbox, command="seq 1 400000", max_output_bytes=16 * 1024 * 1024)
    done = wait(client, sandbox, c["id"])
    assert done["exit_code"] == 0 and done["stdout_truncated"] is True
    total = done["stdout_bytes"]
    o = output(client, sandbox, c["id"])
    out = raw(o, "stdout")
    assert len(out) == 1024 * 1024
    assert out.endswith(b"\n399999\n400000\n")
    assert o["stdout_offset"] == total - len(out) and o["stdout_next_offset"] == total


def test_background_cannot_start(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"argv": ["no-such-program-xyz"], "background": True})
    # a background command answers at once, before the agent has tried to start it: a program
    # that is not there shows as a command that failed, with the reason
    assert r.status == 201, r
    assert r.json()["state"] == "running", r
    done = wait(client, sandbox, r.json()["id"])
    assert done["state"] == "failed" and "no-such-program-xyz" in done["error"]


def test_background_bad_requests(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": "true", "background": True, "stream": True})
    assert r.status == 400 and r.error[0] == "invalid_request"
    for tail, method, body in [("", "GET", None), ("/output", "GET", None),
                               ("/wait", "POST", {}), ("/signal", "POST", {})]:
        r = client.request(method, cmd_path(sandbox, "cmd-999999", tail), body)
        assert r.status == 404 and r.error[0] == "not_found", (tail, r)
    c = start(client, sandbox, command="sleep 30")
    for body in [{"signal": "NOPE"}, {"signal": 0}, {"signal": 65}, {"sig": "TERM"}]:
        r = client.request("POST", cmd_path(sandbox, c["id"], "/signal"), body)
        assert r.status == 400, (body, r)
    for body in [{"timeout_seconds": -1}, {"timeout_seconds": 3601}, {"timeout": 1}]:
        r = client.request("POST", cmd_path(sandbox, c["id"], "/wait"), body)
        assert r.status == 400, (body, r)
    r = client.request("GET", cmd_path(sandbox, c["id"], "/output"),
                       query={"stdout_offset": "-1"})
    assert r.status == 400
    client.expect(200, "POST", cmd_path(sandbox, c["id"], "/signal"), {"signal": "KILL"})
    assert wait(client, sandbox, c["id"])["signal"] == 9


@pytest.mark.parametrize("n", [3])
def test_commands_listed_oldest_first(client, make_sandbox, n):
    sid = make_sandbox(memory_mib=256)["id"]
    ids = [start(client, sid, command=f"echo {i}")["id"] for i in range(n)]
    for cid in ids:
        wait(client, sid, cid)
    listed = client.expect(200, "GET", f"/v1/sandboxes/{sid}/commands").json()["commands"]
    assert [c["id"] for c in listed] == ids
