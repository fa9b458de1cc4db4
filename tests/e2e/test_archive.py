"""Directories in and out (issue 12, point 5): GET files/archive streams a tar of a tree made by
the agent (byte-exact, modes, symlinks as symlinks, mtimes, empty directories, long names),
flow-controlled like a read; POST files/extract unpacks a tar put in the sandbox in pieces, and
refuses entries that would land outside the target ('..', absolute names, a path through a
symlink, even one the archive made itself). `withruntime sandbox cp` moves trees both ways."""

import hashlib
import io
import os
import subprocess
import tarfile
import time
import uuid

import pytest

from test_flow import raw_request, sandbox_cpu_usec, wait_for
from test_output import RssWatch, rss

MIB = 1024 * 1024
EPERM = 1


@pytest.fixture
def d(client, sandbox):
    """A fresh directory under /workspace for one test; its absolute path."""
    name = f"/workspace/t-{uuid.uuid4().hex[:12]}"
    client.files("POST", sandbox, "mkdir", 200, {"path": name})
    return name


def sh(client, sid, script):
    r = client.exec(sid, script)
    assert r["exit_code"] == 0, r
    return r["stdout"]


def make_tree(client, sid, root):
    """A tree with a 12 MiB file (past the 8 MiB upload limit), modes, a symlink, an empty
    directory, a long path and a FIFO."""
    long = "/".join(["a-directory-name-long-enough-to-need-pax"] * 4)
    sh(client, sid, f"""set -e; cd {root}
        mkdir -p sub/deeper empty {long}
        head -c {12 * MIB + 5} /dev/urandom > big.bin; chmod 0640 big.bin
        printf '#!/bin/sh\\necho hi\\n' > sub/run.sh; chmod 0755 sub/run.sh
        : > sub/deeper/empty.txt; chmod 0600 sub/deeper/empty.txt
        echo deep > {long}/deep.txt
        ln -s sub/run.sh link; ln -s /etc/passwd abs-link
        mkfifo fifo
        touch -d '2001-02-03 04:05:06' sub/run.sh
        touch -h -d '2002-02-03 04:05:06' link
        chmod 0700 empty""")
    return long


def sandbox_manifest(client, sid, root):
    """{name: (type, mode, size, sha256 or link target, mtime)} of the tree, from inside."""
    out = sh(client, sid, f"""cd {root} && find . -mindepth 1 ! -type p | sort | while read -r p; do
        n=${{p#./}}
        if [ -L "$p" ]; then echo "$n|l|$(stat -c %a "$p")|0|$(readlink "$p")|$(stat -c %Y "$p")"
        elif [ -d "$p" ]; then echo "$n|d|$(stat -c %a "$p")|0|-|$(stat -c %Y "$p")"
        else echo "$n|f|$(stat -c %a "$p")|$(stat -c %s "$p")|$(sha256sum < "$p" | cut -d' ' -f1)|$(stat -c %Y "$p")"
        fi; done""")
    m = {}
    for line in out.splitlines():
        n, t, mode, size, what, mtime = line.split("|")
        m[n] = (t, int(mode, 8) if t != "l" else 0, int(size), what, int(mtime))
    return m


def local_manifest(root, dir_mtimes=True):
    m = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if os.path.islink(p):
                m[rel] = ("l", 0, 0, os.readlink(p), int(st.st_mtime))
            elif os.path.isdir(p):
                m[rel] = ("d", st.st_mode & 0o7777, 0, "-", int(st.st_mtime))
            else:
                with open(p, "rb") as f:
                    h = hashlib.sha256(f.read()).hexdigest()
                m[rel] = ("f", st.st_mode & 0o7777, st.st_size, h, int(st.st_mtime))
    return m


def tar_manifest(data):
    m = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for ti in tf:
            n = ti.name.rstrip("/")
            if ti.issym():
                m[n] = ("l", 0, 0, ti.linkname, int(ti.mtime))
            elif ti.isdir():
                m[n] = ("d", ti.mode, 0, "-", int(ti.mtime))
            else:
                h = hashlib.sha256(tf.extractfile(ti).read()).hexdigest()
                m[n] = ("f", ti.mode, ti.size, h, int(ti.mtime))
    return m


