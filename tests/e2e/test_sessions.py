"""Interactive sessions: POST /v1/sandboxes/{id}/sessions and its WebSocket (GET .../connect),
driven by a WebSocket client written here over a plain socket, and `withruntime sandbox shell`
and `sandbox exec -i` driven through a pseudo-terminal and pipes."""
import base64
import fcntl
import hashlib
import json
import os
import pty
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import conftest  # noqa: E402

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class WS:
    """A minimal RFC 6455 client: enough to drive a session and to misbehave on purpose."""

    def __init__(self, daemon, path, key=None, headers=None, protocols=None):
        self.sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
        wskey = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{daemon.port}",
                 "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
                 f"Sec-WebSocket-Key: {wskey}"]
        if key is None:
            key = daemon.key
        if key:
            lines.append(f"Authorization: Bearer {key}")
        if protocols:
            lines.append("Sec-WebSocket-Protocol: " + ", ".join(protocols))
        lines += list(headers or [])
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            assert chunk, f"closed during the handshake: {buf!r}"
            buf += chunk
        head, self.buf = buf.split(b"\r\n\r\n", 1)
        self.head = head.decode()
        self.status = int(self.head.split()[1])
        self.headers = {ln.split(":", 1)[0].strip().lower(): ln.split(":", 1)[1].strip()
                        for ln in self.head.split("\r\n")[1:] if ":" in ln}
        if self.status == 101:
            want = base64.b64encode(hashlib.sha1(wskey.encode() + GUID).digest()).decode()
            assert self.headers["sec-websocket-accept"] == want
        self.output = b""
        self.texts = []
        self.close_code = None

    def send_frame(self, op, payload, mask=True, fin=True, rsv=0, length=None):
        n = len(payload) if length is None else length
        b0 = (0x80 if fin else 0) | rsv | op
        mbit = 0x80 if mask else 0
        if n < 126:
            hdr = struct.pack("!BB", b0, mbit | n)
        elif n < 65536:
            hdr = struct.pack("!BBH", b0, mbit | 126, n)
        else:
            hdr = struct.pack("!BBQ", b0, mbit | 127, n)
        if mask:
            key = os.urandom(4)
            payload = bytes(c ^ key[i % 4] for i, c in enumerate(payload))
            hdr += key
        self.sock.sendall(hdr + payload)

    def send_bytes(self, data):
        self.send_frame(2, data)

    def send_json(self, obj):
        self.send_frame(1, json.dumps(obj).encode())

    def _need(self, n, deadline):
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; output so far: {self.output[-2000:]!r}"
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk

    def read_frame(self, timeout=30):
        deadline = time.monotonic() + timeout
        self._need(2, deadline)
        b0, b1 = self.buf[0], self.buf[1]
        assert not b1 & 0x80, "a server frame must not be masked"
        n, p = b1 & 0x7F, 2
        if n == 126:
            self._need(4, deadline)
            n, p = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            self._need(10, deadline)
            n, p = struct.unpack("!Q", self.buf[2:10])[0], 10
        self._need(p + n, deadline)
        payload, self.buf = self.buf[p:p + n], self.buf[p + n:]
        op = b0 & 0x0F
        if op == 2:
            self.output += payload
        elif op == 1:
            self.texts.append(json.loads(payload))
        elif op == 8:
            self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
        elif op == 9:
            self.send_frame(10, payload)
        return op, payload

    def read_until(self, needle, timeout=30, start=0):
        deadline = time.monotonic() + timeout
        while needle not in self.output[start:]:
            op, _ = self.read_frame(max(0.1, deadline - time.monotonic()))
            assert op != 8, f"closed before {needle!r}: {self.output[-2000:]!r}"
        return self.output

    def read_exit(self, timeout=30):
        """Reads to the exit message and the close that follows it."""
        deadline = time.monotonic() + timeout
        while self.close_code is None:
            self.read_frame(max(0.1, deadline - time.monotonic()))
        exits = [t for t in self.texts if t.get("type") == "exit"]
        assert exits, (self.texts, self.output[-2000:])
        return exits[-1]

    def read_close(self, timeout=30):
        deadline = time.monotonic() + timeout
        try:
            while self.close_code is None:
                self.read_frame(max(0.1, deadline - time.monotonic()))
        except EOFError:
            pass
        return self.close_code

    def close(self):
        self.sock.close()


