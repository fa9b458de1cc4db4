"""Directories in and out through the SDK (issue 12, point 5): upload_dir and download_dir keep a
tree (files byte for byte, modes, symlinks as symlinks, empty directories, mtimes) across more
than one upload piece, and a hostile archive (made by python's tarfile inside a sandbox, served
as a download) never writes outside the local target."""

import hashlib
import io
import os
import tarfile

import pytest

from stubhttp import Stub
from withruntime import (
    Client,
    DirTransfer,
    FileTooLarge,
    NotFound,
    Sandbox,
    UnsafeArchive,
)

MIB = 1024 * 1024


def manifest(root):
    m = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                m[rel] = ("link", os.readlink(p), int(st.st_mtime))
            elif os.path.isdir(p):
                m[rel] = ("dir", oct(st.st_mode & 0o7777), int(st.st_mtime))
            elif not os.path.isfile(p):
                m[rel] = ("other",)
            else:
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                m[rel] = ("file", oct(st.st_mode & 0o7777), st.st_size, digest,
                          int(st.st_mtime))
    return m


def make_tree(root):
    os.makedirs(os.path.join(root, "sub", "deeper"))
    os.makedirs(os.path.join(root, "empty"))
    big = os.path.join(root, "big.bin")
    with open(big, "wb") as f:
        f.write(os.urandom(9 * MIB + 7))
    os.chmod(big, 0o640)
    run = os.path.join(root, "sub", "run.sh")
    with open(run, "w") as f:
        f.write("#!/bin/sh\necho from-the-tree\n")
    os.chmod(run, 0o755)
    open(os.path.join(root, "sub", "deeper", "empty.txt"), "w").close()
    os.symlink("sub/run.sh", os.path.join(root, "link"))
    os.symlink("/etc/hostname", os.path.join(root, "abs-link"))
    os.link(run, os.path.join(root, "hard.sh"))
    os.mkfifo(os.path.join(root, "fifo"))
    os.chmod(os.path.join(root, "empty"), 0o700)
    long = os.path.join(root, *(["a-long-directory-name-for-a-pax-path"] * 4))
    os.makedirs(long)
    with open(os.path.join(long, "deep.txt"), "w") as f:
        f.write("deep")
    os.utime(run, (1000000000, 1000000000))
    os.utime(os.path.join(root, "sub"), (1100000000, 1100000000))


def test_round_trip_upload_then_download(sandbox, tmp_path):
    src = tmp_path / "src"
    make_tree(str(src))
    up = sandbox.files.upload_dir(str(src), "/workspace/dirs/project")
    assert isinstance(up, DirTransfer)
    assert up.path == "/workspace/dirs/project"
    assert up.bytes == 9 * MIB + 7 + 2 * 29 + 4
    assert any("fifo" in s for s in up.skipped)
    # the sandbox sees the tree: a symlink, an executable, the hard link as a file of its own
    r = sandbox.exec("cd /workspace/dirs/project && ./link && readlink link abs-link && "
                     "stat -c '%a %Y' sub/run.sh empty big.bin && cat hard.sh | wc -l && "
                     "ls -a /tmp | grep -c withruntime-upload || true")
    assert r.stdout == ("from-the-tree\nsub/run.sh\n/etc/hostname\n755 1000000000\n700 "
                        f"{int(os.lstat(src / 'empty').st_mtime)}\n640 "
                        f"{int(os.lstat(src / 'big.bin').st_mtime)}\n2\n0\n"), r
    back = tmp_path / "back"
    down = sandbox.files.download_dir("/workspace/dirs/project", str(back))
    assert down.path == str(back) and down.skipped == []
    want = manifest(str(src))
    del want["fifo"]
    assert manifest(str(back)) == want
    # symlinks stay symlinks, and the one pointing out of the tree was not followed
    assert os.readlink(back / "abs-link") == "/etc/hostname"
    # downloading into an existing tree replaces what has the same name, keeps the rest
    (back / "mine.txt").write_text("keep me")
    (back / "big.bin").write_text("replace me")
    sandbox.files.download_dir("/workspace/dirs/project", str(back))
    assert (back / "mine.txt").read_text() == "keep me"
    assert (back / "big.bin").read_bytes() == (src / "big.bin").read_bytes()


