"""Sandboxes: create or find one, run commands in it, move files in and out, end its lease.

    from withruntime import Sandbox

    with Sandbox.create(timeout_seconds=900, on_lease_end="stop") as sbx:
        r = sbx.exec("python3 -c 'print(6 * 7)'")
        print(r.exit_code, r.stdout)          # 0 42
        sbx.files.write("notes.txt", "hello")
        print(sbx.files.read_text("notes.txt"))

Every method is one HTTP call on a connection of its own while it runs (its client keeps
finished calls' connections open for the next ones), so threads may share a sandbox.

:class:`AsyncSandbox` is the same for asyncio (``await AsyncSandbox.create()``): both are made
from one set of operations (``_ops``), so they send the same requests and answer the same.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import (  # AsyncIterator: named by the async classes' annotations
    Any,
    AsyncIterator,  # noqa: F401
    BinaryIO,
    Callable,
    Dict,
    Generator,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Type,
    Union,
)
from urllib.parse import quote, urlencode

import asyncio
import functools

from . import _archive
from ._ops import (
    Call,
    Emit,
    NextLine,
    ReadPiece,
    Steps,
    async_face,
    class_context_operation,
    class_operation,
    context_operation,
    iteration,
    operation,
    steps,
    sync_face,
)
from ._terminal import AsyncTerminal, Terminal
from .async_client import AsyncClient
from .client import Client
from .errors import FileTooLarge, NotFound, WithruntimeError, error_from_response

__all__ = ["Sandbox", "AsyncSandbox", "ExecResult", "ExecEvent", "FileInfo", "Files",
           "AsyncFiles", "Command", "AsyncCommand", "CommandOutput", "Terminal", "AsyncTerminal"]

# sbx.files.read returns at most this many bytes unless told otherwise.
DEFAULT_READ_MAX = 100 << 20
# Uploads bigger than this go in pieces (the daemon takes at most 8 MiB in one request by default),
# and read_stream fetches pieces of this size.
PIECE_SIZE = 8 << 20

# Seconds added to a command's own timeout before the SDK gives up waiting for the daemon.
_EXEC_MARGIN = 60.0
_DEFAULT_EXEC_TIMEOUT = 300.0


def _decode(data: Any, encoding: Any) -> bytes:
    if not isinstance(data, str):
        return b""
    if encoding == "base64":
        try:
            return base64.b64decode(data)
        except ValueError:
            return data.encode("utf-8", "replace")
    return data.encode("utf-8", "surrogatepass")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExecResult:
    """What a finished command did.

    Attributes:
        exit_code: The exit status, or -1 when a signal killed the command.
        stdout: Standard output as text (invalid UTF-8 replaced with U+FFFD).
        stderr: Standard error as text.
        stdout_bytes: Standard output exactly as the command wrote it.
        stderr_bytes: Standard error exactly as the command wrote it.
        stdout_truncated: True when output past ``max_output_bytes`` was dropped.
        stderr_truncated: The same for standard error.
        timed_out: True when the daemon killed the command for running past its timeout.
        signal: The number of the signal that killed it (e.g. 9), else None.
        duration_ms: How long it ran.
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    signal: Optional[int] = None
    duration_ms: int = 0

    @property
    def ok(self) -> bool:
        """True when the command exited 0 on its own."""
        return self.exit_code == 0 and not self.timed_out and self.signal is None

    @classmethod
    def _from_api(cls, d: Mapping[str, Any]) -> "ExecResult":
        out = _decode(d.get("stdout"), d.get("stdout_encoding"))
        err = _decode(d.get("stderr"), d.get("stderr_encoding"))
        return cls._build(d, out, err)

    @classmethod
    def _build(cls, d: Mapping[str, Any], out: bytes, err: bytes) -> "ExecResult":
        sig = d.get("signal")
        return cls(
            exit_code=int(d.get("exit_code", -1)),
            stdout=_text(out),
            stderr=_text(err),
            stdout_bytes=out,
            stderr_bytes=err,
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            timed_out=bool(d.get("timed_out", False)),
            signal=int(sig) if isinstance(sig, int) else None,
            duration_ms=int(d.get("duration_ms", 0) or 0),
        )

    def __repr__(self) -> str:
        def short(s: str) -> str:
            return repr(s if len(s) <= 80 else s[:77] + "...")

        return (f"ExecResult(exit_code={self.exit_code}, stdout={short(self.stdout)}, "
                f"stderr={short(self.stderr)}, timed_out={self.timed_out}, signal={self.signal})")


@dataclass(frozen=True)
class ExecEvent:
    """One event of :meth:`Sandbox.exec_stream`.

    Attributes:
        type: ``"stdout"``, ``"stderr"``, ``"truncated"`` (once per stream that passed
            ``max_output_bytes``: ``raw["stream"]`` names it; what followed was dropped) or
            ``"exit"`` (the last one; newer daemons may add types, which are passed on with
            ``raw`` only).
        data: The bytes of an output event.
        text: ``data`` as text (invalid UTF-8 replaced; a multi-byte character may be split
            across two events, so join ``data`` when that matters).
        result: On ``"exit"``: the whole :class:`ExecResult`, with all the output streamed.
        raw: The event as the daemon sent it.
    """

    type: str
    data: bytes = b""
    text: str = ""
    result: Optional[ExecResult] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class FileInfo:
    """A file or directory in a sandbox.

    Attributes:
        name: The last path component.
        path: The absolute path inside the sandbox.
        type: ``"file"``, ``"directory"``, ``"symlink"`` or ``"other"``.
        size: Size in bytes.
        mode: Permission bits as an octal string, e.g. ``"0644"``.
        mtime: Last modification, RFC 3339 UTC.
        target: A symlink's target, else None.
    """

    name: str
    path: str
    type: str
    size: int
    mode: str
    mtime: str
    target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def _from_api(cls, d: Mapping[str, Any]) -> "FileInfo":
        return cls(
            name=str(d.get("name", "")),
            path=str(d.get("path", "")),
            type=str(d.get("type", "other")),
            size=int(d.get("size", 0) or 0),
            mode=str(d.get("mode", "")),
            mtime=str(d.get("mtime", "")),
            target=d.get("target") if isinstance(d.get("target"), str) else None,
        )


