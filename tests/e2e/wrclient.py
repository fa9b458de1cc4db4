"""A small HTTP client for the end-to-end tests (standard library only).

Every response it receives is checked against api/openapi.yaml before a test sees it, so a test
that only looks at one field still fails when the rest of the answer breaks the spec.
"""

import base64
import http.client
import json
import socket
import urllib.parse

import apispec

DEFAULT_TIMEOUT = 180.0


class Response:
    def __init__(self, method, path, status, headers, body):
        self.method = method
        self.path = path
        self.status = status
        self.headers = headers  # lower-case keys
        self.body = body

    def json(self):
        return json.loads(self.body)

    @property
    def error(self):
        """(code, message, errno) of an error answer."""
        e = self.json()["error"]
        return e["code"], e["message"], e.get("errno")

    def __repr__(self):
        return f"<{self.method} {self.path} -> {self.status} {self.body[:300]!r}>"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, sock_path, timeout=DEFAULT_TIMEOUT):
        super().__init__("localhost", timeout=timeout)
        self.sock_path = sock_path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.sock_path)
        self.sock = s


def build_path(path, query=None):
    if query:
        items = [(k, _qval(v)) for k, v in query.items() if v is not None]
        path += "?" + urllib.parse.urlencode(items, quote_via=urllib.parse.quote)
    return path