def test_errors(sandbox, tmp_path):
    with pytest.raises(NotFound):
        sandbox.files.download_dir("/workspace/no-such-dir", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    with pytest.raises(NotADirectoryError):
        sandbox.files.upload_dir(str(tmp_path / "missing"), "/workspace/x")
    sandbox.files.write("dirs/a-file", "x")
    src = tmp_path / "s"
    src.mkdir()
    (src / "f").write_text("f")
    with pytest.raises(Exception) as e:
        sandbox.files.upload_dir(str(src), "/workspace/dirs/a-file")
    assert "a-file" in str(e.value)
    # the staging file is gone even so
    assert sandbox.exec("ls -a /tmp | grep -c withruntime-upload || true").stdout == "0\n"


HOSTILE = r"""
import io, tarfile, sys
tricks = sys.argv[1]
with tarfile.open("/workspace/evil-%s.tar" % tricks, "w", format=tarfile.GNU_FORMAT) as tf:
    def add(name, data=b"", kind=tarfile.REGTYPE, link=""):
        ti = tarfile.TarInfo(name); ti.type = kind; ti.linkname = link; ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data) if data else None)
    add("fine.txt", b"fine")
    if tricks == "dotdot":
        add("../escaped.txt", b"escaped")
    elif tricks == "deep-dotdot":
        add("a/b/../../../escaped.txt", b"escaped")
    elif tricks == "absolute":
        add(sys.argv[2] + "/escaped.txt", b"escaped")
    elif tricks == "symlink":
        add("up", kind=tarfile.SYMTYPE, link="..")
        add("up/escaped.txt", b"escaped")
    elif tricks == "abs-symlink":
        add("out", kind=tarfile.SYMTYPE, link=sys.argv[2])
        add("out/escaped.txt", b"escaped")
    elif tricks == "device":
        add("null", kind=tarfile.CHRTYPE)
        add("hard", kind=tarfile.LNKTYPE, link="/etc/passwd")
        add("pipe", kind=tarfile.FIFOTYPE)
        ti = tarfile.TarInfo("setuid"); ti.mode = 0o4755; ti.size = 1
        tf.addfile(ti, io.BytesIO(b"s"))
"""


@pytest.mark.parametrize("tricks", ["dotdot", "deep-dotdot", "absolute", "symlink",
                                    "abs-symlink", "device"])
def test_hostile_archive_never_writes_outside_the_target(sandbox, tmp_path, tricks):
    """The archive is made by python's tarfile inside the sandbox and served as a download by
    a stand-in daemon (the real one's agent makes honest archives)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    sandbox.files.write("/tmp/hostile.py", HOSTILE)
    r = sandbox.exec(f"python3 /tmp/hostile.py {tricks} {outside}")
    assert r.exit_code == 0, r.stderr
    evil = sandbox.files.read(f"/workspace/evil-{tricks}.tar")
    target = tmp_path / "target"
    with Stub(body=evil, content_type="application/x-tar") as stub:
        sbx = Sandbox({"id": "sb-hostile"}, Client(stub.url))
        if tricks == "device":
            res = sbx.files.download_dir("/workspace", str(target))
            assert sorted(os.listdir(target)) == ["fine.txt", "setuid"]
            assert os.stat(target / "setuid").st_mode & 0o7777 == 0o755
            assert len(res.skipped) == 3 and "hard link" in " ".join(res.skipped)
        else:
            with pytest.raises(UnsafeArchive) as e:
                sbx.files.download_dir("/workspace", str(target))
            assert e.value.code == "unsafe_archive"
            assert ("'..'" in e.value.message or "absolute" in e.value.message or
                    "symlink" in e.value.message), e.value.message
            # what came before the bad entry is there, nothing else anywhere
            assert (target / "fine.txt").read_bytes() == b"fine"
    assert os.listdir(outside) == []
    assert sorted(os.listdir(tmp_path)) == ["outside", "target"]


def tar_bytes(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def served(body, fn):
    with Stub(body=body, content_type="application/x-tar") as stub:
        return fn(Sandbox({"id": "sb-stub"}, Client(stub.url)).files)


def test_limits_and_malformed_archives(tmp_path):
    many = tar_bytes([(f"f{i}", b"x") for i in range(20)])
    with pytest.raises(FileTooLarge, match="max_entries"):
        served(many, lambda f: f.download_dir("/w", str(tmp_path / "a"), max_entries=10))
    assert len(os.listdir(tmp_path / "a")) == 10
    big = tar_bytes([("big", b"y" * 100000)])
    with pytest.raises(FileTooLarge, match="max_bytes"):
        served(big, lambda f: f.download_dir("/w", str(tmp_path / "b"), max_bytes=50000))
    assert os.listdir(tmp_path / "b") == []
    bad = bytearray(tar_bytes([("c", b"z")]))
    bad[0] ^= 1  # the checksum no longer matches
    with pytest.raises(UnsafeArchive, match="checksum"):
        served(bytes(bad), lambda f: f.download_dir("/w", str(tmp_path / "c")))
    # a pax header that claims a gigabyte is refused before it is read
    huge = bytearray(tar_bytes([("d" * 150, b"z")]))
    huge[124:136] = b"%011o\0" % (1 << 30)
    huge[148:156] = b"        "
    huge[148:155] = b"%06o\0" % sum(huge[:512])
    with pytest.raises(UnsafeArchive, match="pax"):
        served(bytes(huge), lambda f: f.download_dir("/w", str(tmp_path / "d")))
    # an archive that stops in the middle of an entry
    cut = tar_bytes([("e", b"q" * 5000)])[:2048]
    with pytest.raises(UnsafeArchive, match="ended in the middle"):
        served(cut, lambda f: f.download_dir("/w", str(tmp_path / "e")))
    # a name of 100 bytes without a NUL, and a GNU long name
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name in ("n" * 100, "g" * 180):
            ti = tarfile.TarInfo(name)
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"1"))
    res = served(buf.getvalue(), lambda f: f.download_dir("/w", str(tmp_path / "f")))
    assert sorted(os.listdir(tmp_path / "f")) == ["g" * 180, "n" * 100] and res.entries == 2


def test_mutated_archives_are_refused_cleanly_and_never_escape(tmp_path):
    """300 random mutations of a few archives (fixed seed): each is extracted or refused with a
    WithruntimeError (never another exception), and nothing appears beside the target."""
    import random
    from withruntime import WithruntimeError, _archive

    seeds = [tar_bytes([("d/f.txt", b"hello"), ("x" * 150, b"long")])]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, kind, link in (("up", tarfile.SYMTYPE, ".."), ("g" * 120, tarfile.REGTYPE, ""),
                                 ("h", tarfile.LNKTYPE, "d")):
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = kind, link
            tf.addfile(ti)
    seeds.append(buf.getvalue())
    rnd = random.Random(12)
    for i in range(300):
        b = bytearray(rnd.choice(seeds))
        for _ in range(rnd.randint(1, 6)):
            pos = rnd.randrange(len(b) + 1)
            r = rnd.random()
            if r < 0.5:
                b[pos:pos + 1] = bytes([rnd.randrange(256)])
            elif r < 0.7:
                b[pos:pos + 8] = rnd.choice([b"\x80" + b"\xff" * 7, b"\0" * 8, b"../../..",
                                             b"/tmp/xx/", b"99999999"])
            elif r < 0.85:
                del b[pos:]
            else:
                b[pos:pos] = rnd.randbytes(rnd.randint(1, 600))
        if rnd.random() < 0.7 and len(b) >= 512:  # a right checksum, to reach deeper code
            blk = b[:512]
            blk[148:156] = b" " * 8
            b[148:156] = b"%06o\0 " % sum(blk)
        base = tmp_path / f"m{i}"
        base.mkdir()
        try:
            _archive.extract_stream(iter([bytes(b[:100]), bytes(b[100:])]), str(base / "in"),
                                    1 << 20, 64)
        except WithruntimeError:
            pass
        assert os.listdir(base) == ["in"], i
