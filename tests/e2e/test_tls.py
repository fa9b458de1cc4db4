"""TLS on the API's TCP listener (`serve --tls-cert/--tls-key`), and keys never sent in clear text.

A daemon of its own serves TLS on 127.0.0.1 with a throwaway CA's certificate (made here with the
`openssl` command) for the address 127.0.0.1 only. The CLI and the SDK reach it with the CA file,
fail without it, and fail for a name the certificate does not carry; clients that do not speak
TLS, or nothing at all, are closed without harm to the daemon. A key meant for plain http to an
address that is not loopback is refused before any connection: those checks run in a network
namespace of their own with no route anywhere, so even a broken check could not send a byte off
this host. All traffic goes to loopback.
"""

import asyncio
import http.client
import json
import os
import pty
import select
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import time

import pytest

import conftest
import wrclient
from test_failures import FakeDaemon, serve_checked

sys.path.insert(0, os.path.join(conftest.ROOT, "python"))

import withruntime  # noqa: E402

T = 60
CAP = 8  # --max-connections: small, so the cap is reached with a few silent clients


def openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=T)
    assert r.returncode == 0, r.stderr
    return r


def make_pki(d):
    """A CA, a server certificate for IP 127.0.0.1 signed by it, and a key of another pair."""
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("[srv]\nsubjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\n")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=withruntime test CA", cwd=d)
    openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf",
            "-extensions", "srv", cwd=d)
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out",
            "other.key", cwd=d)
    return {n: os.path.join(d, n) for n in ("ca.pem", "srv.pem", "srv.key", "other.key")}


class TLSDaemon(FakeDaemon):
    """A fake-driver daemon whose TCP listener speaks TLS. Its own helpers (start's key check,
    health, cleanup) talk to the Unix socket, which stays plain."""

    def __init__(self):
        self.pki_dir = tempfile.mkdtemp(prefix="wr-tls-pki-")
        self.pki = make_pki(self.pki_dir)
        super().__init__(conftest.WR_AGENT, [
            "--tls-cert", self.pki["srv.pem"], "--tls-key", self.pki["srv.key"],
            "--header-timeout", "2", "--idle-timeout", "120", "--max-connections", str(CAP)])
        self.url = f"https://127.0.0.1:{self.port}"
        self.client = wrclient.Client(unix_path=self.socket_path)