def _qval(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    return str(v)


class Client:
    def __init__(self, host="127.0.0.1", port=7070, unix_path=None, key=None):
        """key: the API key sent as "Authorization: Bearer <key>" on every request (a request
        that sets its own Authorization header keeps it). None: no key (root on the Unix
        socket is the admin without one)."""
        self.host = host
        self.port = port
        self.unix_path = unix_path
        self.key = key
        self.spec = apispec.spec()

    def with_key(self, key):
        """The same daemon, another key (None: none)."""
        return Client(self.host, self.port, self.unix_path, key)

    def _auth(self, hdrs):
        if self.key is not None and not any(k.lower() == "authorization" for k in hdrs):
            hdrs["Authorization"] = f"Bearer {self.key}"
        return hdrs

    # ---- plumbing ----

    def _conn(self, timeout):
        if self.unix_path:
            return UnixHTTPConnection(self.unix_path, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, *, data=None, query=None, headers=None,
                timeout=DEFAULT_TIMEOUT, validate=True):
        """Sends one request on a fresh connection. body: JSON-encoded; data: raw bytes."""
        full = build_path(path, query)
        hdrs = self._auth(dict(headers or {}))
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif data is not None:
            hdrs.setdefault("Content-Type", "application/octet-stream")
        conn = self._conn(timeout)
        try:
            conn.request(method, full, body=data, headers=hdrs)
            r = conn.getresponse()
            payload = r.read()
            resp = Response(method, full, r.status, {k.lower(): v for k, v in r.getheaders()},
                            payload)
        finally:
            conn.close()
        if validate:
            self.spec.validate_response(method, full, resp.status, resp.headers, resp.body)
        return resp

    def raw(self, method, path, headers, body, timeout=DEFAULT_TIMEOUT, validate=True):
        """Sends a hand-built request over a socket, tolerating the server closing early (as it
        may for an oversize body), and reads whatever answer it gave."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in self._auth(dict(headers)).items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            try:
                s.sendall(head + body)
            except (BrokenPipeError, ConnectionResetError):
                pass
            r = http.client.HTTPResponse(s, method=method)
            r.begin()
            payload = r.read()
            resp = Response(method, path, r.status, {k.lower(): v for k, v in r.getheaders()},
                            payload)
        finally:
            s.close()
        if validate:
            self.spec.validate_response(method, path, resp.status, resp.headers, resp.body)
        return resp

    def expect(self, status, method, path, body=None, **kw):
        r = self.request(method, path, body, **kw)
        assert r.status == status, f"expected {status}: {r!r}"
        return r

    # ---- sandboxes ----

    def health(self):
        return self.expect(200, "GET", "/v1/health").json()

    def create(self, **fields):
        r = self.expect(201, "POST", "/v1/sandboxes", fields)
        return r.json()

    def get(self, sid):
        return self.expect(200, "GET", f"/v1/sandboxes/{sid}").json()

    def list(self):
        return self.expect(200, "GET", "/v1/sandboxes").json()["sandboxes"]

    def delete(self, sid):
        return self.expect(200, "DELETE", f"/v1/sandboxes/{sid}").json()

    # ---- exec ----

    def exec(self, sid, command=None, *, expect=200, **fields):
        body = dict(fields)
        if command is not None:
            body["command"] = command
        r = self.expect(expect, "POST", f"/v1/sandboxes/{sid}/exec", body)
        return r.json()

    def stream(self, sid, body, timeout=DEFAULT_TIMEOUT):
        return ExecStream(self, sid, dict(body, stream=True), timeout)

    # ---- files ----

    def read_file(self, sid, path, **query):
        r = self.expect(200, "GET", f"/v1/sandboxes/{sid}/files/content",
                        query=dict(query, path=path))
        return r.body

    def write_file(self, sid, path, data, **query):
        r = self.expect(200, "PUT", f"/v1/sandboxes/{sid}/files/content", data=data,
                        query=dict(query, path=path))
        return r.json()

    def files(self, method, sid, op, expect=None, body=None, data=None, **query):
        route = f"/v1/sandboxes/{sid}/files" + (f"/{op}" if op else "")
        if method == "PUT" and data is None:
            data = b""
        r = self.request(method, route, body, data=data, query=query)
        if expect is not None:
            assert r.status == expect, f"expected {expect}: {r!r}"
        return r


def output(result, stream="stdout"):
    """The raw bytes of an exec result's stream, whatever its encoding."""
    enc = result[f"{stream}_encoding"]
    s = result[stream]
    if enc == "base64":
        return base64.b64decode(s, validate=True)
    assert enc == "utf-8"
    return s.encode("utf-8")


def chunk_bytes(event):
    if event["encoding"] == "base64":
        return base64.b64decode(event["data"], validate=True)
    return event["data"].encode("utf-8")


class ExecStream:
    """A streaming exec, read one NDJSON line at a time as the daemon sends it. Each line is
    checked against the spec as it arrives; the whole exchange is checked at the end."""

    def __init__(self, client, sid, body, timeout):
        self.client = client
        self.path = f"/v1/sandboxes/{sid}/exec"
        self.conn = client._conn(timeout)
        data = json.dumps(body).encode()
        self.conn.request("POST", self.path, body=data,
                          headers=client._auth({"Content-Type": "application/json"}))
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}
        self.events = []
        self.done = False
        spec = client.spec
        if self.status != 200 or not self.headers.get("content-type", "").startswith(
                "application/x-ndjson"):
            body = self.resp.read()
            self.done = True
            self.conn.close()
            spec.validate_response("POST", self.path, self.status, self.headers, body)
            self.body = body
        else:
            spec.validate_response("POST", self.path, self.status, self.headers, b"")
            self.line_ptr = ("/paths/~1v1~1sandboxes~1{id}~1exec/post/responses/200/content/"
                             "application~1x-ndjson/schema")

    def next_event(self):
        """The next event, or None at the end of the stream."""
        if self.done:
            return None
        while True:
            line = self.resp.readline()
            if not line:
                self.close()
                return None
            if line.strip():
                break
        assert line.endswith(b"\n"), f"stream line without newline: {line!r}"
        ev = self.client.spec.validate_stream_line(self.line_ptr, line, f"POST {self.path}")
        self.events.append(ev)
        return ev

    def read_all(self):
        while self.next_event() is not None:
            pass
        return self.events

    def close(self):
        if not self.done:
            self.done = True
            self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
