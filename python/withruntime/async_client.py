"""The daemon over asyncio: HTTP/1.1 on ``asyncio`` streams (TCP, TLS or the Unix socket).

:class:`AsyncClient` finds the daemon, authenticates and reads answers and errors exactly as
:class:`~withruntime.Client` does (both are a :class:`~withruntime.client.ClientBase`); only the
I/O is its own:

- connections are kept open between calls (HTTP/1.1 keep-alive) in a pool per event loop:
  at most ``max_connections`` at once (a call beyond that waits for one to be free) and at most
  ``max_idle`` kept idle, each for at most 30 s (the daemon closes idle connections after 60 s
  by default). A kept connection that the daemon closed before answering is replaced by a
  fresh one and the request sent again: the daemon closes a connection only between requests,
  before reading the next one;
- answers with a ``Content-Length``, chunked ones and ones that end with the connection;
- ``timeout`` bounds each socket operation (connecting, sending, each read), as in the sync
  client;
- a call that is cancelled (``task.cancel()``, ``asyncio.wait_for``) closes its connection:
  the daemon then cancels what the request was doing (a command gets SIGKILL, a read stops).
"""

from __future__ import annotations

import asyncio
import re
import time
import weakref
from collections import deque
from typing import Any, Awaitable, Deque, Dict, Mapping, Optional, Tuple, TypeVar

from ._ops import async_face
from .client import _IDLE_MAX_S, DEFAULT_TIMEOUT, ClientBase
from .errors import ConfigurationError, ServerError, WithruntimeError

__all__ = ["AsyncClient"]

# A status line or header line longer than this is a malformed answer.
_LINE_LIMIT = 64 << 10
_MAX_HEADERS = 100
# Largest piece read from the socket at once, and longest line of a streamed answer.
_PIECE = 1 << 20
_MAX_STREAM_LINE = 16 << 20

_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_BAD_HEADER = re.compile(r"[\x00\r\n]")

_T = TypeVar("_T")


