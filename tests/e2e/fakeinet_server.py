"""The fake internet's servers: run by tests/e2e/fakenet.py inside the internet namespace.

One process, one thread per listener (and per connection):
  - DNS on <dns>:53, UDP and TCP: A records from a table (names case-insensitive), NXDOMAIN
    for names not in it, an empty NOERROR answer for other types (AAAA, MX, ...) of known names.
  - HTTP on :80 and HTTPS on :443 and :8443 of every fake host's address (the second HTTPS port
    for what must tell ports apart, as a secret bound to one). A server's identity is the
    address the connection arrived at (as on the real internet): it presents that host's
    certificate whatever the SNI says, and answers as that host whatever the Host header says.
  - a package index: pypi.org/simple/ (PEP 503) and files.pythonhosted.org/packages/<file>.
  - the metadata service: HTTP on 169.254.169.254:80.
  - GET /bytes/<n> on every host (for benchmarks): n bytes (at most BYTES_MAX) with a
    Content-Length, streamed from one pseudo-random MiB repeated, never held whole.
  - a WebSocket (RFC 6455) at /ws on every host: the handshake's 101, then each frame echoed
    back unmasked until a close; /ws-refused answers a handshake 403 (and stays HTTP). Any
    other path answers a handshake as a plain GET, as a server without WebSockets would.

Usage: fakeinet_server.py CONFIG.json (written by fakenet.py). Every DNS query is appended to
config["dns_log"] and every HTTP request to config["http_log"] (JSON lines) before it is
answered, so a client that has its answer can read the log line.

Control: one JSON object per line on stdin, one answer line on stdout:
  {"op": "set_dns", "name": N, "addr": A, "ttl": T}   A: an IPv4 address, or null to remove N;
                                                   T: the answer's TTL in seconds (default 5)
The first line on stdout is "ready" once every socket listens. EOF on stdin (the test process
went away) ends the server.
"""

import base64
import hashlib
import html
import http.server
import json
import os
import random
import re
import socket
import socketserver
import ssl
import struct
import sys
import threading
import time

LOG_BODY_MAX = 64 * 1024
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
WS_FRAME_MAX = 1 << 20
BYTES_MAX = 16 * 1024 ** 3
BYTES_BLOCK = random.Random(20240501).randbytes(1 << 20)  # the same bytes every run


class Log:
    def __init__(self, path):
        self.lock = threading.Lock()
        self.f = open(path, "a", encoding="utf-8")

    def write(self, rec):
        line = json.dumps(rec, sort_keys=True) + "\n"
        with self.lock:
            self.f.write(line)
            self.f.flush()


class State:
    def __init__(self, cfg):
        self.cfg = cfg
        self.lock = threading.Lock()
        self.table = {k.lower().rstrip("."): v for k, v in cfg["dns_table"].items()}
        self.ttls = {}  # name -> TTL, for names set with one; DNS_TTL otherwise
        self.dns_log = Log(cfg["dns_log"])
        self.http_log = Log(cfg["http_log"])
        wheel = cfg["wheel"]
        with open(wheel, "rb") as f:
            self.wheel_bytes = f.read()
        self.wheel_name = os.path.basename(wheel)
        self.wheel_sha256 = hashlib.sha256(self.wheel_bytes).hexdigest()

    def lookup(self, name):
        """(address or None, TTL)"""
        with self.lock:
            return self.table.get(name), self.ttls.get(name, DNS_TTL)

    def set_dns(self, name, addr, ttl=None):
        name = name.lower().rstrip(".")
        if ttl is not None and not (isinstance(ttl, int) and 0 <= ttl < 2**31):
            raise ValueError(f"bad ttl {ttl!r}")
        with self.lock:
            self.ttls.pop(name, None)
            if addr is None:
                self.table.pop(name, None)
            else:
                socket.inet_aton(addr)
                self.table[name] = addr
                if ttl is not None:
                    self.ttls[name] = ttl


# ---------------------------------------------------------------- DNS

QTYPE_A = 1
DNS_TTL = 5  # seconds, for every answer unless set_dns gave another


def parse_query(msg):
    """(id, flags, qname as sent, qtype, qclass, end of question) or None if malformed."""
    if len(msg) < 12:
        return None
    qid, flags, qdcount = struct.unpack("!HHH", msg[:6])
    if flags & 0x8000 or qdcount != 1:
        return None
    labels, i = [], 12
    while True:
        if i >= len(msg):
            return None
        n = msg[i]
        i += 1
        if n == 0:
            break
        if n & 0xC0 or i + n > len(msg):
            return None  # no compression in a question we accept
        labels.append(msg[i:i + n].decode("latin-1"))
        i += n
    if i + 4 > len(msg):
        return None
    qtype, qclass = struct.unpack("!HH", msg[i:i + 4])
    return qid, flags, ".".join(labels), qtype, qclass, i + 4


