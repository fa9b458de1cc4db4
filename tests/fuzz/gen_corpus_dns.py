#!/usr/bin/env python3
"""Writes the seed corpora for tests/fuzz/fuzz_dns_query.c and fuzz_dns_answer.c into
tests/fuzz/corpus/dns_query/ and tests/fuzz/corpus/dns_answer/.

Queries are single UDP datagrams as stub resolvers, dig and hostile sandboxes send them; answers
are what an upstream resolver might return to the daemon's own query, each preceded by the
fuzz_dns_answer input prefix (a byte choosing A or AAAA, the name asked, a NUL byte). Valid and
broken ones both: the fuzzer starts from either. Built with struct by hand, following RFC 1035
and RFC 6891. Run from the repository root; the output is committed, so re-run only when the
targets' input formats change.
"""
import os
import struct
import sys

A, CNAME, TXT, AAAA, OPT, SVCB, HTTPS, TSIG = 1, 5, 16, 28, 41, 64, 65, 250


def name(dotted):
    out = b""
    for label in [l for l in dotted.split(".") if l]:
        b = label.encode("latin-1")
        out += bytes([len(b)]) + b
    return out + b"\x00"


def ptr(off):
    return struct.pack(">H", 0xC000 | off)


def header(id_, flags, qd=1, an=0, ns=0, ar=0):
    return struct.pack(">HHHHHH", id_, flags, qd, an, ns, ar)


def question(qname, qtype, qclass=1):
    return (qname if isinstance(qname, bytes) else name(qname)) + struct.pack(">HH", qtype, qclass)


def opt(size=1232, ext=0, version=0, do=False, options=b""):
    ttl = ext << 24 | version << 16 | (0x8000 if do else 0)
    return b"\x00" + struct.pack(">HHIH", OPT, size, ttl, len(options)) + options


def rr(owner, type_, rdata, ttl=300, class_=1):
    owner = owner if isinstance(owner, bytes) else name(owner)
    return owner + struct.pack(">HHIH", type_, class_, ttl, len(rdata)) + rdata


def queries():
    c = {}
    c["glibc-a"] = header(0xBEEF, 0x0100) + question("pypi.org", A)
    c["dig-noedns-aaaa"] = header(0x0001, 0x0120) + question("files.pythonhosted.org", AAAA)
    cookie = struct.pack(">HH", 10, 8) + bytes(range(1, 9))
    c["dig-edns-cookie"] = header(0x5CA1, 0x0120, ar=1) + question("pypi.org", A) + opt(
        options=cookie)
    c["edns-do-4096"] = header(7, 0x0100, ar=1) + question("a.test", A) + opt(4096, do=True)
    c["edns-padded"] = header(9, 0x0100, ar=1) + question("a.test", A) + opt(
        options=struct.pack(">HH", 12, 600) + bytes(600))
    c["edns-version-1"] = header(5, 0x0100, ar=1) + question("a.test", A) + opt(version=1)
    c["https"] = header(11, 0x0100, ar=1) + question("pypi.org", HTTPS) + opt()
    c["svcb"] = header(12, 0x0100) + question("_dns.resolver.arpa", SVCB)
    c["txt-upper"] = header(13, 0x0100) + question("WWW.Example.COM", TXT)
    c["root"] = header(14, 0x0100) + question("", 2)
    c["name-253"] = header(15, 0x0100) + question(".".join(["a" * 63] * 3 + ["a" * 61]), A)
    c["name-254"] = header(16, 0x0100) + question(".".join(["a" * 63] * 3 + ["a" * 62]), A)
    c["label-64"] = header(17, 0x0100) + question("b" * 64 + ".test", A)
    c["bad-byte"] = header(18, 0x0100) + question(b"\x03a b\x04test\x00", A)
    c["pointer-in-question"] = header(19, 0x0100) + question(b"\x01a" + ptr(12), A)
    c["qdcount-2"] = header(20, 0x0100, qd=2) + question("a.test", A) + question("b.test", A)
    c["notify"] = header(21, 0x2000) + question("a.test", 6)
    c["class-ch"] = header(22, 0x0100) + question("version.bind", TXT, 3)
    c["response"] = header(23, 0x8180) + question("a.test", A)
    c["tsig"] = header(24, 0x0100, ar=1) + question("a.test", A) + rr("key.test", TSIG, b"")
    c["truncated"] = c["dig-edns-cookie"][:30]
    c["trailing"] = c["glibc-a"] + b"\x00"
    c["short"] = b"\x12\x34\x01"
    return c


