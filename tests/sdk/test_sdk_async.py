"""The async SDK (AsyncSandbox, AsyncClient) beside the sync one: against the real daemon the same
operations give the same answers and the same errors; calls run at once on one sandbox; streams
arrive as they are produced and a stream or call given up (cancelled, left, closed) ends the
command in the sandbox. Against small local servers: keep-alive, the bounded pool, a kept
connection the server closed, chunked answers, timeouts, malformed answers, and the same
connection discovery as the sync client."""

import asyncio
import hashlib
import io
import json
import os
import re

import pytest

from stubhttp import Server, Stub, free_port, json_answer
from withruntime import (
    AsyncClient,
    AsyncCommand,
    AsyncSandbox,
    AuthError,
    Client,
    ConfigurationError,
    Conflict,
    DaemonUnavailable,
    ExecFailed,
    FileError,
    FileInfo,
    FileTooLarge,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    Sandbox,
    ServerError,
    WithruntimeError,
)

SECRET = "wr-test-secret-key-async-7d1e"


def run(coro):
    return asyncio.run(coro)


def comparable(result):
    """An ExecResult without its timing."""
    d = dict(vars(result))
    d.pop("duration_ms")
    return d


async def gone_from_sandbox(sbx, marker, seconds=20):
    """True once no process of the sandbox has ``marker`` in its command line (waited for in
    the sandbox, up to ``seconds``)."""
    r = await sbx.exec(f"for i in $(seq {seconds * 10}); do ps -eo args | grep -q '[{marker[0]}]"
                       f"{marker[1:]}' || exit 0; sleep 0.1; done; exit 1",
                       timeout_seconds=seconds + 30)
    return r.exit_code == 0


# ---- against the real daemon ----


def test_same_answers_as_the_sync_sdk(sandbox):
    async def main():
        a = await AsyncSandbox.connect(sandbox.id)
        assert isinstance(a, AsyncSandbox) and a.id == sandbox.id and a.info == sandbox.info
        assert repr(a) == f"AsyncSandbox(id={sandbox.id!r}, state='running')"

        # commands
        for cmd, kw in [("echo out; echo err >&2; exit 3", {}),
                        (["python3", "-c", "import os,sys; print(os.getcwd(), os.environ['X'], "
                                           "sys.stdin.read())"],
                         {"env": {"X": "ex"}, "stdin": b"in\xff"}),
                        (r"printf '\377ok'", {}),
                        ("head -c 5000 /dev/zero", {"max_output_bytes": 10}),
                        ("echo started; sleep 30", {"timeout_seconds": 1})]:
            assert comparable(await a.exec(cmd, **kw)) == comparable(sandbox.exec(cmd, **kw))

        # files
        info = await a.files.write("d/a.txt", "héllo\n", mode=0o600)
        assert isinstance(info, FileInfo) and info == sandbox.files.stat("d/a.txt")
        assert await a.files.read("d/a.txt") == sandbox.files.read("d/a.txt") == "héllo\n".encode()
        assert await a.files.read_text("d/a.txt") == "héllo\n"
        assert await a.files.read("d/a.txt", offset=1, length=3) == \
            sandbox.files.read("d/a.txt", offset=1, length=3)
        await a.files.mkdir("d/sub/deeper")
        sandbox.exec("ln -s a.txt d/link")
        assert await a.files.list("d") == sandbox.files.list("d")
        assert await a.files.stat("d/link") == sandbox.files.stat("d/link")
        assert await a.files.exists("d/link") and not await a.files.exists("d/none")
        with pytest.raises(FileError):
            await a.files.remove("d/sub")
        await a.files.remove("d/sub", recursive=True)
        assert not sandbox.files.exists("d/sub")
        assert [p async for p in a.files.read_stream("d/a.txt", chunk_size=3)] == \
            list(sandbox.files.read_stream("d/a.txt", chunk_size=3))

        # background commands
        cmd = await a.exec_background("printf 'a\\0b'; echo err >&2; exit 4")
        assert isinstance(cmd, AsyncCommand) and cmd.state == "running"
        assert (await cmd.wait(30)) is cmd and cmd.exit_code == 4
        out = await cmd.output()
        sync_cmd = sandbox.command(cmd.id)
        assert vars(out) == vars(sync_cmd.output())
        assert cmd.info == sync_cmd.info
        sleeper = await a.exec_background(["sleep", "1000"])
        assert (await sleeper.wait(0.2)).state == "running"
        assert [c.id for c in await a.commands()] == [c.id for c in sandbox.commands()]
        assert (await a.command(sleeper.id)).state == "running"
        await sleeper.send_signal("TERM")
        assert (await sleeper.wait(30)).signal == 15
        with pytest.raises(Conflict):
            await sleeper.kill()

        # the sandbox
        stats = await a.stats()
        assert set(stats) == set(sandbox.stats())
        assert await a.events() == sandbox.events()
        assert await a.network_log() == sandbox.network_log()
        assert (await a.set_timeout(600)).timeout_seconds == 600
        assert sandbox.refresh().timeout_seconds == 600
        await a.set_network({"internet": True, "allow": ["PyPI.org."]})
        assert a.network == sandbox.refresh().network == {"internet": True, "allow": ["pypi.org"]}
        assert [s.id for s in await AsyncSandbox.list()] == [s.id for s in Sandbox.list()]
        assert (await a.stop()).state == "stopped"
        with pytest.raises(Conflict):
            await a.exec("true")
        assert (await a.start()).state == "running"
        assert sandbox.refresh().state == "running"
        assert await a.files.read_text("d/a.txt") == "héllo\n"

    run(main())