def test_download_is_the_tree_byte_for_byte(client, sandbox, d):
    make_tree(client, sandbox, d)
    want = sandbox_manifest(client, sandbox, d)
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/archive", query={"path": d})
    assert r.status == 200, r
    assert r.headers.get("content-type") == "application/x-tar"
    assert r.headers.get("transfer-encoding") == "chunked"
    got = tar_manifest(r.body)
    # the FIFO is skipped; everything else is there, exactly
    assert got == want
    assert got["big.bin"][0:3] == ("f", 0o640, 12 * MIB + 5)
    assert got["link"][3] == "sub/run.sh" and got["abs-link"][3] == "/etc/passwd"
    assert got["sub/run.sh"][4] == 981173106  # 2001-02-03 04:05:06 UTC
    assert got["empty"] == ("d", 0o700, 0, "-", want["empty"][4])
    assert any(len(n) > 100 for n in got)


def test_download_of_one_file_and_errors(client, sandbox, d):
    sh(client, sandbox, f"echo hello > {d}/one.txt; chmod 0604 {d}/one.txt; ln -s one.txt {d}/l")
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/archive",
                       query={"path": f"{d}/one.txt"})
    assert r.status == 200
    with tarfile.open(fileobj=io.BytesIO(r.body)) as tf:
        (ti,) = tf.getmembers()
        assert (ti.name, ti.mode, tf.extractfile(ti).read()) == ("one.txt", 0o604, b"hello\n")
    # a final symlink is followed
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/archive", query={"path": f"{d}/l"})
    with tarfile.open(fileobj=io.BytesIO(r.body)) as tf:
        assert [t.name for t in tf.getmembers()] == ["one.txt"]
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/archive",
                       query={"path": f"{d}/nope"})
    assert r.status == 404 and r.error[0] == "not_found", r
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/archive",
                       query={"path": "/proc/self/fd/0"})
    assert r.status in (404, 422), r
    r = client.request("GET", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaaaaaaa/files/archive",
                       query={"path": d})
    assert r.status == 404


def build_tar(members, fmt=tarfile.PAX_FORMAT):
    """members: (name, kind, payload) with kind file/dir/sym/hard; returns the archive's bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, kind, payload, *rest in members:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1234567890
            ti.mode = rest[0] if rest else 0o644
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, payload
                tf.addfile(ti)
            elif kind == "hard":
                ti.type, ti.linkname = tarfile.LNKTYPE, payload
                tf.addfile(ti)
            else:
                ti.size = len(payload)
                tf.addfile(ti, io.BytesIO(payload))
    return buf.getvalue()


def put_in_pieces(client, sid, path, data, piece=8 * MIB):
    for off in range(0, max(len(data), 1), piece):
        client.write_file(sid, path, data[off:off + piece], **({"offset": off} if off else {}))


def extract(client, sid, archive, path, remove=True, expect=200):
    r = client.request("POST", f"/v1/sandboxes/{sid}/files/extract",
                       {"archive": archive, "path": path, "remove_archive": remove})
    assert r.status == expect, r
    return r


def test_upload_over_8_mib_extracts_exactly(client, sandbox, d):
    big = os.urandom(20 * MIB + 3)
    data = build_tar([("top", "dir", None, 0o750), ("top/big.bin", "file", big, 0o600),
                      ("top/x.sh", "file", b"#!/bin/sh\n", 0o755),
                      ("top/link", "sym", "x.sh"), ("top/empty", "dir", None, 0o700),
                      ("top/setuid", "file", b"s", 0o4755),
                      ("top/hard", "hard", "top/x.sh"),
                      ("top/" + "n" * 150, "file", b"long")])
    assert len(data) > 8 * MIB
    put_in_pieces(client, sandbox, f"{d}/up.tar", data)
    r = extract(client, sandbox, f"{d}/up.tar", f"{d}/out/new")
    body = r.json()
    assert body["path"] == f"{d}/out/new"
    assert body["bytes"] == len(big) + 10 + 1 + 4
    assert body["entries"] == 7 and body["skipped"] == 1
    assert "hard link" in body["skipped_note"] and "top/hard" in body["skipped_note"]
    m = sandbox_manifest(client, sandbox, f"{d}/out/new")
    assert m["top"][:2] == ("d", 0o750) and m["top"][4] == 1234567890
    assert m["top/big.bin"] == ("f", 0o600, len(big), hashlib.sha256(big).hexdigest(),
                                1234567890)
    assert m["top/x.sh"][1] == 0o755
    assert m["top/link"][3] == "x.sh"
    assert m["top/empty"][:2] == ("d", 0o700)
    assert m["top/setuid"][1] == 0o755  # setuid dropped
    assert m["top/" + "n" * 150][2] == 4
    assert "top/hard" not in m
    # the archive was removed
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/stat", query={"path": f"{d}/up.tar"})
    assert r.status == 404


@pytest.mark.parametrize("members,why", [
    ([("ok.txt", "file", b"fine"), ("../escape.txt", "file", b"x")], "'..'"),
    ([("a/../../escape.txt", "file", b"x")], "'..'"),
    ([("/workspace/escape.txt", "file", b"x")], "absolute"),
    ([("link", "sym", "/workspace"), ("link/escape.txt", "file", b"x")], "symlink"),
    ([("link", "sym", "../.."), ("link/workspace/escape.txt", "file", b"x")], "symlink"),
    ([("etc", "sym", "/etc"), ("etc/passwd", "file", b"root::0:0::/:/bin/sh\n")], "symlink"),
])
def test_extract_refuses_entries_outside_the_target(client, sandbox, d, members, why):
    data = build_tar(members, fmt=tarfile.GNU_FORMAT)
    put_in_pieces(client, sandbox, f"{d}/bad.tar", data)
    before = sh(client, sandbox, "sha256sum /etc/passwd")
    r = extract(client, sandbox, f"{d}/bad.tar", f"{d}/target", expect=422)
    assert r.error[0] == "file_error" and why in r.error[1], r
    # nothing landed outside the target; /etc/passwd is unchanged
    assert sh(client, sandbox, f"ls {d}") == "target\n"
    assert sh(client, sandbox, "ls /workspace/escape.txt 2>/dev/null || echo none") == "none\n"
    assert sh(client, sandbox, "sha256sum /etc/passwd") == before


def test_hostile_archive_made_inside_the_sandbox_cannot_escape(client, sandbox, d):
    """A tar made by python's tarfile in the sandbox, with every trick at once: extraction
    stops at the first bad entry, and nothing is written outside the target."""
    sh(client, sandbox, f"""cd {d} && python3 - <<'EOF'
