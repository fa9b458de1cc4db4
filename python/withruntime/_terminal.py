"""Terminals: an interactive session in a sandbox (``POST /v1/sandboxes/{id}/sessions``) driven
over its WebSocket (``GET .../sessions/{sid}/connect``).

The WebSocket protocol is :mod:`._ws` (no I/O); the terminal's methods are written once, as
operations (``_ops``) whose steps read from and write to a transport: :class:`_SyncSocket`
(blocking, for :class:`Terminal`) or :class:`_AsyncSocket` (asyncio streams, for
:class:`AsyncTerminal`). The transports are opened by ``Client._ws_open`` and
``AsyncClient._ws_open`` over the client's own connection (TCP, TLS or the Unix socket), with
its key in the ``Authorization`` header.

Nothing is read from the socket before the caller asks for output (``recv``, ``wait``,
iterating): the daemon then stops reading the command's terminal once 256 KiB wait unread,
so output the caller does not read is never buffered here beyond one read and one frame.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from types import TracebackType
from typing import Any, AsyncIterator, Dict, Iterator, Mapping, Optional, Type, Union
from urllib.parse import quote

from . import _ws
from ._ops import Call, Steps, async_face, operation, steps, sync_face
from .errors import DaemonUnavailable, SandboxError, ServerError, WithruntimeError

__all__ = ["Terminal", "AsyncTerminal"]

# Bytes asked of the socket at once.
_READ_SIZE = 64 << 10
# Input is sent in frames of at most this many bytes (the daemon takes frames up to 1 MiB).
_SEND_FRAME = 64 << 10
# Seconds close() waits for the daemon's answer to its close frame.
_CLOSE_WAIT = 5.0


def _deadline(timeout: Optional[float]) -> Optional[float]:
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("timeout must be >= 0 or None")
    return time.monotonic() + timeout


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(0.001, deadline - time.monotonic())


def _timed_out(timeout: Optional[float]) -> TimeoutError:
    return TimeoutError("no output from the terminal in time" if timeout is None else
                        f"no output from the terminal within {timeout:g} s")


# ---- opening the WebSocket ----


def _handshake(client: Any, target: str) -> "tuple[bytes, str]":
    client._check_key_safe()
    headers = client._headers(None, None)
    headers.pop("Accept", None)
    try:
        return _ws.handshake_request(client._host_header(), target, headers)
    except ValueError as e:
        from .errors import ConfigurationError

        raise ConfigurationError(str(e).replace("the header Authorization",
                                                "the API key")) from None


def _refused(client: Any, reader: _ws.HandshakeReader, body: bytes) -> WithruntimeError:
    if reader.status >= 400:
        return client._error(reader.status, body)  # type: ignore[no-any-return]
    return ServerError(f"the daemon at {client.url} answered the WebSocket handshake with "
                       f"{reader.status}", status=reader.status)


def _bad_answer(client: Any, e: _ws.ProtocolError) -> ServerError:
    return ServerError(f"the daemon at {client.url} sent a malformed WebSocket answer: {e}")


class _SyncSocket:
    """A connected WebSocket's socket, blocking. ``write`` may be called from one thread
    while another reads."""

    def __init__(self, client: Any, sock: socket.socket, rest: bytes, timeout: float) -> None:
        self._client = client
        self._sock = sock
        self._rest = rest
        self._timeout = timeout
        self._write_lock = threading.Lock()

    @classmethod
    def open(cls, client: Any, target: str, timeout: float) -> "_SyncSocket":
        head, key = _handshake(client, target)
        sent = False
        sock: Optional[socket.socket] = None
        try:
            if client._unix_path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(client._unix_path)
            else:
                sock = socket.create_connection((client._host, client._port), timeout=timeout)
                if client._https:
                    sock = client._tls_context().wrap_socket(sock, server_hostname=client._host)
            sock.sendall(head)
            sent = True
            reader = _ws.HandshakeReader()
            while True:
                data = sock.recv(_READ_SIZE)
                if not data:
                    raise EOFError()
                if reader.feed(data):
                    break
            if reader.status != 101:
                body = reader.rest
                want = reader.body_length()
                while want is not None and len(body) < want:
                    data = sock.recv(want - len(body))
                    if not data:
                        break
                    body += data
                raise _refused(client, reader, body[:want])
            _ws.check_accept(reader.headers, key)
        except _ws.ProtocolError as e:
            if sock is not None:
                sock.close()
            raise _bad_answer(client, e) from None
        except (OSError, EOFError) as e:
            if sock is not None:
                sock.close()
            raise client._unavailable(e, timeout, sent) from None
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        return cls(client, sock, reader.rest, timeout)

    def read(self, deadline: Optional[float], timeout: Optional[float]) -> bytes:
        if self._rest:
            data, self._rest = self._rest, b""
            return data
        try:
            self._sock.settimeout(_left(deadline))
            return self._sock.recv(_READ_SIZE)
        except socket.timeout:
            raise _timed_out(timeout) from None
        except OSError as e:
            raise self._client._unavailable(e, self._timeout, True) from None

    def write(self, data: bytes) -> None:
        with self._write_lock:
            try:
                if self._sock.gettimeout() is not None:
                    self._sock.settimeout(self._timeout)
                self._sock.sendall(data)
            except OSError as e:
                raise self._client._unavailable(e, self._timeout, True) from None

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)  # what was written is sent before the end
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass


class _AsyncSocket:
    """A connected WebSocket on asyncio streams (not one of the client's pooled
    connections)."""

    def __init__(self, client: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 rest: bytes, timeout: float) -> None:
        self._client = client
        self._reader = reader
        self._writer = writer
        self._rest = rest
        self._timeout = timeout
        self._write_lock = asyncio.Lock()

    @classmethod
    async def open(cls, client: Any, target: str, timeout: float) -> "_AsyncSocket":
        head, key = _handshake(client, target)
        sent = False
        writer: Optional[asyncio.StreamWriter] = None
        try:
            conn = await client._connect(timeout)
            reader, writer = conn.reader, conn.writer
            writer.write(head)
            await asyncio.wait_for(writer.drain(), timeout)
            sent = True
            hs = _ws.HandshakeReader()
            while True:
                data = await asyncio.wait_for(reader.read(_READ_SIZE), timeout)
                if not data:
                    raise EOFError()
                if hs.feed(data):
                    break
            if hs.status != 101:
                body = hs.rest
                want = hs.body_length()
                while want is not None and len(body) < want:
                    data = await asyncio.wait_for(reader.read(want - len(body)), timeout)
                    if not data:
                        break
                    body += data
                raise _refused(client, hs, body[:want])
            _ws.check_accept(hs.headers, key)
        except _ws.ProtocolError as e:
            if writer is not None:
                writer.transport.abort()
            raise _bad_answer(client, e) from None
        except BaseException as e:
            if writer is not None:
                writer.transport.abort()
            if isinstance(e, WithruntimeError) or not isinstance(e, Exception):
                raise
            raise client._unavailable(e, timeout, sent) from None
        return cls(client, reader, writer, hs.rest, timeout)

    async def read(self, deadline: Optional[float], timeout: Optional[float]) -> bytes:
        if self._rest:
            data, self._rest = self._rest, b""
            return data
        try:
            return await asyncio.wait_for(self._reader.read(_READ_SIZE), _left(deadline))
        except asyncio.TimeoutError:
            raise _timed_out(timeout) from None
        except (OSError, EOFError) as e:
            raise self._client._unavailable(e, self._timeout, True) from None

    async def write(self, data: bytes) -> None:
        async with self._write_lock:
            try:
                self._writer.write(data)
                await asyncio.wait_for(self._writer.drain(), self._timeout)
            except (OSError, EOFError, asyncio.TimeoutError) as e:
                self.close()
                raise self._client._unavailable(e, self._timeout, True) from None

    def close(self) -> None:
        try:
            self._writer.close()
        except RuntimeError:  # its event loop is closed: the socket goes with it
            pass


# ---- the terminal, written once ----


class _TerminalCore:
    """An interactive session in a sandbox, connected: its command's terminal (or pipes, with
    ``tty=False``) as bytes both ways. Made by ``sbx.terminal(...)``.

    Attributes:
        id: The session's id (``ses-N``), as in ``sbx.sessions()``.
        info: The daemon's description of the session when it was created.
        exit_code: Once the session ended (seen by ``recv``, ``wait`` or iterating): its exit
            status, -1 when a signal killed it; None before, or when it failed.
        exit_signal: The number of the signal that killed it, or None.
        error: Why the session failed (its sandbox stopped, its agent died), or None.
    """

    def __init__(self, sandbox: Any, info: Mapping[str, Any], io: Any) -> None:
        self._sbx = sandbox
        self.info: Dict[str, Any] = dict(info)
        self.id = str(info["id"])
        self._path = f"{sandbox._path}/sessions/{quote(self.id, safe='')}"
        self._io = io
        self._proto = _ws.Protocol()
        self.exit_code: Optional[int] = None
        self.exit_signal: Optional[int] = None
        self.error: Optional[str] = None
        self.exited = False  # the daemon said the session ended
        self._ended = False  # the connection ended
        self._closed = False

    def __repr__(self) -> str:
        state = "exited" if self.exited else "closed" if self._ended else "open"
        return f"{type(self).__name__}(id={self.id!r}, sandbox={self._sbx.id!r}, {state})"

    def _gone(self) -> WithruntimeError:
        return WithruntimeError("the terminal's connection is closed", code="closed")

    def _on_text(self, text: str) -> None:
        try:
            msg = json.loads(text)
        except ValueError:
            return
        if not isinstance(msg, dict) or msg.get("type") != "exit":
            return
        code, sig, err = msg.get("exit_code"), msg.get("signal"), msg.get("error")
        self.exit_code = code if isinstance(code, int) else None
        self.exit_signal = sig if isinstance(sig, int) else None
        self.error = err if isinstance(err, str) else None
        self.exited = True

    def _end(self) -> Steps:
        """The connection is over: send what the protocol still owes (the reply to a close),
        then close the socket."""
        self._ended = True
        out = self._proto.take_output()
        try:
            if out:
                yield Call(self._io, "write", out)
        except WithruntimeError:
            pass
        finally:
            self._io.close()

    def _output(self, deadline: Optional[float], timeout: Optional[float]) -> Steps:
        """The next piece of output, or None when the connection has ended."""
        while not self._ended:
            try:
                ev = self._proto.next_event()
            except _ws.ProtocolError as e:
                self._proto.take_output()
                self._proto._out.append(self._proto.send_close(e.code))
                yield from self._end()
                raise ServerError(f"the daemon broke the WebSocket protocol: {e}") from None
            if ev is not None and ev[0] == "close":
                yield from self._end()  # sends the reply to the close, if it still can
                continue
            out = self._proto.take_output()
            if out:  # pongs: if the connection broke, the reads that follow say so
                try:
                    yield Call(self._io, "write", out)
                except WithruntimeError:
                    pass
            if ev is None:
                data = yield Call(self._io, "read", deadline, timeout)
                if not data:
                    yield from self._end()
                else:
                    self._proto.feed(data)
                continue
            kind, payload = ev
            if kind == "text":
                self._on_text(str(payload))
            elif payload:
                return payload
        return None

    def _send_frame(self, opcode: int, payload: bytes) -> Steps:
        if self._ended or self._proto.close_sent:
            raise self._gone()
        yield Call(self._io, "write", _ws.frame(opcode, payload))

    def _control(self, msg: Dict[str, Any]) -> Steps:
        yield from self._send_frame(_ws.TEXT, json.dumps(msg).encode("utf-8"))

    @operation
    def send(self, data: Union[bytes, str]) -> None:
        """Types ``data`` (a str is sent as UTF-8) into the session.

        Raises:
            WithruntimeError: The connection is closed (code ``closed``).
        """
        if isinstance(data, str):
            data = data.encode("utf-8")
        for i in range(0, len(data), _SEND_FRAME):
            yield from self._send_frame(_ws.BINARY, bytes(data[i:i + _SEND_FRAME]))

    @operation
    def recv(self, timeout: Optional[float] = None) -> bytes:
        """The next output as it comes (any amount); b"" once the session has ended and its
        output is all read. Waits at most ``timeout`` seconds (None: for ever), then raises
        :class:`TimeoutError` (nothing is lost: call again)."""
        data = yield from self._output(_deadline(timeout), timeout)
        return data or b""

    @operation
    def resize(self, rows: int, cols: int) -> None:
        """Sets the terminal's size (1..10000 each); the command gets SIGWINCH."""
        if not (1 <= rows <= 10000 and 1 <= cols <= 10000):
            raise ValueError("rows and cols must be 1..10000")
        yield from self._control({"type": "resize", "rows": int(rows), "cols": int(cols)})

    @operation
    def signal(self, name: Union[str, int]) -> None:
        """Sends a signal (``"INT"``, ``"TERM"``, ``"KILL"``, ... or a number) to the session's
        whole process tree."""
        yield from self._control({"type": "signal", "signal": name})

    @operation
    def eof(self) -> None:
        """Ends the input: the command's stdin closes (``tty=False``), or ^D is typed."""
        yield from self._control({"type": "eof"})

    @operation
    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the session to end and returns its exit status (-1 when a signal killed it:
        see :attr:`exit_signal`). Output not read before is read and dropped.

        Raises:
            TimeoutError: It still runs after ``timeout`` seconds.
            SandboxError: The session failed (its sandbox stopped, its agent died).
            DaemonUnavailable: The connection ended before the session did.
        """
        deadline = _deadline(timeout)
        while (yield from self._output(deadline, timeout)) is not None:
            pass
        if not self.exited:
            raise DaemonUnavailable("the terminal's connection ended before its session did")
        if self.exit_code is None:
            raise SandboxError(f"the session failed: {self.error or 'no exit status'}",
                               code="session_failed")
        return self.exit_code

    @operation
    def close(self) -> None:
        """Closes the connection (the WebSocket close handshake, waiting at most 5 s). The
        session itself runs on, and the daemon kills it when no client connects within its
        grace period (``serve --session-grace``); leaving a ``with`` block also kills it."""
        if self._closed:
            return
        self._closed = True
        if self._ended:
            return
        try:
            close = self._proto.send_close(1000)
            if close:
                yield Call(self._io, "write", close)
            deadline = time.monotonic() + _CLOSE_WAIT
            while (yield from self._output(deadline, _CLOSE_WAIT)) is not None:
                pass
        except (WithruntimeError, TimeoutError):
            pass
        finally:
            self._ended = True
            self._io.close()

    @operation
    def kill(self) -> None:
        """Kills the session's process tree if it still runs, and has the daemon forget it
        (``DELETE .../sessions/{sid}``)."""
        yield from steps(self._sbx._client.request, "DELETE", self._path)


@sync_face
class Terminal(_TerminalCore):
    """An interactive session in a sandbox (``sbx.terminal()``), with blocking calls. As a
    context manager it closes the connection and kills the session (if it still runs) when
    the block is left; iterating gives its output until it ends::

        with sbx.terminal("bash") as term:
            term.send("echo $((6*7)); exit 3\\n")
            for chunk in term:
                print(chunk.decode(errors="replace"), end="")
            print(term.exit_code)                      # 3
    """

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()
        if not self.exited:
            try:
                self.kill()
            except WithruntimeError:
                pass

    def __iter__(self) -> Iterator[bytes]:
        while True:
            data = self.recv()
            if not data:
                return
            yield data


@async_face(Terminal="AsyncTerminal")
class AsyncTerminal(_TerminalCore):
    """An interactive session in an :class:`~withruntime.AsyncSandbox`
    (``await sbx.terminal()``): the methods of :class:`Terminal` as coroutines, ``async for
    chunk in term`` for its output, and ``async with`` to close it (and kill the session if it
    still runs) when the block is left. One task may read while others send, resize or
    signal."""

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]],
                        exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        await self.close()
        if not self.exited:
            try:
                await self.kill()
            except WithruntimeError:
                pass

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        data = await self.recv()
        if not data:
            raise StopAsyncIteration
        return data
