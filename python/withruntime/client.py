"""Finding the daemon and talking HTTP/1.1 to it, over TCP or its Unix socket.

Where the daemon is, in order (the same order as the ``withruntime`` command line):

1. ``RUNTIME_URL`` (``https://host:port``, ``http://host:port`` or
   ``unix:/path/to/withruntime.sock``);
2. the connection saved by ``withruntime login``:
   ``$XDG_CONFIG_HOME/withruntime/connection.json`` or ``~/.config/withruntime/connection.json``,
   ``{"url": "...", "key": "...", "ca_file": "..."}``;
3. the local Unix socket ``$WITHRUNTIME_STATE_DIR/withruntime.sock`` (default
   ``/var/lib/withruntime/withruntime.sock``). When nothing answers there and we are root with
   the ``withruntime`` command on ``PATH``, that command is asked to start the daemon, as the
   command line itself does.

``RUNTIME_API_KEY``, when set, is the key in every case (over a saved connection's key). The key
travels only in the ``Authorization: Bearer`` header; it is never part of a repr, a message or an
exception. It is never sent over plain ``http://`` to a host that is not loopback (127.0.0.0/8,
``::1``, ``localhost``): such a call raises :class:`ConfigurationError` before connecting.

An ``https://`` daemon's certificate must chain to the system's CAs, or to the CAs in
``RUNTIME_CA_FILE`` (a PEM file; else the saved connection's ``ca_file``, else the ``ca_file``
argument) when given, and name the URL's host.

A :class:`Client` keeps the connections of its finished calls open (HTTP/1.1 keep-alive) and
gives each to one call at a time, so one client (and every sandbox that uses it) can be shared
between threads. :class:`~withruntime.AsyncClient` (``async_client``)
finds the daemon the same way and shares everything here but the I/O.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import json
import os
import select
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Generator, List, Mapping, Optional, Tuple, Type, TypeVar, Union

from ._ops import Call, operation, steps, sync_face
from .errors import (
    ConfigurationError,
    DaemonUnavailable,
    ServerError,
    WithruntimeError,
    error_from_response,
)

__all__ = ["Client", "ClientBase", "Connection", "Response", "resolve_connection",
           "DEFAULT_STATE_DIR"]

DEFAULT_STATE_DIR = "/var/lib/withruntime"
SOCKET_NAME = "withruntime.sock"
USER_AGENT = "withruntime-python/0.1.0"

# Seconds to wait on any one socket operation of a call that has no better bound.
DEFAULT_TIMEOUT = 120.0

# A kept connection idle for longer than this is closed rather than used again (the daemon
# closes idle connections after 60 s by default).
_IDLE_MAX_S = 30.0
# Errors that mean a kept connection had been closed by the daemon before our request reached
# it: the daemon closes a connection only between requests, so it is sent again on a fresh one.
_STALE_ERRORS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                 ConnectionAbortedError)

_C = TypeVar("_C", bound="ClientBase")


@dataclass(frozen=True)
class Connection:
    """Where the daemon is and how to authenticate; ``source`` says where it was found
    (``"argument"``, ``"RUNTIME_URL"``, the saved file's path, or ``"local socket"``)."""

    url: str
    key: Optional[str] = None
    source: str = "argument"
    state_dir: Optional[str] = None  # set when this is the local daemon's socket
    ca_file: Optional[str] = None  # https: trust only the CAs in this PEM file

    def __repr__(self) -> str:  # the key stays out of reprs and logs
        key = "set" if self.key else "none"
        return f"Connection(url={self.url!r}, key={key}, source={self.source!r})"


def is_loopback_host(host: str) -> bool:
    """True if host is this machine's loopback by its spelling alone: ``localhost``, an address in
    127.0.0.0/8 or ``::1`` (IPv4-mapped too). Nothing is looked up."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def config_path() -> str:
    """The file ``withruntime login`` saves the connection in."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    if xdg.startswith("/"):
        return os.path.join(xdg, "withruntime", "connection.json")
    return os.path.join(os.path.expanduser("~"), ".config", "withruntime", "connection.json")


def _load_saved(path: str) -> Optional[Tuple[str, Optional[str], Optional[str]]]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigurationError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ConfigurationError(
            f"{path}: not valid JSON ({e}); run `withruntime login URL` again") from None
    url = data.get("url") if isinstance(data, dict) else None
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f'{path}: no "url"; run `withruntime login URL` again')
    key = data.get("key")
    ca = data.get("ca_file")
    return (url, key if isinstance(key, str) and key else None,
            ca if isinstance(ca, str) and ca else None)


