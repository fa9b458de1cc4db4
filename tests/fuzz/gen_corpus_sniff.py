#!/usr/bin/env python3
"""Writes the derived seed corpora for tests/fuzz/fuzz_sniff_tls.c and fuzz_sniff_http.c.

corpus/sniff_tls/ starts from real ClientHellos captured on loopback (committed as they are):
openssl-tls13.bin (`openssl s_client -servername pypi.org -alpn h2,http/1.1`),
openssl-tls12.bin (`-tls1_2 -servername files.pythonhosted.org -alpn http/1.1`),
openssl-nosni.bin (`-noservername`) and curl.bin (`curl https://pypi.org` with --resolve),
all OpenSSL 3.0. From openssl-tls13.bin this writes the shapes the fuzzer should start from:
the hello fragmented over small records, cut short, followed by other records, and broken
(a second name, a NUL in the name, lengths that overflow), plus an ECH extension.
corpus/sniff_http/ gets request heads in each target form, a chunked body followed by the next
request, and the smuggling and lookalike shapes the proxy refuses.

Run from the repository root after capturing; the output is committed, so re-run only when
the parsers' formats change.
"""
import os
import struct

TLS = "tests/fuzz/corpus/sniff_tls"
HTTP = "tests/fuzz/corpus/sniff_http"


def write(d, name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def records(msg, frag):
    out = b""
    for i in range(0, len(msg), frag):
        part = msg[i:i + frag]
        out += struct.pack(">BHH", 0x16, 0x0301, len(part)) + part
    return out


def u16(n):
    return struct.pack(">H", n)


def ext(t, data):
    return u16(t) + u16(len(data)) + data


def sni(*names, list_adj=0):
    entries = b"".join(b"\x00" + u16(len(n)) + n for n in names)
    return ext(0, u16(len(entries) + list_adj) + entries)


def hello(exts):
    body = u16(0x0303) + b"\x11" * 32 + b"\x20" + b"\x22" * 32 + u16(4) + u16(0x1301) + \
        u16(0x1302) + b"\x01\x00" + u16(len(exts)) + exts
    return b"\x01" + struct.pack(">I", len(body))[1:] + body


def tls():
    real = open(os.path.join(TLS, "openssl-tls13.bin"), "rb").read()
    msg = real[5:]
    write(TLS, "frag-1.bin", records(msg, 1))
    write(TLS, "frag-7.bin", records(msg, 7))
    write(TLS, "frag-100.bin", records(msg, 100))
    write(TLS, "cut-header.bin", real[:3])
    write(TLS, "cut-middle.bin", real[:len(real) // 2])
    write(TLS, "cut-last.bin", real[:-1])
    write(TLS, "then-ccs.bin", real + bytes.fromhex("140303000101") + bytes.fromhex("1703030005") +
          b"early")
    alpn = ext(16, u16(12) + b"\x02h2\x08http/1.1")
    write(TLS, "built-sni-alpn.bin", records(hello(sni(b"pypi.org") + alpn), 16384))
    write(TLS, "built-ech.bin", records(hello(sni(b"public.example") +
                                              ext(0xfe0d, bytes.fromhex("0000010001070000")) +
                                              alpn), 16384))
    write(TLS, "built-upper.bin", records(hello(sni(b"PyPI.ORG")), 16384))
    write(TLS, "bad-two-names.bin", records(hello(sni(b"pypi.org", b"evil.test")), 16384))
    write(TLS, "bad-nul-name.bin", records(hello(sni(b"pypi.org\x00evil.test")), 16384))
    write(TLS, "bad-list-len.bin", records(hello(sni(b"pypi.org", list_adj=1)), 16384))
    write(TLS, "bad-two-sni.bin", records(hello(sni(b"pypi.org") + sni(b"evil.test")), 16384))
    write(TLS, "bad-hs-len.bin", bytes.fromhex("1603010004") + b"\x01\xff\xff\xff")
    write(TLS, "bad-record-len.bin", bytes.fromhex("160301ffff01"))
    write(TLS, "not-tls.bin", b"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n")


def http():
    reqs = {
        "get.txt": "GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\nUser-Agent: pip/24\r\n"
                   "Accept: */*\r\n\r\n",
        "get-port.txt": "GET / HTTP/1.1\r\nHost: PyPI.org:8080\r\n\r\n",
        "absolute.txt": "GET http://pypi.org/simple/?q=1 HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
        "absolute-v6.txt": "GET http://[2001:db8::1]:8080/ HTTP/1.1\r\nHost: [2001:db8::1]:8080"
                           "\r\n\r\n",
        "connect.txt": "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n"
                       "Proxy-Connection: keep-alive\r\n\r\n",
        "options.txt": "OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "http10.txt": "GET / HTTP/1.0\r\nHost: a.test\r\n\r\n",
        "addr-host.txt": "GET / HTTP/1.1\r\nHost: 0x7f000001\r\n\r\n",
        "post-length.txt": "POST /upload HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello"
                           "GET /next HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "post-chunked.txt": "POST /upload HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
                            "\r\n5\r\nhello\r\nA;n=v\r\n0123456789\r\n0\r\nX-Sum: 1\r\n\r\n"
                            "GET /next HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "chunked-body.txt": "5\r\nhello\r\n0\r\n\r\n",
        "pipelined.txt": "GET /a HTTP/1.1\r\nHost: a.test\r\n\r\nGET /b HTTP/1.1\r\nHost: b.test"
                         "\r\n\r\n",
        "cut.txt": "GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\nAcc",
        "bad-two-hosts.txt": "GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.test\r\n\r\n",
        "bad-mismatch.txt": "GET http://evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
        "bad-userinfo.txt": "GET http://pypi.org@evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
        "bad-lookalike.txt": "GET pypi.org@evil.test HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
        "bad-connect.txt": "CONNECT evil.test:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
        "bad-cl-te.txt": "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "bad-cl-twice.txt": "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n"
                            "Content-Length: 5\r\n\r\n",
        "bad-te-gzip.txt": "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked"
                           "\r\n\r\n",
        "bad-underscore.txt": "POST / HTTP/1.1\r\nHost: a.test\r\nContent_Length: 5\r\n\r\n",
        "bad-fold.txt": "GET / HTTP/1.1\r\nHost: a.test\r\nX-A: b\r\n c\r\n\r\n",
        "bad-bare-lf.txt": "GET / HTTP/1.1\nHost: a.test\n\n",
        "bad-chunk-size.txt": "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
                              "\r\n5 \r\nhello\r\n0\r\n\r\n",
        "websocket.txt": "GET /chat HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\n"
                         "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n",
        "h2c.txt": "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                   "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
        # upstreams' answers, for sniff_http_answer
        "answer-101.txt": "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                          "Connection: Upgrade\r\n\r\n\x81\x05hello",
        "answer-length.txt": "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
                             "HTTP/1.1 204 No Content\r\n\r\n",
        "answer-chunked.txt": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n",
        "answer-interim.txt": "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200\r\n\r\nto the close",
        "answer-bad-cl.txt": "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
    }
    for name, text in reqs.items():
        write(HTTP, name, text.encode("latin-1"))
    write(HTTP, "utf8-value.txt", "GET / HTTP/1.1\r\nHost: a.test\r\nUser-Agent: café\r\n\r\n"
          .encode())


if __name__ == "__main__":
    os.makedirs(TLS, exist_ok=True)
    os.makedirs(HTTP, exist_ok=True)
    tls()
    http()