class _Stale(Exception):
    """A kept connection ended before the first byte of an answer."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        return (not self.reader.at_eof() and not self.writer.transport.is_closing()
                and now - self.idle_since < _IDLE_MAX_S)

    def abort(self) -> None:
        try:
            self.writer.transport.abort()
        except RuntimeError:  # its event loop is closed: the socket goes with it
            pass


class _Pool:
    """One event loop's connections: a slot per call in flight, and the idle ones. While any
    are idle a task of the loop closes each when its idle time is up, and all of them when it
    is cancelled (``asyncio.run`` cancels every task before it closes the loop)."""

    def __init__(self, max_connections: int, max_idle: int) -> None:
        self.slots = asyncio.Semaphore(max_connections)
        self.idle: Deque[_Conn] = deque()
        self.max_idle = max_idle
        self._reaper: "Optional[asyncio.Task[None]]" = None

    def take_idle(self) -> Optional[_Conn]:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()  # the most recently used: the least likely to be closed
            if conn.usable(now):
                conn.reused = True
                return conn
            conn.abort()
        return None

    def put(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        if len(self.idle) < self.max_idle and conn.usable(conn.idle_since):
            self.idle.append(conn)
            if self._reaper is None or self._reaper.done():
                self._reaper = asyncio.get_running_loop().create_task(self._reap())
        else:
            conn.abort()

    async def _reap(self) -> None:
        try:
            while self.idle:
                due = min(c.idle_since for c in self.idle) + _IDLE_MAX_S
                await asyncio.sleep(max(0.0, due - time.monotonic()) + 0.05)
                now = time.monotonic()
                for conn in [c for c in self.idle if not c.usable(now)]:
                    self.idle.remove(conn)
                    conn.abort()
        except asyncio.CancelledError:
            self.close_idle()
            raise

    def close_idle(self) -> None:
        while self.idle:
            self.idle.pop().abort()


class _Answer:
    """One answer being read: status and headers, then the body in pieces. Holds its pool
    slot until the body is read (the connection then goes back to the pool) or it is
    aborted."""

    def __init__(self, client: "AsyncClient", pool: _Pool, conn: _Conn, timeout: float) -> None:
        self._client = client
        self._pool = pool
        self._conn = conn
        self._timeout = timeout
        self._released = False
        self.status = 0
        self.headers: Dict[str, str] = {}
        self._framing = "none"
        self._left = 0  # bytes left of the body (length) or of the current chunk (chunked)
        self._done = False
        self._keep_alive = False
        self._last_error: Optional[BaseException] = None

    def _release(self, reuse: bool) -> None:
        if self._released:
            return
        self._released = True
        if reuse:
            self._pool.put(self._conn)
        else:
            self._conn.abort()
        self._pool.slots.release()

    def abort(self) -> None:
        """Closes the connection (the daemon then cancels the request's work)."""
        self._release(False)

    async def _io(self, aw: Awaitable[_T]) -> _T:
        """One socket operation within the timeout. Any failure (a cancellation too) closes the
        connection; a socket error is raised as the SDK's error."""
        try:
            return await asyncio.wait_for(aw, self._timeout)
        except BaseException as e:
            self._last_error = e
            self.abort()
            if isinstance(e, (WithruntimeError, _Stale)) or not isinstance(e, Exception):
                raise
            if isinstance(e, (ValueError, asyncio.LimitOverrunError)):
                raise self._malformed("a line over the limit") from None
            raise self._client._unavailable(e, self._timeout, True) from None

    def _malformed(self, what: str) -> ServerError:
        self.abort()
        return ServerError(f"the daemon at {self._client.url} sent a malformed HTTP answer: "
                           f"{what}")

    async def _line(self) -> bytes:
        line = await self._io(self._conn.reader.readline())
        if not line.endswith(b"\n"):
            raise self._client._unavailable(EOFError(), self._timeout, True)
        return line

    async def read_head(self, method: str) -> None:
        reader = self._conn.reader
        while True:
            try:
                first = await self._io(reader.readline())
            except WithruntimeError:
                if self._conn.reused and isinstance(self._last_error, ConnectionResetError):
                    raise _Stale() from None
                raise
            if not first:
                self.abort()
                if self._conn.reused:
                    raise _Stale()
                raise self._client._unavailable(EOFError(), self._timeout, True)
            if not first.endswith(b"\n"):
                raise self._client._unavailable(EOFError(), self._timeout, True)
            parts = first.split(None, 2)
            if (len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0")
                    or len(parts[1]) != 3 or not parts[1].isdigit()):
                raise self._malformed(f"status line {first[:100]!r}")
            status = int(parts[1])
            headers: Dict[str, str] = {}
            for _ in range(_MAX_HEADERS + 1):
                line = await self._line()
                if line in (b"\r\n", b"\n"):
                    break
                name, sep, value = line.decode("latin-1").partition(":")
                if not sep:
                    raise self._malformed(f"header line {line[:100]!r}")
                name = name.strip().lower()
                value = value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            else:
                raise self._malformed(f"more than {_MAX_HEADERS} headers")
            if 100 <= status < 200:  # an interim answer: the real one follows
                continue
            break
        self.status = status
        self.headers = headers
        if method == "HEAD" or status in (204, 304):
            self._framing = "none"
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing = "chunked"
        elif "content-length" in headers:
            cl = headers["content-length"]
            if not cl.isdigit() or len(cl) > 18:
                raise self._malformed(f"Content-Length {cl[:40]!r}")
            self._framing = "length"
            self._left = int(cl)
        else:
            self._framing = "close"
        self._keep_alive = (parts[0] == b"HTTP/1.1" and self._framing != "close"
                            and "close" not in headers.get("connection", "").lower())
        if self._framing == "none" or (self._framing == "length" and self._left == 0):
            self._finish()

    def _finish(self) -> None:
        self._done = True
        self._release(self._keep_alive)

    async def piece(self) -> bytes:
        """The next piece of the body; b"" at its end."""
        if self._done:
            return b""
        reader = self._conn.reader
        if self._framing == "close":
            data = await self._io(reader.read(_PIECE))
            if not data:
                self._finish()
            return data
        if self._framing == "chunked" and self._left == 0:
            line = await self._line()
            size = line.split(b";", 1)[0].strip()
            if not size or len(size) > 15 or not re.fullmatch(rb"[0-9a-fA-F]+", size):
                raise self._malformed(f"chunk size {line[:40]!r}")
            self._left = int(size, 16)
            if self._left == 0:
                while (await self._line()) not in (b"\r\n", b"\n"):  # trailers
                    pass
                self._finish()
                return b""
        data = await self._io(reader.read(min(self._left, _PIECE)))
        if not data:
            raise self._client._unavailable(EOFError(), self._timeout, True)
        self._left -= len(data)
        if self._left == 0:
            if self._framing == "chunked":
                if await self._io(reader.readexactly(2)) != b"\r\n":
                    raise self._malformed("a chunk without its CRLF")
            else:
                self._finish()
        return data

    async def read_all(self) -> bytes:
        parts = []
        while True:
            data = await self.piece()
            if not data:
                return b"".join(parts)
            parts.append(data)


class _LineSource:
    """The objects of an NDJSON answer, one per line, read as they arrive; the request is sent
    on the first read."""

    def __init__(self, client: "AsyncClient", open_args: Tuple[Any, ...]) -> None:
        self._client = client
        self._open_args = open_args
        self._answer: Optional[_Answer] = None
        self._buf = bytearray()
        self._ended = False
        self._aborted = False

    async def next_or_none(self) -> Optional[Dict[str, Any]]:
        """The next object, or None at the end of the answer."""
        if self._aborted:
            return None
        if self._answer is None:
            self._answer = await self._client._open(*self._open_args)
            if self._answer.status >= 400:
                raise self._client._error(self._answer.status, await self._answer.read_all(),
                                          self._answer.headers)
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0 and self._ended and self._buf:
                nl = len(self._buf) - 1
            if nl >= 0:
                line = bytes(self._buf[:nl + 1])
                del self._buf[:nl + 1]
                obj = self._client._stream_object(line)
                if obj is not None:
                    return obj
                continue
            if self._ended:
                return None
            data = await self._answer.piece()
            if not data:
                self._ended = True
            elif len(self._buf) + len(data) > _MAX_STREAM_LINE:
                self._answer.abort()
                raise ServerError(f"the daemon at {self._client.url} sent a stream line longer "
                                  f"than {_MAX_STREAM_LINE} bytes")
            self._buf += data

    def close(self) -> None:
        """Closes the connection now."""
        self._aborted = True
        if self._answer is not None:
            self._answer.abort()

    def __aiter__(self) -> "_LineSource":
        return self

    async def __anext__(self) -> Dict[str, Any]:
        try:
            obj = await self.next_or_none()
        except BaseException:
            self.close()
            raise
        if obj is None:
            self.close()
            raise StopAsyncIteration
        return obj

    async def aclose(self) -> None:
        self.close()


@async_face()
class AsyncClient(ClientBase):
    """A connection to one withruntime daemon for asyncio: found, authenticated and checked
    exactly as :class:`~withruntime.Client` (the same arguments), every call a coroutine.

    Args:
        url: As for :class:`~withruntime.Client`; without it the daemon is found from the
            environment.
        api_key: As for :class:`~withruntime.Client`.
        timeout: Seconds to wait on one socket operation of an ordinary call.
        ca_file: As for :class:`~withruntime.Client`.
        max_connections: Calls in flight at once on one event loop; more wait for a free
            connection.
        max_idle: Connections kept open between calls, per event loop.

    ``await client.aclose()`` (or ``async with AsyncClient() as client:``) closes the idle
    connections; the client stays usable.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ca_file: Optional[str] = None,
        max_connections: int = 100,
        max_idle: int = 10,
    ) -> None:
        super().__init__(url, api_key, timeout=timeout, ca_file=ca_file)
        if max_connections < 1 or max_idle < 0:
            raise ValueError("max_connections must be >= 1 and max_idle >= 0")
        self.max_connections = max_connections
        self.max_idle = max_idle
        self._twin: Any = None
        self._pools: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool]" = \
            weakref.WeakKeyDictionary()

    def _pool(self) -> _Pool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = _Pool(self.max_connections, self.max_idle)
        return pool

    async def aclose(self) -> None:
        """Closes the connections kept open for this event loop (the client stays usable)."""
        self._pool().close_idle()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _request_head(self, method: str, target: str, headers: Mapping[str, str],
                      body: Optional[bytes]) -> bytes:
        if _BAD_TARGET.search(target):
            raise ConfigurationError(f"a request path with spaces or control characters: "
                                     f"{target[:100]!r}")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header()}",
                 "Accept-Encoding: identity"]
        for name, value in headers.items():
            if _BAD_HEADER.search(name) or _BAD_HEADER.search(value):
                what = "the API key" if name == "Authorization" else f"the header {name}"
                raise ConfigurationError(f"{what} holds a line break or NUL")
            lines.append(f"{name}: {value}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _connect(self, timeout: float) -> _Conn:
        if self._unix_path is not None:
            opening = asyncio.open_unix_connection(self._unix_path, limit=_LINE_LIMIT)
        elif self._https:
            opening = asyncio.open_connection(self._host, self._port, ssl=self._tls_context(),
                                              server_hostname=self._host, limit=_LINE_LIMIT,
                                              ssl_handshake_timeout=timeout)
        else:
            opening = asyncio.open_connection(self._host, self._port, limit=_LINE_LIMIT)
        reader, writer = await asyncio.wait_for(opening, timeout)
        return _Conn(reader, writer)

    async def _open(
        self,
        method: str,
        target: str,
        body: Optional[bytes],
        content_type: Optional[str],
        timeout: float,
        headers: Optional[Mapping[str, str]] = None,
    ) -> _Answer:
        """Sends one request and returns its answer with the status and headers read."""
        self._check_key_safe()
        head = self._request_head(method, target, self._headers(content_type, headers), body)
        pool = self._pool()
        await pool.slots.acquire()
        held = True  # this call holds a slot (an answer, once made, gives it back itself)
        autostarted = False
        try:
            while True:
                conn = pool.take_idle()
                reused = conn is not None
                sent = False
                try:
                    if conn is None:
                        conn = await self._connect(timeout)
                    conn.writer.write(head)
                    if body:
                        conn.writer.write(body)
                    await asyncio.wait_for(conn.writer.drain(), timeout)
                    sent = True
                except BaseException as e:
                    if conn is not None:
                        conn.abort()
                    if reused and isinstance(e, (ConnectionError, EOFError)):
                        continue  # the daemon closed a kept connection: a fresh one
                    if (isinstance(e, Exception) and not autostarted
                            and self._may_autostart(e, sent)):
                        autostarted = True
                        loop = asyncio.get_running_loop()
                        if await loop.run_in_executor(None, self._maybe_autostart):
                            continue
                    if isinstance(e, WithruntimeError) or not isinstance(e, Exception):
                        raise
                    raise self._unavailable(e, timeout, sent) from None
                answer = _Answer(self, pool, conn, timeout)
                held = False
                try:
                    await answer.read_head(method)
                except _Stale:  # the answer gave its slot back with the connection
                    await pool.slots.acquire()
                    held = True
                    continue
                return answer
        finally:
            if held:
                pool.slots.release()

    async def _ws_open(self, target: str, timeout: float) -> Any:
        """A WebSocket to ``target`` (a terminal's), on a connection of its own."""
        from ._terminal import _AsyncSocket

        return await _AsyncSocket.open(self, target, timeout)

    def _sync_twin(self) -> Any:
        """A blocking :class:`~withruntime.Client` for the same daemon, key and CA (what
        ``AsyncFiles.upload_dir`` runs in a thread)."""
        if self._twin is None:
            from .client import Client

            twin = Client(self._conn.url, self._conn.key, timeout=self.timeout,
                          ca_file=self._conn.ca_file)
            twin._conn = self._conn  # its source and state directory: messages, autostart
            self._twin = twin
        return self._twin

    async def _exchange(self, method: str, target: str, body: Optional[bytes],
                        content_type: Optional[str],
                        timeout: float) -> Tuple[int, Dict[str, str], bytes]:
        """One request on a pooled connection: the answer's status, headers and body."""
        answer = await self._open(method, target, body, content_type, timeout)
        return answer.status, dict(answer.headers), await answer.read_all()

    def stream_ndjson(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        timeout: Optional[float] = None,
    ) -> _LineSource:
        """One call whose answer is newline-delimited JSON: an async iterator of its objects,
        as each line arrives (the request is sent on the first ``__anext__``). ``aclose()``,
        or cancelling the task that waits on it, closes the connection."""
        body, content_type = self._body_of(json_body, None, None)
        t = self.timeout if timeout is None else timeout
        return _LineSource(self, (method, self._target(path, None), body, content_type, t,
                                  {"Accept": "application/x-ndjson"}))
