"""The terminal in the SDK (issue 12, points 1 and 3), sync and async, against the real daemon:
typing into a shell and reading its answer, the terminal's size before and after a resize, the
exit status, end of input on pipes, signals, a read-only key and a stranger refused, the async
terminal beside another coroutine; and async directory transfer (point 5): a round trip with a
symlink, and a hostile archive refused."""

import asyncio
import base64
import hashlib
import io
import json
import os
import queue
import re
import socket
import ssl
import struct
import subprocess
import tarfile
import threading
import time

import pytest

from stubhttp import Stub
from withruntime import (
    AsyncClient,
    AsyncSandbox,
    AsyncTerminal,
    AuthError,
    Client,
    DirTransfer,
    NotFound,
    Sandbox,
    ServerError,
    Terminal,
    UnsafeArchive,
    WithruntimeError,
)


def read_until(term, pattern, timeout=30.0):
    """Output until it matches the regex ``pattern`` (bytes); fails with what came."""
    out = b""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, out):
        left = deadline - time.monotonic()
        assert left > 0, f"no {pattern!r} in {out[-2000:]!r}"
        data = term.recv(timeout=left)
        assert data, f"the session ended before {pattern!r}: {out[-2000:]!r}"
        out += data
    return out


async def aread_until(term, pattern, timeout=30.0):
    out = b""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, out):
        left = deadline - time.monotonic()
        assert left > 0, f"no {pattern!r} in {out[-2000:]!r}"
        data = await term.recv(timeout=left)
        assert data, f"the session ended before {pattern!r}: {out[-2000:]!r}"
        out += data
    return out


# ---- sync ----


def test_sync_terminal_types_resizes_and_exits(sandbox):
    with sandbox.terminal(rows=24, cols=80) as term:
        assert isinstance(term, Terminal) and term.id.startswith("ses-")
        term.send("echo $((6*7))\n")
        read_until(term, rb"[\r\n]42\r\n")
        term.send(b"stty size\n")
        read_until(term, rb"[\r\n]24 80\r\n")
        term.resize(30, 100)
        term.send("stty size\n")
        read_until(term, rb"[\r\n]30 100\r\n")
        listed = {s["id"]: s for s in sandbox.sessions()}
        assert listed[term.id]["state"] == "running" and listed[term.id]["connected"] is True
        term.send("exit 3\n")
        assert term.wait(timeout=30) == 3
        assert (term.exit_code, term.exit_signal, term.exited) == (3, None, True)
        assert term.recv() == b""  # the end, and it stays the end
        with pytest.raises(WithruntimeError) as e:
            term.send("more\n")
        assert e.value.code == "closed"
    s = {s["id"]: s for s in sandbox.sessions()}[term.id]
    assert (s["state"], s["exit_code"], s["rows"], s["cols"]) == ("exited", 3, 30, 100)


def drain(term, timeout=30.0):
    """All the output to the end (b"" from recv), within ``timeout`` seconds."""
    out = b""
    deadline = time.monotonic() + timeout
    while True:
        data = term.recv(timeout=max(0.01, deadline - time.monotonic()))
        if not data:
            return out
        out += data


def test_sync_pipes_eof_signal_and_timeout(sandbox):
    with sandbox.terminal("echo ready; exec wc -l", tty=False) as term:
        read_until(term, rb"^ready\n")
        term.send(b"one\ntwo\nthree\n")
        with pytest.raises(TimeoutError):  # wc waits for the end of its input
            term.recv(timeout=0.3)
        term.eof()
        assert drain(term) == b"3\n"
        assert term.exit_code == 0
    with sandbox.terminal("echo ready; exec sleep 60", tty=False) as term:
        read_until(term, rb"^ready\n")
        term.signal("KILL")
        assert term.wait(timeout=30) == -1 and term.exit_signal == 9
    # a lot of output, read at the caller's pace: all of it arrives, in pieces of at most 1 MiB
    with sandbox.terminal("head -c 8000000 /dev/zero; echo; echo end", tty=False) as term:
        sizes = []
        while chunk := term.recv(timeout=30):
            sizes.append(len(chunk))
        assert sum(sizes) == 8000005 and max(sizes) <= 1 << 20 and term.exit_code == 0
    # left without reading: leaving the block kills the session and the daemon forgets it
    with sandbox.terminal("sleep 60", tty=False) as term:
        sid = term.id
    assert sid not in [s["id"] for s in sandbox.sessions()]