def new_session(client, sid, **body):
    r = client.request("POST", f"/v1/sandboxes/{sid}/sessions", body)
    assert r.status == 201, r
    return r.json()


def connect(daemon, sid, ses, **kw):
    return WS(daemon, f"/v1/sandboxes/{sid}/sessions/{ses['id']}/connect", **kw)


def wait_for(pred, what, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_shell_types_and_resizes(daemon, client, sandbox):
    ses = new_session(client, sandbox, rows=24, cols=80)
    assert ses["state"] == "running" and ses["tty"] is True and ses["connected"] is False
    ws = connect(daemon, sandbox, ses)
    try:
        assert ws.status == 101, ws.head
        try:
            ws.read_until(b"# ")  # the prompt: bash drops what was typed before it started
        except AssertionError as e:
            # seen once in a sanitizer run (CI at 1fba05b) and not reproduced since: say enough
            # to find out why if it comes back
            got = client.request("GET", f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}")
            sb = client.request("GET", f"/v1/sandboxes/{sandbox}")
            raise AssertionError(f"{e}\nsession: {got.body!r}\nsandbox: {sb.body!r}\n"
                                 f"daemon log:\n{daemon.log_tail(80)}") from e
        ws.send_bytes(b"echo $((6*7))x\n")
        ws.read_until(b"42x")
        ws.send_bytes(b"stty size\n")
        ws.read_until(b"24 80")
        ws.send_json({"type": "resize", "rows": 33, "cols": 101})
        ws.send_bytes(b"stty size\n")
        ws.read_until(b"33 101")
        got = client.request("GET", f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}").json()
        assert got["connected"] is True and (got["rows"], got["cols"]) == (33, 101)
        ws.send_json({"type": "nonsense"})
        ws.send_bytes(b"exit 7\n")
        ex = ws.read_exit()
        assert ex == {"type": "exit", "exit_code": 7, "signal": None}, ex
        assert ws.close_code == 1000
        assert any(t.get("type") == "error" for t in ws.texts), ws.texts
    finally:
        ws.close()
    got = client.request("GET", f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}").json()
    assert got["state"] == "exited" and got["exit_code"] == 7 and got["ended_at"], got
    listed = client.request("GET", f"/v1/sandboxes/{sandbox}/sessions").json()["sessions"]
    assert ses["id"] in [s["id"] for s in listed]
    r = client.request("DELETE", f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}")
    assert r.status == 200 and r.json() == {"id": ses["id"], "deleted": True}
    assert client.request("GET", f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}").status == 404


def test_ctrl_d_ends_the_shell_with_its_status(daemon, client, sandbox):
    # without line editing the shell reads its terminal line by line, so a ^D is an end of file
    # whenever it comes (readline's own mode switch could turn an early one into a NUL)
    ses = new_session(client, sandbox, argv=["bash", "--noediting", "-i"])
    ws = connect(daemon, sandbox, ses)
    try:
        ws.read_until(b"# ")
        mark = len(ws.output)
        ws.send_bytes(b"(exit 5)\n")
        ws.read_until(b"# ", start=mark + 8)
        ws.send_bytes(b"\x04")
        assert ws.read_exit() == {"type": "exit", "exit_code": 5, "signal": None}
    finally:
        ws.close()


def test_the_server_hangs_up_after_the_clients_close_frame(daemon, client, sandbox):
    # RFC 6455 5.5.1: after its close frame the server waits for the client's before it ends
    # the TCP connection, so a browser sees a clean close (and a client that never answers is
    # let go after a few seconds)
    ses = new_session(client, sandbox, argv=["sh", "-c", "exit 3"], tty=False)
    ws = connect(daemon, sandbox, ses)
    try:
        assert ws.read_exit()["exit_code"] == 3 and ws.close_code == 1000
        ws.sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            ws.sock.recv(1)  # still open: it waits for our close frame
        ws.send_frame(8, struct.pack("!H", 1000))
        ws.sock.settimeout(10)
        assert ws.sock.recv(1) == b""  # answered: it hangs up
    finally:
        ws.close()


def test_pipes_session_signal_and_eof(daemon, client, sandbox):
    ses = new_session(client, sandbox, argv=["sh", "-c", "wc -c; trap 'echo got-int; exit 9' INT; "
                                              "echo ready; while :; do sleep 0.05; done"],
                      tty=False)
    ws = connect(daemon, sandbox, ses, protocols=["withruntime"])
    try:
        assert ws.status == 101 and ws.headers.get("sec-websocket-protocol") == "withruntime"
        ws.send_bytes(b"12345")
        ws.send_json({"type": "eof"})
        ws.read_until(b"ready")
        assert b"5" in ws.output
        ws.send_json({"type": "signal", "signal": "INT"})
        ws.read_until(b"got-int")
        assert ws.read_exit()["exit_code"] == 9
    finally:
        ws.close()


def test_reconnect_within_grace_gets_missed_output(daemon, client, sandbox):
    ses = new_session(client, sandbox, tty=False, argv=[
        "sh", "-c", "while [ ! -e /tmp/ses-go ]; do sleep 0.05; done; echo produced-while-away; "
        "touch /tmp/ses-done; read x; echo bye-$x"])
    path = f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}"
    ws = connect(daemon, sandbox, ses)
    assert ws.status == 101
    wait_for(lambda: client.request("GET", path).json()["connected"], "the client attached")
    ws.close()
    wait_for(lambda: not client.request("GET", path).json()["connected"], "the client gone")
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec", {
        "command": "touch /tmp/ses-go; while [ ! -e /tmp/ses-done ]; do sleep 0.05; done"})
    assert r.status == 200 and r.json()["exit_code"] == 0, r
    ws = connect(daemon, sandbox, ses)
    try:
        ws.read_until(b"produced-while-away")
        ws.send_bytes(b"again\n")
        ws.read_until(b"bye-again")
        assert ws.read_exit()["exit_code"] == 0
    finally:
        ws.close()
    client.request("POST", f"/v1/sandboxes/{sandbox}/exec", {"command": "rm -f /tmp/ses-*"})