@pytest.fixture(scope="module")
def tls():
    d = TLSDaemon()
    try:
        yield from serve_checked(d)
    finally:
        shutil.rmtree(d.pki_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def key(tls):
    k = tls.make_key()
    yield k["key"]
    tls.admin.request("POST", f"/v1/keys/{k['id']}/revoke")


def cli(tls, *args, env=None, stdin=None, netns=False):
    """Runs the CLI with only the given connection settings (no saved login: HOME is empty)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("RUNTIME_") and k not in ("XDG_CONFIG_HOME",)}
    home = tempfile.mkdtemp(prefix="wr-tls-home-")
    base["HOME"] = home
    base.update(env or {})
    argv = [tls.bin, *args]
    if netns:  # a network namespace with nothing in it: no byte can leave this host
        argv = ["unshare", "--net", "--", *argv]
    try:
        return subprocess.run(argv, env=base, input=stdin, capture_output=True, text=True,
                              timeout=T)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def https_env(tls, key, ca=True, url=None):
    env = {"RUNTIME_URL": url or tls.url, "RUNTIME_API_KEY": key}
    if ca:
        env["RUNTIME_CA_FILE"] = tls.pki["ca.pem"]
    return env


def tls_request(tls, head, body=b""):
    """One hand-made request over TLS (trusting the test CA); (status, body)."""
    ctx = ssl.create_default_context(cafile=tls.pki["ca.pem"])
    with socket.create_connection(("127.0.0.1", tls.port), timeout=T) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(head.encode() + body)
            f = s.makefile("rb")
            status = int(f.readline().split()[1])
            n = 0
            while True:
                line = f.readline().strip()
                if not line:
                    break
                k, v = line.decode().split(":", 1)
                if k.strip().lower() == "content-length":
                    n = int(v)
            return status, f.read(n)


def drain(sock, limit=60):
    """Reads sock until the daemon closes it (EOF or reset): (closed within limit s, bytes)."""
    sock.settimeout(limit)
    got = b""
    try:
        while True:
            b = sock.recv(4096)
            if not b:
                return True, got
            got += b
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return True, got
    except socket.timeout:
        return False, got


def closed_eventually(sock, limit=60):
    return drain(sock, limit)[0]


def open_fds(tls):
    return len(os.listdir(f"/proc/{tls.proc.pid}/fd"))


# ---- the CLI ----


def test_cli_lists_and_runs_over_https(tls, key):
    r = cli(tls, "sandbox", "list", env=https_env(tls, key))
    assert r.returncode == 0 and r.stdout.startswith("ID"), r
    r = cli(tls, "sandbox", "run", "--", "echo", "over tls", env=https_env(tls, key))
    assert r.returncode == 0 and r.stdout == "over tls\n", r


def test_cli_exec_interactive_over_https(tls, key):
    # a session's WebSocket on the TLS listener: the upgraded connection stays TLS
    r = cli(tls, "sandbox", "create", env=https_env(tls, key))
    assert r.returncode == 0, r
    sid = r.stdout.strip()
    try:
        r = cli(tls, "sandbox", "exec", "-i", sid, "--", "sh", "-c", "tr a-z A-Z; exit 6",
                env=https_env(tls, key), stdin="over a websocket\n")
        assert r.returncode == 6 and r.stdout == "OVER A WEBSOCKET\n", r
    finally:
        cli(tls, "sandbox", "rm", sid, env=https_env(tls, key))


def test_cli_without_the_ca_refuses_the_certificate(tls, key):
    r = cli(tls, "sandbox", "list", env=https_env(tls, key, ca=False))
    assert r.returncode != 0, r
    assert "certificate" in r.stderr and "not trusted" in r.stderr, r.stderr
    assert "RUNTIME_CA_FILE" in r.stderr and key not in r.stderr, r.stderr


def test_cli_checks_the_name_in_the_certificate(tls, key):
    # the certificate is for the address 127.0.0.1, not the name localhost
    r = cli(tls, "sandbox", "list",
            env=https_env(tls, key, url=f"https://localhost:{tls.port}"))
    assert r.returncode != 0 and "mismatch" in r.stderr, r


def test_cli_with_an_unreadable_ca_file(tls, key):
    env = https_env(tls, key)
    env["RUNTIME_CA_FILE"] = os.path.join(tls.pki_dir, "missing.pem")
    r = cli(tls, "sandbox", "list", env=env)
    assert r.returncode != 0 and "missing.pem" in r.stderr, r


def test_cli_plain_http_to_the_tls_port_fails_cleanly(tls, key):
    r = cli(tls, "sandbox", "list", env={"RUNTIME_URL": f"http://127.0.0.1:{tls.port}",
                                          "RUNTIME_API_KEY": key})
    assert r.returncode != 0 and "daemon" in r.stderr, r
    tls.assert_alive()


# ---- the SDK ----


def test_sdk_over_https(tls, key):
    c = withruntime.Client(tls.url, key, ca_file=tls.pki["ca.pem"])
    with withruntime.Sandbox.create(client=c, memory_mib=256, on_lease_end="delete") as sbx:
        assert sbx.exec("echo sdk").stdout == "sdk\n"
        assert [e.data for e in sbx.exec_stream("echo s") if e.type == "stdout"] == [b"s\n"]
        sbx.files.write("t.txt", b"tls")
        assert sbx.files.read("t.txt") == b"tls"


def test_sdk_ca_file_from_the_environment(tls, key, monkeypatch):
    for k, v in https_env(tls, key).items():
        monkeypatch.setenv(k, v)
    assert withruntime.Client().request_json("GET", "/v1/sandboxes") == {"sandboxes": []}


def test_sdk_without_the_ca_refuses_the_certificate(tls, key, monkeypatch):
    monkeypatch.delenv("RUNTIME_CA_FILE", raising=False)
    with pytest.raises(withruntime.ConfigurationError) as ei:
        withruntime.Client(tls.url, key).health()
    assert "not trusted" in ei.value.message and key not in str(ei.value)
    with pytest.raises(withruntime.ConfigurationError) as ei:
        withruntime.Client(f"https://localhost:{tls.port}", key,
                           ca_file=tls.pki["ca.pem"]).health()
    assert "not trusted" in ei.value.message


def test_async_sdk_over_https(tls, key, monkeypatch):
    monkeypatch.delenv("RUNTIME_CA_FILE", raising=False)

    async def main():
        c = withruntime.AsyncClient(tls.url, key, ca_file=tls.pki["ca.pem"])
        async with withruntime.AsyncSandbox.create(client=c, memory_mib=256,
                                                   on_lease_end="delete") as sbx:
            assert (await sbx.exec("echo sdk")).stdout == "sdk\n"
            got = [e.data async for e in sbx.exec_stream("echo s") if e.type == "stdout"]
            assert got == [b"s\n"]
            await sbx.files.write("t.txt", b"tls")
            assert await sbx.files.read("t.txt") == b"tls"
        await c.aclose()
        with pytest.raises(withruntime.ConfigurationError) as ei:
            await withruntime.AsyncClient(tls.url, key).health()
        assert "not trusted" in ei.value.message and key not in str(ei.value)
        with pytest.raises(withruntime.ConfigurationError) as ei:
            await withruntime.AsyncClient(f"https://localhost:{tls.port}", key,
                                          ca_file=tls.pki["ca.pem"]).health()
        assert "not trusted" in ei.value.message

    asyncio.run(main())


# ---- what reaches the TLS port ----


def test_tls_answers_go_out_without_waiting_for_acks(tls, key):
    """An answer over TLS is two records or more (header block, body); with Nagle's algorithm
    on, the second waited for the client's delayed ACK of the first: ~40 ms on every call
    (bench/sdk.py measured 44 ms for a health check, 0.3 ms with the option). The daemon's end
    of the connection is read for TCP_NODELAY."""
    ctx = ssl.create_default_context(cafile=tls.pki["ca.pem"])
    conn = http.client.HTTPSConnection("127.0.0.1", tls.port, timeout=T, context=ctx)
    try:
        conn.request("GET", "/v1/health", headers={"Authorization": f"Bearer {key}"})
        r = conn.getresponse()
        r.read()
        assert r.status == 200, r.status
        end = conftest.daemons_end(tls.proc.pid, conn.sock)
        try:
            assert end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            end.close()
    finally:
        conn.close()


def test_plain_http_to_the_tls_port_is_closed_and_the_daemon_serves_on(tls, key):
    before = open_fds(tls)
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", tls.port), timeout=T) as s:
            s.sendall(f"GET /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1:{tls.port}\r\n"
                      f"Authorization: Bearer {key}\r\n\r\n".encode())
            closed, got = drain(s)
            assert closed and not got.startswith(b"HTTP/"), got
    for _ in range(50):  # a handshake that is garbage halfway
        with socket.create_connection(("127.0.0.1", tls.port), timeout=T) as s:
            s.sendall(b"\x16\x03\x01\x00\x30" + os.urandom(48))
            assert closed_eventually(s)
    status, _ = tls_request(tls, f"GET /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1:{tls.port}\r\n"
                                 f"Authorization: Bearer {key}\r\nConnection: close\r\n\r\n")
    assert status == 200
    deadline = time.monotonic() + 10
    while open_fds(tls) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_fds(tls) <= before, "the failed handshakes left fds open"


def test_a_client_that_never_speaks_is_closed(tls, key):
    """Closed by the header deadline (counted in the log), not by the idle timeout."""
    before = tls.log_bytes().count(b"event=http.header_timeout")
    silent = socket.create_connection(("127.0.0.1", tls.port), timeout=T)
    ctx = ssl.create_default_context(cafile=tls.pki["ca.pem"])
    handshaken = ctx.wrap_socket(socket.create_connection(("127.0.0.1", tls.port), timeout=T),
                                 server_hostname="127.0.0.1")
    try:
        assert closed_eventually(silent), "a client that never started TLS was not closed"
        assert closed_eventually(handshaken), "a client that never sent a request was not closed"
    finally:
        silent.close()
        handshaken.close()
    assert tls.log_bytes().count(b"event=http.header_timeout") >= before + 2
    assert withruntime.Client(tls.url, key, ca_file=tls.pki["ca.pem"]).health()["status"] == "ok"


def test_silent_clients_at_the_cap_hold_a_new_one_only_until_the_deadline(tls, key):
    silent = [socket.create_connection(("127.0.0.1", tls.port), timeout=T) for _ in range(CAP)]
    try:
        # waits in the backlog while the cap is full, answered once the deadline frees it
        c = withruntime.Client(tls.url, key, ca_file=tls.pki["ca.pem"], timeout=T)
        assert c.health()["status"] == "ok"
        assert all(closed_eventually(s) for s in silent)
    finally:
        for s in silent:
            s.close()


def test_limits_and_the_door_on_tls(tls, key):
    host = f"127.0.0.1:{tls.port}"
    head = (f"POST /v1/sandboxes HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 99999999\r\n"
            f"Connection: close\r\n\r\n")
    status, body = tls_request(tls, head, b"{}")
    assert status == 413 and json.loads(body)["error"]["code"] == "payload_too_large", body
    get = (f"GET /v1/sandboxes HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
           f"Connection: close\r\n")
    assert tls_request(tls, get + f"Origin: https://{host}\r\n\r\n")[0] == 200
    # on a TLS listener the daemon's own origin is https
    assert tls_request(tls, get + f"Origin: http://{host}\r\n\r\n")[0] == 403
    assert tls_request(tls, get.replace(host, "evil.example") + "\r\n")[0] == 403


# ---- keys never go in clear text off loopback ----


def test_cli_refuses_a_key_for_plain_http_off_loopback(tls, key):
    r = cli(tls, "sandbox", "list", env={"RUNTIME_URL": "http://10.0.0.1:1",
                                          "RUNTIME_API_KEY": key}, netns=True)
    assert r.returncode != 0 and "clear text" in r.stderr and "https://" in r.stderr, r
    assert key not in r.stderr
    r = cli(tls, "login", "http://10.0.0.1:1", "--key", "-", stdin=key + "\n", netns=True)
    assert r.returncode != 0 and "refusing" in r.stderr, r


def test_sdk_refuses_a_key_for_plain_http_off_loopback(tls, key):
    code = ("import sys, withruntime\n"
            "try:\n"
            "    withruntime.Client('http://10.0.0.1:1', sys.argv[1]).health()\n"
            "except withruntime.ConfigurationError as e:\n"
            "    print(e.message)\n"
            "    sys.exit(3)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(conftest.ROOT, "python"))
    r = subprocess.run(["unshare", "--net", "--", sys.executable, "-c", code, key], env=env,
                       capture_output=True, text=True, timeout=T)
    assert r.returncode == 3 and "clear text" in r.stdout, r
    assert key not in r.stdout


# ---- login ----


def test_login_with_the_key_on_stdin(tls, key):
    home = tempfile.mkdtemp(prefix="wr-tls-login-")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RUNTIME_") and k != "XDG_CONFIG_HOME"}
    env["HOME"] = home
    try:
        r = subprocess.run([tls.bin, "login", "--url", tls.url, "--key", "-", "--ca-file",
                            tls.pki["ca.pem"]], input=key + "\n", env=env, capture_output=True,
                           text=True, timeout=T)
        assert r.returncode == 0 and "answers" in r.stderr, r
        assert "warning" not in r.stderr, r.stderr
        path = os.path.join(home, ".config", "withruntime", "connection.json")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open(path) as f:
            saved = json.load(f)
        assert saved == {"url": tls.url, "key": key, "ca_file": tls.pki["ca.pem"]}
        r = subprocess.run([tls.bin, "sandbox", "list"], env=env, capture_output=True, text=True,
                           timeout=T)
        assert r.returncode == 0, r
        # a key in argv works, with a warning that others can read it
        r = subprocess.run([tls.bin, "login", tls.url, "--key", key, "--ca-file",
                            tls.pki["ca.pem"]], env=env, capture_output=True, text=True,
                           timeout=T, stdin=subprocess.DEVNULL)
        assert r.returncode == 0 and "process list" in r.stderr, r
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_login_asks_for_the_key_without_echo(tls, key):
    home = tempfile.mkdtemp(prefix="wr-tls-login-")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RUNTIME_") and k != "XDG_CONFIG_HOME"}
    env["HOME"] = home
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([tls.bin, "login", tls.url, "--ca-file", tls.pki["ca.pem"]],
                             stdin=slave, stdout=slave, stderr=slave, env=env,
                             start_new_session=True)
        os.close(slave)
        slave = -1
        out = b""
        deadline = time.monotonic() + T
        while b"API key" not in out and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                out += os.read(master, 4096)
        assert b"API key" in out, out
        os.write(master, key.encode() + b"\n")
        while p.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out += os.read(master, 4096)
                except OSError:
                    break
        assert p.wait(timeout=T) == 0, out
        assert key.encode() not in out, "the key was echoed"
        with open(os.path.join(home, ".config", "withruntime", "connection.json")) as f:
            assert json.load(f)["key"] == key
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
        shutil.rmtree(home, ignore_errors=True)


# ---- start-up errors ----


@pytest.mark.parametrize("cert,keyf,says", [
    ("srv.pem", "other.key", "does not match"),
    ("missing.pem", "srv.key", "missing.pem"),
    ("srv.pem", "ca.pem", "not a PEM private key"),
    ("srv.key", "srv.key", "not a PEM certificate")])
def test_bad_tls_files_stop_the_daemon_at_start(tls, cert, keyf, says):
    state = tempfile.mkdtemp(prefix="wr-tls-bad-")
    try:
        r = subprocess.run([tls.bin, "serve", "--state-dir", state, "--driver", "fake",
                            "--agent", tls.agent, "--listen", f"127.0.0.1:{conftest.free_port()}",
                            "--socket", os.path.join(state, "s.sock"),
                            "--tls-cert", os.path.join(tls.pki_dir, cert),
                            "--tls-key", os.path.join(tls.pki_dir, keyf)],
                           capture_output=True, text=True, timeout=T, stdin=subprocess.DEVNULL)
        assert r.returncode != 0 and says in r.stderr, r
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_tls_flags_go_together(tls):
    r = subprocess.run([tls.bin, "serve", "--tls-cert", tls.pki["srv.pem"]], capture_output=True,
                       text=True, timeout=T, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "go together" in r.stderr, r