def test_refused_keys_raise_the_sdks_errors(daemon, sandbox):
    keys = []
    for read_only in (True, False):
        status, body = daemon.admin_request("POST", "/v1/keys", {
            "name": f"sdk-term-{time.time_ns()}", "read_only": read_only})
        assert status == 201, body
        keys.append(json.loads(body))
    ro, stranger = keys
    try:
        ro_sbx = Sandbox({"id": sandbox.id}, Client(daemon.url, ro["key"]))
        with pytest.raises(AuthError) as e:
            ro_sbx.terminal()
        assert e.value.status == 403
        # the same classes from the WebSocket handshake itself
        with sandbox.terminal() as term:
            target = f"/v1/sandboxes/{sandbox.id}/sessions/{term.id}/connect"
            with pytest.raises(AuthError) as e:
                Client(daemon.url, ro["key"])._ws_open(target, 10)
            assert e.value.status == 403 and "read-only" in e.value.message
            with pytest.raises(NotFound):
                Client(daemon.url, stranger["key"])._ws_open(target, 10)
            with pytest.raises(AuthError) as e:
                Client(daemon.url, "")._ws_open(target, 10)
            assert e.value.status == 401
            term.send("echo still here\n")  # none of them took the session over
            read_until(term, rb"[\r\n]still here\r\n")
    finally:
        for k in keys:
            daemon.admin_request("POST", f"/v1/keys/{k['id']}/revoke")


def test_over_the_unix_socket(daemon, sandbox):
    sbx = Sandbox({"id": sandbox.id}, Client("unix:" + daemon.socket_path))
    with sbx.terminal(["cat"], tty=False) as term:
        term.send("over the socket\n")
        term.eof()
        assert drain(term) == b"over the socket\n" and term.exit_code == 0

    async def main():
        asbx = AsyncSandbox({"id": sandbox.id}, AsyncClient("unix:" + daemon.socket_path))
        async with await asbx.terminal(["cat"], tty=False) as term:
            await term.send(b"async too\n")
            await term.eof()
            assert await term.recv(timeout=30) == b"async too\n"
            assert await term.wait(timeout=30) == 0

    run(main())


# ---- async ----


def run(coro):
    return asyncio.run(coro)


def read_only_key(daemon):
    status, body = daemon.admin_request("POST", "/v1/keys", {
        "name": f"sdk-term-{time.time_ns()}", "read_only": True})
    assert status == 201, body
    return json.loads(body)


def test_async_terminal_beside_another_coroutine(daemon, sandbox):
    async def main():
        sbx = await AsyncSandbox.connect(sandbox.id)
        async with await sbx.terminal(rows=24, cols=80) as term:
            assert isinstance(term, AsyncTerminal)
            await term.send("echo $((6*7))\n")
            await aread_until(term, rb"[\r\n]42\r\n")
            await term.send("stty size\n")
            await aread_until(term, rb"[\r\n]24 80\r\n")
            await term.resize(40, 120)
            await term.send("stty size\n")
            await aread_until(term, rb"[\r\n]40 120\r\n")
            # the loop runs on while a read waits: a ticker counts, and an exec runs to its
            # end, while the shell sleeps before it answers
            ticks = 0
            done = asyncio.Event()

            async def ticker():
                nonlocal ticks
                while not done.is_set():
                    ticks += 1
                    await asyncio.sleep(0.01)

            t = asyncio.ensure_future(ticker())
            await term.send("sleep 1; echo slept\n")
            before = ticks
            other = asyncio.ensure_future(sbx.exec("echo beside"))
            await aread_until(term, rb"[\r\n]slept\r\n")
            done.set()
            await t
            assert ticks - before >= 10
            assert (await other).stdout == "beside\n"
            await term.send("exit 3\n")
            assert await term.wait(timeout=30) == 3
        assert [s["state"] for s in await sbx.sessions() if s["id"] == term.id] == ["exited"]

        async with sbx.terminal("echo ready; exec wc -l", tty=False) as term:  # no await
            await aread_until(term, rb"^ready\n")
            await term.send(b"a\nb\nc\n")
            await term.eof()

            async def rest():
                return b"".join([chunk async for chunk in term])

            assert await asyncio.wait_for(rest(), 30) == b"3\n"
            assert term.exit_code == 0

        ro = AsyncSandbox({"id": sandbox.id}, AsyncClient(api_key=ro_key["key"]))
        with pytest.raises(AuthError) as e:
            await ro.terminal()
        assert e.value.status == 403
        target = f"/v1/sandboxes/{sandbox.id}/sessions/ses-1/connect"
        with pytest.raises(AuthError) as e:  # the handshake's refusal, the same class
            await ro.client._ws_open(target, 10)
        assert e.value.status == 403

    ro_key = read_only_key(daemon)
    try:
        run(main())
    finally:
        daemon.admin_request("POST", f"/v1/keys/{ro_key['id']}/revoke")