def test_create_and_async_with(daemon, new_sandboxes):
    async def main():
        async with AsyncSandbox.create(memory_mib=256, on_lease_end="delete",
                                       metadata={"k": "v"}) as sbx:
            assert sbx.state == "running" and sbx.metadata == {"k": "v"}
            assert (await sbx.exec("cat /etc/hostname")).stdout == "sandbox\n"
            sid = sbx.id
        assert sbx.state == "deleted"
        with pytest.raises(NotFound) as ei:
            await AsyncSandbox.connect(sid)
        assert sid in ei.value.message

        # create is a coroutine as well: for a task, gather, asyncio.run
        made = await asyncio.create_task(AsyncSandbox.create(memory_mib=256))
        assert isinstance(made, AsyncSandbox) and made.state == "running"
        await made.delete()

        # the default is to stop, and a block that raises still ends the lease
        with pytest.raises(ZeroDivisionError):
            async with await AsyncSandbox.create(memory_mib=256) as sbx:
                await sbx.files.write("kept.txt", "still here")
                1 / 0
        again = await AsyncSandbox.connect(sbx.id)
        assert again.state == "stopped"
        await again.start()
        assert await again.files.read_text("kept.txt") == "still here"
        states = [e.get("state") for e in await again.events() if e.get("type") == "state"]
        assert states[0] == "creating" and "stopped" in states
        await again.delete()
        assert again.state == "deleted"
        with pytest.raises(NotFound):
            await again.refresh()

    run(main())
    assert new_sandboxes() == []


def test_ten_execs_at_once_on_one_sandbox(sandbox):
    # Each command waits until all ten have started: they finish only if all run at once.
    # (Shell builtins but sleep: a 512 MiB sandbox runs at most 32 processes.)
    cmd = ("touch /tmp/ready-{i}; n=0; while set -- /tmp/ready-*; [ $# -lt 10 ]; do "
           "n=$((n+1)); [ $n -gt 600 ] && exit 9; sleep 0.05; done; echo {i}")

    async def main():
        sbx = await AsyncSandbox.connect(sandbox.id)
        results = await asyncio.gather(*[sbx.exec(cmd.format(i=i), timeout_seconds=60)
                                         for i in range(10)])
        assert [(r.exit_code, r.stdout, r.stderr) for r in results] == \
            [(0, f"{i}\n", "") for i in range(10)]
        # and many small calls at once, files and commands mixed
        writes = await asyncio.gather(*[sbx.files.write(f"many/{i}.txt", str(i))
                                        for i in range(30)])
        assert sorted(w.name for w in writes) == sorted(f"{i}.txt" for i in range(30))
        reads = await asyncio.gather(*[sbx.files.read(f"many/{i}.txt") for i in range(30)])
        assert reads == [str(i).encode() for i in range(30)]

    run(main())


