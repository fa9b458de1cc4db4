"""Directory trees in and out of a sandbox as tar streams (``sbx.files.upload_dir`` and
``download_dir``), standard library only.

Up: the local tree is turned into a tar stream piece by piece (never whole in memory) and
written to a staging file in the sandbox in pieces of the upload limit, then extracted there by
the sandbox's agent (``POST files/extract``), which refuses entries outside the target.

Down: ``GET files/archive`` streams a tar made by the agent, extracted here as it arrives. The
archive comes from a sandbox, which may be hostile, so this module parses it itself (Python's
``tarfile`` reads a pax header or GNU long name whole into memory, whatever its size) and
extracts it itself: it never writes outside the target, never follows a symlink (one it made or
one that was there: every directory on the way is opened with ``O_NOFOLLOW`` relative to its
parent), never makes devices, FIFOs or hard links, drops setuid/setgid/sticky bits, and stops at
a size and an entry limit with a clear error.
"""

from __future__ import annotations

import errno as _errno
import http.client
import os
import secrets
import stat as _stat
import tarfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from .errors import FileError, FileTooLarge, SandboxError

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Files

__all__ = ["DirTransfer", "UnsafeArchive", "tar_pieces", "Extractor"]

BLOCK = 512
MAX_NAME = 4096
MAX_EXT = 64 << 10
MAX_DEPTH = 256
DEFAULT_MAX_BYTES = 64 << 30
DEFAULT_MAX_ENTRIES = 1_000_000
_READ = 1 << 20
_O_PATH = getattr(os, "O_PATH", 0o10000000)


class UnsafeArchive(FileError):
    """An archive entry would land outside the target (an absolute name, a ``..`` component,
    a path through a symlink), or the archive is malformed. Nothing was written outside the
    target; what was extracted before the entry stays."""

    default_code = "unsafe_archive"


@dataclass
class DirTransfer:
    """What ``upload_dir`` or ``download_dir`` moved.

    Attributes:
        path: The target directory (in the sandbox for an upload, local for a download).
        entries: Directories, files and symlinks made.
        bytes: Bytes of file content written.
        skipped: Entries not copied (devices, FIFOs, sockets, hard links), with why.
    """

    path: str
    entries: int = 0
    bytes: int = 0
    skipped: List[str] = field(default_factory=list)


# ---- writing: a local tree as a tar stream ----


def _header(ti: tarfile.TarInfo) -> bytes:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_pieces(root: str, piece_size: int, skipped: List[str]) -> Iterator[bytes]:
    """Yields a tar archive of the contents of the directory ``root`` (names relative to it) in
    pieces of ``piece_size`` bytes (the last may be shorter). Symlinks are stored as symlinks and
    never followed; every name of a hard-linked file is stored as a file; devices, FIFOs and
    sockets are skipped and named in ``skipped``. A file that changes size while it is read is
    cut or padded to the size its header gave, so the archive stays well-formed."""
    buf = bytearray()
    stack: List[Tuple[str, str]] = [(root, "")]
    while stack:
        path, rel = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name, reverse=True)
        except FileNotFoundError:
            continue
        subdirs = []
        for e in reversed(entries):
            name = rel + e.name
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            ti = tarfile.TarInfo(name)
            ti.mtime = int(st.st_mtime)
            ti.mode = st.st_mode & 0o7777
            if _stat.S_ISDIR(st.st_mode):
                if name.count("/") >= MAX_DEPTH:
                    raise FileError(f"{e.path}: more than {MAX_DEPTH} levels deep")
                ti.type = tarfile.DIRTYPE
                buf += _header(ti)
                subdirs.append((e.path, name + "/"))
            elif _stat.S_ISLNK(st.st_mode):
                ti.type = tarfile.SYMTYPE
                ti.linkname = os.readlink(e.path)
                ti.mode = 0o777
                buf += _header(ti)
            elif _stat.S_ISREG(st.st_mode):
                try:
                    fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                with os.fdopen(fd, "rb") as f:
                    size = os.fstat(fd).st_size
                    ti.size = size
                    buf += _header(ti)
                    left = size
                    while left:
                        chunk = f.read(min(left, piece_size))
                        if not chunk:  # it shrank: zeros to the size the header gave
                            chunk = bytes(min(left, piece_size))
                        buf += chunk
                        left -= len(chunk)
                        while len(buf) >= piece_size:
                            yield bytes(buf[:piece_size])
                            del buf[:piece_size]
                    buf += bytes(-size % BLOCK)
            else:
                skipped.append(f"{name}: not a file, directory or symlink")
            while len(buf) >= piece_size:
                yield bytes(buf[:piece_size])
                del buf[:piece_size]
        # depth first, in name order
        stack.extend(reversed(subdirs))
    buf += bytes(2 * BLOCK)
    while buf:
        yield bytes(buf[:piece_size])
        del buf[:piece_size]


