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