def prefix(qname, qtype):
    return bytes([0 if qtype == A else 1]) + qname.encode() + b"\x00"


def answers():
    c = {}
    q = question("www.example.test", A)
    target = 12 + len(q) + 2 + 10  # the CNAME's rdata
    cname = rr(ptr(12), CNAME, name("cdn.example.net"), 600)
    body = (cname + rr(ptr(target), A, bytes([192, 0, 2, 10]), 120)
            + rr(b"\x05other" + ptr(target + 4), A, bytes([10, 0, 0, 1]), 30)
            + rr(ptr(target), A, bytes([192, 0, 2, 11])) + opt())
    cname_msg = header(0xABCD, 0x8180, an=4, ar=1) + q + body
    c["cname-a"] = prefix("www.example.test", A) + cname_msg
    c["cname-a-tc"] = prefix("www.example.test", A) + bytes([0xAB, 0xCD, 0x83, 0x80]) + cname_msg[4:]
    c["cname-a-truncated"] = prefix("www.example.test", A) + cname_msg[:60]
    v6 = bytes.fromhex("20010db8000000000000000000000009")
    chain = (rr("c.test", CNAME, name("d.test"), 50) + rr("b.test", CNAME, name("c.test"), 40)
             + rr(ptr(12), CNAME, name("B.TEST"), 60) + rr("d.test", AAAA, v6, 70))
    c["chain-aaaa"] = prefix("a.test", AAAA) + header(1, 0x8180, an=4) + question(
        "a.test", AAAA) + chain
    loop = (rr(ptr(12), CNAME, name("b.test")) + rr("b.test", CNAME, name("a.test"))
            + rr(ptr(12), A, bytes([1, 2, 3, 4])))
    c["cname-loop"] = prefix("a.test", A) + header(2, 0x8180, an=3) + question("a.test", A) + loop
    c["nxdomain"] = prefix("gone.test", A) + header(3, 0x8183) + question("gone.test", A)
    c["refused-bare"] = prefix("a.test", A) + header(4, 0x8185, qd=0)
    c["ext-rcode"] = prefix("a.test", A) + header(5, 0x8180, ar=1) + question("a.test", A) + opt(
        ext=1)
    c["self-pointer"] = prefix("a.test", A) + header(6, 0x8180, an=1) + question(
        "a.test", A) + rr(ptr(24), A, bytes(4))
    c["forward-pointer"] = prefix("a.test", A) + header(7, 0x8180, an=1) + question(
        "a.test", A) + rr(ptr(40), A, bytes(4))
    # an owner reached through n pointers, each before the last (the rdata of a type-99 record)
    for n in (16, 17):
        m = header(8, 0x8180, an=2) + question("a.test", A) + ptr(12)
        m += struct.pack(">HHIH", 99, 1, 60, (n - 1) * 2)
        prev = 12
        for _ in range(n - 1):
            here = len(m)
            m += ptr(prev)
            prev = here
        m += rr(ptr(prev), A, bytes([1, 2, 3, 4]))
        c[f"jumps-{n}"] = prefix("a.test", A) + m
    c["bad-a-length"] = prefix("a.test", A) + header(9, 0x8180, an=1) + question("a.test", A) + rr(
        ptr(12), A, bytes(5))
    c["many-a"] = prefix("many.test", A) + header(10, 0x8180, an=20) + question(
        "many.test", A) + b"".join(rr(ptr(12), A, bytes([10, 0, 0, i])) for i in range(20))
    # the id comes from the answer itself (the target tries another id on its own); here the
    # question is another name's
    c["other-name"] = prefix("b.test", A) + header(11, 0x8180, an=1) + question("a.test", A) + rr(
        ptr(12), A, bytes(4))
    return c


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus"
    for sub, files in (("dns_query", queries()), ("dns_answer", answers())):
        out = os.path.join(root, sub)
        os.makedirs(out, exist_ok=True)
        for fname, data in sorted(files.items()):
            with open(os.path.join(out, fname + ".bin"), "wb") as f:
                f.write(data)
        print(f"wrote {len(files)} files to {out}")


if __name__ == "__main__":
    main()