# ---- reading: a hostile tar stream extracted under a directory ----


def _num(f: bytes, what: str, limit: int) -> int:
    if f[0] & 0x80:
        if f[0] != 0x80:
            raise UnsafeArchive(f"tar header: {what} is negative or too large")
        v = int.from_bytes(f[1:], "big")
    else:
        s = f.lstrip(b" ")
        end = len(s)
        for i, c in enumerate(s):
            if c in (0, 0x20):
                end = i
                break
        digits, rest = s[:end], s[end:]
        if rest.strip(b" \0"):
            raise UnsafeArchive(f"tar header: {what} is not an octal number")
        if digits and not all(0x30 <= c <= 0x37 for c in digits):
            raise UnsafeArchive(f"tar header: {what} is not an octal number")
        v = int(digits, 8) if digits else 0
    if v > limit:
        raise UnsafeArchive(f"tar header: {what} out of range")
    return v


def _field(f: bytes) -> bytes:
    n = f.find(b"\0")
    return f if n < 0 else f[:n]


@dataclass
class _Hdr:
    type: bytes
    name: bytes
    link: bytes
    size: int
    mode: int
    mtime: int


def parse_header(blk: bytes) -> Optional[_Hdr]:
    """One 512-byte header block, or None for the end (a zero block)."""
    if not any(blk):
        return None
    want = _num(blk[148:156], "checksum", 0o7777777)
    masked = blk[:148] + b" " * 8 + blk[156:]
    if want != sum(masked) and want != sum(b - 256 if b > 127 else b for b in masked):
        raise UnsafeArchive("tar header: bad checksum")
    h = _Hdr(type=blk[156:157], name=_field(blk[0:100]), link=_field(blk[157:257]),
             size=_num(blk[124:136], "size", 2**63 - 1),
             mode=_num(blk[100:108], "mode", 0o7777777) & 0o7777,
             mtime=_num(blk[136:148], "mtime", 2**63 - 1))
    if blk[257:263] == b"ustar\0":
        prefix = _field(blk[345:500])
        if prefix:
            h.name = prefix + b"/" + h.name
    return h


def apply_pax(data: bytes, h: _Hdr) -> None:
    """Applies pax records (path, linkpath, size, mtime) to h; raises on a malformed one."""
    pos = 0
    while pos < len(data):
        sp = data.find(b" ", pos, pos + 9)
        if sp <= pos or not data[pos:sp].isdigit():
            raise UnsafeArchive("malformed pax record")
        rlen = int(data[pos:sp])
        if rlen < sp - pos + 4 or pos + rlen > len(data) or data[pos + rlen - 1] != 0x0A:
            raise UnsafeArchive("malformed pax record")
        rec = data[sp + 1:pos + rlen - 1]
        key, eq, val = rec.partition(b"=")
        if not eq or not key:
            raise UnsafeArchive("malformed pax record")
        if key in (b"path", b"linkpath"):
            if len(val) > MAX_NAME or b"\0" in val:
                raise UnsafeArchive(f"pax {key.decode()} too long or with a NUL byte")
            if key == b"path":
                h.name = val
            else:
                h.link = val
        elif key == b"size":
            if not val.isdigit() or int(val) > 2**63 - 1:
                raise UnsafeArchive("pax size is not a number in range")
            h.size = int(val)
        elif key == b"mtime":
            whole = val.split(b".", 1)[0]
            if whole.startswith(b"-"):
                h.mtime = 0
            elif not whole.isdigit() or int(whole) > 2**63 - 1:
                raise UnsafeArchive("pax mtime is not a number in range")
            else:
                h.mtime = int(whole)
        pos += rlen


