"""Bad requests get the documented status and error envelope, and the daemon stays up.

Every answer is checked against api/openapi.yaml by the client (envelope, non-empty message,
the code that goes with the status, the Allow header of a 405).
"""

import json
import socket

import pytest

UNKNOWN = "sb-aaaaaaaaaaaaaaaaaaaaa"


@pytest.fixture(autouse=True)
def still_healthy(client):
    yield
    assert client.health()["status"] == "ok"


def expect_error(r, status, code):
    assert r.status == status, r
    got_code, message, _ = r.error
    assert got_code == code, r
    assert message.strip()
    assert r.headers["content-type"].startswith("application/json")
    return message


@pytest.mark.parametrize("method,path,body", [
    ("GET", f"/v1/sandboxes/{UNKNOWN}", None),
    ("DELETE", f"/v1/sandboxes/{UNKNOWN}", None),
    ("GET", f"/v1/sandboxes/{UNKNOWN}/events", None),
    ("GET", f"/v1/sandboxes/{UNKNOWN}/commands", None),
    ("GET", f"/v1/sandboxes/{UNKNOWN}/commands/cmd-1", None),
    ("POST", f"/v1/sandboxes/{UNKNOWN}/commands/cmd-1/wait", {}),
    ("POST", f"/v1/sandboxes/{UNKNOWN}/exec", {"command": "true"}),
    ("GET", f"/v1/sandboxes/{UNKNOWN}/files/content?path=x", None),
    ("GET", f"/v1/sandboxes/{UNKNOWN}/files/list?path=/", None),
    ("GET", f"/v1/sandboxes/{UNKNOWN}/files/stat?path=/", None),
    ("POST", f"/v1/sandboxes/{UNKNOWN}/files/mkdir", {"path": "x"}),
    ("DELETE", f"/v1/sandboxes/{UNKNOWN}/files?path=x", None),
    ("GET", "/v1/sandboxes/not-an-id", None),
    ("GET", "/v1/sandboxes/sb-AAAAAAAAAAAAAAAAAAAAA", None),
    ("GET", "/v1/sandboxes/..%2F..%2Fetc", None),
])
def test_unknown_sandbox_is_404(client, method, path, body):
    msg = expect_error(client.request(method, path, body), 404, "not_found")
    if UNKNOWN in path:
        assert UNKNOWN in msg, msg  # says which sandbox


def test_unknown_id_in_put(client):
    r = client.request("PUT", f"/v1/sandboxes/{UNKNOWN}/files/content", data=b"x",
                       query={"path": "x"})
    expect_error(r, 404, "not_found")


@pytest.mark.parametrize("method,path", [
    ("GET", "/index.html"),  # "/" is the dashboard (test_dashboard.py)
    ("GET", "/v1"),
    ("GET", "/v1/nope"),
    ("GET", "/v2/sandboxes"),
    ("POST", "/v1/sandboxes/x/y/z"),
    ("GET", f"/v1/sandboxes/{UNKNOWN}/files/nope?path=x"),
    ("GET", "/v1/healthz"),
])
def test_unknown_route_is_404(client, method, path):
    expect_error(client.request(method, path), 404, "not_found")


@pytest.mark.parametrize("method,path,allow", [
    ("POST", f"/v1/sandboxes/{UNKNOWN}", {"GET", "HEAD", "DELETE"}),
    ("PUT", "/v1/sandboxes", {"GET", "HEAD", "POST"}),
    ("DELETE", "/v1/health", {"GET", "HEAD"}),
    ("GET", f"/v1/sandboxes/{UNKNOWN}/exec", {"POST"}),
    ("POST", f"/v1/sandboxes/{UNKNOWN}/files/content?path=x", {"GET", "HEAD", "PUT"}),
])
def test_wrong_method_is_405(client, method, path, allow):
    r = client.request(method, path, {} if method in ("POST", "PUT") else None)
    expect_error(r, 405, "method_not_allowed")
    assert {m.strip() for m in r.headers["allow"].split(",")} == allow


def head_then_get(client, path):
    """HEAD then GET of path, pipelined on one connection: (status, headers, body) of each.
    Had the HEAD sent a body, the GET's answer would not start where the HEAD's head ends."""
    s = socket.create_connection((client.host, client.port), timeout=60)
    try:
        auth = f"Authorization: Bearer {client.key}\r\n" if client.key else ""
        one = f"{{}} {path} HTTP/1.1\r\nHost: {client.host}:{client.port}\r\n{auth}"
        s.sendall((one.format("HEAD") + "\r\n" + one.format("GET") +
                   "Connection: close\r\n\r\n").encode())
        f = s.makefile("rb")  # one reader for both answers: nothing read ahead is lost
        answers = []
        for method in ("HEAD", "GET"):
            status = int(f.readline().split()[1])
            headers = {}
            while (line := f.readline().strip()):
                k, v = line.decode().split(":", 1)
                headers[k.strip().lower()] = v.strip()
            body = b"" if method == "HEAD" else f.read(int(headers["content-length"]))
            answers.append((status, headers, body))
        assert f.read() == b"", "bytes after the GET's answer"
        return answers
    finally:
        s.close()