def dns_answer(state, msg, proto, peer):
    q = parse_query(msg)
    if q is None:
        if len(msg) >= 2:  # FORMERR
            return msg[:2] + struct.pack("!HHHHH", 0x8001, 0, 0, 0, 0)
        return None
    qid, flags, qname, qtype, qclass, end = q
    name = qname.lower().rstrip(".")
    state.dns_log.write({"name": name, "type": qtype, "proto": proto, "client": peer,
                         "time": time.time()})
    addr, ttl = state.lookup(name)
    rflags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080  # QR, opcode+RD kept, AA, RA
    answers = b""
    ancount = 0
    if addr is None:
        rflags |= 3  # NXDOMAIN
    elif qtype == QTYPE_A and qclass == 1:
        answers = struct.pack("!HHHIH", 0xC00C, QTYPE_A, 1, ttl, 4) + socket.inet_aton(addr)
        ancount = 1
    header = struct.pack("!HHHHHH", qid, rflags, 1, ancount, 0, 0)
    return header + msg[12:end] + answers


def serve_dns_udp(state, sock):
    while True:
        try:
            msg, peer = sock.recvfrom(4096)
        except OSError:
            continue
        try:
            out = dns_answer(state, msg, "udp", peer[0])
            if out:
                sock.sendto(out, peer)
        except Exception as e:  # one bad packet never stops the server
            print(f"dns udp: {e!r}", file=sys.stderr, flush=True)


def recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def serve_dns_tcp_conn(state, conn, peer):
    with conn:
        conn.settimeout(10)
        try:
            while True:
                head = recv_exact(conn, 2)
                if head is None:
                    return
                msg = recv_exact(conn, struct.unpack("!H", head)[0])
                if msg is None:
                    return
                out = dns_answer(state, msg, "tcp", peer[0])
                if not out:
                    return
                conn.sendall(struct.pack("!H", len(out)) + out)
        except OSError:
            return


def serve_dns_tcp(state, sock):
    while True:
        try:
            conn, peer = sock.accept()
        except OSError:
            continue
        threading.Thread(target=serve_dns_tcp_conn, args=(state, conn, peer),
                         daemon=True).start()


# ---------------------------------------------------------------- HTTP