def make_tree(root):
    os.makedirs(os.path.join(root, "sub"))
    with open(os.path.join(root, "sub", "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho hi\n")
    os.chmod(os.path.join(root, "sub", "run.sh"), 0o755)
    os.symlink("sub/run.sh", os.path.join(root, "link"))


def test_async_directory_round_trip(sandbox, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(str(src))

    async def main():
        sbx = await AsyncSandbox.connect(sandbox.id)
        up = await sbx.files.upload_dir(str(src), "/workspace/tree")
        assert isinstance(up, DirTransfer) and up.entries >= 3
        assert (await sbx.files.stat("tree/link")).target == "sub/run.sh"
        assert (await sbx.exec("./tree/link")).stdout == "hi\n"
        down = await sbx.files.download_dir("/workspace/tree", str(dst))
        assert down.entries == up.entries and down.skipped == []
        with pytest.raises(NotFound):
            await sbx.files.download_dir("/workspace/nothing-here", str(tmp_path / "x"))

    run(main())
    assert os.readlink(dst / "link") == "sub/run.sh"
    assert (dst / "sub" / "run.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert os.stat(dst / "sub" / "run.sh").st_mode & 0o777 == 0o755


def test_async_hostile_archive_is_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in ("fine.txt", "../escaped.txt"):
            ti = tarfile.TarInfo(name)
            ti.size = 4
            tf.addfile(ti, io.BytesIO(b"data"))
    target = tmp_path / "target"

    async def main():
        with Stub(body=buf.getvalue(), content_type="application/x-tar") as stub:
            sbx = AsyncSandbox({"id": "sb-stub"}, AsyncClient(stub.url))
            with pytest.raises(UnsafeArchive) as e:
                await sbx.files.download_dir("/workspace", str(target))
            assert "'..'" in e.value.message

    run(main())
    assert os.listdir(tmp_path) == ["target"]
    assert os.listdir(target) == ["fine.txt"]


# ---- the protocol over TLS, against a stand-in daemon ----


class FakeSessionDaemon:
    """HTTPS on loopback with a self-signed certificate: answers the session's POST (201), its
    DELETE, and the connect with a WebSocket that pings, sends a fragmented message, echoes
    each binary frame with "echo:" before it, and on an eof message sends an exit message and
    closes. It checks that every client frame is masked and that the pong carries the ping's
    payload."""

    def __init__(self, tmp_path, hostile=False):
        self.hostile = hostile
        self.cert = str(tmp_path / "cert.pem")
        key = str(tmp_path / "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", self.cert,
                        "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(self.cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.listener.getsockname()[1]}"
        self.problems = []
        self.requests = []
        self.closes = queue.Queue()  # the close code of each connection the client closed
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, raw):
        try:
            sock = self.ctx.wrap_socket(raw, server_side=True)
            f = sock.makefile("rb")
            while True:
                line = f.readline()
                if not line:
                    return
                method, path = line.decode().split()[:2]
                headers = {}
                while (h := f.readline()) not in (b"\r\n", b""):
                    k, v = h.decode().split(":", 1)
                    headers[k.strip().lower()] = v.strip()
                f.read(int(headers.get("content-length", 0)))
                self.requests.append((method, path, headers.get("authorization")))
                if path.endswith("/connect"):
                    accept = base64.b64encode(hashlib.sha1(
                        headers["sec-websocket-key"].encode()
                        + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()).decode()
                    sock.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                  "Connection: Upgrade\r\nSec-WebSocket-Accept: "
                                  f"{accept}\r\n\r\n").encode())
                    return self._websocket(sock, f)
                body = json.dumps({"id": "ses-9", "state": "running"} if method == "POST"
                                  else {"id": "ses-9", "deleted": True}).encode()
                status = "201 Created" if method == "POST" else "200 OK"
                sock.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        except (OSError, ValueError):
            return

    def _websocket(self, sock, f):
        def send(op, payload, fin=True):
            sock.sendall(struct.pack("!BB", (0x80 if fin else 0) | op, len(payload)) + payload)

        send(0x9, b"ping!")
        if self.hostile:  # the header of a 2 MiB frame
            sock.sendall(struct.pack("!BBQ", 0x82, 127, 2 << 20))
        send(0x2, b"frag", fin=False)
        send(0x0, b"mented")
        while True:
            b0, b1 = f.read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", f.read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", f.read(8))[0]
            if not b1 & 0x80:
                self.problems.append("an unmasked frame")
                return
            mask = f.read(4)
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(f.read(n)))
            op = b0 & 0x0F
            if op == 0xA and data != b"ping!":
                self.problems.append(f"pong {data!r}")
            elif op == 0x2:
                send(0x2, b"echo:" + data[:100])
            elif op == 0x1 and json.loads(data)["type"] == "eof":
                send(0x1, json.dumps({"type": "exit", "exit_code": 7, "signal": None}).encode())
                send(0x8, struct.pack("!H", 1000))
            elif op == 0x8:
                self.closes.put(struct.unpack("!H", data[:2])[0])
                sock.close()
                return

    def close(self):
        self.listener.close()