def _clean(name: bytes) -> List[bytes]:
    shown = name.decode("utf-8", "replace")[:200]
    if name.startswith(b"/"):
        raise UnsafeArchive(f"archive entry '{shown}' is an absolute path: refused",
                            errno=_errno.EPERM)
    comps = []
    for c in name.split(b"/"):
        if c in (b"", b"."):
            continue
        if c == b"..":
            raise UnsafeArchive(f"archive entry '{shown}' has a '..' component: it would land "
                                f"outside the target; refused", errno=_errno.EPERM)
        if len(c) > 255:
            raise UnsafeArchive(f"archive entry '{shown}': a name over 255 bytes")
        comps.append(c)
    if len(comps) > MAX_DEPTH:
        raise UnsafeArchive(f"archive entry '{shown}': more than {MAX_DEPTH} levels deep")
    return comps


def _open_dir(name: bytes, dir_fd: int) -> int:
    """Opens a directory relative to dir_fd, never through a symlink (OSError ELOOP)."""
    try:
        p = os.open(name, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except NotADirectoryError:
        if _stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise OSError(_errno.ELOOP, "a symlink") from None
        raise
    try:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=p)
    finally:
        os.close(p)


class Extractor:
    """Extracts a tar stream fed in pieces under the directory open at ``root_fd`` (taken)."""

    def __init__(self, root_fd: int, max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
                 max_entries: Optional[int] = DEFAULT_MAX_ENTRIES) -> None:
        self.root = root_fd
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.pending = bytearray()
        self.state = "hdr"
        self.pax: Optional[bytes] = None
        self.longname: Optional[bytes] = None
        self.longlink: Optional[bytes] = None
        self.ext_type = b""
        self.need = 0  # ext: bytes of record; data/skip: bytes of data
        self.pad = 0
        self.fd = -1
        self.h: Optional[_Hdr] = None
        self.entries = 0
        self.bytes = 0
        self.skipped: List[str] = []
        self.nskipped = 0
        self.fixups: List[Tuple[List[bytes], int, int]] = []

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.root >= 0:
            os.close(self.root)
            self.root = -1

    def __enter__(self) -> "Extractor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def feed(self, data: bytes) -> None:
        self.pending += data
        p = self.pending
        while True:
            if self.state == "end":
                p.clear()
                return
            if self.state == "hdr":
                if len(p) < BLOCK:
                    return
                blk = bytes(p[:BLOCK])
                del p[:BLOCK]
                self._on_header(blk)
            elif self.state == "ext":
                if len(p) < self.need + self.pad:
                    return
                rec = bytes(p[:self.need])
                del p[:self.need + self.pad]
                self._on_ext(rec)
                self.state = "hdr"
            elif self.state in ("data", "skip"):
                if not p:
                    return
                k = min(self.need, len(p))
                if k and self.state == "data":
                    self._write(p[:k])
                    self.bytes += k
                del p[:k]
                self.need -= k
                if self.need:
                    return
                if self.state == "data":
                    self._close_file()
                self.state = "pad" if self.pad else "hdr"
            elif self.state == "pad":
                k = min(self.pad, len(p))
                del p[:k]
                self.pad -= k
                if self.pad:
                    return
                self.state = "hdr"

    def _write(self, data: Any) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def _close_file(self) -> None:
        assert self.h is not None
        os.fchmod(self.fd, self.h.mode & 0o777)
        os.utime(self.fd, (self.h.mtime, self.h.mtime))
        os.close(self.fd)
        self.fd = -1

    def _on_ext(self, rec: bytes) -> None:
        if self.ext_type == b"x":
            apply_pax(rec, _Hdr(b"0", b"", b"", 0, 0, 0))  # checked now
            self.pax = rec
        elif self.ext_type in (b"L", b"K"):
            name = _field(rec)
            if len(name) > MAX_NAME:
                raise UnsafeArchive(f"archive: a long name over {MAX_NAME} bytes")
            if self.ext_type == b"L":
                self.longname = name
            else:
                self.longlink = name

    def _expect(self, size: int, state: str) -> None:
        self.need = size
        self.pad = -size % BLOCK
        self.state = state if size else ("pad" if self.pad else "hdr")

    def _on_header(self, blk: bytes) -> None:
        h = parse_header(blk)
        if h is None:
            self.state = "end"
            return
        t = h.type
        if t in (b"x", b"g", b"L", b"K"):
            if h.size > MAX_EXT:
                raise UnsafeArchive(f"archive: a {'pax' if t in (b'x', b'g') else 'long-name'} "
                                    f"record of {h.size} bytes (at most {MAX_EXT})")
            self.ext_type = t
            self.need, self.pad = h.size, -h.size % BLOCK
            self.state = "ext"
            return
        if self.longname is not None:
            h.name, self.longname = self.longname, None
        if self.longlink is not None:
            h.link, self.longlink = self.longlink, None
        if self.pax is not None:
            apply_pax(self.pax, h)
            self.pax = None
        self.h = h
        shown = h.name.decode("utf-8", "replace")
        if self.max_entries is not None and self.entries + self.nskipped >= self.max_entries:
            raise FileTooLarge(f"the archive has more than {self.max_entries} entries "
                               f"(max_entries)")
        isreg = t in (b"0", b"\0", b"7", b"")
        if not (isreg or t in (b"5", b"2")):
            kind = {b"1": "hard link", b"3": "device", b"4": "device", b"6": "FIFO"}.get(
                t, "unknown type")
            self.nskipped += 1
            if len(self.skipped) < 100:
                self.skipped.append(f"{shown}: {kind}, skipped")
            self._expect(0 if t in (b"1", b"2", b"3", b"4", b"5", b"6") else h.size, "skip")
            return
        if isreg and self.max_bytes is not None and h.size > self.max_bytes - self.bytes:
            raise FileTooLarge(f"the archive holds more than {self.max_bytes} bytes of files "
                               f"(max_bytes), at '{shown[:200]}'")
        comps = _clean(h.name)
        if not comps:
            if t != b"5":
                raise UnsafeArchive(f"archive entry '{shown[:200]}': a file with no name")
            self._expect(0, "skip")
            return
        parent = self._walk(comps, shown)
        try:
            leaf = comps[-1]
            self.entries += 1
            if t == b"5":
                try:
                    os.mkdir(leaf, 0o700, dir_fd=parent)
                except FileExistsError:
                    st = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
                    if not _stat.S_ISDIR(st.st_mode):
                        os.unlink(leaf, dir_fd=parent)
                        os.mkdir(leaf, 0o700, dir_fd=parent)
                self.fixups.append((comps, h.mode & 0o777, h.mtime))
                self._expect(0, "skip")
            elif t == b"2":
                if not h.link:
                    raise UnsafeArchive(f"archive entry '{shown[:200]}': a symlink to nothing")
                self._clear(parent, leaf, shown)
                os.symlink(h.link, leaf, dir_fd=parent)
                try:
                    os.utime(leaf, (h.mtime, h.mtime), dir_fd=parent, follow_symlinks=False)
                except OSError:
                    pass
                self._expect(0, "skip")
            else:
                self._clear(parent, leaf, shown)
                self.fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                                  os.O_CLOEXEC | os.O_NOCTTY, 0o600, dir_fd=parent)
                self._expect(h.size, "data")
                if self.state != "data":
                    self._close_file()
        finally:
            if parent != self.root:
                os.close(parent)

    @staticmethod
    def _clear(parent: int, leaf: bytes, shown: str) -> None:
        try:
            st = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if _stat.S_ISDIR(st.st_mode):
            raise FileError(f"archive entry '{shown[:200]}': a directory is in the way",
                            errno=_errno.EISDIR)
        os.unlink(leaf, dir_fd=parent)

    def _walk(self, comps: List[bytes], shown: str) -> int:
        cur = self.root
        try:
            for c in comps[:-1]:
                try:
                    nxt = _open_dir(c, cur)
                except FileNotFoundError:
                    try:
                        os.mkdir(c, 0o755, dir_fd=cur)
                    except FileExistsError:
                        pass
                    nxt = _open_dir(c, cur)
                except OSError as e:
                    if e.errno == _errno.ELOOP:
                        raise UnsafeArchive(
                            f"archive entry '{shown[:200]}' goes through the symlink "
                            f"'{c.decode('utf-8', 'replace')}': refused",
                            errno=_errno.EPERM) from None
                    raise
                if cur != self.root:
                    os.close(cur)
                cur = nxt
            return cur
        except BaseException:
            if cur != self.root:
                os.close(cur)
            raise

    def finish(self) -> None:
        """The archive must have ended; directories then get their modes and mtimes."""
        if not (self.state == "end" or (self.state == "hdr" and not self.pending and
                                        self.pax is None and self.longname is None)):
            raise UnsafeArchive("archive: it ended in the middle of an entry")
        for comps, mode, mtime in reversed(self.fixups):
            try:
                parent = self._walk(comps, "")
            except (OSError, FileError):
                continue
            try:
                fd = _open_dir(comps[-1], parent)
            except OSError:
                continue
            finally:
                if parent != self.root:
                    os.close(parent)
            try:
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)