def test_stream_arrives_as_it_is_produced(sandbox):
    async def main():
        sbx = await AsyncSandbox.connect(sandbox.id)
        events = sbx.exec_stream(
            "echo first; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo second; "
            "echo done >&2", timeout_seconds=60)
        first = await events.__anext__()
        assert (first.type, first.data, first.text) == ("stdout", b"first\n", "first\n")
        await sbx.files.write("/workspace/go", "")
        rest = [ev async for ev in events]
        assert rest[-1].type == "exit"
        assert b"".join(e.data for e in rest if e.type == "stdout") == b"second\n"
        assert b"".join(e.data for e in rest if e.type == "stderr") == b"done\n"
        result = rest[-1].result
        assert result.exit_code == 0 and result.stdout == "first\nsecond\n"

        # the same events as the sync stream
        cmd = r"printf '\377'; echo x >&2; exit 7"
        got = [(e.type, e.data) async for e in sbx.exec_stream(cmd)]
        want = [(e.type, e.data) for e in sandbox.exec_stream(cmd)]
        assert sorted(got) == sorted(want) and got[-1] == ("exit", b"")
        with pytest.raises(ExecFailed) as ei:
            async for _ in sbx.exec_stream(["no-such-program-xyz"]):
                pass
        assert "no-such-program-xyz" in ei.value.message

    run(main())


def test_a_cancelled_stream_ends_its_command(sandbox):
    async def main():
        sbx = await AsyncSandbox.connect(sandbox.id)
        started = asyncio.Event()
        seen = []

        async def consume():
            async for ev in sbx.exec_stream("echo started; exec sleep 31337",
                                            timeout_seconds=600):
                seen.append(ev.data)
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == [b"started\n"]
        assert await gone_from_sandbox(sbx, "sleep 31337")

        # leaving the loop early, in an async with block: closed at once
        async with sbx.exec_stream("echo a; exec sleep 31338", timeout_seconds=600) as events:
            async for ev in events:
                assert ev.data == b"a\n"
                break
        assert await gone_from_sandbox(sbx, "sleep 31338")

        # a whole (not streamed) exec whose task is cancelled
        task = asyncio.create_task(sbx.exec("touch /tmp/c-started; exec sleep 31339",
                                            timeout_seconds=600))
        while not await sbx.files.exists("/tmp/c-started"):
            pass
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await gone_from_sandbox(sbx, "sleep 31339")
        # the sandbox and the client carry on
        assert (await sbx.exec("echo ok")).stdout == "ok\n"

    run(main())


def test_files_over_8_mib_go_in_pieces(sandbox):
    data = os.urandom(20 << 20)
    digest = hashlib.sha256(data).hexdigest()

    async def main():
        sbx = await AsyncSandbox.connect(sandbox.id)
        info = await sbx.files.write("big.bin", data)
        assert info.size == len(data)
        assert (await sbx.exec("sha256sum big.bin")).stdout.split()[0] == digest
        assert await sbx.files.read("big.bin") == data
        pieces = [p async for p in sbx.files.read_stream("big.bin")]
        assert [len(p) for p in pieces] == [8 << 20, 8 << 20, 4 << 20]
        # from a binary file object, read in pieces off the event loop
        info = await sbx.files.write("big2.bin", io.BytesIO(data), mode="0640")
        assert (info.size, info.mode) == (len(data), "0640")
        assert (await sbx.exec("sha256sum big2.bin")).stdout.split()[0] == digest
        with pytest.raises(TypeError):
            await sbx.files.write("t.txt", io.StringIO("text"))
        with pytest.raises(FileTooLarge) as ei:
            await sbx.files.read("big.bin", max_bytes=1 << 20)
        assert ei.value.size == len(data)

    run(main())
    assert sandbox.files.read("big2.bin") == data


