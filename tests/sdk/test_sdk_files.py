"""Files through the SDK: read, write, list, stat, mkdir, remove, and their errors."""

import pytest

from withruntime import FileError, FileInfo, NotFound


def test_write_and_read_back(sandbox):
    info = sandbox.files.write("notes/a.txt", "héllo\n")
    assert isinstance(info, FileInfo)
    assert info.path == "/workspace/notes/a.txt"
    assert info.name == "a.txt" and info.type == "file" and info.is_file
    assert info.size == len("héllo\n".encode())
    assert sandbox.files.read("/workspace/notes/a.txt") == "héllo\n".encode()
    assert sandbox.files.read_text("notes/a.txt") == "héllo\n"
    # the command line inside sees the same file
    assert sandbox.exec("cat notes/a.txt").stdout == "héllo\n"


def test_binary_round_trip_and_ranges(sandbox):
    data = bytes(range(256)) * 64
    sandbox.files.write("blob.bin", data)
    assert sandbox.files.read("blob.bin") == data
    assert sandbox.files.read("blob.bin", offset=10, length=5) == data[10:15]
    assert sandbox.files.read("blob.bin", offset=len(data) - 3) == data[-3:]
    assert sandbox.exec("sha256sum blob.bin").stdout.split()[0] == \
        __import__("hashlib").sha256(data).hexdigest()


def test_overwrite_truncates(sandbox):
    sandbox.files.write("f.txt", "long content here")
    sandbox.files.write("f.txt", b"short")
    assert sandbox.files.read("f.txt") == b"short"


def test_mode(sandbox):
    assert sandbox.files.write("run.sh", "#!/bin/sh\necho ran\n", mode=0o755).mode == "0755"
    assert sandbox.exec("./run.sh").stdout == "ran\n"
    assert sandbox.files.write("secret.txt", "s", mode="0600").mode == "0600"
    assert sandbox.files.stat("secret.txt").mode == "0600"


def test_write_without_parents(sandbox):
    with pytest.raises((NotFound, FileError)):
        sandbox.files.write("missing/dir/x.txt", "x", parents=False)
    assert not sandbox.files.exists("missing")


def test_list_and_stat(sandbox):
    sandbox.files.mkdir("d/sub")
    sandbox.files.write("d/one.txt", "1")
    sandbox.exec("ln -s one.txt d/link")
    entries = {e.name: e for e in sandbox.files.list("d")}
    assert set(entries) == {"sub", "one.txt", "link"}
    assert entries["sub"].is_dir
    assert entries["one.txt"].size == 1
    assert entries["link"].type == "symlink" and entries["link"].target == "one.txt"
    st = sandbox.files.stat("d")
    assert st.type == "directory" and st.path == "/workspace/d"
    assert sandbox.files.stat("d/link").type == "symlink"  # not followed
    assert sandbox.files.exists("d/one.txt")
    assert not sandbox.files.exists("d/two.txt")


def test_mkdir(sandbox):
    info = sandbox.files.mkdir("a/b/c")
    assert info.path == "/workspace/a/b/c" and info.is_dir
    sandbox.files.mkdir("a/b/c")  # parents=True: an existing directory is fine
    with pytest.raises((NotFound, FileError)):
        sandbox.files.mkdir("x/y", parents=False)
    assert sandbox.files.mkdir("m", mode=0o700).mode == "0700"


def test_remove(sandbox):
    sandbox.files.write("gone.txt", "x")
    sandbox.files.remove("gone.txt")
    assert not sandbox.files.exists("gone.txt")
    sandbox.files.write("tree/a/b.txt", "x")
    with pytest.raises(FileError) as ei:
        sandbox.files.remove("tree")
    assert ei.value.errno == 39  # ENOTEMPTY
    assert "tree" in ei.value.message
    sandbox.files.remove("tree", recursive=True)
    assert not sandbox.files.exists("tree")


def test_file_errors(sandbox):
    with pytest.raises(NotFound) as ei:
        sandbox.files.read("nope.txt")
    assert "nope.txt" in ei.value.message
    with pytest.raises(NotFound):
        sandbox.files.stat("nope.txt")
    with pytest.raises(NotFound):
        sandbox.files.remove("nope.txt")
    sandbox.files.mkdir("adir")
    with pytest.raises(FileError) as ei:
        sandbox.files.read("adir")
    assert ei.value.errno == 21 and ei.value.code == "file_error" and ei.value.status == 422
    with pytest.raises(TypeError):
        sandbox.files.write("x", 42)


