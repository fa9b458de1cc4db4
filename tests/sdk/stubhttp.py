"""A tiny HTTP server on 127.0.0.1 (or a Unix socket) that records requests and answers with
a fixed status and body: for what the real daemon cannot be made to say on demand (a 401, a
proxy's HTML page) and for checking the headers the SDK sends."""

import json
import os
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on (as of now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stub:
    def __init__(self, status=200, body=None, content_type="application/json", unix_path=None):
        self.status = status
        self.body = body if body is not None else {"status": "ok"}
        self.content_type = content_type
        self.unix_path = unix_path
        self.requests = []  # (method, path, headers dict, body bytes)
        self._server = None

    @property
    def url(self):
        if self.unix_path:
            return "unix:" + self.unix_path
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def address_string(self):
                return "stub"

            def _any(self):
                n = int(self.headers.get("Content-Length", "0") or 0)
                body = self.rfile.read(n) if n else b""
                stub.requests.append((self.command, self.path, dict(self.headers.items()), body))
                data = stub.body if isinstance(stub.body, bytes) else json.dumps(stub.body).encode()
                self.send_response(stub.status)
                self.send_header("Content-Type", stub.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        if self.unix_path:
            class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
                daemon_threads = True

                def get_request(self):
                    sock, _ = super().get_request()
                    return sock, ("stub", 0)

            self._server = UnixServer(self.unix_path, Handler)
        else:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        if self.unix_path and os.path.exists(self.unix_path):
            os.unlink(self.unix_path)