def test_daemon_errors_are_the_same_as_sync(sandbox):
    bad_id = "sb-" + "d" * 21
    cases = [
        ("exec", ("true",), {"timeout_seconds": -1}),
        ("exec", (["/nonexistent/prog"],), {}),
        ("exec", ("cat",), {"stdin": "x" * (2 << 20)}),  # over the 1 MiB JSON limit
        ("files.read", ("/",), {}),
        ("files.read", ("missing.txt",), {}),
        ("files.mkdir", ("x/y",), {"parents": False}),
        ("command", ("cmd-999999",), {}),
    ]

    def target(obj, name):
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    def sync_error(fn, *a, **kw):
        with pytest.raises(WithruntimeError) as ei:
            fn(*a, **kw)
        return ei.value

    async def async_error(aw):
        with pytest.raises(WithruntimeError) as ei:
            await aw
        return ei.value

    def same(s, a):
        assert (type(a), a.status, a.code, a.message, a.errno) == \
            (type(s), s.status, s.code, s.message, s.errno)

    async def main():
        a = await AsyncSandbox.connect(sandbox.id)
        kinds = []
        for name, args, kw in cases:
            s_err = sync_error(target(sandbox, name), *args, **kw)
            a_err = await async_error(target(a, name)(*args, **kw))
            same(s_err, a_err)
            kinds.append(type(a_err))
        assert kinds == [InvalidRequest, ExecFailed, PayloadTooLarge, FileError, NotFound,
                         NotFound, NotFound]
        same(sync_error(Sandbox.connect, bad_id), await async_error(AsyncSandbox.connect(bad_id)))
        same(sync_error(Client().request, "PUT", "/v1/sandboxes"),
             await async_error(AsyncClient().request("PUT", "/v1/sandboxes")))
        assert isinstance(await async_error(AsyncClient().request("PUT", "/v1/sandboxes")),
                          MethodNotAllowed)
        # the client carries on after each of them
        assert (await a.exec("echo fine")).stdout == "fine\n"
        await a.stop()
        same(sync_error(sandbox.files.read, "x"), await async_error(a.files.read("x")))
        with pytest.raises(Conflict) as ei:
            await a.exec("true")
        assert ei.value.status == 409 and "stopped" in ei.value.message

    run(main())


def test_one_client_on_two_event_loops(sandbox):
    client = AsyncClient()

    async def once(n):
        sbx = await AsyncSandbox.connect(sandbox.id, client=client)
        assert (await sbx.exec(f"echo {n}")).stdout == f"{n}\n"
        assert (await client.health())["status"] == "ok"
        await client.aclose()

    run(once(1))
    run(once(2))  # a new loop: the first loop's connections are not used in it


def test_local_unix_socket(daemon, clean_env, monkeypatch):
    monkeypatch.setenv("WITHRUNTIME_STATE_DIR", daemon.state_dir)

    async def main():
        client = AsyncClient()
        assert client.url == Client().url == "unix:" + daemon.socket_path
        assert (await client.health())["status"] == "ok"
        assert await client.images() == Client().images()
        async with await AsyncSandbox.create(memory_mib=256, on_lease_end="delete") as sbx:
            assert sbx.client.url.startswith("unix:")
            assert (await sbx.exec("echo over the socket")).stdout == "over the socket\n"
            assert [e.data async for e in sbx.exec_stream("echo s") if e.type == "stdout"] == \
                [b"s\n"]

    run(main())