@pytest.mark.parametrize("path", [
    "/v1/health", "/v1/sandboxes", "/v1/sandboxes/{sb}", "/v1/sandboxes/{sb}/files/list?path=/etc",
    "/v1/sandboxes/{sb}/files/content?path=/etc/passwd", f"/v1/sandboxes/{UNKNOWN}", "/app.js",
])
def test_head_answers_as_get_without_a_body(client, sandbox, path):
    path = path.replace("{sb}", sandbox)
    (hs, hh, hbody), (gs, gh, gbody) = head_then_get(client, path)
    assert hs == gs and hbody == b"", (hs, gs, hbody)
    for name in ("content-type", "etag", "cache-control", "content-security-policy"):
        assert hh.get(name) == gh.get(name), (name, hh, gh)
    assert int(hh["content-length"]) == len(gbody) > 0, (hh, len(gbody))
    client.spec.validate_response("HEAD", path, hs, hh, hbody)


def test_head_is_not_a_websocket(client):
    r = client.request("HEAD", f"/v1/sandboxes/{UNKNOWN}/sessions/ses-1/connect")
    assert r.status == 405 and r.headers["allow"] == "GET" and r.body == b"", r


def test_post_on_real_sandbox_is_405(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}", {})
    expect_error(r, 405, "method_not_allowed")
    # and it did nothing to the sandbox
    assert client.get(sandbox)["state"] == "running"


@pytest.mark.parametrize("data", [
    b"{", b"{\"cpus\": }", b"not json", b"{\"cpus\": 2,}", b"\xff\xfe", b"[]", b"\"str\"",
    b"null", b"42", b"{\"cpus\": 2} trailing",
])
def test_invalid_json_is_400(client, data):
    r = client.request("POST", "/v1/sandboxes", data=data,
                       headers={"Content-Type": "application/json"})
    expect_error(r, 400, "invalid_request")


@pytest.mark.parametrize("body,field", [
    ({"cpus": "two"}, "cpus"),
    ({"cpus": 1.5}, "cpus"),
    ({"cpus": 0}, "cpus"),
    ({"cpus": 100000}, "cpus"),
    ({"memory_mib": 64}, "memory_mib"),
    ({"memory_mib": 65537}, "memory_mib"),
    ({"memory_mib": "4096"}, "memory_mib"),
    ({"image": 5}, "image"),
    ({"image": "No such image!"}, "image"),
    ({"cpus": None}, "cpus"),
    ({"network": None}, "network"),
    ({"on_lease_end": None}, "on_lease_end"),
    ({"env": {"A": 1}}, "env"),
    ({"env": ["A=1"]}, "env"),
    ({"env": {"A=B": "x"}}, "env"),
    ({"metadata": "x"}, "metadata"),
    ({"metadata": {"k": None}}, "metadata"),
    ({"timeout_seconds": 0}, "timeout_seconds"),
    ({"timeout_seconds": 86401}, "timeout_seconds"),
    ({"timeout_seconds": True}, "timeout_seconds"),
    ({"on_lease_end": "explode"}, "on_lease_end"),
    ({"network": True}, "network"),
    ({"network": {"internet": "yes"}}, "internet"),
    ({"network": {"internet": False, "proxy": "x"}}, "proxy"),
    ({"network": {"allow": ["pypi.org"]}}, "network.allow"),
    ({"network": {"internet": True, "allow": ["pypi.org", "127.0.0.1"]}}, "network.allow[1]"),
    ({"network": {"internet": True, "allow": ["pypi.org@evil.test"]}}, "pypi.org@evil.test"),
    ({"network": {"internet": True, "allow": ["*"]}}, "network.allow[0]"),
    ({"network": {"internet": True, "deny": ["*.org"]}}, "network.deny[0]"),
    ({"network": {"internet": True, "allow": ["pypi.org:99999"]}}, "port"),
    ({"cpu": 2}, "cpu"),
    ({"cpus": 1, "memoryMib": 512}, "memoryMib"),
    ({"metadata": {"k": "v" * 1025}}, "metadata"),
    ({"image": "x" * 65}, "image"),
])
def test_bad_create_fields_are_400(client, body, field):
    before = {s["id"] for s in client.list()}
    r = client.request("POST", "/v1/sandboxes", body, validate=False)
    if r.status == 201:  # wrongly created: remove it so later tests do not trip over it
        client.request("DELETE", f"/v1/sandboxes/{r.json()['id']}", validate=False)
    client.spec.validate_response("POST", "/v1/sandboxes", r.status, r.headers, r.body)
    msg = expect_error(r, 400, "invalid_request")
    assert field in msg, msg
    assert {s["id"] for s in client.list()} == before  # nothing was created


