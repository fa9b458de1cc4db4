"""A small WebDriver BiDi client for Debian's firefox-esr, so the dashboard's tests can drive
Firefox without geckodriver (which Debian does not package, and which may not be downloaded).

Firefox speaks BiDi itself when started with --remote-debugging-port: it prints the address on
stderr, and one WebSocket to ws://127.0.0.1:PORT/session carries JSON commands and answers
(https://w3c.github.io/webdriver-bidi/). The WebSocket client is a plain socket (RFC 6455, text
frames only), standard library only, like tests/e2e/test_sessions.py's.

Firefox is started in a process group of its own with a fresh profile in a temporary directory;
close() kills that group by its id (the PID of the Firefox we started), kills the crash helper
that Firefox double-forks out of the group (found by the parent PID on its command line), and
removes the directory. Outside traffic is pointed at a closed loopback port (a proxy that is not
there; loopback is never proxied), so the browser reaches only the daemon under test.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time

FIREFOX = os.environ.get("WR_FIREFOX", "/usr/bin/firefox-esr")
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
START_TIMEOUT = 30  # seconds for Firefox to print its BiDi address (about 2 s on 2 cores)
CMD_TIMEOUT = 30  # seconds for any one command's answer (navigate waits for the page's load)

# WebDriver's code points for keys that are not characters (the spec's "keyboard actions").
ENTER = "\ue007"
BACKSPACE = "\ue003"

# user.js: no first-run pages, updates, telemetry or remote settings; downloads go to a
# directory without asking; anything not on loopback goes to a proxy at a closed port.
PREFS = {
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "browser.aboutwelcome.enabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "datareporting.healthreport.uploadEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "app.update.disabledForTesting": True,
    "app.normandy.enabled": False,
    "extensions.update.enabled": False,
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "browser.safebrowsing.downloads.enabled": False,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "network.proxy.type": 1,
    "network.proxy.http": "127.0.0.1",
    "network.proxy.http_port": 9,
    "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": 9,
    "network.proxy.allow_hijacking_localhost": False,
    "browser.download.folderList": 2,
    "browser.download.useDownloadDir": True,
    "browser.download.always_ask_before_handling_new_types": False,
    "browser.download.start_downloads_in_tmp_dir": False,
    "browser.download.alwaysOpenPanel": False,
}


class BiDiError(Exception):
    """A command answered with an error, or the browser went away."""


def _value(rv):
    """A BiDi RemoteValue as Python: primitives, lists and dicts; nodes and other objects stay
    as the RemoteValue (a node's "sharedId" refers to it in later commands)."""
    t = rv["type"]
    if t in ("undefined", "null"):
        return None
    if t in ("string", "boolean", "number", "bigint"):
        return rv["value"]
    if t in ("array", "set"):
        return [_value(v) for v in rv.get("value", [])]
    if t in ("object", "map"):
        return {k if isinstance(k, str) else _value(k): _value(v) for k, v in rv.get("value", [])}
    return rv


def _arg(v):
    """A Python value as a BiDi LocalValue (a node given as the RemoteValue that named it)."""
    if v is None:
        return {"type": "null"}
    if isinstance(v, bool):
        return {"type": "boolean", "value": v}
    if isinstance(v, (int, float)):
        return {"type": "number", "value": v}
    if isinstance(v, str):
        return {"type": "string", "value": v}
    if isinstance(v, dict) and "sharedId" in v:
        return {"sharedId": v["sharedId"]}
    raise TypeError(f"cannot pass {v!r} to the page")


class _WebSocket:
    """Text frames over one TCP connection to the browser (masked, as a client must)."""

    def __init__(self, port, path):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CMD_TIMEOUT)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise BiDiError(f"closed during the WebSocket handshake: {buf!r}")
            buf += chunk
        head, self.buf = buf.split(b"\r\n\r\n", 1)
        want = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest())
        if not head.startswith(b"HTTP/1.1 101") or want not in head:
            raise BiDiError(f"not a WebSocket answer: {head!r}")

    def send(self, text):
        data = text.encode()
        n = len(data)
        if n < 126:
            hdr = struct.pack("!BB", 0x81, 0x80 | n)
        elif n < 65536:
            hdr = struct.pack("!BBH", 0x81, 0x80 | 126, n)
        else:
            hdr = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
        mask = os.urandom(4)
        pad = mask * (n // 4 + 1)
        masked = (int.from_bytes(data, "big") ^ int.from_bytes(pad[:n], "big")).to_bytes(n, "big")
        self.sock.sendall(hdr + mask + masked)

    def _need(self, n, deadline):
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BiDiError("timed out waiting for the browser")
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise BiDiError("the browser closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self, deadline):
        """The next whole text message (pings answered, fragments joined)."""
        parts = []
        while True:
            b0, b1 = self._need(2, deadline)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._need(2, deadline))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._need(8, deadline))[0]
            payload = self._need(n, deadline)  # a server's frames are never masked
            op = b0 & 0x0F
            if op == 8:
                raise BiDiError(f"the browser closed the WebSocket: {payload!r}")
            if op == 9:
                self.sock.sendall(struct.pack("!BB", 0x8A, 0x80 | len(payload)) + b"\0" * 4
                                  + payload)
                continue
            if op in (0, 1, 2):
                parts.append(payload)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Firefox:
    """One headless Firefox with one tab, driven over BiDi. Use as a context manager or call
    close(): it always kills the browser and removes its profile."""

    def __init__(self, binary=FIREFOX, width=1280, height=900):
        self.dir = tempfile.mkdtemp(prefix="wr-firefox-")
        self.profile = os.path.join(self.dir, "profile")
        self.downloads = os.path.join(self.dir, "downloads")
        os.mkdir(self.profile)
        os.mkdir(self.downloads)
        self.log_path = os.path.join(self.dir, "firefox.log")
        self.proc = None
        self.ws = None
        self.ids = 0
        try:
            prefs = dict(PREFS, **{"browser.download.dir": self.downloads})
            with open(os.path.join(self.profile, "user.js"), "w") as f:
                for k, v in prefs.items():
                    f.write(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n")
            env = dict(os.environ, MOZ_CRASHREPORTER_DISABLE="1", HOME=self.dir)
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [binary, "--headless", "--no-remote", "--profile", self.profile,
                     "--remote-debugging-port=0", "about:blank"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                    start_new_session=True)
            port = self._port()
            self.ws = _WebSocket(port, "/session")
            self.cmd("session.new", {"capabilities": {}})
            self.context = self.cmd("browsingContext.getTree", {})["contexts"][0]["context"]
            self.viewport(width, height)
        except BaseException:
            self.close()
            raise

    def _port(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            m = re.search(rb"WebDriver BiDi listening on ws://127\.0\.0\.1:(\d+)", self.log())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise BiDiError(f"Firefox printed no BiDi address (exit {self.proc.poll()}):\n"
                        + self.log().decode(errors="replace")[-2000:])

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read()

    def cmd(self, method, params, timeout=CMD_TIMEOUT):
        """Sends one command; its result, or BiDiError with the browser's error and message.
        Events (none are subscribed to) are skipped."""
        self.ids += 1
        mine = self.ids
        self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(deadline))
            if msg.get("id") != mine:
                continue
            if msg.get("type") == "error":
                raise BiDiError(f"{method}: {msg.get('error')}: {msg.get('message')}")
            return msg["result"]

    # ---- the page ----

    def viewport(self, width, height):
        self.cmd("browsingContext.setViewport",
                 {"context": self.context, "viewport": {"width": width, "height": height}})

    def go(self, url):
        self.cmd("browsingContext.navigate",
                 {"context": self.context, "url": url, "wait": "complete"})

    def js(self, function, *args):
        """Calls a JavaScript function (source text) in the page with args; its value (a
        promise is awaited). A thrown exception raises BiDiError with its text."""
        r = self.cmd("script.callFunction", {
            "functionDeclaration": function, "arguments": [_arg(a) for a in args],
            "target": {"context": self.context}, "awaitPromise": True,
            "resultOwnership": "none", "userActivation": False})
        if r["type"] == "exception":
            d = r["exceptionDetails"]
            raise BiDiError(f"script threw: {d.get('text')}")
        return _value(r["result"])

    def element(self, css):
        """The first element matching css, scrolled into view; BiDiError if there is none."""
        node = self.js("(css) => { const e = document.querySelector(css); if (e)"
                       " e.scrollIntoView({block: 'center', inline: 'nearest'}); return e; }", css)
        if not node:
            raise BiDiError(f"no element matches {css}")
        return node

    def click(self, css):
        """A real mouse click (move, press, release) in the middle of the element."""
        node = self.element(css)
        self.cmd("input.performActions", {"context": self.context, "actions": [{
            "type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
            "actions": [
                {"type": "pointerMove", "x": 0, "y": 0,
                 "origin": {"type": "element", "element": {"sharedId": node["sharedId"]}}},
                {"type": "pointerDown", "button": 0},
                {"type": "pointerUp", "button": 0}]}]})

    def type(self, text):
        """Key presses into whatever has the focus; ENTER and BACKSPACE are keys."""
        acts = []
        for ch in text:
            acts += [{"type": "keyDown", "value": ch}, {"type": "keyUp", "value": ch}]
        self.cmd("input.performActions", {"context": self.context, "actions": [
            {"type": "key", "id": "keyboard", "actions": acts}]})

    def screenshot(self, path):
        data = self.cmd("browsingContext.captureScreenshot",
                        {"context": self.context, "origin": "document"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    # ---- the end ----

    def _strays(self):
        """PIDs of live processes still in Firefox's group, and its crash helper (which leaves
        the group; its first argument is the PID it watches)."""
        pids = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            state, _, pgid = stat.rsplit(")", 1)[1].split()[:3]
            if state == "Z":  # dead already; whoever they were reparented to reaps them
                continue
            helper = (argv[0].endswith(b"/crashhelper") and len(argv) > 1
                      and argv[1] == str(self.proc.pid).encode())
            if int(pgid) == self.proc.pid or helper:
                pids.append(int(name))
        return pids

    def close(self):
        """Kills Firefox (by its PID and process group), waits until none of its processes are
        left, and removes the profile. Raises if a process survives."""
        try:
            if self.ws is not None:
                self.ws.close()
            if self.proc is not None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
                deadline = time.monotonic() + 10
                while True:
                    left = self._strays()
                    if not left:
                        break
                    if time.monotonic() > deadline:
                        raise BiDiError(f"Firefox processes left after the kill: {left}")
                    for pid in left:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    time.sleep(0.05)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
