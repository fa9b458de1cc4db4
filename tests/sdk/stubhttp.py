"""Small HTTP servers for what the real daemon cannot be made to do on demand.

- :class:`Stub`: on 127.0.0.1 (or a Unix socket), records requests and answers with a fixed
  status and body (a 401, a proxy's HTML page; the headers the SDK sends).
- :class:`Server`: HTTP/1.1 on 127.0.0.1 in an asyncio event loop, answering each request with
  raw bytes the test gives, and counting connections: keep-alive, closes, timeouts, malformed
  answers. :class:`ThreadedServer` runs one in a thread of its own, for the sync client.
"""

import asyncio
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
    def __init__(self, status=200, body=None, content_type="application/json", unix_path=None,
                 headers=None):
        self.status = status
        self.headers = dict(headers or {})  # sent with every answer
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
                for name, value in stub.headers.items():
                    self.send_header(name, value)
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


class Server:
    """An HTTP/1.1 server on 127.0.0.1 in the test's event loop. ``answer(n, request)`` gives the
    n-th request's raw answer (bytes; ``(bytes, "close")`` to close the connection after it), or
    None to close the connection without one; it may be a coroutine. Counts connections, open
    ones, and requests in flight."""

    def __init__(self, answer):
        self.answer = answer
        self.connections = 0
        self.open = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0
        self.changed = asyncio.Condition()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, exc_type, *exc):
        if exc_type is None:  # every connection was closed by one side or the other
            await self.wait_for(lambda: self.open == 0)
        self.server.close()
        await self.server.wait_closed()

    async def _note(self, **delta):
        async with self.changed:
            for k, v in delta.items():
                setattr(self, k, getattr(self, k) + v)
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.changed.notify_all()

    async def wait_for(self, predicate):
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(predicate), 10)

    async def _serve(self, reader, writer):
        await self._note(connections=1, open=1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                self.requests += 1
                await self._note(in_flight=1)
                out = self.answer(self.requests, head)
                if asyncio.iscoroutine(out):
                    out = await out
                await self._note(in_flight=-1)
                if out is None:
                    break
                close = isinstance(out, tuple)
                writer.write(out[0] if close else out)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            await self._note(open=-1)


def json_answer(obj, chunked=False, extra=b""):
    data = json.dumps(obj).encode()
    if not chunked:
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(data)).encode() + b"\r\n" + extra + b"\r\n" + data)
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in (data[:3], data[3:]))
    return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + extra + b"\r\n" + body
            + b"0\r\nX-Trailer: t\r\n\r\n")


class ThreadedServer:
    """A :class:`Server` in an event loop of its own thread, for blocking clients:
    ``with ThreadedServer(answer) as ts:``; ``ts.server`` is the :class:`Server` (its counts, its
    ``answer``), ``ts.url`` its URL, and ``ts.wait_for(pred)`` waits (10 s at most) until
    ``pred()`` holds."""

    def __init__(self, answer):
        self.server = Server(answer)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    @property
    def url(self):
        return self.server.url

    def wait_for(self, predicate):
        self._call(self.server.wait_for(predicate))

    def __enter__(self):
        self.thread.start()
        self._call(self.server.__aenter__())
        return self

    async def _end_connections(self):
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __exit__(self, *exc):
        try:
            self._call(self.server.__aexit__(*exc))
        finally:
            # a test that failed may leave connections open: end them in their loop
            self._call(self._end_connections())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.run_until_complete(asyncio.sleep(0))  # the closes' last callbacks
            self.loop.close()
