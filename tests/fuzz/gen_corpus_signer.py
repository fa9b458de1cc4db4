#!/usr/bin/env python3
"""Writes the seed corpus for tests/fuzz/fuzz_signer.c into tests/fuzz/corpus/signer/.

An input is a session: datagrams as the signer receives them from its client, each after a
2-byte big-endian length. A datagram is a type byte, a 4-byte big-endian request id and a payload,
as src/net/signer.h lays them out. The keys below are fixed public keys (made once with the
openssl tool); the signer takes any EC P-256 one. Run from the repository root; the output is
committed, so re-run only when the protocol changes.
"""
import os
import struct

HELLO, SIGN, CERT, ERR = 0x01, 0x02, 0x81, 0x82
MSG_MAX = 16 * 1024

P256 = bytes.fromhex(
    "3059301306072a8648ce3d020106082a8648ce3d030107034200047b534eac940f8fa6f5a39820e6690199"
    "d03b40aed5854f38a7d03afe210f451eca71b4c584b76333c3529459a1478e55136617f01a9a1264abd564"
    "213f51a20e")
P384 = bytes.fromhex(
    "3076301006072a8648ce3d020106052b81040022036200040644ac7cbeec1cd2595e82ae2e27b28c007a38"
    "42fcd264bebed770d582423b6948020bd4f4e47f5d001e790ab21091a8c24787ed69ec8c563e800a554886"
    "7336c8d2a00d71b2736c5ddda5c087a2f6647cba9b9e6d6b9b7a01030fffe86f6155")
RSA1024 = bytes.fromhex(
    "30819f300d06092a864886f70d010101050003818d0030818902818100ae5e322d46e3ec68d4dc51323019"
    "51e70d0fde32bfe25dc5f34c1723df061e47b3767d98120f8b375600588989453b5569a327daa736c9c7aa"
    "cd198df03a44ded976a63e6ca7fe913641fb8913a62ccb3c4432172e6ccbcbce1520cebd973b7ee0e951ae"
    "c1d7c1f93160ffc2ca4e276e5155aed7600e15b157abd968f78fffc90203010001")


def msg(type_, id_, payload=b""):
    if isinstance(payload, str):
        payload = payload.encode()
    return bytes([type_]) + struct.pack(">I", id_) + payload


def session(*datagrams):
    return b"".join(struct.pack(">H", len(d)) + d for d in datagrams)


def corpus():
    hello = msg(HELLO, 1, P256)
    c = {}
    c["hello-sign"] = session(hello, msg(SIGN, 2, "api.example.com"))
    c["hello-only"] = session(hello)
    c["bad-hosts"] = session(hello, *[msg(SIGN, 2 + i, h) for i, h in enumerate([
        "", "a..b", "1.2.3.4", "UPPER.example", "-x.com", "a.com.", "a,DNS:evil.com",
        "a" * 64 + ".com", ".".join(["a" * 63] * 4), "a\0b.com", "under_score.com"])],
        msg(SIGN, 20, "ok.example"))
    c["long-name"] = session(hello, msg(SIGN, 2, ".".join(["a" * 63] * 3 + ["a" * 61])))
    c["sign-max"] = session(hello, msg(SIGN, 2, "a" * (MSG_MAX - 5)))
    c["oversize"] = session(hello, msg(SIGN, 2, "a" * (MSG_MAX - 4)))
    c["sign-before-hello"] = session(msg(SIGN, 1, "api.example.com"))
    c["second-hello"] = session(hello, msg(HELLO, 2, P256))
    c["hello-p384"] = session(msg(HELLO, 1, P384))
    c["hello-rsa"] = session(msg(HELLO, 1, RSA1024))
    c["hello-garbage"] = session(msg(HELLO, 1, b"\x30\x82\xff\xff not DER"))
    c["hello-cut"] = session(msg(HELLO, 1, P256[:-10]))
    c["hello-trailing"] = session(msg(HELLO, 1, P256 + b"\0"))
    c["hello-empty"] = session(msg(HELLO, 1))
    c["short"] = session(b"\x02\0\0")
    c["empty"] = session(b"")
    c["unknown-type"] = session(hello, msg(0x7f, 2, "x"))
    # Answers, sent the wrong way: the signer refuses them, the answer parser reads them.
    c["cert-answer"] = session(msg(CERT, 2, struct.pack(">q", 1767225600) + b"\x30\x03\x02\x01\x01"))
    c["err-answer"] = session(msg(ERR, 0, "a message shorter than its header"))
    return c


def main():
    out = os.path.join("tests", "fuzz", "corpus", "signer")
    os.makedirs(out, exist_ok=True)
    for name, data in corpus().items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
