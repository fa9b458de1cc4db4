"""Every error the daemon answers arrives as its own exception type, carrying the daemon's code
and message."""

import pytest

import withruntime
from stubhttp import Stub
from withruntime import (
    AuthError,
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
                DaemonUnavailable, withruntime.ConfigurationError):
        assert issubclass(cls, WithruntimeError)
    assert issubclass(FileError, SandboxError) and issubclass(ExecFailed, SandboxError)
    assert issubclass(DaemonUnavailable, ConnectionError)


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
