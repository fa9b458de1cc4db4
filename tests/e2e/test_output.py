"""Output that tries to break the caps or the encoding (issue 3): endless random bytes, a 2 GB line
without a newline, NUL bytes and terminal escapes. The caps must hold exactly, the daemon's
memory must not grow with what a command writes, and every byte must come back as it was
(docs/api.md "Exec": UTF-8 text when the bytes are valid UTF-8, else base64)."""

import json
import threading

import pytest

from wrclient import chunk_bytes, output

MIB = 1024 * 1024
RSS_LIMIT = 200 * MIB  # the daemon's resident memory while a command floods it


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class RssWatch:
    """Samples a process's VmRSS every 0.1 s in a thread; .peak is the highest seen."""

    def __init__(self, pid):
        self.pid = pid
        self.peak = rss(pid)
        self.samples = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss(self.pid))
            self.samples += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss(self.pid))


def control_chars(body):
    """Raw bytes below 0x20 in a JSON document (JSON forbids them inside strings; a terminal
    would act on them)."""
    return sorted({b for b in body.rstrip(b"\n") if b < 0x20})


@pytest.mark.parametrize("cap", [65536, 1048576])
def test_urandom_is_cut_at_the_cap(client, sandbox, cap):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": "cat /dev/urandom", "timeout_seconds": 2,
                        "max_output_bytes": cap})
    assert r.status == 200, r
    assert control_chars(r.body) == [], "raw control bytes in the JSON answer"
    res = json.loads(r.body)
    assert res["timed_out"] is True and res["signal"] == 9 and res["exit_code"] == -1, \
        {k: v for k, v in res.items() if k not in ("stdout", "stderr")}
    assert res["stdout_truncated"] is True
    assert res["stdout_encoding"] == "base64"  # random bytes are not UTF-8
    out = output(res)
    assert len(out) == cap
    assert len(set(out)) > 200  # it is the random stream, not padding
    assert output(res, "stderr") == b"" and res["stderr_truncated"] is False


def test_urandom_stream_is_cut_at_the_cap(client, sandbox):
    cap = 100000
    with client.stream(sandbox, {"command": "cat /dev/urandom", "timeout_seconds": 2,
                                 "max_output_bytes": cap}) as s:
        assert s.status == 200
        events = s.read_all()
    assert events and events[-1]["type"] == "exit", events[-1:]
    end = events[-1]
    assert end["timed_out"] is True and end["stdout_truncated"] is True, end
    out = b"".join(chunk_bytes(e) for e in events if e["type"] == "stdout")
    assert len(out) == cap


@pytest.mark.slow
def test_two_gigabyte_line_without_newline(client, sandbox, daemon):
    """2e9 bytes of 'a' and no newline: the answer holds exactly the cap (the server maximum,
    16 MiB) and the daemon never holds much more than that."""
    cap = 16 * MIB
    with RssWatch(daemon.proc.pid) as watch:
        r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                           {"command": "head -c 2000000000 /dev/zero | tr '\\0' a",
                            "timeout_seconds": 150, "max_output_bytes": cap})
    assert r.status == 200, r
    res = r.json()
    summary = {k: v for k, v in res.items() if k not in ("stdout", "stderr")}
    assert res["stdout_truncated"] is True, summary
    assert res["stdout_encoding"] == "utf-8"
    assert res["stdout"] == "a" * cap, summary
    assert res["stderr"] == "", res["stderr"][:500]
    # it ran to its end, or for 150 s (a bound on the run time, not a speed check)
    assert (res["exit_code"] == 0 and not res["timed_out"]) or res["timed_out"], summary
    assert watch.samples >= 5
    assert watch.peak < RSS_LIMIT, \
        f"daemon VmRSS reached {watch.peak / MIB:.0f} MiB while the command wrote 2 GB"
    # and the daemon let go of it
    assert rss(daemon.proc.pid) < RSS_LIMIT


NUL_ESC = b"\0\x1b[31mred\x1b[0m\0"
# an xterm title change, BEL, CR LF, then a byte that makes the stream invalid UTF-8
NUL_ESC_BINARY = b"\0\x1b]0;pwned\x07\r\n\x1b[2J\xff"
PRINTF = r"printf '\0\033[31mred\033[0m\0'; printf '\0\033]0;pwned\007\r\n\033[2J\377' >&2"


def test_nul_and_escapes_round_trip(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec", {"command": PRINTF})
    assert r.status == 200, r
    assert control_chars(r.body) == [], f"raw control bytes in the JSON answer: {r.body!r}"
    res = json.loads(r.body)
    assert res["exit_code"] == 0, res
    # valid UTF-8 (NUL and ESC are): text, every byte kept
    assert res["stdout_encoding"] == "utf-8"
    assert res["stdout"] == NUL_ESC.decode()
    # not valid UTF-8: base64 of the exact bytes
    assert res["stderr_encoding"] == "base64"
    assert output(res, "stderr") == NUL_ESC_BINARY


def test_nul_and_escapes_round_trip_streamed(client, sandbox):
    with client.stream(sandbox, {"command": PRINTF}) as s:
        assert s.status == 200
        events = s.read_all()
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0, events[-1]
    got = {k: b"".join(chunk_bytes(e) for e in events if e["type"] == k)
           for k in ("stdout", "stderr")}
    assert got == {"stdout": NUL_ESC, "stderr": NUL_ESC_BINARY}


def test_nul_and_escapes_round_trip_background(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": PRINTF, "background": True})
    assert r.status == 201, r
    cid = r.json()["id"]
    done = client.expect(200, "POST", f"/v1/sandboxes/{sandbox}/commands/{cid}/wait",
                         {"timeout_seconds": 60}).json()
    assert done["state"] == "exited" and done["exit_code"] == 0, done
    r = client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/commands/{cid}/output")
    assert control_chars(r.body) == [], f"raw control bytes in the JSON answer: {r.body!r}"
    o = r.json()
    assert output(o) == NUL_ESC and output(o, "stderr") == NUL_ESC_BINARY


def test_control_characters_do_not_blow_up_the_answer(client, sandbox):
    """1 MiB of \\x01 is valid UTF-8, but as JSON text it would take 6 MiB: it comes as base64,
    and the answer stays within 1.5x the output."""
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": "head -c 1048576 /dev/zero | tr '\\0' '\\1'",
                        "max_output_bytes": 1048576})
    assert r.status == 200, r
    res = json.loads(r.body)
    assert res["stdout_encoding"] == "base64"
    assert output(res) == b"\x01" * 1048576
    assert len(r.body) < 1.5 * 1048576, len(r.body)


def test_non_ascii_text_is_not_escaped(client, sandbox):
    text = "héllo wörld ✓ 日本語\n" * 1000
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": "cat", "stdin": text})
    assert r.status == 200, r
    res = json.loads(r.body)
    assert res["stdout_encoding"] == "utf-8" and res["stdout"] == text
    # as is: 28,000 bytes of text, 1,000 "\\n" escapes and the other fields; as \\uXXXX it would be
    # 48,000
    assert len(r.body) < len(text.encode()) + 3000, len(r.body)