def test_a_client_that_stops_reading_stops_the_command(daemon, client, sandbox):
    # 64 KiB lines, counted in a file as they are written (replaced whole: never read half-made)
    ses = new_session(client, sandbox, tty=False, argv=[
        "sh", "-c", "i=0; while :; do head -c 65535 /dev/zero | tr '\\0' x; echo; i=$((i+1)); "
        "echo $i > /tmp/bp-count.t; mv /tmp/bp-count.t /tmp/bp-count; done"])
    ws = connect(daemon, sandbox, ses)
    try:
        assert ws.status == 101

        def count():
            r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                               {"command": "cat /tmp/bp-count 2>/dev/null || echo 0"})
            return int(r.json()["stdout"])

        # not reading: the count must settle (the command blocks on its output)
        last, deadline = -1, time.monotonic() + 60
        while True:
            n = count()
            if n == last:
                break
            assert time.monotonic() < deadline, f"the command never blocked ({n} x 64 KiB)"
            last = n
            time.sleep(0.5)  # a second look, to see it stand still; not a synchronisation
        # the daemon's part is 512 KiB; the rest is the kernel's socket and pipe buffers
        assert n * 65536 < 32 << 20, f"{n} x 64 KiB went out to a client that reads nothing"
        got = 0
        while got < (n + 8) * 65536:  # reading again lets it run on
            op, payload = ws.read_frame()
            got += len(payload)
            ws.output = b""
        assert count() > n
    finally:
        ws.close()
        client.request("DELETE", f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}")
        client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": "rm -f /tmp/bp-count /tmp/bp-count.t"})


