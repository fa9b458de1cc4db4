"""The client side of a WebSocket (RFC 6455), without I/O: the opening handshake's request and
the check of its answer, frames to send (masked, as a client must) and the frames and messages
parsed from the bytes received. The sync and async terminals (``_terminal``) feed it what
their sockets read and write what it gives; it never buffers more than one frame (at most
:data:`MAX_MESSAGE` bytes) and the bytes of one read beyond it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from typing import Dict, List, Mapping, Optional, Tuple

__all__ = ["ProtocolError", "handshake_request", "HandshakeReader", "check_accept", "Protocol",
           "TEXT", "BINARY", "CLOSE", "PING", "PONG", "MAX_MESSAGE", "MAX_HEAD"]

CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

# A frame or a message (all its fragments) from the daemon longer than this is refused.
MAX_MESSAGE = 1 << 20
# The handshake's answer (status line and headers) longer than this is refused.
MAX_HEAD = 64 << 10
# An error answer's body longer than this is cut.
MAX_ERROR_BODY = 64 << 10


class ProtocolError(Exception):
    """The peer broke the protocol; ``code`` is the close code to send (1002, 1007 or 1009)."""

    def __init__(self, message: str, code: int = 1002) -> None:
        super().__init__(message)
        self.code = code


def handshake_request(host: str, target: str, headers: Mapping[str, str]) -> Tuple[bytes, str]:
    """The opening handshake's request for ``target`` and the key whose accept value the answer
    must carry."""
    key = base64.b64encode(os.urandom(16)).decode("ascii")
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Version: 13", f"Sec-WebSocket-Key: {key}"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"the header {name} holds a line break or NUL")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), key


class HandshakeReader:
    """Collects the handshake's answer: :meth:`feed` returns True once the head is complete;
    then ``status``, ``headers`` and ``rest`` (the bytes after the head) are set."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.status = 0
        self.headers: Dict[str, str] = {}
        self.rest = b""

    def feed(self, data: bytes) -> bool:
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD:
                raise ProtocolError(f"a handshake answer over {MAX_HEAD} bytes")
            return False
        head = bytes(self._buf[:end]).decode("latin-1")
        self.rest = bytes(self._buf[end + 4:])
        self._buf = bytearray()
        lines = head.split("\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"a malformed status line {lines[0][:100]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"a malformed header line {line[:100]!r}")
            name = name.strip().lower()
            value = value.strip()
            self.headers[name] = f"{self.headers[name]}, {value}" if name in self.headers else value
        return True

    def body_length(self) -> Optional[int]:
        """An error answer's Content-Length (cut to :data:`MAX_ERROR_BODY`), or None."""
        cl = self.headers.get("content-length", "")
        if not cl.isdigit() or len(cl) > 18:
            return None
        return min(int(cl), MAX_ERROR_BODY)


def check_accept(headers: Mapping[str, str], key: str) -> None:
    """Checks a 101 answer's headers against the handshake's key."""
    want = base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode("ascii")
    if headers.get("upgrade", "").lower() != "websocket":
        raise ProtocolError("the answer does not upgrade to websocket")
    if "upgrade" not in headers.get("connection", "").lower():
        raise ProtocolError("the answer's Connection header is not Upgrade")
    if headers.get("sec-websocket-accept", "") != want:
        raise ProtocolError("the answer's Sec-WebSocket-Accept does not match its key")


def frame(opcode: int, payload: bytes = b"") -> bytes:
    """One final frame from the client, masked with a fresh random key."""
    n = len(payload)
    b0 = 0x80 | opcode
    if n < 126:
        head = struct.pack("!BB", b0, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", b0, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", b0, 0x80 | 127, n)
    mask = os.urandom(4)
    if n:
        # XOR with the key repeated: one big-integer operation, not a Python loop per byte
        key = (mask * (n // 4 + 1))[:n]
        payload = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
    return head + mask + payload


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode("utf-8")[:120]


class Protocol:
    """The frames received: :meth:`feed` bytes, then :meth:`next_event` until it gives None.

    Events: ``("binary", bytes)``, ``("text", str)``, ``("close", code)``. A ping is answered
    (the pong waits in :meth:`take_output`), as is the peer's close (with the same code) when
    this side has not sent its own."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._frag_op = 0
        self._frag: Optional[bytearray] = None
        self._out: List[bytes] = []
        self.close_sent = False
        self.close_received: Optional[int] = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    def wants_data(self) -> bool:
        """True when no complete frame is buffered (so reading more is what to do next)."""
        return self._frame_size() is None

    def _frame_size(self) -> Optional[Tuple[int, int]]:
        buf = self._buf
        if len(buf) < 2:
            return None
        n, p = buf[1] & 0x7F, 2
        if n == 126:
            if len(buf) < 4:
                return None
            n, p = struct.unpack_from("!H", buf, 2)[0], 4
        elif n == 127:
            if len(buf) < 10:
                return None
            n, p = struct.unpack_from("!Q", buf, 2)[0], 10
        if n > MAX_MESSAGE:
            raise ProtocolError(f"a frame of {n} bytes (the limit is {MAX_MESSAGE})", 1009)
        if buf[0] & 0x0F == CONT and self._frag is not None and len(self._frag) + n > MAX_MESSAGE:
            raise ProtocolError(f"a message over {MAX_MESSAGE} bytes", 1009)
        if len(buf) < p + n:
            return None
        return p, n

    def send_close(self, code: int = 1000) -> bytes:
        """The close frame to send (empty if one was sent already)."""
        if self.close_sent:
            return b""
        self.close_sent = True
        return frame(CLOSE, close_payload(code))

    def take_output(self) -> bytes:
        """What the protocol itself must send (pongs, the reply to a close)."""
        out = b"".join(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Optional[Tuple[str, object]]:
        while True:
            size = self._frame_size()
            if size is None:
                return None
            p, n = size
            b0, b1 = self._buf[0], self._buf[1]
            payload = bytes(self._buf[p:p + n])
            del self._buf[:p + n]
            fin, op = bool(b0 & 0x80), b0 & 0x0F
            if b0 & 0x70:
                raise ProtocolError("a frame with reserved bits set")
            if b1 & 0x80:
                raise ProtocolError("a masked frame from the server")
            if op >= 0x8:
                if not fin or n > 125:
                    raise ProtocolError("a fragmented or long control frame")
                if op == PING:
                    if not self.close_sent:
                        self._out.append(frame(PONG, payload))
                    continue
                if op == PONG:
                    continue
                if op != CLOSE:
                    raise ProtocolError(f"an unknown opcode {op}")
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.close_received = code
                if not self.close_sent:
                    self.close_sent = True
                    self._out.append(frame(CLOSE, close_payload(1000 if code == 1005 else code)))
                return ("close", code)
            if op == CONT:
                if self._frag is None:
                    raise ProtocolError("a continuation frame with no message")
                if len(self._frag) + n > MAX_MESSAGE:
                    raise ProtocolError(f"a message over {MAX_MESSAGE} bytes", 1009)
                self._frag += payload
                if not fin:
                    continue
                op, payload, self._frag = self._frag_op, bytes(self._frag), None
            elif op in (TEXT, BINARY):
                if self._frag is not None:
                    raise ProtocolError("a new message inside a fragmented one")
                if not fin:
                    self._frag_op, self._frag = op, bytearray(payload)
                    continue
            else:
                raise ProtocolError(f"an unknown opcode {op}")
            if op == TEXT:
                try:
                    return ("text", payload.decode("utf-8"))
                except UnicodeDecodeError:
                    raise ProtocolError("a text message that is not UTF-8", 1007) from None
            return ("binary", payload)
