"""The files API: content, list, stat, mkdir, remove."""

import datetime
import hashlib
import os
import socket
import uuid

import pytest

import conftest

from wrclient import output

ENOENT, EEXIST, ENOTDIR, EISDIR, ENOTEMPTY = 2, 17, 20, 21, 39


@pytest.fixture
def d(client, sandbox):
    """A fresh directory under /workspace for one test; its relative name."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    client.files("POST", sandbox, "mkdir", 200, {"path": name})
    return name


def test_big_binary_roundtrip(client, sandbox, d):
    data = os.urandom(100 * 1024 * 1024)
    # in pieces of the upload limit: the first creates the file, the rest go at their offsets
    piece = 8 << 20
    for off in range(0, len(data), piece):
        st = client.write_file(sandbox, f"{d}/blob.bin", data[off:off + piece],
                               **({"offset": off} if off else {}))
    assert st["type"] == "file"
    assert st["size"] == len(data)
    assert st["path"] == f"/workspace/{d}/blob.bin"
    assert st["name"] == "blob.bin"
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/content",
                       query={"path": f"/workspace/{d}/blob.bin"})
    assert r.status == 200
    # the answer says its size up front (not chunked) and keeps every byte
    assert r.headers.get("content-length") == str(len(data)), r.headers
    assert "transfer-encoding" not in r.headers
    back = r.body
    assert len(back) == len(data)
    assert back == data
    # and it is really there for programs inside
    r = client.exec(sandbox, f"sha256sum {d}/blob.bin")
    assert r["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
    # ranges
    assert client.read_file(sandbox, f"{d}/blob.bin", offset=1000, length=5000) == \
        data[1000:6000]
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/content",
                       query={"path": f"{d}/blob.bin", "offset": len(data) - 10, "length": 100})
    assert r.headers.get("content-length") == "10" and r.body == data[-10:]
    assert client.read_file(sandbox, f"{d}/blob.bin", offset=len(data) - 10) == data[-10:]
    assert client.read_file(sandbox, f"{d}/blob.bin", offset=len(data) - 10, length=100) == \
        data[-10:]
    assert client.read_file(sandbox, f"{d}/blob.bin", length=0) == b""
    assert client.read_file(sandbox, f"{d}/blob.bin", offset=len(data)) == b""
    assert client.read_file(sandbox, f"{d}/blob.bin", offset=len(data) + 12345) == b""


def read_response(f):
    """One response with a Content-Length from a socket's file: (status, body)."""
    status = int(f.readline().split()[1])
    length = 0
    while True:
        line = f.readline().strip()
        if not line:
            break
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    return status, f.read(length)


def test_pipelined_request_after_a_big_upload(daemon, client, sandbox, d):
    """An upload's body is pulled from the socket in big reads, never past its end: a request
    sent right behind it on the same connection is answered, and both are right."""
    data = os.urandom(8 << 20)
    auth = conftest.auth_header(daemon.port)
    path = f"/v1/sandboxes/{sandbox}/files/content?path={d}/piped.bin"
    head = (f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(data)}\r\n\r\n")
    get = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n"
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=60) as s:
        s.sendall(head.encode() + data + get.encode())
        f = s.makefile("rb")
        st1, body1 = read_response(f)
        st2, body2 = read_response(f)
    assert st1 == 200 and b'"size":8388608' in body1, body1
    assert st2 == 200 and body2 == data


def test_read_of_a_growing_file_is_its_size_when_opened(client, sandbox, d):
    """A file that grows while it is read: the answer is the size it had when opened, whole
    (its Content-Length and its body agree), never a body cut short or run long."""
    client.write_file(sandbox, f"{d}/grow", b"g" * (8 << 20))
    r = client.exec(sandbox, f"nohup sh -c 'for i in $(seq 400); do "
                             f"head -c 262144 /dev/zero >> {d}/grow; done' >/dev/null 2>&1 &")
    assert r["exit_code"] == 0
    for _ in range(3):
        r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/content",
                           query={"path": f"{d}/grow"})
        assert r.status == 200
        n = int(r.headers["content-length"])
        assert n >= 8 << 20 and len(r.body) == n
        assert r.body[:8 << 20] == b"g" * (8 << 20)
    client.exec(sandbox, f"pkill -f 'head -c 262144' ; pkill -f 'seq 400'; true")


def test_read_what_a_command_wrote(client, sandbox, d):
    client.exec(sandbox, f"printf 'made inside\\377' > {d}/in.txt")
    assert client.read_file(sandbox, f"{d}/in.txt") == b"made inside\xff"
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/content",
                       query={"path": f"{d}/in.txt"})
    assert r.headers["content-type"].startswith("application/octet-stream")