def test_the_protocol_over_tls(tmp_path):
    fake = FakeSessionDaemon(tmp_path)
    try:
        big = os.urandom(70000)  # more than one frame of input, and a 64-bit length
        client = Client(fake.url, "secret-key", ca_file=fake.cert)
        with Sandbox({"id": "sb-x"}, client).terminal() as term:
            assert term.recv(timeout=10) == b"fragmented"
            term.send(big)
            got = read_until(term, rb"(?s)echo:.*echo:", timeout=10)
            assert got[:105] == b"echo:" + big[:100]
            term.eof()
            assert term.wait(timeout=10) == 7
        assert fake.closes.get(timeout=10) == 1000 and fake.problems == []

        async def main():
            sbx = AsyncSandbox({"id": "sb-x"}, AsyncClient(fake.url, "secret-key",
                                                            ca_file=fake.cert))
            term = await sbx.terminal()
            assert await term.recv(timeout=10) == b"fragmented"
            await term.send("hello")
            assert await term.recv(timeout=10) == b"echo:hello"
            await term.close()  # the close handshake: the stand-in saw 1000
            with pytest.raises(WithruntimeError):
                await term.send("late")
            await sbx.client.aclose()

        run(main())
        assert fake.closes.get(timeout=10) == 1000 and fake.problems == []
        assert {r[2] for r in fake.requests} == {"Bearer secret-key"}
        assert [r[0] for r in fake.requests] == ["POST", "GET", "POST", "GET"]
    finally:
        fake.close()


def test_a_daemon_that_breaks_the_protocol(tmp_path):
    fake = FakeSessionDaemon(tmp_path, hostile=True)
    try:
        client = Client(fake.url, "secret-key", ca_file=fake.cert)
        with Sandbox({"id": "sb-x"}, client).terminal() as term:
            with pytest.raises(ServerError) as e:
                term.recv(timeout=10)
            assert "WebSocket protocol" in e.value.message and "2097152" in e.value.message
            assert term.recv(timeout=10) == b""
        assert fake.closes.get(timeout=10) == 1009 and fake.problems == []
        assert [r[0] for r in fake.requests] == ["POST", "GET", "DELETE"]

        async def main():
            sbx = AsyncSandbox({"id": "sb-x"}, AsyncClient(fake.url, "secret-key",
                                                            ca_file=fake.cert))
            async with sbx.terminal() as term:
                with pytest.raises(ServerError):
                    await term.recv(timeout=10)
                assert [chunk async for chunk in term] == []
            await sbx.client.aclose()

        run(main())
        assert fake.closes.get(timeout=10) == 1009 and fake.problems == []
    finally:
        fake.close()


