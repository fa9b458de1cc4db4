"""Finding the daemon: RUNTIME_URL and RUNTIME_API_KEY, the saved connection, the local Unix
socket; the key goes in the Authorization header and nowhere else."""

import json
import os
import shlex
import shutil
import signal
import socket
import time

import pytest

import withruntime
from stubhttp import Stub, free_port
from withruntime import AuthError, Client, ConfigurationError, DaemonUnavailable, Sandbox
from withruntime.tools import sandbox_tools

SECRET = "wr-test-secret-key-4f1b2c"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No RUNTIME_URL, no key, an empty config directory, and no `withruntime` on PATH (so
    nothing starts a daemon behind the test's back)."""
    for k in ("RUNTIME_URL", "RUNTIME_API_KEY", "RUNTIME_CA_FILE", "WITHRUNTIME_STATE_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    return tmp_path


def save_connection(base, url, key=None):
    d = base / "config" / "withruntime"
    d.mkdir(parents=True, exist_ok=True)
    doc = {"url": url}
    if key:
        doc["key"] = key
    (d / "connection.json").write_text(json.dumps(doc))


def test_runtime_url_and_key(clean_env, monkeypatch):
    with Stub(body={"sandboxes": []}) as stub:
        monkeypatch.setenv("RUNTIME_URL", stub.url)
        monkeypatch.setenv("RUNTIME_API_KEY", SECRET)
        assert Sandbox.list() == []
        method, path, headers, _ = stub.requests[0]
        assert (method, path) == ("GET", "/v1/sandboxes")
        assert headers["Authorization"] == "Bearer " + SECRET
        client = Client()
        assert client.url == stub.url
        assert SECRET not in repr(client)
        assert SECRET not in repr(client.connection)


def test_no_key_no_header(clean_env, monkeypatch):
    with Stub(body={"sandboxes": []}) as stub:
        monkeypatch.setenv("RUNTIME_URL", stub.url)
        Sandbox.list()
        assert "Authorization" not in stub.requests[0][2]


def test_saved_connection(clean_env, monkeypatch):
    with Stub(body={"sandboxes": []}) as stub:
        save_connection(clean_env, stub.url, "saved-key")
        assert Client().url == stub.url
        Sandbox.list()
        assert stub.requests[-1][2]["Authorization"] == "Bearer saved-key"
        # RUNTIME_API_KEY wins over the saved key, as in the command line
        monkeypatch.setenv("RUNTIME_API_KEY", SECRET)
        Sandbox.list()
        assert stub.requests[-1][2]["Authorization"] == "Bearer " + SECRET
        # and RUNTIME_URL over the saved URL
        monkeypatch.setenv("RUNTIME_URL", "http://127.0.0.1:1")
        assert Client().url == "http://127.0.0.1:1"


def test_saved_connection_under_home(clean_env, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    home = clean_env / "home"
    (home / ".config" / "withruntime").mkdir(parents=True)
    (home / ".config" / "withruntime" / "connection.json").write_text(
        json.dumps({"url": "http://127.0.0.1:9/x"}))
    monkeypatch.setenv("HOME", str(home))
    assert Client().url == "http://127.0.0.1:9/x"


def test_saved_connection_to_the_real_daemon(daemon, clean_env):
    save_connection(clean_env, daemon.url, daemon.key)
    with Sandbox.create(memory_mib=256, on_lease_end="delete") as sbx:
        assert sbx.exec("echo via saved").stdout == "via saved\n"


def test_saved_connection_without_a_key_is_refused(daemon, clean_env):
    save_connection(clean_env, daemon.url)
    with pytest.raises(AuthError) as ei:
        Sandbox.create(memory_mib=256, on_lease_end="delete")
    assert ei.value.status == 401 and "API key" in ei.value.message


def test_local_unix_socket(daemon, clean_env, monkeypatch):
    monkeypatch.setenv("WITHRUNTIME_STATE_DIR", daemon.state_dir)
    client = Client()
    assert client.url == "unix:" + daemon.socket_path
    assert client.health()["status"] == "ok"
    with Sandbox.create(memory_mib=256, on_lease_end="delete") as sbx:
        assert sbx.client.url.startswith("unix:")
        assert sbx.exec("echo over the socket").stdout == "over the socket\n"
        assert [e.data for e in sbx.exec_stream("echo s") if e.type == "stdout"] == [b"s\n"]
        sbx.files.write("u.txt", b"unix")
        assert sbx.files.read("u.txt") == b"unix"


def test_unix_url_forms(daemon):
    for url in ("unix:" + daemon.socket_path, "unix://" + daemon.socket_path):
        assert Client(url).health()["status"] == "ok"


def test_default_socket_path(clean_env):
    assert Client().url == "unix:/var/lib/withruntime/withruntime.sock"


def test_no_daemon_at_url(clean_env, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("RUNTIME_URL", url)
    with pytest.raises(DaemonUnavailable) as ei:
        Sandbox.create()
    assert isinstance(ei.value, ConnectionError)
    assert url in ei.value.message
    assert ei.value.status is None


def test_no_daemon_on_socket(clean_env, monkeypatch):
    state = clean_env / "state"
    state.mkdir()
    monkeypatch.setenv("WITHRUNTIME_STATE_DIR", str(state))
    with pytest.raises(DaemonUnavailable) as ei:
        Sandbox.list()
    assert str(state / "withruntime.sock") in ei.value.message
    assert "RUNTIME_URL" in ei.value.message  # says how to point elsewhere


def test_bad_urls(clean_env, monkeypatch):
    for bad in ("ftp://host:1", "127.0.0.1:7070", "unix:", "http://host:notaport"):
        monkeypatch.setenv("RUNTIME_URL", bad)
        with pytest.raises(ConfigurationError) as ei:
            Client()
        assert "RUNTIME_URL" in ei.value.message


def test_bad_saved_connection(clean_env):
    d = clean_env / "config" / "withruntime"
    d.mkdir(parents=True)
    (d / "connection.json").write_text("{not json")
    with pytest.raises(ConfigurationError) as ei:
        Client()
    assert "connection.json" in ei.value.message
    assert "withruntime login" in ei.value.message


def test_key_never_reaches_the_model(clean_env, monkeypatch):
    monkeypatch.setenv("RUNTIME_API_KEY", SECRET)
    # a daemon that refuses the key, and one that is not there
    with Stub(status=401, body={"error": {"code": "unauthorized",
                                          "message": "the API key is not valid"}}) as stub:
        monkeypatch.setenv("RUNTIME_URL", stub.url)
        sbx = Sandbox({"id": "sb-" + "c" * 21}, Client())
        outputs = [tool(*args) for tool, args in zip(
            sandbox_tools(sbx), [("ls",), ("a.txt",), ("a.txt", "x"), (".",)])]
        assert stub.requests[0][2]["Authorization"] == "Bearer " + SECRET
    for out in outputs:
        assert out.startswith("error:")
        assert "the API key is not valid" in out
        assert SECRET not in out
    monkeypatch.setenv("RUNTIME_URL", f"http://127.0.0.1:{free_port()}")
    sbx = Sandbox({"id": "sb-" + "c" * 21}, Client())
    out = sandbox_tools(sbx)[0]("ls")
    assert "could not be reached" in out and SECRET not in out
    assert SECRET not in repr(sbx) and SECRET not in repr(sbx.client)
    with pytest.raises(withruntime.WithruntimeError) as ei:
        sbx.exec("ls")
    assert SECRET not in str(ei.value) and SECRET not in repr(ei.value)


def _pids_serving(state_dir):
    """PIDs of processes whose command line is a daemon serving state_dir."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and state_dir.encode() in argv:
            found.append(int(d))
    return found


def test_starts_the_local_daemon_when_none_runs(daemon, clean_env, monkeypatch):
    if daemon.bin_is_dev:
        pytest.skip("the dev daemon binary has no command line to start a daemon with")
    if os.geteuid() != 0:
        pytest.skip("only root's programs start the local daemon")
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to start the daemon in a network namespace")
    # The daemon the CLI starts serves its state directory's socket and also 127.0.0.1:7070
    # (the CLI gives `serve` no --listen). The README's two commands leave such a daemon
    # running, so 7070 may be taken on this host: the `withruntime` the SDK finds on PATH runs
    # the real one in a network namespace of its own, where 7070 is free, and the test talks to
    # it over the socket (a path, reachable from any network namespace).
    bindir = clean_env / "bin"
    bindir.mkdir()
    wrapper = bindir / "withruntime"
    wrapper.write_text(f'#!/bin/sh\nexec unshare --net -- {shlex.quote(daemon.bin)} "$@"\n')
    wrapper.chmod(0o755)
    state = str(clean_env / "state")
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("WITHRUNTIME_STATE_DIR", state)
    # as on a host where the README's daemon runs: 7070 held here, whenever it is free
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 7070))
        holder.listen(1)
    except OSError:
        holder.close()
        holder = None
    try:
        client = Client()
        assert client.url == f"unix:{state}/withruntime.sock"
        assert client.health()["status"] == "ok"
        assert len(_pids_serving(state)) == 1
        # started as /proc/self/exe, it still goes by its own name in ps, top and pgrep
        with open(f"/proc/{_pids_serving(state)[0]}/comm") as f:
            assert f.read().strip() == "withruntime"
    finally:
        # the daemon was started detached (not our child): stop it by its pid
        pids = _pids_serving(state)
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        for _ in range(150):
            if not any(os.path.exists(f"/proc/{pid}") for pid in pids):
                break
            time.sleep(0.1)
        if holder is not None:
            holder.close()


@pytest.mark.parametrize("host,loop", [
    ("localhost", True), ("LOCALHOST", True), ("127.0.0.1", True), ("127.9.8.7", True),
    ("::1", True), ("::ffff:127.0.0.1", True), ("10.0.0.1", False), ("0.0.0.0", False),
    ("127.1", False), ("localhost.evil.example", False), ("api.example.com", False)])
def test_loopback_by_spelling(host, loop):
    assert withruntime.client.is_loopback_host(host) is loop


def test_key_never_sent_in_clear_text_off_loopback(clean_env, monkeypatch):
    # 0.0.0.0 is not loopback by its spelling, but a connection to it would stay on this host:
    # a check that failed to refuse could not send the key anywhere, and would be seen as
    # "cannot reach" instead of the refusal
    monkeypatch.setenv("RUNTIME_URL", "http://0.0.0.0:1")
    monkeypatch.setenv("RUNTIME_API_KEY", SECRET)
    with pytest.raises(ConfigurationError) as ei:
        Sandbox.list()
    assert "clear text" in ei.value.message and "https://" in ei.value.message
    assert SECRET not in str(ei.value)
    with pytest.raises(ConfigurationError):
        Client("http://0.0.0.0:1", SECRET).health()
    # without a key, or over https, it is tried (and nothing listens there)
    with pytest.raises(DaemonUnavailable):
        Client("http://0.0.0.0:1").health()
    with pytest.raises(DaemonUnavailable):
        Client("https://0.0.0.0:1", SECRET).health()


def test_ca_file_from_the_environment_and_the_saved_connection(clean_env, monkeypatch):
    d = clean_env / "config" / "withruntime"
    d.mkdir(parents=True)
    (d / "connection.json").write_text(json.dumps(
        {"url": "https://127.0.0.1:9", "key": SECRET, "ca_file": "/saved/ca.pem"}))
    assert Client().connection.ca_file == "/saved/ca.pem"
    monkeypatch.setenv("RUNTIME_CA_FILE", "/env/ca.pem")
    assert Client().connection.ca_file == "/env/ca.pem"
    assert Client(ca_file="/arg/ca.pem").connection.ca_file == "/arg/ca.pem"
    with pytest.raises(ConfigurationError) as ei:
        Client("https://127.0.0.1:9", ca_file=str(clean_env / "missing.pem")).health()
    assert "missing.pem" in ei.value.message