def test_write_truncates_and_empty_file(client, sandbox, d):
    client.write_file(sandbox, f"{d}/f", b"a long first version")
    client.write_file(sandbox, f"{d}/f", b"short")
    assert client.read_file(sandbox, f"{d}/f") == b"short"
    st = client.write_file(sandbox, f"{d}/f", b"")
    assert st["size"] == 0
    assert client.read_file(sandbox, f"{d}/f") == b""
    assert client.exec(sandbox, f"wc -c < {d}/f")["stdout"].strip() == "0"


def test_write_at_an_offset(client, sandbox, d):
    f = f"{d}/pieces.bin"
    # offset 0 on a missing file creates it
    st = client.write_file(sandbox, f, b"hello world", offset=0)
    assert st["size"] == 11 and st["mode"] == "0644"
    # in place: never truncated
    st = client.write_file(sandbox, f, b"WORLD", offset=6)
    assert st["size"] == 11
    assert client.read_file(sandbox, f) == b"hello WORLD"
    # at the end: the file grows
    st = client.write_file(sandbox, f, b"!!", offset=11)
    assert st["size"] == 13
    assert client.read_file(sandbox, f) == b"hello WORLD!!"
    # across the end
    client.write_file(sandbox, f, b"XYZ", offset=12)
    assert client.read_file(sandbox, f) == b"hello WORLD!XYZ"
    # an offset write keeps the file's mode unless one is given
    client.exec(sandbox, f"chmod 0751 {f}")
    assert client.write_file(sandbox, f, b"h", offset=0)["mode"] == "0751"
    assert client.write_file(sandbox, f, b"h", offset=0, mode="0640")["mode"] == "0640"
    assert client.exec(sandbox, f"stat -c %a {f}")["stdout"].strip() == "640"
    # without an offset the file is replaced (and gets the default mode) as before
    st = client.write_file(sandbox, f, b"new")
    assert st["size"] == 3 and st["mode"] == "0644"


def test_write_past_the_end_is_refused(client, sandbox, d):
    f = f"{d}/short.bin"
    client.write_file(sandbox, f, b"12345")
    r = client.files("PUT", sandbox, "content", data=b"x", path=f, offset=6)
    assert r.status == 422, r
    code, message, errno = r.error
    assert code == "file_error" and errno == 22
    assert "past the end" in message and "5 bytes" in message
    assert client.read_file(sandbox, f) == b"12345"  # untouched: no hole, no byte
    # a missing file takes offset 0 only, and is not created by a refused write
    r = client.files("PUT", sandbox, "content", data=b"x", path=f"{d}/none", offset=1)
    assert r.status == 422 and r.error[2] == 22, r
    assert "past the end" in r.error[1]
    assert client.files("GET", sandbox, "stat", path=f"{d}/none").status == 404
    # a sparse file made inside cannot be grown with a hole either
    client.exec(sandbox, f"truncate -s 1M {d}/sparse")
    r = client.files("PUT", sandbox, "content", data=b"x", path=f"{d}/sparse", offset=2 << 20)
    assert r.status == 422, r
    # bad offsets
    for bad in ("-1", "x", "9223372036854775808", "1e3"):
        r = client.files("PUT", sandbox, "content", data=b"x", path=f, offset=bad)
        assert r.status == 400 and r.error[0] == "invalid_request", (bad, r)
    assert client.read_file(sandbox, f) == b"12345"


MAX_UPLOAD = 8 << 20