def server_frame(op, payload, fin=True, rsv=0, masked=False, length=None):
    n = len(payload) if length is None else length
    b0 = (0x80 if fin else 0) | rsv | op
    if n < 126:
        head = struct.pack("!BB", b0, (0x80 if masked else 0) | n)
    elif n < 65536:
        head = struct.pack("!BBH", b0, (0x80 if masked else 0) | 126, n)
    else:
        head = struct.pack("!BBQ", b0, (0x80 if masked else 0) | 127, n)
    return head + (b"\0\0\0\0" if masked else b"") + payload


def unmask(frame):
    """A client frame's opcode and payload; it must be masked."""
    assert frame[1] & 0x80
    n, p = frame[1] & 0x7F, 2
    if n == 126:
        n, p = struct.unpack("!H", frame[2:4])[0], 4
    elif n == 127:
        n, p = struct.unpack("!Q", frame[2:10])[0], 10
    mask, data = frame[p:p + 4], frame[p + 4:]
    assert len(data) == n
    return frame[0] & 0x0F, bytes(c ^ mask[i % 4] for i, c in enumerate(data))


def test_the_websocket_protocol_without_io():
    from withruntime import _ws

    for payload in (b"", b"x" * 125, b"y" * 300, os.urandom(70000)):
        f = _ws.frame(_ws.BINARY, payload)
        assert unmask(f) == (_ws.BINARY, payload)
        assert f[-len(payload):] != payload or not payload  # masked on the wire
    p = _ws.Protocol()
    # a message in pieces, fed a byte at a time, with a ping in its middle
    wire = (server_frame(2, b"ab", fin=False) + server_frame(9, b"hi")
            + server_frame(0, b"cd") + server_frame(1, "é".encode()))
    events = []
    for i in range(len(wire)):
        p.feed(wire[i:i + 1])
        while (ev := p.next_event()) is not None:
            events.append(ev)
    assert events == [("binary", b"abcd"), ("text", "é")]
    assert unmask(p.take_output()) == (_ws.PONG, b"hi") and p.take_output() == b""
    p.feed(server_frame(8, struct.pack("!H", 1001)))
    assert p.next_event() == ("close", 1001)
    assert unmask(p.take_output()) == (_ws.CLOSE, struct.pack("!H", 1001))
    assert p.send_close() == b""  # once only
    bad = [
        (server_frame(2, b"", length=(1 << 20) + 1), 1009),  # refused from its header alone
        (server_frame(2, b"x" * 1000, fin=False) + server_frame(0, b"", length=1 << 20), 1009),
        (server_frame(2, b"x", rsv=0x40), 1002),
        (server_frame(2, b"x", masked=True), 1002),
        (server_frame(9, b"x" * 126), 1002),
        (server_frame(0, b"x"), 1002),
        (server_frame(5, b"x"), 1002),
        (server_frame(1, b"\xff"), 1007),
    ]
    for wire, code in bad:
        p = _ws.Protocol()
        p.feed(wire)
        with pytest.raises(_ws.ProtocolError) as e:
            while p.next_event() is not None:
                pass
        assert e.value.code == code, wire[:20]
    r = _ws.HandshakeReader()
    with pytest.raises(_ws.ProtocolError):
        r.feed(b"HTTP/1.1 101 OK\r\n" + b"X: y\r\n" * 20000)


# ---- python/README.md ----


def readme_examples():
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "python", "README.md")
    with open(readme) as f:
        text = f.read()
    section = text[text.index("\n## Terminal\n"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readmes_terminal_examples(daemon, new_sandboxes, capsys):
    sync_example, async_example = readme_examples()
    exec(compile(sync_example, "python/README.md (Terminal)", "exec"), {"__name__": "readme"})
    assert re.search(r"[\r\n]42\r?\n", capsys.readouterr().out)
    exec(compile(async_example, "python/README.md (Terminal, async)", "exec"),
         {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "30 100" in out and out.splitlines()[-1] == "exit 3", out
    assert new_sandboxes() == []
