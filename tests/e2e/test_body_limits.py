"""Request bodies are bounded on every route (issue 8, point 1): a body over the upload limit
(8 MiB by default; docs/architecture.md "Connections and fds") is refused before it is read
whole, whether it announces its size or comes chunked, so huge bodies to a route that does not
exist, or to a JSON route, cost the daemon a bounded amount of memory."""

import socket
import threading

import conftest

from test_output import RssWatch, rss

MIB = 1024 * 1024
UPLOAD_LIMIT = 8 * MIB


def send_head(port, method, path, headers):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1",
             conftest.auth_header(port).strip()] + headers
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return s


def read_status(s):
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


def test_a_huge_content_length_is_refused_before_the_body(daemon):
    for method, path in (("POST", "/v1/sandboxes"), ("POST", "/v1/nope"),
                         ("PUT", "/v1/sandboxes/sb-x/files/content?path=/x")):
        s = send_head(daemon.port, method, path,
                      ["Content-Type: application/json", "Content-Length: 10000000000"])
        try:
            # no body sent at all: the answer cannot wait for it
            assert read_status(s) == 413, (method, path)
        finally:
            s.close()


def flood_chunked(port, path, total, sent):
    s = send_head(port, "POST", path, ["Content-Type: application/json",
                                       "Transfer-Encoding: chunked"])
    chunk = b"%x\r\n" % MIB + b"x" * MIB + b"\r\n"
    try:
        for _ in range(total // MIB):
            s.sendall(chunk)
            sent.append(MIB)
    except OSError:
        pass  # the daemon closed the connection once the body passed the limit
    finally:
        s.close()


def test_huge_chunked_bodies_cost_bounded_memory(daemon, client):
    """Six parallel 200 MB chunked bodies, to a route that does not exist and to a JSON route:
    each is cut off at the limit, and the daemon grows by about six limits, not 1.2 GB."""
    before = rss(daemon.proc.pid)
    sent = []
    with RssWatch(daemon.proc.pid) as watch:
        threads = [threading.Thread(target=flood_chunked,
                                    args=(daemon.port, "/v1/nope" if i % 2 else "/v1/sandboxes",
                                          200 * MIB, sent))
                   for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    growth = watch.peak - before
    assert growth < 6 * UPLOAD_LIMIT + 48 * MIB, f"the daemon grew by {growth / MIB:.0f} MiB"
    # each sender was cut off well before its 200 MB went through
    assert sum(sent) < 6 * 200 * MIB
    assert client.request("GET", "/v1/health").status == 200