def test_connect_is_refused_to_read_only_keys_and_strangers(daemon, client, sandbox):
    ses = new_session(client, sandbox)
    path = f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}"
    ro = daemon.make_key(read_only=True)
    other = daemon.make_key()
    try:
        ws = connect(daemon, sandbox, ses, key=ro["key"])
        assert ws.status == 403, ws.head
        ws.close()
        assert client.with_key(ro["key"]).request("POST", f"/v1/sandboxes/{sandbox}/sessions",
                                                  {}).status == 403
        ws = connect(daemon, sandbox, ses, key=other["key"])
        assert ws.status == 404, ws.head
        ws.close()
        ws = connect(daemon, sandbox, ses, key="")
        assert ws.status == 401, ws.head
        ws.close()
        # a browser's way: the key as a subprotocol, never echoed back
        ws = connect(daemon, sandbox, ses, key="",
                     protocols=["withruntime", f"withruntime.key.{daemon.key}"])
        assert ws.status == 101 and ws.headers["sec-websocket-protocol"] == "withruntime"
        ws.close()
        ws = connect(daemon, sandbox, ses, headers=["Origin: http://evil.example"])
        assert ws.status == 403, ws.head
        ws.close()
        r = client.request("GET", path + "/connect")  # not a WebSocket handshake
        assert r.status == 426, r
    finally:
        for k in (ro, other):
            daemon.admin.request("POST", f"/v1/keys/{k['id']}/revoke")
        client.request("DELETE", path)


@pytest.mark.parametrize("frame,code", [
    (dict(op=2, payload=b"x", mask=False), 1002),             # unmasked client frame
    (dict(op=2, payload=b"x", rsv=0x40), 1002),               # reserved bit
    (dict(op=3, payload=b"x"), 1002),                         # unknown opcode
    (dict(op=9, payload=b"p" * 126), 1002),                   # control frame over 125
    (dict(op=8, payload=b"\x03"), 1002),                      # close with a 1-byte body
    (dict(op=1, payload=b"\xff\xfe"), 1007),                  # text not UTF-8
    (dict(op=2, payload=b"", length=1 << 40), 1009),          # huge length
    (dict(op=1, payload=b"{", fin=False), None),              # a fragment, then a new message
])
def test_hostile_frames_close_the_connection_not_the_session(daemon, client, sandbox, frame,
                                                             code):
    ses = new_session(client, sandbox, argv=["cat"], tty=False)
    ws = connect(daemon, sandbox, ses)
    try:
        assert ws.status == 101
        ws.send_frame(**frame)
        if code is None:
            ws.send_frame(1, b"{}")
            code = 1002
        assert ws.read_close() == code
    finally:
        ws.close()
    # the session runs on, and a well-behaved client gets it back
    ws = connect(daemon, sandbox, ses)
    try:
        ws.send_frame(9, b"hi")
        assert ws.read_frame() == (10, b"hi")
        ws.send_bytes(b"still-here\n")
        ws.read_until(b"still-here")
    finally:
        ws.close()
    client.request("DELETE", f"/v1/sandboxes/{sandbox}/sessions/{ses['id']}")


def test_session_ends_with_its_sandbox(daemon, client, make_sandbox):
    sb = make_sandbox(memory_mib=512)["id"]
    ses = new_session(client, sb)
    ws = connect(daemon, sb, ses)
    try:
        ws.send_bytes(b"echo up\n")
        ws.read_until(b"up")
        assert client.request("POST", f"/v1/sandboxes/{sb}/stop", timeout=60).status == 200
        ex = ws.read_exit()
        assert ex["exit_code"] is None and ex.get("error"), ex
    finally:
        ws.close()
    got = client.request("GET", f"/v1/sandboxes/{sb}/sessions/{ses['id']}").json()
    assert got["state"] == "failed", got
    r = client.request("POST", f"/v1/sandboxes/{sb}/sessions", {})
    assert r.status == 409, r


# ---- the CLI ----


def _read_pty(fd, needle, timeout=30):
    out = b""
    deadline = time.monotonic() + timeout
    while needle not in out:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {needle!r}: {out[-2000:]!r}"
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    assert needle in out, out[-2000:]
    return out