import io, tarfile
with tarfile.open("evil.tar", "w", format=tarfile.GNU_FORMAT) as tf:
    def add(name, data=b"", kind=tarfile.REGTYPE, link=""):
        ti = tarfile.TarInfo(name); ti.type = kind; ti.linkname = link; ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data) if data else None)
    add("fine.txt", b"ok")
    add("up", kind=tarfile.SYMTYPE, link="..")
    add("up/pwned.txt", b"escaped")
    add("../pwned2.txt", b"escaped")
EOF""")
    r = extract(client, sandbox, f"{d}/evil.tar", f"{d}/t", remove=False, expect=422)
    assert "symlink 'up'" in r.error[1], r
    assert sh(client, sandbox, f"cat {d}/t/fine.txt") == "ok"
    assert sh(client, sandbox, f"ls {d}") == "evil.tar\nt\n"
    # a path through a symlink the sandbox planted in the target beforehand is refused too
    sh(client, sandbox, f"mkdir -p {d}/t2 && ln -s /etc {d}/t2/etc")
    data = build_tar([("etc/evil.conf", "file", b"x")])
    put_in_pieces(client, sandbox, f"{d}/t2.tar", data)
    r = extract(client, sandbox, f"{d}/t2.tar", f"{d}/t2", expect=422)
    assert "symlink" in r.error[1]
    assert sh(client, sandbox, "ls /etc/evil.conf 2>/dev/null || echo none") == "none\n"


def test_extract_errors(client, sandbox, d):
    r = extract(client, sandbox, f"{d}/missing.tar", f"{d}/x", expect=404)
    client.write_file(sandbox, f"{d}/junk.tar", b"this is not a tar archive" * 40)
    r = extract(client, sandbox, f"{d}/junk.tar", f"{d}/x", remove=False, expect=422)
    assert "checksum" in r.error[1] or "octal" in r.error[1], r
    data = build_tar([("f", "file", b"x" * 5000)])
    client.write_file(sandbox, f"{d}/cut.tar", data[:2048])
    r = extract(client, sandbox, f"{d}/cut.tar", f"{d}/y", expect=422)
    assert "ended in the middle" in r.error[1], r
    for body in ({"path": d}, {"archive": "a.tar"}, {"archive": "a", "path": d, "x": 1},
                 {"archive": "", "path": d}, {"archive": "a", "path": d, "remove_archive": 1}):
        r = client.request("POST", f"/v1/sandboxes/{sandbox}/files/extract", body)
        assert r.status == 400, (body, r)


def test_another_keys_sandbox_is_not_found_and_read_only_keys_cannot_extract(daemon, client, sandbox, d):
    ro = client.with_key(daemon.make_key(read_only=True)["key"])
    # another key's sandbox is not found; a read-only key may not extract
    r = ro.request("GET", f"/v1/sandboxes/{sandbox}/files/archive", query={"path": d})
    assert r.status == 404
    r = ro.request("POST", f"/v1/sandboxes/{sandbox}/files/extract", {"archive": "a", "path": d})
    assert r.status == 403 and r.error[0] == "forbidden"


def test_slow_reader_of_a_huge_tree_costs_little_and_leaving_stops_it(daemon, client, sandbox, d):
    sh(client, sandbox, f"truncate -s 1T {d}/huge")
    before = rss(daemon.proc.pid)
    s, status, head = raw_request(daemon, "GET", f"/v1/sandboxes/{sandbox}/files/archive",
                                  {"path": d})
    assert status == 200 and b"application/x-tar" in head
    got = b""
    with RssWatch(daemon.proc.pid) as watch:
        for _ in range(12):
            got += s.recv(65536)
            time.sleep(0.25)
        time.sleep(1.5)
    assert len(got) > 2048
    growth = watch.peak - before
    assert growth < 48 * MIB, f"the daemon grew by {growth / MIB:.0f} MiB for a slow reader"
    cpu0 = sandbox_cpu_usec(client, sandbox)
    time.sleep(2)
    waiting = sandbox_cpu_usec(client, sandbox) - cpu0
    assert waiting < 500_000, f"the sandbox used {waiting} us of CPU in 2 s while nobody read"
    s.close()
    wait_for(lambda: b"files.read_cancelled" in daemon.log_bytes(), 10, "files.read_cancelled")
    r = client.exec(sandbox, "echo ok")
    assert r["stdout"] == "ok\n"


def test_download_of_a_9_gib_file_has_a_pax_size(daemon, client, sandbox, d):
    """Past 8 GiB the size goes in a pax record (and base-256 in the header)."""
    sh(client, sandbox, f"truncate -s 9G {d}/nine")
    s, status, _ = raw_request(daemon, "GET", f"/v1/sandboxes/{sandbox}/files/archive",
                               {"path": d}, rcvbuf=1 << 20)
    assert status == 200
    body = b""
    while len(body) < 8192:
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    s.close()
    # de-chunk the start of the body
    size, rest = body.split(b"\r\n", 1)
    start = rest[:int(size, 16)]
    assert b"size=9663676416\n" in start[:2048]
    assert b"path=" not in start[:1024]


def wr(daemon, *args, timeout=120):
    return subprocess.run([daemon.bin, *args], capture_output=True, env=daemon.cli_env(),
                          timeout=timeout)


def test_cli_cp_both_ways(daemon, client, sandbox, d, tmp_path):
    src = tmp_path / "src"
    (src / "sub" / "empty").mkdir(parents=True)
    (src / "big.bin").write_bytes(os.urandom(9 * MIB + 1))
    (src / "big.bin").chmod(0o600)
    (src / "sub" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "sub" / "run.sh").chmod(0o755)
    os.symlink("sub/run.sh", src / "link")
    os.utime(src / "sub" / "run.sh", (1000000000, 1000000000))
    r = wr(daemon, "sandbox", "cp", str(src), f"{sandbox}:{d}/up")
    assert r.returncode == 0, r
    assert sh(client, sandbox, f"sh {d}/up/sub/run.sh; readlink {d}/up/link; "
                               f"stat -c %a {d}/up/big.bin") == "hi\nsub/run.sh\n600\n"
    # and back, to a new local directory
    back = tmp_path / "back"
    r = wr(daemon, "sandbox", "cp", f"{sandbox}:{d}/up", str(back))
    assert r.returncode == 0, r
    assert local_manifest(back) == local_manifest(src)
    # single files both ways
    r = wr(daemon, "sandbox", "cp", str(src / "big.bin"), f"{sandbox}:{d}/one.bin")
    assert r.returncode == 0, r
    r = wr(daemon, "sandbox", "cp", f"{sandbox}:{d}/one.bin", str(tmp_path / "one.bin"))
    assert r.returncode == 0, r
    assert (tmp_path / "one.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert (tmp_path / "one.bin").stat().st_mode & 0o777 == 0o600
    # a symlink is followed: to a file, a file; to a directory, its tree
    sh(client, sandbox, f"ln -s one.bin {d}/to-file && ln -s up {d}/to-dir")
    r = wr(daemon, "sandbox", "cp", f"{sandbox}:{d}/to-file", str(tmp_path / "via-link.bin"))
    assert r.returncode == 0, r
    assert (tmp_path / "via-link.bin").read_bytes() == (src / "big.bin").read_bytes()
    r = wr(daemon, "sandbox", "cp", f"{sandbox}:{d}/to-dir", str(tmp_path / "via-link-dir"))
    assert r.returncode == 0, r
    assert local_manifest(tmp_path / "via-link-dir") == local_manifest(src)
    # a file onto a directory goes into it under its own name, both ways (as cp does)
    into = tmp_path / "into"
    into.mkdir()
    r = wr(daemon, "sandbox", "cp", f"{sandbox}:{d}/one.bin", str(into))
    assert r.returncode == 0, r
    assert (into / "one.bin").read_bytes() == (src / "big.bin").read_bytes()
    r = wr(daemon, "sandbox", "cp", f"{sandbox}:{d}/up/sub/run.sh", str(tmp_path / "new") + "/")
    assert r.returncode == 1 and b"No such file or directory" in r.stderr, r  # no such dir
    sh(client, sandbox, f"mkdir {d}/updir")
    for dest in (f"{d}/updir", f"{d}/updir/"):
        r = wr(daemon, "sandbox", "cp", str(src / "sub" / "run.sh"), f"{sandbox}:{dest}")
        assert r.returncode == 0, r
    assert sh(client, sandbox, f"ls {d}/updir; sh {d}/updir/run.sh") == "run.sh\nhi\n"
    # errors: a missing path, a bad operand
    r = wr(daemon, "sandbox", "cp", f"{sandbox}:{d}/nope", str(tmp_path / "nope"))
    assert r.returncode != 0 and b"nope" in r.stderr, r
    assert not (tmp_path / "nope").exists()
    r = wr(daemon, "sandbox", "cp", str(src), str(tmp_path / "x"))
    assert r.returncode == 2 and b"ID:PATH" in r.stderr, r


class HostileDaemon:
    """A stand-in daemon on loopback that says every path is a directory and serves a fixed
    archive for it: what a compromised sandbox (or agent) could send the CLI."""

    def __init__(self, archive):
        import http.server
        import threading
        body = archive

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                if "/files/stat" in self.path:
                    data, ctype = b'{"type": "directory", "mode": "0755"}', "application/json"
                else:
                    data, ctype = body, "application/x-tar"
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.mark.parametrize("members,why", [
    ([("ok.txt", "file", b"fine"), ("../escaped.txt", "file", b"x")], "'..'"),
    ([("ok.txt", "file", b"fine"), ("{outside}/escaped.txt", "file", b"x")], "absolute"),
    ([("ok.txt", "file", b"fine"), ("up", "sym", ".."), ("up/escaped.txt", "file", b"x")],
     "symlink"),
    ([("ok.txt", "file", b"fine"), ("out", "sym", "{outside}"), ("out/escaped.txt", "file", b"x")],
     "symlink"),
])
def test_cli_cp_refuses_a_hostile_download(daemon, tmp_path, members, why):
    outside = tmp_path / "outside"
    outside.mkdir()
    members = [(n.replace("{outside}", str(outside)), k,
                p.replace("{outside}", str(outside)) if isinstance(p, str) else p)
               for n, k, p in members]
    stub = HostileDaemon(build_tar(members, fmt=tarfile.GNU_FORMAT))
    try:
        r = subprocess.run([daemon.bin, "sandbox", "cp", "sb-aaaaaaaaaaaaaaaaaaaaa:/w",
                            str(tmp_path / "target")], capture_output=True, timeout=60,
                           env=daemon.cli_env(RUNTIME_URL=stub.url))
    finally:
        stub.close()
    assert r.returncode == 1 and why.encode() in r.stderr, r
    assert (tmp_path / "target" / "ok.txt").read_bytes() == b"fine"
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "target"]


def test_cli_cp_download_limits(daemon, tmp_path):
    stub = HostileDaemon(build_tar([(f"f{i}", "file", b"x" * 1000) for i in range(10)]))
    try:
        r = wr_at(daemon, stub.url, "--max-entries", "5", tmp_path / "a")
        assert r.returncode == 1 and b"more than 5 entries" in r.stderr, r
        assert len(list((tmp_path / "a").iterdir())) == 5
        r = wr_at(daemon, stub.url, "--max-bytes", "2500", tmp_path / "b")
        assert r.returncode == 1 and b"more than 2500 bytes" in r.stderr, r
        assert len(list((tmp_path / "b").iterdir())) == 2
    finally:
        stub.close()


def wr_at(daemon, url, opt, val, dest):
    return subprocess.run([daemon.bin, "sandbox", "cp", opt, val, "sb-aaaaaaaaaaaaaaaaaaaaa:/w",
                           str(dest)], capture_output=True, timeout=60,
                          env=daemon.cli_env(RUNTIME_URL=url))