# ---- the two operations ----


def upload_dir(files: "Files", local: str, remote: str, piece_size: int) -> DirTransfer:
    if not os.path.isdir(local):
        raise NotADirectoryError(_errno.ENOTDIR, "not a directory", local)
    staging = f"/tmp/.withruntime-upload-{secrets.token_hex(8)}.tar"
    skipped: List[str] = []
    offset = 0
    try:
        for piece in tar_pieces(local, piece_size, skipped):
            files._sbx._client.request_json(
                "PUT", files._path("/content"),
                query={"path": staging, "mode": "0600" if offset == 0 else None,
                       "offset": offset if offset else None},
                body=piece, content_type="application/octet-stream")
            offset += len(piece)
    except BaseException:
        if offset:
            try:
                files.remove(staging)
            except Exception:  # the error being raised matters more
                pass
        raise
    d: Dict[str, Any] = files._sbx._client.request_json(
        "POST", files._path("/extract"),
        json_body={"archive": staging, "path": remote, "remove_archive": True})
    if d.get("skipped_note"):
        skipped.append(str(d["skipped_note"]))
    return DirTransfer(path=str(d.get("path", remote)), entries=int(d.get("entries", 0)),
                       bytes=int(d.get("bytes", 0)), skipped=skipped)


def extract_stream(pieces: Iterator[bytes], local: str, max_bytes: Optional[int],
                   max_entries: Optional[int]) -> DirTransfer:
    """Extracts a tar stream (an iterator of byte pieces) under the local directory ``local``
    (made if missing)."""
    os.makedirs(local, exist_ok=True)
    root = os.open(local, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    with Extractor(root, max_bytes, max_entries) as ex:
        for piece in pieces:
            ex.feed(piece)
        ex.finish()
        return DirTransfer(path=local, entries=ex.entries, bytes=ex.bytes,
                           skipped=list(ex.skipped))


def download_dir(files: "Files", remote: str, local: str, max_bytes: Optional[int],
                 max_entries: Optional[int]) -> DirTransfer:
    client = files._sbx._client
    timeout = client.timeout
    conn, resp = client._open("GET", client._target(files._path("/archive"), {"path": remote}),
                              None, None, timeout)
    try:
        if resp.status >= 400:
            raise client._error(resp.status, client._read(resp, timeout))

        def pieces() -> Iterator[bytes]:
            while True:
                try:
                    data = resp.read1(_READ) if hasattr(resp, "read1") else resp.read(_READ)
                except http.client.IncompleteRead:
                    raise SandboxError(f"the archive of {remote} was cut short (the sandbox "
                                       f"failed to read something, or the daemon went away)")
                except (OSError, http.client.HTTPException) as e:
                    raise client._unavailable(e, timeout, True) from None
                if not data:
                    return
                yield data

        return extract_stream(pieces(), local, max_bytes, max_entries)
    finally:
        conn.close()
