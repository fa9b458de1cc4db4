"""Every error the daemon answers arrives as its own exception type, carrying the daemon's code
and message."""

import asyncio

import pytest

import withruntime
from stubhttp import Stub
from withruntime import (
    AsyncClient,
    AsyncSandbox,
    AuthError,
    CapacityError,
    Client,
    Conflict,
    DaemonUnavailable,
    ExecFailed,
    FileError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    Sandbox,
    SandboxError,
    ServerError,
    WithruntimeError,
)


def test_hierarchy():
    for cls in (InvalidRequest, AuthError, NotFound, MethodNotAllowed, Conflict,
                PayloadTooLarge, SandboxError, FileError, ExecFailed, ServerError,
                DaemonUnavailable, CapacityError, withruntime.ConfigurationError):
        assert issubclass(cls, WithruntimeError)
    assert issubclass(FileError, SandboxError) and issubclass(ExecFailed, SandboxError)
    assert issubclass(DaemonUnavailable, ConnectionError)
    # the daemon answered: code that retries on a lost connection must not spin on it
    assert not issubclass(CapacityError, (ConnectionError, DaemonUnavailable))


def test_daemon_errors_are_typed(sandbox):
    cases = [
        (InvalidRequest, 400, "invalid_request", lambda: sandbox.exec("true", timeout_seconds=-1)),
        (NotFound, 404, "not_found", lambda: Sandbox.connect("sb-" + "d" * 21)),
        (MethodNotAllowed, 405, "method_not_allowed",
         lambda: Client().request("PUT", "/v1/sandboxes")),
        (FileError, 422, "file_error", lambda: sandbox.files.read("/")),
        (ExecFailed, 422, "exec_failed", lambda: sandbox.exec(["/nonexistent/prog"])),
        # over the daemon's 1 MiB JSON limit
        (PayloadTooLarge, 413, "payload_too_large",
         lambda: sandbox.exec("cat", stdin="x" * (2 << 20))),
    ]
    for cls, status, code, action in cases:
        with pytest.raises(cls) as ei:
            action()
        e = ei.value
        assert (e.status, e.code) == (status, code), (cls, e)
        assert e.message and str(e) == e.message
        assert e.details.get("code") == code
    sandbox.stop()
    with pytest.raises(Conflict) as ei:
        sandbox.files.read("x")
    assert ei.value.status == 409 and "stopped" in ei.value.message


@pytest.mark.parametrize("status,body,cls,code", [
    (401, {"error": {"code": "unauthorized", "message": "no key"}}, AuthError, "unauthorized"),
    (403, {"error": {"code": "forbidden", "message": "read-only key"}}, AuthError, "forbidden"),
    (503, {"error": {"code": "unavailable", "message": "shutting down"}}, DaemonUnavailable,
     "unavailable"),
    (500, {"error": {"code": "internal", "message": "disk full"}}, ServerError, "internal"),
    (418, {"error": {"code": "teapot", "message": "short and stout"}}, WithruntimeError, "teapot"),
])
def test_error_answers_map_to_types(status, body, cls, code):
    with Stub(status=status, body=body) as stub:
        with pytest.raises(cls) as ei:
            Sandbox.list(client=Client(stub.url))
    e = ei.value
    assert type(e) is cls
    assert (e.status, e.code, e.message) == (status, code, body["error"]["message"])
    assert repr(e) == f"{cls.__name__}(code={code!r}, message={body['error']['message']!r})"


def test_non_json_error_page():
    with Stub(status=502, body=b"<html>Bad Gateway</html>", content_type="text/html") as stub:
        with pytest.raises(ServerError) as ei:
            Client(stub.url).health()
    assert ei.value.status == 502
    assert "502" in ei.value.message and "Bad Gateway" in ei.value.message


def test_success_that_is_not_json():
    with Stub(status=200, body=b"hello", content_type="text/plain") as stub:
        with pytest.raises(WithruntimeError) as ei:
            Sandbox.list(client=Client(stub.url))
    assert "not JSON" in ei.value.message


CAPACITY = {"error": {"code": "capacity", "message": (
    "not enough disk: 2300 MiB free, 2048 MiB of it kept in reserve (--disk-reserve-mib), and 3 "
    "running sandboxes are given 128 MiB each to write; 12 stopped sandboxes hold 9.1 GiB; "
    "`withruntime sandbox prune` or POST /v1/sandboxes/prune frees it")}}


def check_capacity(e, retry_after):
    assert type(e) is CapacityError, e
    assert (e.status, e.code, e.retry_after) == (503, "capacity", retry_after)
    assert str(e) == CAPACITY["error"]["message"]


def test_capacity_answer_raises_capacity_error_with_retry_after():
    with Stub(status=503, body=CAPACITY, headers={"Retry-After": "5"}) as stub:
        with pytest.raises(CapacityError) as ei:
            Sandbox.create(client=Client(stub.url))
        check_capacity(ei.value, 5)

        async def go():
            async with AsyncClient(stub.url) as c:
                await AsyncSandbox.create(client=c)

        with pytest.raises(CapacityError) as ei:
            asyncio.run(go())
        check_capacity(ei.value, 5)
    assert stub.requests[0][:2] == ("POST", "/v1/sandboxes")


@pytest.mark.parametrize("value", [None, "soon", "Wed, 21 Oct 2026 07:28:00 GMT", "-1",
                                   "99999999999999999999"])
def test_capacity_answer_without_a_usable_retry_after(value):
    headers = {"Retry-After": value} if value is not None else {}
    with Stub(status=503, body=CAPACITY, headers=headers) as stub:
        with pytest.raises(CapacityError) as ei:
            Sandbox.create(client=Client(stub.url))
    check_capacity(ei.value, None)