def resolve_connection() -> Connection:
    """Finds the daemon the way the module docstring describes."""
    env_key = os.environ.get("RUNTIME_API_KEY") or None
    env_ca = os.environ.get("RUNTIME_CA_FILE") or None
    url = os.environ.get("RUNTIME_URL")
    if url:
        return Connection(url=url, key=env_key, source="RUNTIME_URL", ca_file=env_ca)
    path = config_path()
    saved = _load_saved(path)
    if saved is not None:
        return Connection(url=saved[0], key=env_key or saved[1], source=path,
                          ca_file=env_ca or saved[2])
    state_dir = os.environ.get("WITHRUNTIME_STATE_DIR") or DEFAULT_STATE_DIR
    return Connection(url="unix:" + os.path.join(state_dir, SOCKET_NAME), key=env_key,
                      source="local socket", state_dir=state_dir, ca_file=env_ca)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix stream socket."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether an idle kept connection has anything to read: after a whole answer that can only
    be its end (or bytes nobody asked for), so it is not used again."""
    try:
        if hasattr(select, "poll"):
            p = select.poll()
            p.register(sock, select.POLLIN | select.POLLPRI)
            return bool(p.poll(0))
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class _Kept:
    """A client's idle connections, the most recently used first out. Safe between threads; a
    forked child drops the parent's (their sockets are the parent's conversations)."""

    def __init__(self, max_idle: int) -> None:
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._pid = os.getpid()

    def take(self) -> Optional[http.client.HTTPConnection]:
        now = time.monotonic()
        done: List[http.client.HTTPConnection] = []
        found = None
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                done = [c for c, _ in self._idle]
                self._idle = []
            while found is None and self._idle:
                conn, since = self._idle.pop()
                if (now - since < _IDLE_MAX_S and conn.sock is not None
                        and not _closed_by_peer(conn.sock)):
                    found = conn
                else:
                    done.append(conn)
        for conn in done:
            conn.close()
        return found

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self._pid == os.getpid() and len(self._idle) < self.max_idle:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


@dataclass
class Response:
    """A finished, successful answer."""

    status: int
    headers: Dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class ClientBase:
    """What :class:`Client` and :class:`~withruntime.AsyncClient` share: where the daemon is,
    the key, TLS, how a request is addressed and how its answer or error is read, and the calls
    themselves (``request``, ``request_json``, ``health``, ``images``) written once. Only the
    I/O (``_exchange`` and ``stream_ndjson``) is theirs. Arguments: see :class:`Client`.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ca_file: Optional[str] = None,
    ) -> None:
        if url is None:
            conn = resolve_connection()
            if api_key is not None or ca_file is not None:
                conn = Connection(conn.url, api_key if api_key is not None else conn.key,
                                  conn.source, conn.state_dir, ca_file or conn.ca_file)
        else:
            conn = Connection(url=url, key=api_key or None,
                              ca_file=ca_file or os.environ.get("RUNTIME_CA_FILE") or None)
        self._conn = conn
        self._key = conn.key
        self._ssl_context: Optional[ssl.SSLContext] = None
        self.timeout = timeout
        self._autostart_lock = threading.Lock()
        self._autostarted = False
        self._unix_path: Optional[str] = None
        self._https = False
        self._host = ""
        self._port = 0
        self._prefix = ""
        self._parse_url(conn.url)

    @classmethod
    def from_env(cls: Type[_C], *, timeout: float = DEFAULT_TIMEOUT) -> _C:
        """A client for the daemon that the environment names (the default everywhere)."""
        return cls(timeout=timeout)

    def _parse_url(self, url: str) -> None:
        where = f"RUNTIME_URL={url!r}" if self._conn.source == "RUNTIME_URL" else repr(url)
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            if path.startswith("//"):
                path = path[2:]
            if not path:
                raise ConfigurationError(f"bad daemon URL {where}: no socket path after 'unix:'")
            self._unix_path = path
            self.url = "unix:" + path
            return
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"bad daemon URL {where}: use http://HOST:PORT or unix:/path/to/withruntime.sock")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        try:
            self._port = parts.port or (443 if self._https else 80)
        except ValueError:
            raise ConfigurationError(f"bad daemon URL {where}: bad port") from None
        self._prefix = parts.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.url = f"{parts.scheme}://{host}:{self._port}{self._prefix}"

    @property
    def connection(self) -> Connection:
        """Where this client's daemon is (its repr leaves the key out)."""
        return self._conn

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"

    # ---- what both transports share ----

    def _tls_context(self) -> ssl.SSLContext:
        """The context for https: the system's CAs or the CA file; hostnames checked."""
        if self._ssl_context is None:
            ca = self._conn.ca_file
            try:
                ctx = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as e:
                reason = getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)
                raise ConfigurationError(f"cannot load the CA file {ca!r}: {reason}") from None
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            self._ssl_context = ctx
        return self._ssl_context

    def _check_key_safe(self) -> None:
        """Refuses, before any connection, to send the key where it would cross a network
        readable: plain http to a host that is not loopback."""
        if (self._key and self._unix_path is None and not self._https
                and not is_loopback_host(self._host)):
            raise ConfigurationError(
                f"refusing to send the API key in clear text to {self.url}: use https:// (the "
                f"daemon's serve --tls-cert), or reach it on a loopback address (an SSH tunnel)")

    def _host_header(self) -> str:
        """The ``Host`` header's value."""
        if self._unix_path is not None:
            return "localhost"
        host = f"[{self._host}]" if ":" in self._host else self._host
        if self._port != (443 if self._https else 80):
            host += f":{self._port}"
        return host

    def _headers(self, content_type: Optional[str], extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
        h = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if content_type:
            h["Content-Type"] = content_type
        if self._key:
            h["Authorization"] = "Bearer " + self._key
        if extra:
            h.update(extra)
        return h

    def _target(self, path: str, query: Optional[Mapping[str, Any]]) -> str:
        """The request target: the URL's path prefix, ``path`` and the encoded query."""
        target = self._prefix + path
        if query:
            items = [(k, _query_value(v)) for k, v in query.items() if v is not None]
            if items:
                target += "?" + urllib.parse.urlencode(items, quote_via=urllib.parse.quote)
        return target

    @staticmethod
    def _body_of(json_body: Any, body: Optional[bytes],
                 content_type: Optional[str]) -> Tuple[Optional[bytes], Optional[str]]:
        if json_body is not None:
            return json.dumps(json_body).encode("utf-8"), "application/json"
        return body, content_type

    def _unavailable(self, e: BaseException, timeout: Optional[float],
                     sent: bool) -> WithruntimeError:
        """The error for a failure to reach the daemon or to read its answer."""
        if isinstance(e, ssl.SSLCertVerificationError) and not sent:
            return ConfigurationError(
                f"the certificate of the withruntime daemon at {self.url} is not trusted: "
                f"{e.verify_message} (give its CA with RUNTIME_CA_FILE or ca_file=)")
        if isinstance(e, ssl.SSLError) and not sent:
            msg = f"TLS handshake with the withruntime daemon at {self.url} failed: {e.reason}"
            if e.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE"):
                msg += "; is it serving https (serve --tls-cert)?"
            return DaemonUnavailable(msg)
        if isinstance(e, (socket.timeout, TimeoutError, asyncio.TimeoutError)):
            msg = f"the withruntime daemon at {self.url} did not answer within {timeout:g} s"
        elif isinstance(e, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                            EOFError)):
            msg = f"the withruntime daemon at {self.url} closed the connection"
        else:
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            msg = f"cannot reach the withruntime daemon at {self.url}: {reason}"
        if sent:
            msg += " (the request may or may not have taken effect)"
        elif self._conn.source == "local socket":
            msg += ("; start it with `withruntime serve` (as root), or set RUNTIME_URL "
                    "(and RUNTIME_API_KEY) to reach a daemon elsewhere")
        return DaemonUnavailable(msg)

    @staticmethod
    def _may_autostart(e: BaseException, sent: bool) -> bool:
        """Whether a failure to connect is one that starting the local daemon could cure."""
        return isinstance(e, (ConnectionRefusedError, FileNotFoundError)) and not sent

    def _maybe_autostart(self) -> bool:
        """Asks the ``withruntime`` command to start the local daemon, once. True if it ran."""
        state_dir = self._conn.state_dir
        if state_dir is None or os.geteuid() != 0:
            return False
        exe = shutil.which("withruntime")
        if exe is None:
            return False
        with self._autostart_lock:
            if self._autostarted:
                return True
            self._autostarted = True
            env = {k: v for k, v in os.environ.items() if k not in ("RUNTIME_URL",)}
            try:
                subprocess.run([exe, "--state-dir", state_dir, "sandbox", "list"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=env, timeout=60, check=False)
            except (OSError, subprocess.SubprocessError):
                return False
            return True

    @staticmethod
    def _error(status: int, raw: bytes,
               headers: Optional[Mapping[str, str]] = None) -> WithruntimeError:
        """The typed error for an answer of 400 or more with body ``raw`` (and its headers,
        lower-case names, for ``Retry-After``)."""
        err = None
        try:
            doc = json.loads(raw)
            if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
                err = doc["error"]
        except ValueError:
            pass
        return error_from_response(status, err, raw.decode("utf-8", "replace"), headers)

    def _json_of(self, resp: Response, method: str, path: str) -> Any:
        try:
            return resp.json()
        except ValueError:
            raise ServerError(
                f"the daemon at {self.url} answered {method} {path} with something that is "
                f"not JSON: {resp.body[:200]!r}", status=resp.status) from None

    def _stream_object(self, line: bytes) -> Optional[Dict[str, Any]]:
        """One line of an NDJSON answer as an object, or None for a blank line or a value that
        is not an object."""
        line = line.strip()
        if not line:
            return None
        try:
            obj = json.loads(line)
        except ValueError:
            raise ServerError(
                f"the daemon at {self.url} sent a stream line that is not JSON: "
                f"{line[:200]!r}") from None
        return obj if isinstance(obj, dict) else None

    # ---- calls ----

    @operation
    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        json_body: Any = None,
        body: Optional[bytes] = None,
        content_type: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Response:
        """Makes one call and returns its answer; raises a :class:`WithruntimeError` subclass
        for an error answer and :class:`DaemonUnavailable` when the daemon cannot be reached.

        Args:
            method: ``GET``, ``POST``, ``PUT`` or ``DELETE``.
            path: Starts with ``/v1/``.
            query: Query parameters; None values are left out, booleans sent as true/false.
            json_body: Sent as JSON when given.
            body: Raw bytes to send instead (with ``content_type``).
            content_type: The body's type.
            timeout: Seconds per socket operation (default: the client's).
        """
        body, content_type = self._body_of(json_body, body, content_type)
        t = self.timeout if timeout is None else timeout
        status, headers, data = yield Call(self, "_exchange", method, self._target(path, query),
                                           body, content_type, t)
        if status >= 400:
            raise self._error(status, data, headers)
        return Response(status, headers, data)

    @operation
    def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        """:meth:`request`, returning the decoded JSON answer."""
        resp = yield from steps(self.request, method, path, **kwargs)
        return self._json_of(resp, method, path)

    # ---- system ----

    @operation
    def health(self) -> Dict[str, Any]:
        """``GET /v1/health``: ``{"status": "ok", "version": ..., "driver": ..., "sandboxes": N,
        "network": {"enabled": bool[, "reason": ...]}}``."""
        return dict((yield from steps(self.request_json, "GET", "/v1/health")))

    @operation
    def images(self) -> List[Dict[str, Any]]:
        """``GET /v1/images``: the built images, each ``{"name", "size_bytes", "created_at"}``."""
        d = yield from steps(self.request_json, "GET", "/v1/images")
        return list(d.get("images", []))


@sync_face
class Client(ClientBase):
    """A connection to one withruntime daemon, with blocking calls.

    Args:
        url: ``https://host:port`` (a daemon started with ``serve --tls-cert``),
            ``http://host:port`` or ``unix:/path/to/withruntime.sock``. Without it the daemon is
            found from the environment (see the module docstring).
        api_key: The bearer key. Without it (and without ``url``) it comes from
            ``RUNTIME_API_KEY`` or the saved connection. It is never sent over plain
            ``http://`` to a host that is not loopback.
        timeout: Seconds to wait on one socket operation of an ordinary call. Commands get
            their own timeout plus a margin.
        ca_file: For ``https://``: trust only the CAs in this PEM file (default
            ``RUNTIME_CA_FILE``, else the saved connection's, else the system's CAs).
        max_idle: Connections kept open between calls (HTTP/1.1 keep-alive), each for at most
            30 s; ``0`` opens a connection per call. A kept connection that the daemon closed
            before answering is replaced by a fresh one and the request sent again: the daemon
            closes a connection only between requests, before reading the next one.

    Each call has a connection to itself, so threads may share a client. ``client.close()`` (or
    ``with Client() as client:``) closes the kept connections; the client stays usable.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ca_file: Optional[str] = None,
        max_idle: int = 8,
    ) -> None:
        super().__init__(url, api_key, timeout=timeout, ca_file=ca_file)
        if max_idle < 0:
            raise ValueError("max_idle must be >= 0")
        self._kept = _Kept(max_idle)
        # The kept sockets are closed when the client goes, not left to the collector.
        weakref.finalize(self, self._kept.close)

    @property
    def max_idle(self) -> int:
        return self._kept.max_idle

    def close(self) -> None:
        """Closes the connections kept open between calls (the client stays usable)."""
        self._kept.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _new_connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._unix_path is not None:
            return _UnixHTTPConnection(self._unix_path, timeout)
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=self._tls_context())
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _open(
        self,
        method: str,
        target: str,
        body: Optional[bytes],
        content_type: Optional[str],
        timeout: Optional[float],
        headers: Optional[Mapping[str, str]] = None,
        kept: bool = False,
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends one request and returns the open connection and its response (any status):
        on a kept connection when ``kept`` and one is idle, else on a new one."""
        self._check_key_safe()
        hdrs = self._headers(content_type, headers)
        autostarted = False
        while True:
            conn = self._kept.take() if kept else None
            reused = conn is not None
            if conn is None:
                conn = self._new_connection(timeout)
            sent = False
            try:
                if reused:
                    conn.timeout = timeout
                    conn.sock.settimeout(timeout)
                else:
                    conn.connect()
                conn.request(method, target, body=body, headers=hdrs)
                sent = True
                return conn, conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if reused and isinstance(e, _STALE_ERRORS):
                    continue
                if not autostarted and self._may_autostart(e, sent) and self._maybe_autostart():
                    autostarted = True
                    continue
                raise self._unavailable(e, timeout, sent) from None
            except BaseException:  # an interrupt: the connection is in no state to keep
                conn.close()
                raise

    def _read(self, resp: http.client.HTTPResponse, timeout: Optional[float]) -> bytes:
        try:
            return resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise self._unavailable(e, timeout, True) from None

    def _exchange(self, method: str, target: str, body: Optional[bytes],
                  content_type: Optional[str],
                  timeout: float) -> Tuple[int, Dict[str, str], bytes]:
        """One request on a kept connection or a new one: the answer's status, headers and
        body. The connection is kept for the next call when the answer was read whole and the
        daemon did not say it closes it."""
        conn, resp = self._open(method, target, body, content_type, timeout, kept=True)
        whole = False
        try:
            data = self._read(resp, timeout)
            whole = True
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            if whole and not resp.will_close and conn.sock is not None:
                self._kept.put(conn)
            else:
                conn.close()

    def _ws_open(self, target: str, timeout: float) -> Any:
        """A WebSocket to ``target`` (a terminal's), on a connection of its own."""
        from ._terminal import _SyncSocket

        return _SyncSocket.open(self, target, timeout)

    def stream_ndjson(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        timeout: Optional[float] = None,
    ) -> Generator[Dict[str, Any], None, None]:
        """Makes one call whose answer is newline-delimited JSON, and yields each object as
        its line arrives. Closing the generator closes the connection."""
        body, content_type = self._body_of(json_body, None, None)
        t = self.timeout if timeout is None else timeout
        conn, resp = self._open(method, self._target(path, None), body, content_type, t,
                                headers={"Accept": "application/x-ndjson"})
        try:
            if resp.status >= 400:
                raise self._error(resp.status, self._read(resp, t),
                                  {k.lower(): v for k, v in resp.getheaders()})
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise self._unavailable(e, t, True) from None
                if not line:
                    return
                obj = self._stream_object(line)
                if obj is not None:
                    yield obj
        finally:
            conn.close()


def _query_value(v: Union[str, int, float, bool]) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def default_client() -> Client:
    """A client for the daemon the environment names, resolved on every call (so a changed
    ``RUNTIME_URL`` is seen)."""
    return Client()