# ---- connection discovery: the same as the sync client ----


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No RUNTIME_URL, no key, an empty config directory, nothing on PATH to start a daemon."""
    for k in ("RUNTIME_URL", "RUNTIME_API_KEY", "RUNTIME_CA_FILE", "WITHRUNTIME_STATE_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    return tmp_path


def save_connection(base, doc):
    d = base / "config" / "withruntime"
    d.mkdir(parents=True, exist_ok=True)
    (d / "connection.json").write_text(json.dumps(doc))


def test_discovery_matches_the_sync_client(clean_env, monkeypatch):
    def both():
        s, a = Client(), AsyncClient()
        assert (a.url, a.connection) == (s.url, s.connection)
        return a

    assert both().url == "unix:/var/lib/withruntime/withruntime.sock"
    monkeypatch.setenv("WITHRUNTIME_STATE_DIR", str(clean_env / "state"))
    assert both().connection.source == "local socket"
    save_connection(clean_env, {"url": "https://127.0.0.1:9", "key": "saved",
                                "ca_file": "/saved/ca.pem"})
    assert both().connection.ca_file == "/saved/ca.pem"
    monkeypatch.setenv("RUNTIME_CA_FILE", "/env/ca.pem")
    monkeypatch.setenv("RUNTIME_API_KEY", SECRET)
    a = both()
    assert a.connection.ca_file == "/env/ca.pem" and a.connection.key == SECRET
    monkeypatch.setenv("RUNTIME_URL", "http://127.0.0.1:1/prefix/")
    assert both().url == "http://127.0.0.1:1/prefix"
    assert SECRET not in repr(a) and SECRET not in repr(a.connection)
    for bad in ("ftp://host:1", "127.0.0.1:7070", "unix:", "http://host:notaport"):
        monkeypatch.setenv("RUNTIME_URL", bad)
        with pytest.raises(ConfigurationError) as ei:
            AsyncClient()
        assert "RUNTIME_URL" in ei.value.message


def test_the_key_goes_in_the_header_only(clean_env, monkeypatch):
    with Stub(body={"sandboxes": []}) as stub:
        monkeypatch.setenv("RUNTIME_URL", stub.url)
        monkeypatch.setenv("RUNTIME_API_KEY", SECRET)
        assert run(AsyncSandbox.list()) == []
        Sandbox.list()
        (m1, p1, h1, _), (m2, p2, h2, _) = stub.requests
        assert (m1, p1) == (m2, p2) == ("GET", "/v1/sandboxes")
        assert h1["Authorization"] == h2["Authorization"] == "Bearer " + SECRET
        assert h1["User-Agent"] == h2["User-Agent"] and h1["Accept"] == h2["Accept"]


def test_no_key_in_clear_text_off_loopback(clean_env):
    with pytest.raises(ConfigurationError) as ei:
        run(AsyncClient("http://0.0.0.0:1", SECRET).health())
    assert "clear text" in ei.value.message and SECRET not in str(ei.value)
    with pytest.raises(DaemonUnavailable):  # without a key it is tried, and nothing is there
        run(AsyncClient("http://0.0.0.0:1").health())
    with pytest.raises(ConfigurationError) as ei:
        run(AsyncClient("https://127.0.0.1:9", SECRET, ca_file=str(clean_env / "no.pem")).health())
    assert "no.pem" in ei.value.message


def test_no_daemon(clean_env, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(DaemonUnavailable) as ei:
        run(AsyncSandbox.create(client=AsyncClient(url)))
    assert isinstance(ei.value, ConnectionError) and url in ei.value.message
    state = clean_env / "state"
    state.mkdir()
    monkeypatch.setenv("WITHRUNTIME_STATE_DIR", str(state))
    with pytest.raises(DaemonUnavailable) as ei:
        run(AsyncSandbox.list())
    assert str(state / "withruntime.sock") in ei.value.message and "RUNTIME_URL" in ei.value.message


@pytest.mark.parametrize("status,body,cls", [
    (401, {"error": {"code": "unauthorized", "message": "no key"}}, AuthError),
    (403, {"error": {"code": "forbidden", "message": "read-only key"}}, AuthError),
    (503, {"error": {"code": "unavailable", "message": "shutting down"}}, DaemonUnavailable),
    (500, {"error": {"code": "internal", "message": "disk full"}}, ServerError),
    (418, {"error": {"code": "teapot", "message": "short and stout"}}, WithruntimeError),
    (502, b"<html>Bad Gateway</html>", ServerError),
    (200, b"hello", ServerError),
])
def test_error_answers_like_sync(status, body, cls):
    ctype = "application/json" if isinstance(body, dict) else "text/html"
    with Stub(status=status, body=body, content_type=ctype) as stub:
        with pytest.raises(WithruntimeError) as s:
            Sandbox.list(client=Client(stub.url))
        with pytest.raises(WithruntimeError) as a:
            run(AsyncSandbox.list(client=AsyncClient(stub.url)))
    assert type(a.value) is type(s.value) is cls
    assert (a.value.status, a.value.code, a.value.message) == \
        (s.value.status, s.value.code, s.value.message)


# ---- the transport, against a local server of the test's own ----


def test_keep_alive_reuses_one_connection():
    async def main():
        async with Server(lambda n, _: json_answer({"status": "ok", "n": n},
                                                   chunked=n % 2 == 0)) as srv:
            client = AsyncClient(srv.url)
            got = [(await client.health())["n"] for _ in range(6)]
            assert got == [1, 2, 3, 4, 5, 6]
            assert srv.connections == 1
            # an interim 100 answer is passed over; Connection: close is honoured
            srv.answer = lambda n, _: (b"HTTP/1.1 100 Continue\r\n\r\n"
                                       + json_answer({"n": n}, extra=b"Connection: close\r\n"))
            assert (await client.health())["n"] == 7
            srv.answer = lambda n, _: json_answer({"n": n})
            assert (await client.health())["n"] == 8
            assert srv.connections == 2
            await client.aclose()
            await srv.wait_for(lambda: srv.open == 0)

    run(main())


def test_the_pool_is_bounded():
    async def main():
        release = asyncio.Event()

        async def answer(n, _):
            if srv.in_flight >= 3:
                release.set()
            await release.wait()
            return json_answer({"n": n})

        async with Server(answer) as srv:
            client = AsyncClient(srv.url, max_connections=3, max_idle=1)
            got = await asyncio.gather(*[client.health() for _ in range(12)])
            assert sorted(g["n"] for g in got) == list(range(1, 13))
            assert srv.max_in_flight == 3
            await srv.wait_for(lambda: srv.open <= 1)  # one kept idle, the others closed
            await client.aclose()
            await srv.wait_for(lambda: srv.open == 0)

    run(main())


def test_a_kept_connection_the_server_closed_is_replaced():
    async def main():
        # the second request on the first connection is met by the connection closing, as a
        # daemon's idle timeout would: the client sends it again on a fresh connection
        async with Server(lambda n, _: None if n == 2 else json_answer({"n": n})) as srv:
            client = AsyncClient(srv.url)
            assert (await client.health())["n"] == 1
            assert (await client.request_json("POST", "/v1/x", json_body={}))["n"] == 3
            assert srv.connections == 2
            await client.aclose()

    run(main())


def test_timeouts_and_malformed_answers():
    async def main():
        never = asyncio.Event()

        async def silent(n, _):
            await never.wait()

        async with Server(silent) as srv:
            with pytest.raises(DaemonUnavailable) as ei:
                await AsyncClient(srv.url, timeout=0.3).health()
            assert "did not answer within 0.3 s" in ei.value.message
            never.set()
        for bad, what in [(b"HTPP/1.1 200 OK\r\n\r\n", "status line"),
                          (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "header line"),
                          (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
                          (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                           "chunk size"),
                          (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n", "headers")]:
            async with Server(lambda n, _, bad=bad: bad) as srv:
                with pytest.raises(ServerError) as ei:
                    await AsyncClient(srv.url).health()
                assert "malformed HTTP answer" in ei.value.message and what in ei.value.message
        # an answer cut short
        async with Server(lambda n, _: (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                                        "close")) as srv:
            with pytest.raises(DaemonUnavailable) as ei:
                await AsyncClient(srv.url).health()
            assert "closed the connection" in ei.value.message

    run(main())


def test_the_readmes_sdk_example(daemon, new_sandboxes, capsys):
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "python", "README.md")
    with open(readme) as f:
        text = f.read()
    section = text[text.index("\n## Async\n"):]
    example = re.findall(r"```python\n(.*?)```", section, re.S)[2]
    assert "asyncio.run(main())" in example
    exec(compile(example, "python/README.md (Async)", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out == (str([f"{i}\n" for i in range(10)]) + "\n"
                                       + "1\n2\n3\nexit 0\n")
    assert new_sandboxes() == []


def test_cancelled_calls_give_their_connections_back():
    async def main():
        release = asyncio.Event()

        async def answer(n, _):
            await release.wait()
            return json_answer({"n": n})

        async with Server(answer) as srv:
            client = AsyncClient(srv.url, max_connections=2)
            # two calls held by the server, three more waiting for a connection: all cancelled
            tasks = [asyncio.create_task(client.health()) for _ in range(5)]
            await srv.wait_for(lambda: srv.in_flight == 2)
            for t in tasks:
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(d, asyncio.CancelledError) for d in done)
            release.set()
            await srv.wait_for(lambda: srv.open == 0)  # their connections were closed
            # both connections are free again
            got = await asyncio.wait_for(asyncio.gather(client.health(), client.health()), 10)
            assert sorted(g["n"] for g in got) == [3, 4]
            await client.aclose()

    run(main())
