"""The sync client keeps connections open between calls (HTTP/1.1 keep-alive): one connection
for a run of calls, a fresh one when the server closed the kept one (before or while the next
request was sent), none past max_idle, none across a fork, a timeout that is not taken for a
closed connection, and close(). Against a local server that counts connections; and against
the real daemon, a sandbox's calls on one connection, closed when its `with` block ends."""

import asyncio
import os
import threading

import pytest

from stubhttp import ThreadedServer, json_answer
from withruntime import Client, DaemonUnavailable, NotFound, Sandbox


def ok(n, _):
    return json_answer({"status": "ok", "n": n})


def test_calls_share_one_connection_until_closed():
    with ThreadedServer(lambda n, _: json_answer({"n": n}, chunked=n % 2 == 0)) as ts:
        client = Client(ts.url)
        assert [client.health()["n"] for _ in range(6)] == [1, 2, 3, 4, 5, 6]
        assert ts.server.connections == 1
        # a POST with a body, and an error answer, keep it too
        assert client.request_json("POST", "/v1/x", json_body={"a": 1})["n"] == 7
        ts.server.answer = lambda n, _: (b"HTTP/1.1 404 Not Found\r\nContent-Type: "
                                         b"application/json\r\nContent-Length: 2\r\n\r\n{}")
        with pytest.raises(NotFound):
            client.health()
        ts.server.answer = ok
        assert client.health()["n"] == 9
        assert ts.server.connections == 1
        # Connection: close is honoured: the next call opens a new one
        ts.server.answer = lambda n, _: json_answer({"n": n}, extra=b"Connection: close\r\n")
        assert client.health()["n"] == 10
        ts.wait_for(lambda: ts.server.open == 0)
        ts.server.answer = ok
        assert client.health()["n"] == 11
        assert ts.server.connections == 2
        client.close()
        ts.wait_for(lambda: ts.server.open == 0)
        assert client.health()["n"] == 12  # still usable after close()
        assert ts.server.connections == 3
        with client:
            pass
        ts.wait_for(lambda: ts.server.open == 0)


def test_a_connection_closed_while_idle_is_not_used_again():
    # the server answers and then closes, as the daemon's idle timeout does
    with ThreadedServer(lambda n, _: (json_answer({"n": n}), "close")) as ts:
        client = Client(ts.url)
        assert client.health()["n"] == 1
        ts.wait_for(lambda: ts.server.open == 0)
        assert client.health()["n"] == 2
        assert (ts.server.connections, ts.server.requests) == (2, 2)
        client.close()


def test_a_connection_closed_as_the_request_arrives_is_replaced():
    # the second request on the first connection is met by the connection closing (the race
    # with an idle timeout): the client sends it again on a fresh connection, once
    with ThreadedServer(lambda n, _: None if n == 2 else json_answer({"n": n})) as ts:
        client = Client(ts.url)
        assert client.health()["n"] == 1
        assert client.request_json("POST", "/v1/x", json_body={})["n"] == 3
        assert (ts.server.connections, ts.server.requests) == (2, 3)
        # a fresh connection closed the same way is an error, not a loop
        ts.server.answer = lambda n, _: None
        client.close()
        with pytest.raises(DaemonUnavailable) as ei:
            client.health()
        assert "closed the connection" in ei.value.message
        assert ts.server.requests == 4


def test_a_slow_answer_on_a_kept_connection_is_a_timeout_not_a_resend():
    async def answer(n, _):
        if n == 2:
            await asyncio.sleep(2)
        return json_answer({"n": n})

    with ThreadedServer(answer) as ts:
        client = Client(ts.url, timeout=0.3)
        assert client.health()["n"] == 1
        with pytest.raises(DaemonUnavailable) as ei:
            client.health()
        assert "did not answer within 0.3 s" in ei.value.message
        assert ts.server.requests == 2  # not sent again
        assert client.health()["n"] == 3  # on a new connection: the timed-out one was closed
        assert ts.server.connections == 2
        client.close()


def test_threads_share_a_client_and_at_most_max_idle_stay_open():
    gate = threading.Barrier(6)

    def answer(n, _):
        return json_answer({"n": n})

    with ThreadedServer(answer) as ts:
        client = Client(ts.url, max_idle=2)
        got, errors = [], []

        def worker():
            try:
                gate.wait(10)
                for _ in range(10):
                    got.append(client.health()["n"])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert sorted(got) == list(range(1, 61))  # every call got its own answer
        ts.wait_for(lambda: ts.server.open <= 2)
        client.close()
        ts.wait_for(lambda: ts.server.open == 0)

        none_kept = Client(ts.url, max_idle=0)
        for _ in range(3):
            none_kept.health()
            ts.wait_for(lambda: ts.server.open == 0)
    with pytest.raises(ValueError):
        Client(ts.url, max_idle=-1)


def test_a_forked_child_does_not_use_the_parents_connection():
    with ThreadedServer(ok) as ts:
        client = Client(ts.url)
        assert client.health()["n"] == 1
        pid = os.fork()
        if pid == 0:  # the child: its call must go on a connection of its own
            code = 1
            try:
                code = 0 if client.health()["n"] == 2 else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.health()["n"] == 3  # the parent's kept connection still answers
        assert ts.server.connections == 2
        client.close()


def test_a_sandboxs_calls_reuse_a_connection(sandbox):
    client = sandbox._client
    client.close()
    sandbox.exec("true")
    first = client._kept.take()
    assert first is not None
    client._kept.put(first)
    for _ in range(5):
        assert sandbox.exec("echo hi").stdout == "hi\n"
        sandbox.files.write("ka.txt", "x")
        assert sandbox.files.read_text("ka.txt") == "x"
    assert client._kept.take() is first  # the same connection all along
    client._kept.put(first)


def test_a_sandbox_closes_its_own_clients_connections(daemon, new_sandboxes):
    with Sandbox.create(on_lease_end="delete") as sbx:
        assert sbx.exec("true").exit_code == 0
        kept = sbx._client._kept
        assert len(kept._idle) == 1
    assert kept._idle == []
    assert new_sandboxes() == []