def test_an_unknown_image_is_404(client):
    before = {s["id"] for s in client.list()}
    r = client.request("POST", "/v1/sandboxes", {"image": "no-such-image"})
    msg = expect_error(r, 404, "not_found")
    # no recipe makes it: the message must not send the reader to `image build no-such-image`
    assert "no image named 'no-such-image'" in msg and "image build" not in msg, msg
    assert {s["id"] for s in client.list()} == before


@pytest.mark.parametrize("body,field", [
    ({}, "command"),
    ({"command": "true", "argv": ["true"]}, "command"),
    ({"command": 5}, "command"),
    ({"argv": "true"}, "argv"),
    ({"argv": []}, "argv"),
    ({"argv": ["echo", 1]}, "argv"),
    ({"command": "true", "cwd": 7}, "cwd"),
    ({"command": "true", "env": {"A": 1}}, "env"),
    ({"command": "true", "stdin": 5}, "stdin"),
    ({"command": "true", "stdin_base64": "***"}, "stdin_base64"),
    ({"command": "true", "stdin": "a", "stdin_base64": "YQ=="}, "stdin"),
    ({"command": "true", "timeout_seconds": 0}, "timeout_seconds"),
    ({"command": "true", "timeout_seconds": -1}, "timeout_seconds"),
    ({"command": "true", "timeout_seconds": 86401}, "timeout_seconds"),
    ({"command": "true", "timeout_seconds": "10"}, "timeout_seconds"),
    ({"command": "true", "max_output_bytes": 0}, "max_output_bytes"),
    ({"command": "true", "max_output_bytes": 16777217}, "max_output_bytes"),
    ({"command": "true", "stream": "yes"}, "stream"),
    ({"command": "true", "timeout": 5}, "timeout"),
])
def test_bad_exec_fields_are_400(client, sandbox, body, field):
    msg = expect_error(client.request("POST", f"/v1/sandboxes/{sandbox}/exec", body), 400,
                       "invalid_request")
    assert field in msg, msg


def test_bad_exec_did_not_run(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/exec",
                       {"command": "touch /workspace/ran", "timeout": 5})
    expect_error(r, 400, "invalid_request")
    assert client.files("GET", sandbox, "stat", path="/workspace/ran").status == 404


def test_oversize_json_is_413(client):
    # Valid JSON, just too big: 2 MiB of metadata.
    body = json.dumps({"metadata": {"k": "x" * (2 * 1024 * 1024)}}).encode()
    r = client.raw("POST", "/v1/sandboxes",
                   {"Content-Type": "application/json", "Content-Length": str(len(body)),
                    "Connection": "close"}, body)
    expect_error(r, 413, "payload_too_large")


def test_just_under_json_limit_is_accepted(client, sandbox):
    pad = 1024 * 1024 - 200
    body = {"command": "wc -c", "stdin": "y" * pad}
    assert len(json.dumps(body)) < 1024 * 1024
    r = client.exec(sandbox, **body)
    assert r["stdout"].strip() == str(pad)


def test_oversize_exec_body_is_413(client, sandbox):
    body = json.dumps({"command": "true", "stdin": "z" * (2 * 1024 * 1024)}).encode()
    r = client.raw("POST", f"/v1/sandboxes/{sandbox}/exec",
                   {"Content-Type": "application/json", "Content-Length": str(len(body)),
                    "Connection": "close"}, body)
    expect_error(r, 413, "payload_too_large")


def test_daemon_survives_garbage(client, daemon):
    import socket
    for junk in [b"\x00\x01\x02\r\n\r\n", b"GET\r\n\r\n", b"GET /v1/health HTTP/9.9\r\n\r\n",
                 b"POST /v1/sandboxes HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
                 b"POST /v1/sandboxes HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]:
        s = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
        try:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            try:
                s.recv(4096)
            except OSError:
                pass
        finally:
            s.close()
    assert client.health()["status"] == "ok"


@pytest.mark.parametrize("query", ["path=/etc/passwd%00.txt", "path=a%00", "path=x&mode=06%0044"])
def test_a_nul_byte_in_a_query_is_400(client, sandbox, query):
    # Decoded, the value would end at the NUL and name another file than the one asked for.
    r = client.request("GET", f"/v1/sandboxes/{sandbox}/files/stat?{query}")
    msg = expect_error(r, 400, "invalid_request")
    assert "NUL" in msg, msg


def test_a_nul_byte_in_the_path_is_400(client, sandbox):
    r = client.request("GET", f"/v1/sandboxes/{sandbox}%00/files/stat?path=x")
    expect_error(r, 400, "invalid_request")