def test_upload_limit_and_a_big_file_in_pieces(client, sandbox, d):
    f = f"{d}/big.bin"
    # exactly the limit works in one request
    first = os.urandom(MAX_UPLOAD)
    assert client.write_file(sandbox, f, first)["size"] == MAX_UPLOAD
    # (more is 413 before the body is read: tests/e2e/test_body_limits.py)
    # bigger files go in pieces at offsets
    second = os.urandom(MAX_UPLOAD // 2)
    st = client.write_file(sandbox, f, second, offset=MAX_UPLOAD)
    assert st["size"] == MAX_UPLOAD + len(second)
    want = hashlib.sha256(first + second).hexdigest()
    assert client.exec(sandbox, f"sha256sum {f}")["stdout"].split()[0] == want
    client.files("DELETE", sandbox, None, 200, path=f)


def test_write_mode_and_parents(client, sandbox, d):
    st = client.write_file(sandbox, f"{d}/a/b/c.txt", b"xyz")
    assert st["mode"] == "0644"
    assert st["size"] == 3
    parent = client.files("GET", sandbox, "stat", 200, path=f"{d}/a/b").json()
    assert parent["type"] == "directory"
    assert parent["mode"] == "0755"
    st = client.write_file(sandbox, f"{d}/secret.key", b"k", mode="0600")
    assert st["mode"] == "0600"
    r = client.exec(sandbox, f"stat -c %a {d}/secret.key")
    assert r["stdout"].strip() == "600"
    # parents=false with a missing parent: not found
    r = client.files("PUT", sandbox, "content", path=f"{d}/nope/x.txt", parents=False)
    assert r.status == 404, r
    assert r.error[2] == ENOENT


def test_read_missing_is_404(client, sandbox, d):
    r = client.files("GET", sandbox, "content", path=f"{d}/does-not-exist")
    assert r.status == 404
    code, message, errno = r.error
    assert code == "not_found" and errno == ENOENT


def test_read_directory_is_file_error(client, sandbox, d):
    r = client.files("GET", sandbox, "content", path=d)
    assert r.status == 422, r
    code, message, errno = r.error
    assert code == "file_error"
    assert errno == EISDIR
    assert "directory" in message.lower()


def test_write_over_directory_is_file_error(client, sandbox, d):
    r = client.request("PUT", f"/v1/sandboxes/{sandbox}/files/content", data=b"x",
                       query={"path": d})
    assert r.status == 422, r
    assert r.error[0] == "file_error" and r.error[2] == EISDIR


def test_list_and_stat(client, sandbox, d):
    client.write_file(sandbox, f"{d}/x.txt", b"abc")
    client.files("POST", sandbox, "mkdir", 200, {"path": f"{d}/sub"})
    client.exec(sandbox, f"ln -s x.txt {d}/link && mkfifo {d}/fifo")
    listing = client.files("GET", sandbox, "list", 200, path=d).json()
    assert listing["path"] == f"/workspace/{d}"
    by_name = {e["name"]: e for e in listing["entries"]}
    assert sorted(by_name) == ["fifo", "link", "sub", "x.txt"]
    x = by_name["x.txt"]
    assert x["type"] == "file" and x["size"] == 3 and x["mode"] == "0644"
    assert x["path"] == f"/workspace/{d}/x.txt"
    now = datetime.datetime.utcnow()
    mtime = datetime.datetime.strptime(x["mtime"][:19], "%Y-%m-%dT%H:%M:%S")
    assert abs((now - mtime).total_seconds()) < 3600
    assert by_name["sub"]["type"] == "directory"
    assert by_name["link"]["type"] == "symlink" and by_name["link"]["target"] == "x.txt"
    assert by_name["fifo"]["type"] == "other"

    # stat does not follow the final symlink
    st = client.files("GET", sandbox, "stat", 200, path=f"{d}/link").json()
    assert st["type"] == "symlink" and st["target"] == "x.txt" and st["name"] == "link"
    # reading through it does
    assert client.read_file(sandbox, f"{d}/link") == b"abc"
    st = client.files("GET", sandbox, "stat", 200, path=f"/workspace/{d}/x.txt").json()
    assert st == x
    # without a path, list shows /workspace
    top = client.files("GET", sandbox, "list", 200).json()
    assert top["path"] == "/workspace" and d in [e["name"] for e in top["entries"]]
    # empty directory lists as empty
    assert client.files("GET", sandbox, "list", 200, path=f"{d}/sub").json()["entries"] == []
    # entries come sorted by name (api/openapi.yaml)
    assert [e["name"] for e in listing["entries"]] == sorted(by_name)


def test_list_errors(client, sandbox, d):
    client.write_file(sandbox, f"{d}/file", b"1")
    r = client.files("GET", sandbox, "list", path=f"{d}/file")
    assert r.status == 422 and r.error[0] == "file_error" and r.error[2] == ENOTDIR
    r = client.files("GET", sandbox, "list", path=f"{d}/missing")
    assert r.status == 404 and r.error[0] == "not_found"
    r = client.files("GET", sandbox, "stat", path=f"{d}/missing")
    assert r.status == 404 and r.error[0] == "not_found"


def test_mkdir(client, sandbox, d):
    e = client.files("POST", sandbox, "mkdir", 200, {"path": f"{d}/one"}).json()
    assert e["type"] == "directory" and e["path"] == f"/workspace/{d}/one"
    assert e["name"] == "one" and e["mode"] == "0755"
    # exists, without parents: EEXIST
    r = client.files("POST", sandbox, "mkdir", body={"path": f"{d}/one", "parents": False})
    assert r.status == 422 and r.error[2] == EEXIST, r
    # exists, with parents (the default): fine
    client.files("POST", sandbox, "mkdir", 200, {"path": f"{d}/one", "parents": True})
    client.files("POST", sandbox, "mkdir", 200, {"path": f"{d}/one"})
    # nested without parents: missing parent
    r = client.files("POST", sandbox, "mkdir", body={"path": f"{d}/two/three", "parents": False})
    assert r.status == 404 and r.error[2] == ENOENT, r
    e = client.files("POST", sandbox, "mkdir", 200,
                     {"path": f"{d}/two/three", "mode": "0700"}).json()
    assert e["mode"] == "0700"
    assert client.exec(sandbox, f"test -d {d}/two/three && stat -c %a {d}/two/three")[
        "stdout"].strip() == "700"


def test_remove(client, sandbox, d):
    client.write_file(sandbox, f"{d}/f.txt", b"x")
    r = client.files("DELETE", sandbox, None, 200, path=f"{d}/f.txt").json()
    assert r == {"path": f"/workspace/{d}/f.txt", "removed": True}
    assert client.files("GET", sandbox, "stat", path=f"{d}/f.txt").status == 404
    assert client.files("DELETE", sandbox, None, path=f"{d}/f.txt").status == 404

    # a symlink is removed, not its target
    client.write_file(sandbox, f"{d}/target", b"t")
    client.exec(sandbox, f"ln -s target {d}/ln")
    client.files("DELETE", sandbox, None, 200, path=f"{d}/ln")
    assert client.read_file(sandbox, f"{d}/target") == b"t"

    # directories: empty ones without recursive, full ones only with it
    client.files("POST", sandbox, "mkdir", 200, {"path": f"{d}/empty"})
    client.files("DELETE", sandbox, None, 200, path=f"{d}/empty")
    client.write_file(sandbox, f"{d}/full/deep/er/file", b"1")
    client.exec(sandbox, f"ln -s / {d}/full/root-link")
    r = client.files("DELETE", sandbox, None, path=f"{d}/full")
    assert r.status == 422 and r.error[0] == "file_error" and r.error[2] == ENOTEMPTY
    assert client.read_file(sandbox, f"{d}/full/deep/er/file") == b"1"
    client.files("DELETE", sandbox, None, 200, path=f"{d}/full", recursive=True)
    assert client.files("GET", sandbox, "stat", path=f"{d}/full").status == 404
    # recursive removal did not follow the symlink to /
    r = client.exec(sandbox, "test -x /bin/sh && ls / | wc -l")
    assert r["exit_code"] == 0 and int(r["stdout"]) > 5


def test_relative_and_absolute_paths_agree(client, sandbox, d):
    client.write_file(sandbox, f"{d}/rel.txt", b"same")
    assert client.read_file(sandbox, f"/workspace/{d}/rel.txt") == b"same"
    assert client.read_file(sandbox, f"./{d}/../{d}/rel.txt") == b"same"
    r = client.exec(sandbox, f"cat /workspace/{d}/rel.txt")
    assert output(r) == b"same"


def test_files_outside_workspace(client, sandbox):
    assert b"root:" in client.read_file(sandbox, "/etc/passwd")
    name = f"/tmp/abs-{uuid.uuid4().hex}"
    client.write_file(sandbox, name, b"in tmp")
    assert client.exec(sandbox, f"cat {name}")["stdout"] == "in tmp"


def test_bad_file_queries(client, sandbox, d):
    base = f"/v1/sandboxes/{sandbox}/files"
    for method, route, query in [
        ("GET", "/content", {}),                                   # path missing
        ("GET", "/content", {"path": ""}),                         # empty path
        ("GET", "/content", {"path": d, "offset": "abc"}),
        ("GET", "/content", {"path": d, "offset": "-1"}),
        ("GET", "/content", {"path": d, "length": "1.5"}),
        ("PUT", "/content", {"path": f"{d}/m", "mode": "rw-r--r--"}),
        ("PUT", "/content", {"path": f"{d}/m", "parents": "maybe"}),
        ("DELETE", "", {"path": d, "recursive": "yes"}),
        ("GET", "/stat", {}),
    ]:
        data = b"x" if method == "PUT" else None
        r = client.request(method, base + route, data=data, query=query)
        assert r.status == 400, (method, route, query, r)
        assert r.error[0] == "invalid_request"
    # nothing happened: d is still there, m was not written
    assert client.files("GET", sandbox, "stat", 200, path=d).json()["type"] == "directory"
    assert client.files("GET", sandbox, "stat", path=f"{d}/m").status == 404
    # mkdir bodies
    for body in [{}, {"path": 3}, {"path": f"{d}/q", "mode": 755},
                 {"path": f"{d}/q", "parents": "yes"}, {"path": f"{d}/q", "owner": "me"}]:
        r = client.files("POST", sandbox, "mkdir", body=body)
        assert r.status == 400, (body, r)


def test_unknown_query_parameter_is_400(client, sandbox, d):
    # a typo must not pass silently (as for JSON bodies): nothing is removed
    client.write_file(sandbox, f"{d}/sub/f", b"1")
    r = client.files("DELETE", sandbox, None, path=f"{d}/sub", recursiv="true")
    assert r.status == 400, r
    assert r.error[0] == "invalid_request" and "recursiv" in r.error[1]
    assert client.read_file(sandbox, f"{d}/sub/f") == b"1"
    r = client.files("GET", sandbox, "content", path=f"{d}/sub/f", ofset="1")
    assert r.status == 400 and "ofset" in r.error[1], r