def test_cli_shell_on_a_terminal(daemon, sandbox):
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    before = termios.tcgetattr(master)  # a pty master reports its slave's settings

    def ctty():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([daemon.bin, "sandbox", "shell", sandbox], stdin=slave, stdout=slave,
                            stderr=slave, env=daemon.cli_env(), preexec_fn=ctty, close_fds=True)
    os.close(slave)
    try:
        _read_pty(master, b"# ")  # the prompt: bash drops what was typed before it started
        os.write(master, b"echo $((6*7))y\r")
        _read_pty(master, b"42y")
        raw = termios.tcgetattr(master)
        assert not raw[3] & termios.ECHO and not raw[3] & termios.ICANON  # raw meanwhile
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        os.kill(proc.pid, signal.SIGWINCH)
        # the resize may race the next line: ask until the new size shows
        deadline = time.monotonic() + 20
        out = b""
        while b"40 120" not in out:
            assert time.monotonic() < deadline, out[-2000:]
            os.write(master, b"stty size\r")
            out += _read_pty(master, b"\n", timeout=10)
            r, _, _ = select.select([master], [], [], 0.3)
            if r:
                out += os.read(master, 65536)
        os.write(master, b"exit 3\r")
        assert proc.wait(timeout=30) == 3
        assert termios.tcgetattr(master) == before  # the terminal is restored
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_cli_shell_restores_the_terminal_when_killed(daemon, sandbox):
    master, slave = os.openpty()
    before = termios.tcgetattr(master)

    def ctty():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([daemon.bin, "sandbox", "shell", sandbox, "--", "sh", "-c",
                             "echo in-$((2+3)); exec sleep 600"], stdin=slave, stdout=slave,
                            stderr=slave, env=daemon.cli_env(), preexec_fn=ctty, close_fds=True)
    os.close(slave)
    try:
        _read_pty(master, b"in-5")
        assert termios.tcgetattr(master) != before  # raw meanwhile
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert termios.tcgetattr(master) == before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_cli_exec_interactive_over_the_unix_socket(daemon, sandbox):
    # root on the Unix socket, without a key: the admin, on the same WebSocket route
    env = daemon.cli_env(RUNTIME_URL=f"unix:{daemon.socket_path}")
    env.pop("RUNTIME_API_KEY")
    r = subprocess.run([daemon.bin, "sandbox", "exec", "-i", sandbox, "--", "rev"],
                       input=b"tekcos\n", capture_output=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout == b"socket\n", r


def test_cli_shell_without_a_terminal_reads_its_stdin(daemon, sandbox):
    r = subprocess.run([daemon.bin, "sandbox", "shell", sandbox], input=b"echo piped-$((3*4))\n",
                       capture_output=True, env=daemon.cli_env(), timeout=60)
    assert r.returncode == 0 and b"piped-12" in r.stdout, r
    r = subprocess.run([daemon.bin, "sandbox", "shell", "--help"], capture_output=True,
                       timeout=60)
    assert r.returncode == 0 and b"sandbox shell sb-" in r.stdout, r


def test_cli_exec_interactive_streams_stdin(daemon, sandbox):
    r = subprocess.run([daemon.bin, "sandbox", "exec", "-i", sandbox, "--", "sh", "-c",
                        "wc -l; echo to-stderr >&2; exit 4"],
                       input=b"a\nb\nc\n", capture_output=True, env=daemon.cli_env(), timeout=60)
    assert r.returncode == 4, r
    assert r.stdout.split() == [b"3", b"to-stderr"], r
    r = subprocess.run([daemon.bin, "sandbox", "exec", "-i", sandbox, "--", "sh", "-c",
                        "kill -TERM $$"], input=b"", capture_output=True, env=daemon.cli_env(),
                       timeout=60)
    assert r.returncode == 128 + 15, r


def test_at_most_16_sessions_run_in_a_sandbox(client):
    # a sandbox of its own: sessions another test left running must not count here
    sandbox = client.create(memory_mib=512)["id"]
    made = []
    try:
        for _ in range(16):
            made.append(new_session(client, sandbox, argv=["sleep", "600"], tty=False)["id"])
        r = client.request("POST", f"/v1/sandboxes/{sandbox}/sessions",
                           {"argv": ["true"], "tty": False})
        assert r.status == 409 and "16 sessions" in r.json()["error"]["message"], r
    finally:
        for s in made:
            assert client.request("DELETE", f"/v1/sandboxes/{sandbox}/sessions/{s}").status == 200
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/sessions", {"argv": ["true"], "tty": False})
    assert r.status == 201, r  # room again
    client.delete(sandbox)
    for bad in ({"rows": 0}, {"cols": 10001}, {"tty": "yes"}, {"command": "x", "argv": ["x"]},
                {"argv": []}, {"shell": True}):
        r = client.request("POST", f"/v1/sandboxes/{sandbox}/sessions", bad)
        assert r.status == 400, (bad, r)


class GraceDaemon(conftest.OwnStateDaemon):
    """Freezes idle sandboxes after 1 s and kills sessions 1 s after their client left."""

    prefix = "wr-grace-"

    def serve_argv(self):
        return super().serve_argv() + ["--freeze-after", "1", "--session-grace", "1"]


def test_frozen_sandbox_thaws_for_a_session_and_the_grace_ends_it(daemon):
    d = GraceDaemon(daemon)
    d.start()
    try:
        c = d.client
        sb = c.request("POST", "/v1/sandboxes", {"memory_mib": 256}).json()["id"]
        wait_for(lambda: c.request("GET", f"/v1/sandboxes/{sb}").json()["frozen"],
                 "the idle sandbox frozen", timeout=60)
        ses = new_session(c, sb, argv=["sh", "-c", "echo alive; exec sleep 600"], tty=False)
        ws = connect(d, sb, ses)
        try:
            ws.read_until(b"alive")
            # an open session keeps it awake well past the freeze delay
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                assert not c.request("GET", f"/v1/sandboxes/{sb}").json()["frozen"]
                time.sleep(0.25)
        finally:
            ws.close()
        path = f"/v1/sandboxes/{sb}/sessions/{ses['id']}"
        wait_for(lambda: c.request("GET", path).json()["state"] != "running",
                 "the session killed after the grace", timeout=30)
        got = c.request("GET", path).json()
        assert got["state"] == "exited" and got["signal"] == 9 and not got["connected"], got
        wait_for(lambda: c.request("GET", f"/v1/sandboxes/{sb}").json()["frozen"],
                 "the sandbox frozen again", timeout=60)
        assert c.request("DELETE", f"/v1/sandboxes/{sb}").status == 200
    finally:
        leftovers, status = d.stop()
        shutil.rmtree(d.state_dir, ignore_errors=True)  # `images` is a symlink: not followed
        log = d.log_bytes()
        assert not [m for m in conftest.SANITIZER_MARKS if m in log], d.log_tail(200)
        assert not leftovers and status == 0, (leftovers, status, d.log_tail())
        shutil.rmtree(d.logdir, ignore_errors=True)


def test_daemon_shutdown_with_a_client_attached(daemon):
    """SIGTERM while a session's WebSocket is open: the client hears the end, the daemon exits
    cleanly (the upgraded connection is freed with the server, no sanitizer report)."""
    d = conftest.OwnStateDaemon(daemon)
    d.start()
    try:
        sb = d.client.request("POST", "/v1/sandboxes", {"memory_mib": 256}).json()["id"]
        ses = new_session(d.client, sb, argv=["sh", "-c", "echo up; exec sleep 600"], tty=False)
        ws = connect(d, sb, ses)
        try:
            ws.read_until(b"up")
            d.proc.send_signal(signal.SIGTERM)
            assert d.proc.wait(timeout=60) == 0, d.log_tail()
            code = ws.read_close()
            assert code in (None, 1000, 1001), code
        finally:
            ws.close()
    finally:
        leftovers, status = d.stop()
        log = d.log_bytes()
        shutil.rmtree(d.state_dir, ignore_errors=True)  # `images` is a symlink: not followed
        assert not [m for m in conftest.SANITIZER_MARKS if m in log], d.log_tail(200)
        shutil.rmtree(d.logdir, ignore_errors=True)