def ws_read_frame(rfile):
    """(opcode, payload) of the next frame from a client, or None at the end or on nonsense."""
    head = rfile.read(2)
    if len(head) < 2:
        return None
    opcode, n = head[0] & 0x0F, head[1] & 0x7F
    if n == 126:
        n = struct.unpack("!H", rfile.read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", rfile.read(8))[0]
    if n > WS_FRAME_MAX or not head[1] & 0x80:
        return None  # too big, or not masked as a client's must be
    mask = rfile.read(4)
    data = rfile.read(n)
    if len(mask) < 4 or len(data) < n:
        return None
    return opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def ws_frame(opcode, payload):
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakeinet/1"
    sys_version = ""
    # headers and body go out in separate writes: without this, Nagle and the client's
    # delayed ACK hold every small answer's body back ~40 ms
    disable_nagle_algorithm = True

    def setup(self):
        self.request.settimeout(30)
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()

    def log_message(self, fmt, *args):
        pass  # every request is in the JSON log; errors go to handle_error

    def record(self, body):
        srv = self.server
        self.server.state.http_log.write({
            "host": srv.host, "addr": srv.addr, "scheme": srv.scheme, "port": srv.port,
            "sni": getattr(self.request, "wr_sni", None),
            "method": self.command, "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "client": self.client_address[0],
            "body": body[:LOG_BODY_MAX].decode("latin-1"),
            "time": time.time(),
        })

    def read_body(self):
        n = self.headers.get("Content-Length")
        if n is not None:
            try:
                n = int(n)
            except ValueError:
                self.close_connection = True
                return b""
            return self.rfile.read(n) if n > 0 else b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return b""

    def reply(self, status, body, ctype="text/plain; charset=utf-8", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        auth = self.headers.get("Authorization")
        if auth is not None:
            self.send_header("X-Seen-Authorization", auth)
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def websocket(self):
        """The handshake's 101, then every frame echoed until a close or the end."""
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.close_connection = True  # no HTTP after it
        while True:
            frame = ws_read_frame(self.rfile)
            if frame is None:
                return
            self.wfile.write(ws_frame(*frame))
            if frame[0] == 8:
                return

    def route(self):
        st, host = self.server.state, self.server.host
        path = self.path.split("?", 1)[0]
        if self.command == "GET" and self.headers.get("Upgrade", "").lower() == "websocket":
            if path == "/ws":
                return self.websocket()
            if path == "/ws-refused":
                return self.reply(403, b"no WebSocket for you\n")
        if self.command in ("GET", "HEAD"):
            m = re.fullmatch(r"/bytes/([0-9]{1,12})", path)
            if m and int(m.group(1)) <= BYTES_MAX:
                return self.stream_bytes(int(m.group(1)))
            if host == "pypi.org" and path.startswith("/simple"):
                return self.index(path)
            if host == "files.pythonhosted.org" and path == "/packages/" + st.wheel_name:
                return self.reply(200, st.wheel_bytes, "application/octet-stream")
        self.reply(200, f"hello from {host}\n".encode())

    def stream_bytes(self, n):
        """n bytes of BYTES_BLOCK over and over, written a block at a time."""
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        if self.command == "HEAD":
            return
        view = memoryview(BYTES_BLOCK)
        while n > 0:
            k = min(n, len(view))
            self.wfile.write(view[:k])
            n -= k

    def index(self, path):
        st = self.server.state
        if path == "/simple":
            return self.reply(301, b"", extra=[("Location", "/simple/")])
        if path == "/simple/":
            body = ('<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" '
                    'content="1.0"><title>Simple index</title></head><body>\n'
                    '<a href="/simple/wr-hello/">wr-hello</a>\n</body></html>\n')
            return self.reply(200, body.encode(), "text/html; charset=utf-8")
        m = re.fullmatch(r"/simple/([^/]+)(/?)", path)
        if not m:
            return self.reply(404, b"not found\n")
        if normalize(m.group(1)) != "wr-hello":
            return self.reply(404, b"not found\n")
        if not m.group(2):
            return self.reply(301, b"", extra=[("Location", f"/simple/{m.group(1)}/")])
        url = (f"https://files.pythonhosted.org/packages/{st.wheel_name}"
               f"#sha256={st.wheel_sha256}")
        body = ('<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" '
                'content="1.0"><title>Links for wr-hello</title></head><body>\n'
                '<h1>Links for wr-hello</h1>\n'
                f'<a href="{html.escape(url)}">{html.escape(st.wheel_name)}</a><br/>\n'
                '</body></html>\n')
        self.reply(200, body.encode(), "text/html; charset=utf-8")

    def handle_any(self):
        body = self.read_body()
        self.record(body)
        self.route()


for _m in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"):
    setattr(Handler, "do_" + _m, Handler.handle_any)


class HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, state, host, addr, port, ctx=None):
        self.state, self.host, self.addr, self.port = state, host, addr, port
        self.scheme = "https" if ctx else "http"
        self.ctx = ctx
        super().__init__((addr, port), Handler)

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)  # no getfqdn(): there is no resolver here
        self.server_name, self.server_port = self.server_address[:2]

    def get_request(self):
        conn, peer = self.socket.accept()
        if self.ctx:
            # the handshake happens in the connection's thread (Handler.setup)
            conn = self.ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, peer

    def handle_error(self, request, client_address):
        e = sys.exc_info()[1]
        if isinstance(e, (ConnectionError, TimeoutError, ssl.SSLError)):
            return
        print(f"{self.scheme}://{self.host} {client_address}: {e!r}", file=sys.stderr,
              flush=True)


def tls_context(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def sni(sock, name, _ctx):
        sock.wr_sni = name.lower() if name else None

    ctx.sni_callback = sni
    return ctx


# ---------------------------------------------------------------- main

def control(state):
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req.get("op") == "set_dns":
                state.set_dns(req["name"], req.get("addr"), req.get("ttl"))
                ans = "ok"
            else:
                ans = "error: unknown op"
        except Exception as e:
            ans = f"error: {e!r}"
        sys.stdout.write(ans.replace("\n", " ") + "\n")
        sys.stdout.flush()
    os._exit(0)  # the test process went away


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    state = State(cfg)
    threads = []

    dns = cfg["dns_addr"]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((dns, 53))
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind((dns, 53))
    t.listen(64)
    threads.append(threading.Thread(target=serve_dns_udp, args=(state, u), daemon=True))
    threads.append(threading.Thread(target=serve_dns_tcp, args=(state, t), daemon=True))

    for host, h in cfg["servers"].items():
        servers = [HTTPServer(state, host, h["addr"], 80)]
        if h.get("cert"):
            for port in (443, 8443):
                servers.append(HTTPServer(state, host, h["addr"], port,
                                          tls_context(h["cert"], h["key"])))
        for s in servers:
            threads.append(threading.Thread(target=s.serve_forever, daemon=True))

    for th in threads:
        th.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    control(state)


if __name__ == "__main__":
    main()