def _mode_str(mode: Union[int, str, None]) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, bool):
        raise TypeError("mode must be an int such as 0o644 or a string such as '0644'")
    if isinstance(mode, int):
        return format(mode, "04o")
    return str(mode)


class _FilesCore:
    """File operations in one sandbox (``sbx.files``). A relative path is relative to
    ``/workspace``; every path resolves inside the sandbox, never on the host."""

    def __init__(self, sandbox: Any) -> None:
        self._sbx = sandbox

    def _path(self, leaf: str) -> str:
        return f"{self._sbx._path}/files{leaf}"

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Steps:
        return steps(getattr(self._sbx._client, method), *args, **kwargs)

    @operation
    def read(
        self,
        path: str,
        offset: Optional[int] = None,
        length: Optional[int] = None,
        *,
        max_bytes: Optional[int] = DEFAULT_READ_MAX,
    ) -> bytes:
        """Reads a file's bytes (optionally ``length`` bytes from ``offset``) into memory.

        At most ``max_bytes`` (default 100 MiB) are read: a larger answer raises
        :class:`FileTooLarge` before it is transferred, when the file's size says so. Read a
        bigger file in parts with :meth:`read_stream` or ``read(path, offset, length)``, or pass
        a larger ``max_bytes`` (``None``: no limit).

        Raises:
            NotFound: The file does not exist.
            FileError: It cannot be read (e.g. it is a directory).
            FileTooLarge: It holds more than ``max_bytes`` from ``offset`` on.
        """
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0 or None")
        want = length
        if max_bytes is not None and (length is None or length > max_bytes):
            info = yield from steps(self.stat, path)
            if info.is_file:
                left = max(0, info.size - (offset or 0))
                if length is not None:
                    left = min(left, length)
                if left > max_bytes:
                    raise self._too_large(path, info.size, max_bytes)
            # The size can change (or path be a symlink): never take more than max_bytes + 1.
            want = max_bytes + 1 if length is None else min(length, max_bytes + 1)
        resp = yield from self._call("request", "GET", self._path("/content"),
                                query={"path": path, "offset": offset, "length": want})
        data: bytes = resp.body
        if max_bytes is not None and len(data) > max_bytes:
            raise self._too_large(path, None, max_bytes)
        return data

    @staticmethod
    def _too_large(path: str, size: Optional[int], max_bytes: int) -> FileTooLarge:
        what = f"{size} bytes" if size is not None else f"more than {max_bytes} bytes"
        return FileTooLarge(
            f"{path} is {what}, more than max_bytes={max_bytes}: read it in parts with "
            f"files.read_stream(path) or files.read(path, offset, length), or pass a larger "
            f"max_bytes (None for no limit)", size=size)

    @iteration
    def read_stream(
        self,
        path: str,
        offset: int = 0,
        length: Optional[int] = None,
        *,
        chunk_size: int = PIECE_SIZE,
    ) -> Iterator[bytes]:
        """Yields a file's bytes from ``offset`` (``length`` of them, or to the end) in pieces of
        at most ``chunk_size`` bytes, each fetched as it is needed (one request per piece), so
        a file of any size can be copied without holding it in memory::

            with open("big.bin", "wb") as out:
                for piece in sbx.files.read_stream("big.bin"):
                    out.write(piece)
        """
        if chunk_size <= 0:
            raise ValueError("chunk_size must be > 0")
        if offset < 0 or (length is not None and length < 0):
            raise ValueError("offset and length must be >= 0")
        pos, left = offset, length
        while left is None or left > 0:
            n = chunk_size if left is None else min(chunk_size, left)
            resp = yield from self._call("request", "GET", self._path("/content"),
                                    query={"path": path, "offset": pos, "length": n})
            data = resp.body
            if data:
                yield Emit(data)
            if len(data) < n:  # the end of the file
                return
            pos += len(data)
            if left is not None:
                left -= len(data)

    @operation
    def read_text(
        self,
        path: str,
        encoding: str = "utf-8",
        errors: str = "strict",
        *,
        max_bytes: Optional[int] = DEFAULT_READ_MAX,
    ) -> str:
        """Reads a file and decodes it (UTF-8 unless told otherwise); ``max_bytes`` as in
        :meth:`read`."""
        data = yield from steps(self.read, path, max_bytes=max_bytes)
        return str(data.decode(encoding, errors))

    @operation
    def write(
        self,
        path: str,
        data: Union[bytes, bytearray, memoryview, str, BinaryIO],
        mode: Union[int, str, None] = None,
        parents: bool = True,
        *,
        piece_size: int = PIECE_SIZE,
    ) -> FileInfo:
        """Creates or replaces a file; missing parent directories are made unless
        ``parents=False``. ``data`` is bytes, a ``str`` (written as UTF-8) or a binary file
        object (read with ``.read(n)`` to its end, never whole). ``mode`` is an int
        (``0o755``) or an octal string (``"0755"``). Returns the new file's :class:`FileInfo`.

        Data bigger than ``piece_size`` (8 MiB) goes in pieces: the first replaces the file,
        each next one is written at its offset. If a piece fails, the error is raised and the
        file holds the pieces sent before it."""
        if piece_size <= 0:
            raise ValueError("piece_size must be > 0")
        if isinstance(data, str):
            data = data.encode("utf-8")
        view: Optional[memoryview] = None
        if isinstance(data, (bytes, bytearray, memoryview)):
            view = memoryview(data).cast("B")
        elif not hasattr(data, "read"):
            raise TypeError(
                f"data must be bytes, str or a binary file, not {type(data).__name__}")
        info: Optional[FileInfo] = None
        offset = 0
        while True:
            if view is not None:
                piece = view[offset:offset + piece_size]  # sent from the caller's buffer
            else:
                piece = self._file_piece((yield ReadPiece(data, piece_size)))
            if not piece:
                break
            info = yield from self._put(path, piece, mode if offset == 0 else None, parents,
                                        offset if info is not None else None)
            offset += len(piece)
        if info is None:  # nothing to send: an empty file
            info = yield from self._put(path, b"", mode, parents, None)
        return info

    @staticmethod
    def _file_piece(piece: Any) -> bytes:
        if piece is None:  # a non-blocking stream with nothing yet
            raise TypeError("data is a non-blocking file object; pass a blocking one")
        if isinstance(piece, str):
            raise TypeError("data is a text file object; open it in binary mode ('rb')")
        return bytes(piece)

    def _put(self, path: str, body: Union[bytes, memoryview], mode: Union[int, str, None],
             parents: bool, offset: Optional[int]) -> Generator[Any, Any, FileInfo]:
        d = yield from self._call(
            "request_json", "PUT", self._path("/content"),
            query={"path": path, "mode": _mode_str(mode), "parents": None if parents else False,
                   "offset": offset},
            body=body, content_type="application/octet-stream")
        return FileInfo._from_api(d)

    @operation
    def list(self, path: str = "/workspace") -> List[FileInfo]:
        """Lists a directory's entries."""
        d = yield from self._call("request_json", "GET", self._path("/list"), query={"path": path})
        return [FileInfo._from_api(e) for e in d.get("entries", [])]

    @operation
    def stat(self, path: str) -> FileInfo:
        """Describes a file, directory or symlink (a final symlink is not followed).

        Raises:
            NotFound: Nothing is at ``path``.
        """
        d = yield from self._call("request_json", "GET", self._path("/stat"), query={"path": path})
        return FileInfo._from_api(d)

    @operation
    def exists(self, path: str) -> bool:
        """True when something (even a dangling symlink) is at ``path``."""
        try:
            yield from steps(self.stat, path)
            return True
        except NotFound:
            return False

    @operation
    def mkdir(self, path: str, parents: bool = True, mode: Union[int, str, None] = None) -> FileInfo:
        """Makes a directory (and, with ``parents``, its missing parents; an existing directory
        is then fine too)."""
        body: Dict[str, Any] = {"path": path, "parents": parents}
        if mode is not None:
            body["mode"] = _mode_str(mode)
        d = yield from self._call("request_json", "POST", self._path("/mkdir"), json_body=body)
        return FileInfo._from_api(d)

    @operation
    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes a file, a symlink or an empty directory; a non-empty directory only with
        ``recursive=True``."""
        yield from self._call("request", "DELETE", self._path(""),
                         query={"path": path, "recursive": True if recursive else None})

@sync_face
class Files(_FilesCore):
    """File operations in one sandbox (``sbx.files``). A relative path is relative to
    ``/workspace``; every path resolves inside the sandbox, never on the host."""

    def upload_dir(self, local: str, remote: str, *,
                   piece_size: int = PIECE_SIZE) -> "_archive.DirTransfer":
        """Copies the contents of the local directory ``local`` into ``remote`` in the sandbox
        (made, with its parents, if missing; what it holds already stays, and an entry replaces
        only what has its own name). Kept: directories, files, symlinks (as symlinks, never
        followed), permission bits (not setuid/setgid) and mtimes; a hard-linked file is copied
        once per name; devices, FIFOs and sockets are skipped and named in the result's
        ``skipped``. The tree goes as a tar stream, in pieces of ``piece_size`` bytes to a
        staging file in the sandbox's ``/tmp``, which the sandbox then extracts and removes::

            sbx.files.upload_dir("./project", "/workspace/project")

        Raises:
            NotADirectoryError: ``local`` is not a directory.
            FileError: The extraction failed in the sandbox (e.g. ``remote`` is a file).
        """
        return _archive.upload_dir(self, local, remote, piece_size)

    def download_dir(self, remote: str, local: str, *,
                     max_bytes: Optional[int] = _archive.DEFAULT_MAX_BYTES,
                     max_entries: Optional[int] = _archive.DEFAULT_MAX_ENTRIES,
                     ) -> "_archive.DirTransfer":
        """Copies the contents of the directory ``remote`` in the sandbox into the local
        directory ``local`` (made if missing), as a tar stream extracted as it arrives. A final
        symlink in ``remote`` is followed; a file (or a symlink to one) lands in ``local`` under
        its own name.

        What a sandbox sends is not trusted: nothing is ever written outside ``local``, no
        symlink is followed (an entry whose path goes through one, or that is absolute or has
        a ``..`` component, raises :class:`UnsafeArchive`; what was extracted before stays),
        setuid/setgid bits are dropped, devices, FIFOs and hard links are skipped (named in the
        result's ``skipped``), and more than ``max_bytes`` of file content (default 64 GiB) or
        ``max_entries`` entries (default 1,000,000) raise :class:`FileTooLarge`.

        Raises:
            NotFound: Nothing is at ``remote``.
            UnsafeArchive: The archive tried to leave ``local``, or is malformed.
            FileTooLarge: A limit was passed.
        """
        return _archive.download_dir(self, remote, local, max_bytes, max_entries)


@async_face(Iterator="AsyncIterator")
class AsyncFiles(_FilesCore):
    """File operations in one :class:`AsyncSandbox` (``sbx.files``), as coroutines
    (``await sbx.files.read(path)``; ``read_stream`` is an async iterator). A relative path is
    relative to ``/workspace``; every path resolves inside the sandbox, never on the host.

    ``upload_dir`` and ``download_dir`` are the sync ones run in a thread (on a blocking twin
    of the sandbox's client), so the event loop runs on while a tree is packed, sent, received
    and extracted; they take the same arguments, make the same checks and give the same
    :class:`DirTransfer`. A cancelled call stops waiting at once; its thread finishes the piece
    it is sending or the archive it is reading."""

    def _sync_files(self) -> Files:
        return Sandbox(self._sbx._info, self._sbx._client._sync_twin()).files

    async def upload_dir(self, local: str, remote: str, *,
                         piece_size: int = PIECE_SIZE) -> "_archive.DirTransfer":
        """:meth:`Files.upload_dir`, without blocking the event loop."""
        run = functools.partial(self._sync_files().upload_dir, local, remote,
                                piece_size=piece_size)
        return await asyncio.get_running_loop().run_in_executor(None, run)

    async def download_dir(self, remote: str, local: str, *,
                           max_bytes: Optional[int] = _archive.DEFAULT_MAX_BYTES,
                           max_entries: Optional[int] = _archive.DEFAULT_MAX_ENTRIES,
                           ) -> "_archive.DirTransfer":
        """:meth:`Files.download_dir`, without blocking the event loop."""
        run = functools.partial(self._sync_files().download_dir, remote, local,
                                max_bytes=max_bytes, max_entries=max_entries)
        return await asyncio.get_running_loop().run_in_executor(None, run)


@dataclass(frozen=True)
class CreateProgress:
    """How a :meth:`Sandbox.create` is going (its ``on_progress`` callback gets these)."""

    stage: str  #: "requesting", then "running" or "failed"
    elapsed_seconds: float  #: since the create began
    sandbox_id: Optional[str] = None  #: once running
    error: Optional[BaseException] = None  #: when failed


def _progress(cb: Optional[Callable[[CreateProgress], Any]], stage: str, t0: float,
              **kw: Any) -> None:
    if cb is None:
        return
    try:
        cb(CreateProgress(stage=stage, elapsed_seconds=time.monotonic() - t0, **kw))
    except Exception:  # a progress display must never lose the sandbox
        pass


class _SandboxCore:
    """A sandbox on a withruntime daemon. Get one with :meth:`create`, :meth:`connect` or
    :meth:`list`; as a context manager it ends its lease when the block is left (see
    :meth:`__exit__`).

    The attributes (``state``, ``image``, ``timeout_seconds``, ...) are as of the last answer
    from the daemon; :meth:`refresh` asks again.
    """

    # set by each face
    _client_cls: Any = None
    _files_cls: Any = None
    _command_cls: Any = None
    _terminal_cls: Any = None

    def __init__(self, info: Mapping[str, Any], client: Any) -> None:
        if not isinstance(client, self._client_cls):
            raise TypeError(f"{type(self).__name__} needs a {self._client_cls.__name__}, not "
                            f"{type(client).__name__}")
        self._client = client
        self._owns_client = False
        self._info: Dict[str, Any] = dict(info)
        self.id: str = str(info["id"])
        self._path = "/v1/sandboxes/" + quote(self.id, safe="")
        self.files = self._files_cls(self)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Steps:
        return steps(getattr(self._client, method), *args, **kwargs)

    # ---- getting one ----

    @class_context_operation
    def create(
        cls,
        *,
        image: Optional[str] = None,
        cpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[int] = None,
        on_lease_end: Optional[str] = None,
        network: Optional[Mapping[str, Any]] = None,
        secrets: Optional[Sequence[str]] = None,
        max_cost_micros: Optional[int] = None,
        client: Optional[Client] = None,
        on_progress: Optional[Callable[["CreateProgress"], Any]] = None,
        **options: Any,
    ) -> "Sandbox":
        """Creates a sandbox and returns it running. Options left out (or None) take the
        daemon's defaults.

        Args:
            image: The image to start from (default ``"default"``).
            cpus: vCPUs (default 2).
            memory_mib: Memory limit in MiB (default 4096).
            disk_mib: Quota on the sandbox's writable layer in MiB (default 10240).
            env: Environment of every command run in it.
            metadata: Your own string labels, stored and returned.
            timeout_seconds: The lease: seconds until ``on_lease_end`` happens (default 3600).
            on_lease_end: ``"stop"`` (keep the files) or ``"delete"``, when the lease ends or
                the ``with`` block is left.
            network: The egress policy, e.g. ``{"internet": True, "allow": ["pypi.org"]}``,
                enforced by the host (default: no network, DNS included). Stored and returned
                normalised (``internet`` always, ``allow`` and ``deny`` only when given).
            secrets: Names of secrets (``withruntime secrets set``) to give it: each name is
                set in its commands' environment to a placeholder that the daemon's proxy
                replaces by the real value in the ``Authorization`` header (and those the
                secret declares) of HTTPS requests to the secret's hosts. With a key, only
                secrets the admin granted to it; any other raises :class:`NotFound`.
            max_cost_micros: A cost cap in micro-dollars: when the sandbox's cost reaches it,
                the daemon stops it (files kept) and later execs raise :class:`CostLimit`. Its
                ``cost_micros`` so far is in :attr:`info` (after :meth:`refresh`).
            client: The daemon to use (default: found from the environment).
            on_progress: Called with a :class:`CreateProgress` as the create goes: ``stage``
                ``"requesting"`` when the request is sent, then ``"running"`` (with the
                sandbox's id) or ``"failed"`` (with the error), each with the seconds since the
                start. Called on the caller's thread (or event loop): keep it quick. What it
                raises is ignored, so a broken progress display never loses a sandbox.
            **options: Any other field of ``POST /v1/sandboxes``, passed through as is: a field
                the daemon does not know is answered with :class:`InvalidRequest` naming it.

        Raises:
            InvalidRequest: An option is unknown or out of range.
            ServerError: The daemon could not create the sandbox.
            DaemonUnavailable: The daemon cannot be reached.
        """
        body: Dict[str, Any] = {
            "image": image,
            "cpus": cpus,
            "memory_mib": memory_mib,
            "disk_mib": disk_mib,
            "env": dict(env) if env is not None else None,
            "metadata": dict(metadata) if metadata is not None else None,
            "timeout_seconds": timeout_seconds,
            "on_lease_end": on_lease_end,
            "network": network,
            "secrets": list(secrets) if secrets else None,
            "max_cost_micros": max_cost_micros,
        }
        body.update(options)
        body = {k: v for k, v in body.items() if v is not None}
        c = client if client is not None else cls._client_cls()
        t0 = time.monotonic()
        _progress(on_progress, "requesting", t0)
        try:
            info = yield from steps(c.request_json, "POST", "/v1/sandboxes", json_body=body)
        except BaseException as e:
            _progress(on_progress, "failed", t0, error=e)
            raise
        sbx = cls(info, c)
        sbx._owns_client = client is None
        _progress(on_progress, "running", t0, sandbox_id=sbx.id)
        return sbx

    @class_context_operation
    def connect(cls, sandbox_id: str, *, client: Optional[Client] = None) -> "Sandbox":
        """Returns the existing sandbox ``sandbox_id``.

        Raises:
            NotFound: There is no such sandbox.
        """
        c = client if client is not None else cls._client_cls()
        sbx = cls({"id": sandbox_id}, c)
        sbx._owns_client = client is None
        yield from steps(sbx.refresh)
        return sbx

    @class_operation
    def list(cls, *, metadata: Optional[Mapping[str, str]] = None, state: Optional[str] = None,
             client: Optional[Client] = None) -> List["Sandbox"]:
        """Every sandbox the daemon has (that this key may see), oldest first.

        Args:
            metadata: Only those whose metadata holds every one of these pairs, e.g.
                ``{"team": "blue"}``.
            state: Only those in this state (``"running"``, ``"stopped"``, ...).
        """
        c = client if client is not None else cls._client_cls()
        query: Dict[str, str] = {}
        if metadata:
            query["metadata"] = urlencode(dict(metadata))
        if state is not None:
            query["state"] = state
        d = yield from steps(c.request_json, "GET", "/v1/sandboxes", query=query or None)
        return [cls(info, c) for info in d.get("sandboxes", [])]

    # ---- what it is ----

    @property
    def client(self) -> Any:
        return self._client

    @property
    def info(self) -> Dict[str, Any]:
        """The daemon's last description of the sandbox (a copy)."""
        return dict(self._info)

    @property
    def state(self) -> str:
        """``creating``, ``running``, ``stopping``, ``stopped``, ``starting``, ``failed`` or
        ``deleting`` (or ``deleted`` after :meth:`delete`); see docs/lifecycle.md."""
        return str(self._info.get("state", "unknown"))

    @property
    def state_reason(self) -> Optional[str]:
        """Why a stopped or failed sandbox is so (e.g. ``lease_ended``, ``user``)."""
        return self._info.get("state_reason")

    @property
    def image(self) -> Optional[str]:
        return self._info.get("image")

    @property
    def cpus(self) -> Optional[int]:
        return self._info.get("cpus")

    @property
    def memory_mib(self) -> Optional[int]:
        return self._info.get("memory_mib")

    @property
    def env(self) -> Dict[str, str]:
        return dict(self._info.get("env") or {})

    @property
    def metadata(self) -> Dict[str, str]:
        return dict(self._info.get("metadata") or {})

    @property
    def timeout_seconds(self) -> Optional[int]:
        return self._info.get("timeout_seconds")

    @property
    def on_lease_end(self) -> str:
        return str(self._info.get("on_lease_end") or "stop")

    @property
    def network(self) -> Dict[str, Any]:
        return dict(self._info.get("network") or {})

    @property
    def created_at(self) -> Optional[str]:
        return self._info.get("created_at")

    @property
    def lease_ends_at(self) -> Optional[str]:
        return self._info.get("lease_ends_at")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.state!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _SandboxCore) and other._face == self._face
                and other.id == self.id and other._client.url == self._client.url)

    def __hash__(self) -> int:
        return hash(self.id)

    # ---- lifecycle ----

    def _update(self, info: Any) -> Any:
        if isinstance(info, dict) and info.get("id") == self.id:
            self._info = dict(info)
        return self

    @operation
    def refresh(self) -> "Sandbox":
        """Asks the daemon for the sandbox's current state and settings; returns self."""
        return self._update((yield from self._call("request_json", "GET", self._path)))

    @operation
    def stop(self) -> "Sandbox":
        """Stops the sandbox; its files stay (``start`` brings it back). Stopping a stopped
        sandbox is fine."""
        return self._update((yield from self._call("request_json", "POST", self._path + "/stop")))

    @operation
    def start(self) -> "Sandbox":
        """Starts a stopped sandbox again, with the files it had, and a fresh lease."""
        return self._update((yield from self._call("request_json", "POST", self._path + "/start")))

    @operation
    def set_timeout(self, seconds: int) -> "Sandbox":
        """Sets the lease to end ``seconds`` from now (and become its length)."""
        return self._update((yield from self._call(
            "request_json", "POST", self._path + "/timeout",
            json_body={"timeout_seconds": seconds})))

    @operation
    def set_network(self, network: Mapping[str, Any]) -> "Sandbox":
        """Replaces the egress policy, e.g. ``{"internet": True, "allow": ["pypi.org"]}``
        (``"deny"`` entries win over ``"allow"``); new connections follow it at once. A bad
        entry raises :class:`InvalidRequest` naming it. ``self.network`` is the policy as the
        daemon keeps it (normalised). The host enforces it: DNS answers only allowed names,
        and every connection goes through the daemon's egress proxy, which checks the TLS
        server name or the HTTP ``Host`` of each request."""
        return self._update((yield from self._call(
            "request_json", "PUT", self._path + "/network", json_body=dict(network))))

    @operation
    def network_log(self) -> List[Dict[str, Any]]:
        """The sandbox's recent denied lookups and connections, oldest first:
        ``{"time", "via" ("dns" or "proxy"), "host", "port", "reason"}``. The daemon keeps the
        last 200."""
        d = yield from self._call("request_json", "GET", self._path + "/network/log")
        return list(d.get("entries", []))

    @operation
    def delete(self) -> None:
        """Deletes the sandbox and everything in it."""
        yield from self._call("request_json", "DELETE", self._path)
        info = dict(self._info)
        info["state"] = "deleted"
        self._info = info

    @operation
    def events(self) -> List[Dict[str, Any]]:
        """The sandbox's history, oldest first: ``{"at", "type", "state", "reason"}``."""
        d = yield from self._call("request_json", "GET", self._path + "/events")
        return list(d.get("events", []))

    @operation
    def end_lease(self) -> None:
        """Does what ``on_lease_end`` says now: stop (the default) or delete. A sandbox that is
        already gone is fine."""
        try:
            if self.on_lease_end == "delete":
                yield from steps(self.delete)
            else:
                yield from steps(self.stop)
        except NotFound:
            pass

    @staticmethod
    def _note_exit_failure(sandbox_id: str, exc: Optional[BaseException],
                           error: WithruntimeError) -> None:
        """Ending the lease on leaving a block failed: raised when the block did not raise, else
        added as a note to the block's own exception (which is the one that propagates)."""
        if exc is None:
            raise error
        if hasattr(exc, "add_note"):
            exc.add_note(f"withruntime: also, ending the lease of {sandbox_id} failed: {error}")

    @operation
    def stats(self) -> Dict[str, Any]:
        """Resource use measured on the host since the sandbox last started: ``cpu_usec``,
        ``memory_bytes``, ``pids``, ``oom_kills``."""
        d: Dict[str, Any] = yield from self._call("request_json", "GET", self._path + "/stats")
        return d

    # ---- commands ----

    @operation
    def exec_background(
        self,
        command: Union[str, Sequence[str]],
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout_seconds: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
    ) -> "Command":
        """Starts a command and returns at once with a handle to it. It runs until it exits,
        is killed, or the sandbox stops (no timeout unless ``timeout_seconds`` is given); its
        output is kept up to ``max_output_bytes`` per stream (default 1 MiB). Arguments as for
        :meth:`exec`.

        Raises:
            Conflict: The sandbox is not running, or has too many commands running.
        """
        body = self._exec_body(command, cwd, env, stdin, timeout_seconds, max_output_bytes)
        body["background"] = True
        d = yield from self._call("request_json", "POST", self._path + "/exec", json_body=body)
        return self._command_cls(self, d)

    @operation
    def commands(self) -> List["Command"]:
        """The sandbox's background commands, oldest first."""
        d = yield from self._call("request_json", "GET", self._path + "/commands")
        return [self._command_cls(self, c) for c in d.get("commands", [])]

    @operation
    def command(self, command_id: str) -> "Command":
        """The background command ``command_id``.

        Raises:
            NotFound: There is no such command.
        """
        d = yield from self._call("request_json", "GET",
                             f"{self._path}/commands/{quote(command_id, safe='')}")
        return self._command_cls(self, d)

    # ---- interactive sessions ----

    @context_operation
    def terminal(
        self,
        command: Union[str, Sequence[str], None] = None,
        *,
        rows: int = 24,
        cols: int = 80,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        tty: bool = True,
    ) -> "Terminal":
        """Starts an interactive session and connects to it (a WebSocket on the client's own
        connection): a :class:`Terminal` to send input to and read output from.

        Args:
            command: A string for ``/bin/sh -c``, a list of strings run directly, or None for a
                login shell (bash where there is one).
            rows: The terminal's height (1..10000).
            cols: The terminal's width (1..10000).
            env: More environment variables for the command.
            cwd: Its working directory (default ``/workspace``).
            tty: True gives it a pseudo-terminal (``TERM=xterm-256color``); False gives it
                pipes, its stdout and stderr both arriving as output, and ``eof()`` closing its
                stdin.

        Raises:
            AuthError: A read-only key.
            Conflict: The sandbox is not running, or runs 16 sessions already.
        """
        body: Dict[str, Any] = {"tty": bool(tty), "rows": rows, "cols": cols}
        if isinstance(command, str):
            body["command"] = command
        elif isinstance(command, (bytes, bytearray)):
            raise TypeError("command must be a str (run by /bin/sh -c) or a list of str (argv)")
        elif command is not None:
            body["argv"] = [str(a) for a in command]
        if env is not None:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        info = yield from self._call("request_json", "POST", self._path + "/sessions",
                                     json_body=body)
        path = f"{self._path}/sessions/{quote(str(info['id']), safe='')}"
        try:
            io = yield Call(self._client, "_ws_open", self._client._target(path + "/connect", None),
                            self._client.timeout)
        except Exception:
            try:  # no one will connect to it: end it now rather than after its grace period
                yield from self._call("request", "DELETE", path)
            except WithruntimeError:
                pass
            raise
        return self._terminal_cls(self, info, io)

    @operation
    def sessions(self) -> List[Dict[str, Any]]:
        """The sandbox's interactive sessions, oldest first: the running ones and the 16 newest
        that ended, each ``{"id", "argv", "state", "tty", "rows", "cols", "connected",
        "created_at", "ended_at", "exit_code", "signal"}`` (see docs/api.md, Sessions)."""
        d = yield from self._call("request_json", "GET", self._path + "/sessions")
        return list(d.get("sessions", []))

    @staticmethod
    def _exec_body(
        command: Union[str, Sequence[str]],
        cwd: Optional[str],
        env: Optional[Mapping[str, str]],
        stdin: Union[str, bytes, None],
        timeout_seconds: Optional[float],
        max_output_bytes: Optional[int],
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {}
        if isinstance(command, str):
            body["command"] = command
        elif isinstance(command, (bytes, bytearray)):
            raise TypeError("command must be a str (run by /bin/sh -c) or a list of str (argv)")
        else:
            argv = list(command)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise TypeError("argv must be a non-empty list of str")
            body["argv"] = argv
        if cwd is not None:
            body["cwd"] = cwd
        if env is not None:
            body["env"] = dict(env)
        if isinstance(stdin, str):
            body["stdin"] = stdin
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            body["stdin_base64"] = base64.b64encode(bytes(stdin)).decode("ascii")
        elif stdin is not None:
            raise TypeError("stdin must be str or bytes")
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        if max_output_bytes is not None:
            body["max_output_bytes"] = max_output_bytes
        return body

    @staticmethod
    def _http_timeout(timeout_seconds: Optional[float]) -> float:
        t = timeout_seconds if isinstance(timeout_seconds, (int, float)) and timeout_seconds > 0 \
            else _DEFAULT_EXEC_TIMEOUT
        return float(t) + _EXEC_MARGIN

    @operation
    def exec(
        self,
        command: Union[str, Sequence[str]],
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout_seconds: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
    ) -> ExecResult:
        """Runs a command and waits for it. A non-zero exit is a result, not an exception.

        Args:
            command: A string, run by ``/bin/sh -c``; or a list of strings, run directly
                (looked up in ``PATH``).
            cwd: Working directory (default ``/workspace``).
            env: Variables added over the sandbox's own ``env``.
            stdin: Fed to the command, then closed (default: ``/dev/null``).
            timeout_seconds: Kill the whole process tree after this long (default 300).
            max_output_bytes: Keep at most this many bytes of each stream (default 1 MiB).

        Raises:
            ExecFailed: The command could not start (not found, bad ``cwd``).
            Conflict: The sandbox is not running.
        """
        body = self._exec_body(command, cwd, env, stdin, timeout_seconds, max_output_bytes)
        d = yield from self._call("request_json", "POST", self._path + "/exec", json_body=body,
                             timeout=self._http_timeout(timeout_seconds))
        return ExecResult._from_api(d)

    @iteration
    def exec_stream(
        self,
        command: Union[str, Sequence[str]],
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout_seconds: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
    ) -> Iterator[ExecEvent]:
        """Runs a command and yields its output as it is produced: ``stdout`` and ``stderr``
        events, then one ``exit`` event whose ``result`` holds everything. Arguments as for
        :meth:`exec`. Leaving the loop early closes the connection (the daemon then kills the
        command).

        Raises:
            ExecFailed: The command could not start.
            SandboxError: The sandbox failed while the command ran.
        """
        body = self._exec_body(command, cwd, env, stdin, timeout_seconds, max_output_bytes)
        body["stream"] = True
        return self._stream(body, self._http_timeout(timeout_seconds))

    def _stream(self, body: Dict[str, Any], timeout: float) -> Generator[Any, Any, None]:
        out = bytearray()
        err = bytearray()
        lines = yield Call(self._client, "stream_ndjson", "POST", self._path + "/exec",
                           json_body=body, timeout=timeout)
        while True:
            ev = yield NextLine(lines)
            if ev is None:
                return
            kind = ev.get("type")
            if kind in ("stdout", "stderr"):
                data = _decode(ev.get("data"), ev.get("encoding"))
                (out if kind == "stdout" else err).extend(data)
                yield Emit(ExecEvent(type=kind, data=data, text=_text(data), raw=ev))
            elif kind == "exit":
                result = ExecResult._build(ev, bytes(out), bytes(err))
                yield Emit(ExecEvent(type="exit", result=result, raw=ev))
                return
            elif kind == "error":
                raise error_from_response(None, ev)
            else:
                yield Emit(ExecEvent(type=str(kind), raw=ev))


@sync_face
class Sandbox(_SandboxCore):
    """A sandbox on a withruntime daemon. Get one with :meth:`create`, :meth:`connect` or
    :meth:`list`; as a context manager it ends its lease when the block is left (see
    :meth:`__exit__`).

    The attributes (``state``, ``image``, ``timeout_seconds``, ...) are as of the last answer
    from the daemon; :meth:`refresh` asks again.
    """

    _client_cls = Client
    _files_cls = Files
    files: Files

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Ends the lease as ``on_lease_end`` says, also when the block raised (if ending it
        fails too, the block's own exception is the one that propagates); then closes the kept
        connections of the client the sandbox made for itself (none was given)."""
        try:
            self.end_lease()
        except WithruntimeError as e:
            self._note_exit_failure(self.id, exc, e)
        finally:
            if self._owns_client:
                self._client.close()


@async_face(Sandbox="AsyncSandbox", Command="AsyncCommand", Client="AsyncClient",
            Iterator="AsyncIterator", Terminal="AsyncTerminal")
class AsyncSandbox(_SandboxCore):
    """A sandbox on a withruntime daemon, for asyncio: the same as :class:`Sandbox` with every
    call a coroutine (``await AsyncSandbox.create()``, ``await sbx.exec(...)``,
    ``await sbx.files.read(...)``) and ``exec_stream`` an async iterator. ``create`` and
    ``connect`` may also be used directly in ``async with``
    (``async with AsyncSandbox.create() as sbx:``). Its
    :class:`AsyncClient` keeps connections open between calls (a bounded pool per event loop),
    and any number of calls may run at once (``asyncio.gather``). As an ``async with`` block
    it ends its lease when the block is left (see :meth:`__aexit__`).
    """

    _client_cls = AsyncClient
    _files_cls = AsyncFiles
    files: AsyncFiles

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Ends the lease as ``on_lease_end`` says, also when the block raised (if ending it
        fails too, the block's own exception is the one that propagates); then closes the idle
        connections of the client the sandbox made for itself (none was given)."""
        try:
            await self.end_lease()
        except WithruntimeError as e:
            self._note_exit_failure(self.id, exc, e)
        finally:
            if self._owns_client:
                await self._client.aclose()


@dataclass
class CommandOutput:
    """Output of a background command from given offsets; pass ``stdout_next_offset`` and
    ``stderr_next_offset`` to :meth:`Command.output` next time to get only what is new. A
    background command keeps the tail of its output (the last ``max_output_bytes``, at most
    1 MiB): ``stdout_offset``/``stderr_offset`` say where the returned bytes start, later than
    asked if older bytes were dropped."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_next_offset: int
    stderr_next_offset: int
    stdout_offset: int = 0
    stderr_offset: int = 0

    @property
    def stdout(self) -> str:
        return _text(self.stdout_bytes)

    @property
    def stderr(self) -> str:
        return _text(self.stderr_bytes)


class _CommandCore:
    """A background command started with :meth:`Sandbox.exec_background`."""

    def __init__(self, sandbox: Any, info: Mapping[str, Any]) -> None:
        self._sandbox = sandbox
        self._info: Dict[str, Any] = dict(info)
        self.id: str = str(info["id"])

    @property
    def _path(self) -> str:
        return f"{self._sandbox._path}/commands/{quote(self.id, safe='')}"

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Steps:
        return steps(getattr(self._sandbox._client, method), *args, **kwargs)

    @property
    def info(self) -> Dict[str, Any]:
        """The daemon's last answer about this command."""
        return dict(self._info)

    @property
    def state(self) -> str:
        """``running``, ``exited`` or ``failed`` (as of the last call)."""
        return str(self._info.get("state"))

    @property
    def exit_code(self) -> Optional[int]:
        """The exit status once exited (-1 if a signal ended it), else None."""
        v = self._info.get("exit_code")
        return int(v) if v is not None else None

    @property
    def signal(self) -> Optional[int]:
        v = self._info.get("signal")
        return int(v) if v is not None else None

    @property
    def error(self) -> Optional[str]:
        """Why it failed (it could not start, or the sandbox stopped under it)."""
        v = self._info.get("error")
        return str(v) if v is not None else None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(id={self.id!r}, state={self.state!r}, "
                f"exit_code={self.exit_code!r})")

    def _set(self, info: Any) -> Any:
        self._info = info
        return self

    @operation
    def refresh(self) -> "Command":
        """Asks the daemon for the command's current state."""
        return self._set((yield from self._call("request_json", "GET", self._path)))

    @operation
    def output(self, stdout_offset: int = 0, stderr_offset: int = 0) -> CommandOutput:
        """Its output so far, from the given offsets (bytes)."""
        d = yield from self._call(
            "request_json", "GET", self._path + "/output",
            query={"stdout_offset": int(stdout_offset), "stderr_offset": int(stderr_offset)})
        self._info = {k: v for k, v in d.items()
                      if not k.startswith(("stdout", "stderr")) or k.endswith(("_bytes",
                                                                                 "_truncated"))}
        return CommandOutput(
            stdout_bytes=_decode(d.get("stdout"), d.get("stdout_encoding")),
            stderr_bytes=_decode(d.get("stderr"), d.get("stderr_encoding")),
            stdout_next_offset=int(d.get("stdout_next_offset", 0)),
            stderr_next_offset=int(d.get("stderr_next_offset", 0)),
            stdout_offset=int(d.get("stdout_offset", 0)),
            stderr_offset=int(d.get("stderr_offset", 0)))

    @operation
    def wait(self, timeout_seconds: float = 30) -> "Command":
        """Waits until the command ends, or ``timeout_seconds`` pass (then it is still
        ``running``: check :attr:`state`)."""
        return self._set((yield from self._call(
            "request_json", "POST", self._path + "/wait",
            json_body={"timeout_seconds": timeout_seconds},
            timeout=float(timeout_seconds) + _EXEC_MARGIN)))

    @operation
    def send_signal(self, sig: Union[int, str] = "TERM") -> "Command":
        """Sends a signal (a number, or a name like ``"TERM"`` or ``"KILL"``) to the command's
        whole process tree.

        Raises:
            Conflict: It is not running.
        """
        return self._set((yield from self._call(
            "request_json", "POST", self._path + "/signal", json_body={"signal": sig})))

    @operation
    def kill(self) -> "Command":
        """Sends SIGKILL to the command's whole process tree."""
        return (yield from steps(self.send_signal, "KILL"))


@sync_face
class Command(_CommandCore):
    """A background command started with :meth:`Sandbox.exec_background`."""

    def __init__(self, sandbox: Sandbox, info: Mapping[str, Any]) -> None:
        super().__init__(sandbox, info)


@async_face(Command="AsyncCommand")
class AsyncCommand(_CommandCore):
    """A background command started with :meth:`AsyncSandbox.exec_background`: the same as
    :class:`Command`, every call a coroutine (``await cmd.wait()``)."""

    def __init__(self, sandbox: AsyncSandbox, info: Mapping[str, Any]) -> None:
        super().__init__(sandbox, info)


Sandbox._command_cls = Command
AsyncSandbox._command_cls = AsyncCommand
Sandbox._terminal_cls = Terminal
AsyncSandbox._terminal_cls = AsyncTerminal