def test_paths_stay_inside_the_sandbox(sandbox):
    # /etc/hostname of the sandbox, not of the host
    assert sandbox.files.read_text("../../etc/hostname").strip() == "sandbox"
    sandbox.exec("ln -s / rootlink")
    assert sandbox.files.read_text("rootlink/etc/hostname").strip() == "sandbox"


PIECE = 8 << 20


@pytest.mark.timeout(600)
def test_a_200_mib_file_goes_in_pieces_both_ways(sandbox, tmp_path):
    import hashlib
    import os

    size = 200 << 20
    src = tmp_path / "big.bin"
    h = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(size // (4 << 20)):
            block = os.urandom(4 << 20)
            h.update(block)
            f.write(block)
    # from a file object: streamed in pieces, never read whole
    with open(src, "rb") as f:
        info = sandbox.files.write("big.bin", f)
    assert info.size == size
    assert sandbox.exec("sha256sum big.bin").stdout.split()[0] == h.hexdigest()
    # bytes bigger than a piece (and than the daemon's 8 MiB upload limit) work too
    data = os.urandom(70 << 20)
    assert sandbox.files.write("b2.bin", data).size == len(data)
    assert sandbox.exec("sha256sum b2.bin").stdout.split()[0] == hashlib.sha256(data).hexdigest()
    del data
    # read back in pages
    back = hashlib.sha256()
    sizes = []
    for piece in sandbox.files.read_stream("big.bin"):
        sizes.append(len(piece))
        back.update(piece)
    assert back.hexdigest() == h.hexdigest()
    assert sum(sizes) == size and max(sizes) == PIECE
    # a part of it, in small pages
    with open(src, "rb") as f:
        f.seek(12345)
        want = f.read(1 << 20)
    got = b"".join(sandbox.files.read_stream("big.bin", offset=12345, length=1 << 20,
                                             chunk_size=100_000))
    assert got == want
    # a replaced file is replaced, not patched: the old tail is gone
    assert sandbox.files.write("big.bin", b"small").size == 5
    assert sandbox.files.read("big.bin") == b"small"


def test_read_has_a_default_maximum(sandbox):
    from withruntime import FileTooLarge

    sandbox.exec("head -c 3000000 /dev/urandom > three.bin")
    with pytest.raises(FileTooLarge) as e:
        sandbox.files.read("three.bin", max_bytes=1_000_000)
    assert e.value.size == 3_000_000
    assert "read_stream" in str(e.value) and "max_bytes" in str(e.value)
    assert isinstance(e.value, FileError)
    # a range within the limit, or a larger limit, reads
    assert len(sandbox.files.read("three.bin", offset=2_500_000, max_bytes=1_000_000)) == 500_000
    assert len(sandbox.files.read("three.bin", length=10, max_bytes=1_000_000)) == 10
    assert len(sandbox.files.read("three.bin", max_bytes=None)) == 3_000_000
    # a symlink is not sized by stat: the bounded read still refuses
    sandbox.exec("ln -sf three.bin link.bin")
    with pytest.raises(FileTooLarge):
        sandbox.files.read("link.bin", max_bytes=1_000_000)


@pytest.mark.timeout(120)
def test_a_one_terabyte_sparse_file_is_refused_not_read(sandbox):
    from withruntime import FileTooLarge

    assert sandbox.exec("truncate -s 1T huge.bin").exit_code == 0
    # refused from its size, before a byte of it is sent
    with pytest.raises(FileTooLarge) as e:
        sandbox.files.read("huge.bin")
    assert e.value.size == 1 << 40
    with pytest.raises(FileTooLarge):
        sandbox.files.read_text("huge.bin")
    # a part of it streams
    pieces = list(sandbox.files.read_stream("huge.bin", offset=(1 << 40) - 1000, length=5000))
    assert b"".join(pieces) == b"\0" * 1000
    gen = sandbox.files.read_stream("huge.bin", offset=1 << 39, chunk_size=1 << 20)
    assert next(gen) == b"\0" * (1 << 20)
    gen.close()
