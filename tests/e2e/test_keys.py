"""Keys and the door: who may call what (docs/security.md).

The session's daemon serves TCP on 127.0.0.1 and its Unix socket; the tests' own key talks TCP,
the admin is root on the socket. Routes are walked from api/openapi.yaml, so a new route is
covered without being listed here.
"""

import json
import os
import re
import socket
import stat
import subprocess
import tempfile
import time

import pytest

import apispec
import conftest
import wrclient
from test_failures import FakeDaemon, serve_checked

T = 60
UNKNOWN = "sb-" + "a" * 21


def raw(port, head, body=b"", src="127.0.0.1"):
    """Sends one hand-made request from address src; (status, headers, body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=T, source_address=(src, 0))
    try:
        s.sendall(head.encode() + body)
        f = s.makefile("rb")
        status = int(f.readline().split()[1])
        headers = {}
        while True:
            line = f.readline().strip()
            if not line:
                break
            k, v = line.decode().split(":", 1)
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        return status, headers, f.read(n)
    finally:
        s.close()


def get(port, path, key=None, host=None, extra="", src="127.0.0.1"):
    head = f"GET {path} HTTP/1.1\r\nHost: {f'127.0.0.1:{port}' if host is None else host}\r\n"
    if key is not None:
        head += f"Authorization: Bearer {key}\r\n"
    return raw(port, head + extra + "Connection: close\r\n\r\n", src=src)


@pytest.fixture(scope="module")
def keys(daemon):
    """Two keys of their own and a read-only key that sees the first one's sandboxes."""
    a = daemon.make_key()
    b = daemon.make_key()
    ro = daemon.make_key(read_only=True, owner_id=a["id"])
    yield a, b, ro
    for k in (a, b, ro):
        daemon.admin.request("POST", f"/v1/keys/{k['id']}/revoke")


# ---- the key ----


def test_every_failure_to_show_a_key_gets_one_401(daemon, keys):
    revoked = daemon.make_key()
    assert daemon.admin.request("POST", f"/v1/keys/{revoked['id']}/revoke").status == 200
    wrong = "wr_" + "a" * 52
    answers = []
    for extra in ("", f"Authorization: Bearer {wrong}\r\n", "Authorization: Bearer x\r\n",
                  f"Authorization: Basic {wrong}\r\n",
                  f"Authorization: Bearer {revoked['key']}\r\n"):
        # from an address of its own: these wrong keys count against it, not the others' tests
        status, headers, body = get(daemon.port, "/v1/sandboxes", extra=extra, src="127.0.0.5")
        assert status == 401, (extra, body)
        assert headers["www-authenticate"].startswith("Bearer"), headers
        answers.append(body)
    assert len(set(answers)) == 1, answers
    assert json.loads(answers[0])["error"]["code"] == "unauthorized"


def test_a_revoked_key_stops_working_at_once(daemon):
    k = daemon.make_key()
    c = daemon.client.with_key(k["key"])
    assert c.request("GET", "/v1/sandboxes").status == 200
    assert daemon.admin.request("POST", f"/v1/keys/{k['id']}/revoke").status == 200
    assert c.request("GET", "/v1/sandboxes").status == 401
    listed = {x["id"]: x for x in daemon.admin.request("GET", "/v1/keys").json()["keys"]}
    assert listed[k["id"]]["revoked_at"] is not None  # its record stays
    assert all("key" not in x for x in listed.values())  # and no key is ever shown again


def test_only_a_hash_is_kept(daemon, keys):
    a = keys[0]
    with open(os.path.join(daemon.state_dir, "withruntime.db"), "rb") as f:
        db = f.read()
    for suffix in ("-wal",):
        try:
            with open(os.path.join(daemon.state_dir, "withruntime.db" + suffix), "rb") as f:
                db += f.read()
        except OSError:
            pass
    assert a["key"].encode() not in db
    assert a["key"].encode() not in daemon.log_bytes()


def test_the_state_directory_is_roots_only(daemon):
    st = os.stat(daemon.state_dir)
    assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    for name in ("withruntime.db", "withruntime.db-wal", "withruntime.db-shm"):
        p = os.path.join(daemon.state_dir, name)
        if os.path.exists(p):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, (name, oct(os.stat(p).st_mode))


def test_a_burst_of_wrong_keys_is_slowed_without_slowing_others(daemon, keys):
    good = keys[0]["key"]
    wrong = "wr_" + "b" * 52
    statuses, retry = [], None
    for _ in range(20):
        status, headers, _ = get(daemon.port, "/v1/sandboxes", key=wrong, src="127.0.0.7")
        statuses.append(status)
        if status == 429:
            retry = headers.get("retry-after")
    first = statuses.index(429)
    # ten at once, then one a second: a few more may pass if the host stalls for seconds
    assert 10 <= first <= 14 and set(statuses[:first]) == {401}, statuses
    assert retry and retry.isdigit() and int(retry) >= 1, retry
    # while it is slowed, even a good key from it is not looked at (a guess that hit would
    # otherwise be told apart from one that missed)
    assert get(daemon.port, "/v1/sandboxes", key=good, src="127.0.0.7")[0] == 429
    # another client is not slowed
    assert get(daemon.port, "/v1/sandboxes", key=good, src="127.0.0.8")[0] == 200
    assert daemon.client.request("GET", "/v1/sandboxes").status == 200


# ---- the door: Host, Origin, Content-Type ----


def test_the_seeds_cross_site_create_is_refused(daemon):
    before = len(daemon.admin.request("GET", "/v1/sandboxes").json()["sandboxes"])
    key = daemon.key
    for host, origin, ctype in (("evil.example", "http://evil.example", "text/plain"),
                                (f"127.0.0.1:{daemon.port}", "http://evil.example",
                                 "application/json"),
                                (f"127.0.0.1:{daemon.port}", None, "text/plain"),
                                ("evil.example", None, "application/json")):
        head = (f"POST /v1/sandboxes HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n"
                f"Authorization: Bearer {key}\r\nContent-Length: 2\r\nConnection: close\r\n")
        if origin:
            head += f"Origin: {origin}\r\n"
        status, _, body = raw(daemon.port, head + "\r\n", b"{}")
        assert status in (403, 415), (host, origin, ctype, body)
        code = json.loads(body)["error"]["code"]
        assert code == ("unsupported_media_type" if status == 415 else "forbidden"), body
    assert len(daemon.admin.request("GET", "/v1/sandboxes").json()["sandboxes"]) == before


@pytest.mark.parametrize("host,ok", [
    ("127.0.0.1:{port}", True), ("localhost:{port}", True), ("LOCALHOST:{port}", True),
    ("127.0.0.1:1", False), ("rebound.evil.example:{port}", False), ("127.0.0.2:{port}", False),
    ("[::1]:{port}", False), ("", False)])
def test_host_must_name_the_daemon(daemon, host, ok):
    status, _, body = get(daemon.port, "/v1/sandboxes", key=daemon.key,
                          host=host.format(port=daemon.port))
    assert status == (200 if ok else 403), (host, body)


@pytest.mark.parametrize("origin,ok", [
    ("http://127.0.0.1:{port}", True), ("http://localhost:{port}", True),
    ("null", False), ("http://evil.example", False), ("http://127.0.0.1:{port}.evil.example",
                                                      False), ("file://", False)])
def test_origin_if_sent_must_be_the_daemons(daemon, origin, ok):
    status, _, body = get(daemon.port, "/v1/sandboxes", key=daemon.key,
                          extra=f"Origin: {origin.format(port=daemon.port)}\r\n")
    assert status == (200 if ok else 403), (origin, body)


def test_json_with_a_charset_is_json(daemon, make_sandbox):
    r = daemon.client.request("POST", "/v1/sandboxes", {"memory_mib": 256},
                              headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status == 201, r
    daemon.client.request("DELETE", f"/v1/sandboxes/{r.json()['id']}")


# ---- ownership and read-only keys ----


def test_a_key_sees_only_its_own_sandboxes(daemon, keys):
    a, b, _ = keys
    ca, cb = daemon.client.with_key(a["key"]), daemon.client.with_key(b["key"])
    sid = ca.expect(201, "POST", "/v1/sandboxes", {"memory_mib": 256}).json()["id"]
    try:
        assert ca.get(sid)["key_id"] == a["id"]
        assert sid in {s["id"] for s in ca.list()}
        assert sid not in {s["id"] for s in cb.list()}
        assert sid in {s["id"] for s in daemon.admin.list()}  # the admin sees every one
        # another key's sandbox is answered exactly as one that does not exist
        for method, path, body in (("GET", "/v1/sandboxes/{}", None),
                                   ("POST", "/v1/sandboxes/{}/exec", {"command": "true"}),
                                   ("GET", "/v1/sandboxes/{}/files/list", None),
                                   ("POST", "/v1/sandboxes/{}/stop", None),
                                   ("DELETE", "/v1/sandboxes/{}", None)):
            mine = cb.request(method, path.format(sid), body)
            none = cb.request(method, path.format(UNKNOWN), body)
            assert mine.status == none.status == 404, (path, mine, none)
            assert mine.body.replace(sid.encode(), b"ID") == none.body.replace(
                UNKNOWN.encode(), b"ID"), (mine, none)
        assert ca.get(sid)["state"] == "running"  # b's stop and delete did nothing
        # prune by b does not touch a's
        cb.expect(200, "POST", "/v1/sandboxes/prune", {"older_than_seconds": 0})
        assert ca.get(sid)["state"] == "running"
    finally:
        ca.request("DELETE", f"/v1/sandboxes/{sid}")


def _fill(template, sid, cid, key_id):
    return (template.replace("{id}", key_id if template.startswith("/v1/keys") else sid)
            .replace("{cid}", cid).replace("{name}", "WALK_SECRET"))


def _operations():
    spec = apispec.spec().doc
    for template, item in spec["paths"].items():
        for method, op in item.items():
            if method in apispec.METHODS:
                yield method.upper(), template, op


def test_every_route_needs_a_key(daemon):
    """Every route but the dashboard's files (which the spec marks `security: []`)."""
    open_routes = 0
    for method, template, op in _operations():
        path = _fill(template, UNKNOWN, "cmd-1", "key_" + "a" * 16)
        r = daemon.client.with_key(None).request(method, path, query={"path": "/workspace"}
                                                 if "files" in template else None)
        if op.get("security") == []:
            assert method == "GET" and not template.startswith("/v1"), (method, template)
            assert r.status == 200, (method, template, r)
            open_routes += 1
        else:
            assert r.status == 401, (method, template, r)
    assert open_routes == 5


def test_read_only_keys_read_and_nothing_else(daemon, keys):
    """Walks every route in the spec with a read-only key made for key a, on a's sandbox: a GET
    (or a POST marked x-read: waiting for a command) is answered (never 401/403) unless it
    changes state (x-changes-state: a session's connect); anything else is 403 and changes
    nothing; the admin's routes are 403 for every key."""
    a, b, ro = keys
    ca, cro = daemon.client.with_key(a["key"]), daemon.client.with_key(ro["key"])
    sid = ca.expect(201, "POST", "/v1/sandboxes", {"memory_mib": 256}).json()["id"]
    try:
        cid = ca.expect(201, "POST", f"/v1/sandboxes/{sid}/exec",
                        {"command": "sleep 1000", "background": True}).json()["id"]
        ca.write_file(sid, "/workspace/kept.txt", b"kept")
        assert {s["id"] for s in cro.list()} == {sid}  # the owner's, and only those
        walked = 0
        for method, template, op in _operations():
            path = _fill(template, sid, cid, a["id"])
            query = {"path": "/workspace/kept.txt"} if "/files" in template else None
            if template.endswith("/files/list"):
                query = {"path": "/workspace"}
            body = {} if method in ("POST", "PUT", "PATCH") and "files/content" not in template \
                else None
            if op.get("x-read"):
                body = {"timeout_seconds": 0.1}  # waiting for a command that runs on
            r = cro.request(method, path, body, query=query)
            walked += 1
            if op.get("x-admin-only"):
                assert r.status == 403, (method, template, r)
                assert ca.request(method, path, body, query=query).status == 403, (method, path)
            elif (method == "GET" and not op.get("x-changes-state")) or op.get("x-read"):
                assert r.status not in (401, 403), (method, template, r)
            else:
                assert r.status == 403 and r.error[0] == "forbidden", (method, template, r)
        assert walked >= 30
        # nothing changed: still running, the file and the command still there
        assert ca.get(sid)["state"] == "running"
        assert ca.read_file(sid, "/workspace/kept.txt") == b"kept"
        assert ca.expect(200, "GET", f"/v1/sandboxes/{sid}/commands/{cid}").json()["state"] \
            == "running"
    finally:
        ca.request("DELETE", f"/v1/sandboxes/{sid}")


def fixed(keys):
    """Keys' records without what moves on its own (today's spend)."""
    return [{f: v for f, v in k.items() if f != "spent_today_micros"} for k in keys]


def test_auditor_keys_read_keys_audit_and_usage_and_nothing_else(daemon, keys):
    """Walks every route in the spec with an auditor key: those marked x-auditor (GET
    /v1/keys, /v1/audit, /v1/usage, /v1/whoami) answer 200; every other one, on key a's
    sandbox and of every method, is 403 with the error every forbidden call gets, and changes
    nothing."""
    a, b, ro = keys
    ca = daemon.client.with_key(a["key"])
    aud = daemon.make_key(auditor=True)
    assert aud["auditor"] is True and aud["read_only"] is True and aud["metrics"] is False
    cau = daemon.client.with_key(aud["key"])
    sid = ca.expect(201, "POST", "/v1/sandboxes", {"memory_mib": 256}).json()["id"]
    try:
        cid = ca.expect(201, "POST", f"/v1/sandboxes/{sid}/exec",
                        {"command": "sleep 1000", "background": True}).json()["id"]
        ca.write_file(sid, "/workspace/kept.txt", b"kept")
        keys_before = daemon.admin.expect(200, "GET", "/v1/keys").json()["keys"]
        allowed, refused = set(), set()
        for method, template, op in _operations():
            path = _fill(template, sid, cid, a["id"])
            query = {"path": "/workspace/kept.txt"} if "/files" in template else None
            body = {"name": "x"} if method in ("POST", "PUT", "PATCH") \
                and "files/content" not in template else None
            if op.get("security") == []:
                continue  # the dashboard's files, anyone's
            r = cau.request(method, path, body, query=query)
            if op.get("x-auditor"):
                assert method == "GET" and r.status == 200, (method, template, r)
                allowed.add(template)
            else:
                assert r.status == 403 and r.error[0] == "forbidden", (method, template, r)
                assert "auditor key" in r.error[1], r
                refused.add((method, template))
        assert allowed == {"/v1/keys", "/v1/audit", "/v1/usage", "/v1/whoami"}, allowed
        assert len(refused) >= 40 and ("GET", "/metrics") in refused
        assert ("GET", "/v1/sandboxes/{id}/files/content") in refused
        assert ("GET", "/v1/secrets") in refused and ("POST", "/v1/keys") in refused
        # nothing changed: no key made or changed, the sandbox, its file and command as they were
        assert fixed(daemon.admin.expect(200, "GET", "/v1/keys").json()["keys"]) == \
            fixed(keys_before)
        assert ca.get(sid)["state"] == "running"
        assert ca.read_file(sid, "/workspace/kept.txt") == b"kept"
        assert ca.expect(200, "GET", f"/v1/sandboxes/{sid}/commands/{cid}").json()["state"] \
            == "running"
        # what it reads: every key, never a key itself nor its hash
        listed = cau.expect(200, "GET", "/v1/keys").json()
        text = json.dumps(listed)
        assert {a["id"], b["id"], ro["id"], aud["id"]} <= {k["id"] for k in listed["keys"]}
        assert "sha256" not in text and not re.search(r"wr_[a-z2-7]{52}", text)
        assert a["key"] not in text and aud["key"] not in text
        assert fixed(listed["keys"]) == fixed(
            daemon.admin.expect(200, "GET", "/v1/keys").json()["keys"])
        me = cau.expect(200, "GET", "/v1/whoami").json()
        assert me["auditor"] is True and me["admin"] is False and me["key"]["id"] == aud["id"]
        assert ca.expect(200, "GET", "/v1/whoami").json()["auditor"] is False
        # the audit trail, the admin's page, with the auditor's own refused attempts in it
        page = cau.expect(200, "GET", "/v1/audit", query={"limit": 200}).json()
        assert page["entries"][0]["seq"] == daemon.admin.expect(
            200, "GET", "/v1/audit", query={"limit": 1}).json()["entries"][0]["seq"]
        tried = {(e["method"], e["route"]) for e in page["entries"]
                 if e["key_id"] == aud["id"] and e["status"] == 403}
        assert ("POST", "/v1/keys") in tried and ("DELETE", "/v1/sandboxes/{id}") in tried
        older = cau.expect(200, "GET", "/v1/audit",
                           query={"limit": 1, "before": page["entries"][0]["seq"]}).json()
        assert older["entries"][0]["seq"] < page["entries"][0]["seq"]
        # usage of every key, as the admin sees it; a plain key sees its own only
        whole = {"from": "2000-01-01", "group_by": "key"}
        mine = {r["key_id"] for r in ca.expect(200, "GET", "/v1/usage", query=whole).json()["rows"]}
        assert mine <= {a["id"]}
        # the same as the admin's, another key's (a's running sandbox) in it once the meter has
        # seen it (each second); a key whose first row lands between the two reads: read again
        deadline = time.monotonic() + 15
        while True:
            theirs = {r["key_id"] for r in cau.expect(200, "GET", "/v1/usage",
                                                      query=whole).json()["rows"]}
            admins = {r["key_id"] for r in daemon.admin.expect(200, "GET", "/v1/usage",
                                                               query=whole).json()["rows"]}
            if (a["id"] in theirs and theirs == admins) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert a["id"] in theirs and theirs == admins, (theirs, admins)
        days = cau.expect(200, "GET", "/v1/usage",
                          query={"from": "2000-01-01", "group_by": "day"}).json()
        assert days["rows"] and all("day" in r for r in days["rows"])
        # other keys still may not read what the auditor reads
        for path in ("/v1/keys", "/v1/audit"):
            r = ca.request("GET", path)
            assert r.status == 403 and "auditor key" in r.error[1], r
    finally:
        ca.request("DELETE", f"/v1/sandboxes/{sid}")
        daemon.admin.request("POST", f"/v1/keys/{aud['id']}/revoke")


def test_auditor_keys_are_only_that(daemon, keys):
    a = keys[0]
    for extra, word in (({"metrics": True}, "metrics"), ({"owner_id": a["id"]}, "owner_id"),
                        ({"read_only": False}, "read_only"), ({"auditor": 1}, "auditor")):
        r = daemon.admin.request("POST", "/v1/keys", dict({"name": "aud-x", "auditor": True},
                                                         **extra))
        assert r.status == 400 and word in r.error[1], (extra, r)
    aud = daemon.make_key(auditor=True)
    try:
        r = daemon.admin.request("PATCH", f"/v1/keys/{aud['id']}", {"read_only": False})
        assert r.status == 409 and "auditor" in r.error[1], r
        r = daemon.admin.request("PATCH", f"/v1/keys/{aud['id']}", {"auditor": False})
        assert r.status == 400, r
        # only the admin makes one: an auditor key cannot, nor can any other key
        for c in (daemon.client.with_key(aud["key"]), daemon.client.with_key(a["key"])):
            r = c.request("POST", "/v1/keys", {"name": "aud-y", "auditor": True})
            assert r.status == 403, r
    finally:
        daemon.admin.request("POST", f"/v1/keys/{aud['id']}/revoke")


def test_no_key_can_make_keys_or_raise_its_own_limits(daemon):
    k = daemon.make_key(daily_limit_micros=1000, max_sandboxes=1)
    c = daemon.client.with_key(k["key"])
    try:
        for method, path, body in (
                ("PATCH", f"/v1/keys/{k['id']}", {"daily_limit_micros": 10 ** 9}),
                ("PATCH", f"/v1/keys/{k['id']}", {"max_sandboxes": None}),
                ("POST", "/v1/keys", {"name": "mine", "daily_limit_micros": 10 ** 9}),
                ("POST", f"/v1/keys/{k['id']}/revoke", None),
                ("GET", "/v1/keys", None), ("GET", "/v1/audit", None)):
            r = c.request(method, path, body)
            assert r.status == 403, (method, path, r)
        # and create takes no limit of its own
        r = c.request("POST", "/v1/sandboxes", {"daily_limit_micros": 10 ** 9})
        assert r.status == 400, r
        now = daemon.admin.expect(200, "GET", f"/v1/keys/{k['id']}").json()
        assert now["daily_limit_micros"] == 1000 and now["max_sandboxes"] == 1
    finally:
        daemon.admin.request("POST", f"/v1/keys/{k['id']}/revoke")


def test_max_sandboxes(daemon):
    k = daemon.make_key(max_sandboxes=1)
    c = daemon.client.with_key(k["key"])
    sid = c.expect(201, "POST", "/v1/sandboxes", {"memory_mib": 256}).json()["id"]
    try:
        r = c.request("POST", "/v1/sandboxes", {"memory_mib": 256})
        assert r.status == 409 and "may keep 1" in r.error[1], r
        daemon.admin.expect(200, "PATCH", f"/v1/keys/{k['id']}", {"max_sandboxes": 2})
        sid2 = c.expect(201, "POST", "/v1/sandboxes", {"memory_mib": 256}).json()["id"]
        c.request("DELETE", f"/v1/sandboxes/{sid2}")
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")
        daemon.admin.request("POST", f"/v1/keys/{k['id']}/revoke")


def test_bad_key_requests_are_refused_with_the_field_named(daemon):
    adm = daemon.admin
    for body, field in (({}, "name"), ({"name": ""}, "name"), ({"name": "x\u0001"}, "name"),
                        ({"name": "x", "daily_limit_micros": -1}, "daily_limit_micros"),
                        ({"name": "x", "max_sandboxes": 10 ** 9}, "max_sandboxes"),
                        ({"name": "x", "owner_id": "key_nope"}, "owner_id"),
                        ({"name": "x", "bogus": 1}, "bogus")):
        r = adm.request("POST", "/v1/keys", body)
        assert r.status == 400 and field in r.error[1], (body, r)
    assert adm.request("GET", "/v1/keys/key_aaaaaaaaaaaaaaaa").status == 404
    assert adm.request("POST", "/v1/keys/nope/revoke").status == 404


def test_revoking_a_key_revokes_the_keys_made_of_it(daemon):
    owner = daemon.make_key()
    of = daemon.make_key(owner_id=owner["id"], read_only=True)
    other = daemon.make_key()  # made of no one: untouched
    c = daemon.client.with_key(of["key"])
    assert c.request("GET", "/v1/sandboxes").status == 200
    r = daemon.admin.expect(200, "POST", f"/v1/keys/{owner['id']}/revoke").json()
    assert r["also_revoked"] == [of["id"]], r
    assert c.request("GET", "/v1/sandboxes").status == 401
    assert daemon.client.with_key(other["key"]).request("GET", "/v1/sandboxes").status == 200
    listed = {x["id"]: x for x in daemon.admin.request("GET", "/v1/keys").json()["keys"]}
    assert listed[of["id"]]["revoked_at"] is not None
    entries = daemon.admin.expect(200, "GET", "/v1/audit", query={"limit": 20}).json()["entries"]
    assert any(e["route"] == f"/v1/keys/{of['id']}/revoke" for e in entries), entries
    # the CLI says so too
    of2 = daemon.make_key(owner_id=other["id"])
    r = admin_cli(daemon, "keys", "revoke", other["id"])
    assert r.returncode == 0 and r.stdout.split() == [other["id"], of2["id"]], r
    assert f"revoked {of2['id']} too" in r.stderr, r
    assert daemon.client.with_key(of2["key"]).request("GET", "/v1/sandboxes").status == 401


# ---- the audit trail ----


def test_mutating_requests_are_audited_without_bodies(daemon, keys):
    a = keys[0]
    ca = daemon.client.with_key(a["key"])
    marker = "audit-secret-value-7d1f"
    sid = ca.expect(201, "POST", "/v1/sandboxes",
                    {"memory_mib": 256, "env": {"TOKEN": marker}}).json()["id"]
    ca.exec(sid, f"echo {marker}")
    ca.request("DELETE", f"/v1/sandboxes/{sid}")
    ca.request("GET", "/v1/sandboxes")
    entries = daemon.admin.expect(200, "GET", "/v1/audit", query={"limit": 50}).json()["entries"]
    mine = [e for e in entries if e["key_id"] == a["id"] and e["sandbox_id"] == sid]
    routes = [(e["method"], e["route"], e["status"]) for e in reversed(mine)]
    assert routes == [("POST", "/v1/sandboxes", 201),
                      ("POST", "/v1/sandboxes/{id}/exec", 200),
                      ("DELETE", "/v1/sandboxes/{id}", 200)], routes
    assert all(e["method"] != "GET" for e in entries)
    assert marker not in json.dumps(entries)
    # pages: before= goes further back
    page = daemon.admin.expect(200, "GET", "/v1/audit", query={"limit": 1}).json()
    assert len(page["entries"]) == 1 and "next_before" in page
    older = daemon.admin.expect(200, "GET", "/v1/audit",
                                query={"limit": 1, "before": page["next_before"]}).json()
    assert older["entries"][0]["seq"] < page["entries"][0]["seq"]


# ---- the CLI ----


def admin_cli(daemon, *args, stdin=None):
    env = dict(os.environ, RUNTIME_URL=f"unix:{daemon.socket_path}")
    env.pop("RUNTIME_API_KEY", None)
    return subprocess.run([daemon.bin, *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=T)


def test_cli_keys(daemon):
    r = admin_cli(daemon, "keys", "create", "--name", "cli-key", "--daily-limit-usd", "2.5",
                  "--max-sandboxes", "3")
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert re.fullmatch(r"wr_[a-z2-7]{52}", key), r.stdout
    kid = re.search(r"key (key_[a-z2-7]{16})", r.stderr).group(1)
    try:
        r = admin_cli(daemon, "keys", "list")
        assert r.returncode == 0 and kid in r.stdout and key not in r.stdout, r
        line = next(x for x in r.stdout.splitlines() if kid in x)
        assert "$2.500000" in line and "cli-key" in line and "in use" in line, line
        # the key works for the CLI over TCP
        env = daemon.cli_env(RUNTIME_API_KEY=key)
        r = subprocess.run([daemon.bin, "sandbox", "list"], env=env, capture_output=True,
                           text=True, timeout=T)
        assert r.returncode == 0, r.stderr
        r = admin_cli(daemon, "keys", "set", kid, "--daily-limit-usd", "none", "--read-only")
        assert r.returncode == 0, r.stderr
        k = daemon.admin.expect(200, "GET", f"/v1/keys/{kid}").json()
        assert k["daily_limit_micros"] is None and k["read_only"] is True, k
        assert admin_cli(daemon, "keys", "create", "--name", "x",
                         "--daily-limit-usd", "1.0000001").returncode == 2
        # a key cannot use the admin's commands
        r = subprocess.run([daemon.bin, "keys", "list"], env=env, capture_output=True,
                           text=True, timeout=T)
        assert r.returncode == 4 and "admin" in r.stderr, r  # refused (403)
    finally:
        r = admin_cli(daemon, "keys", "revoke", kid)
    assert r.returncode == 0, r.stderr
    env = daemon.cli_env(RUNTIME_API_KEY=key)
    r = subprocess.run([daemon.bin, "sandbox", "list"], env=env, capture_output=True, text=True,
                       timeout=T)
    assert r.returncode != 0 and "API key" in r.stderr, r
    r = admin_cli(daemon, "audit", "--limit", "5")
    assert r.returncode == 0 and "/v1/keys/{id}/revoke" in r.stdout, r


def test_cli_tables_name_keys_and_line_up(daemon):
    name = f"cli-names-{os.getpid()}"
    r = admin_cli(daemon, "keys", "create", name)
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    kid = re.search(r"key (key_[a-z2-7]{16})", r.stderr).group(1)
    try:
        env = daemon.cli_env(RUNTIME_API_KEY=key)
        r = subprocess.run([daemon.bin, "sandbox", "run", "--", "true"], env=env,
                           capture_output=True, text=True, timeout=T)
        assert r.returncode == 0, r
        # the audit trail and usage by key say the key's name, as the dashboard does
        audit = admin_cli(daemon, "audit", "--limit", "20").stdout.splitlines()
        mine = [x for x in audit if "/v1/sandboxes" in x and f" {name} " in x]
        assert mine and not [x for x in audit if kid in x], audit
        usage = admin_cli(daemon, "usage", "--by", "key").stdout.splitlines()
        assert [x for x in usage if x.startswith(name + " ")], usage
        # keys list: every ACCESS value starts under its header (read-write is 10 wide)
        rows = admin_cli(daemon, "keys", "list").stdout.splitlines()
        col = rows[0].index("ACCESS")
        after = rows[0].index("DAILY LIMIT")
        for row in rows[1:]:
            assert row[col - 2:col] == "  " and row[col] != " ", rows
            assert row[after - 2:after] == "  ", rows
    finally:
        admin_cli(daemon, "keys", "revoke", kid)


def test_cli_auditor_key(daemon):
    r = admin_cli(daemon, "keys", "create", f"cli-auditor-{os.getpid()}", "--auditor")
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    kid = re.search(r"key (key_[a-z2-7]{16})", r.stderr).group(1)
    try:
        line = next(x for x in admin_cli(daemon, "keys", "list").stdout.splitlines()
                    if kid in x)
        assert " auditor " in line, line
        env = daemon.cli_env(RUNTIME_API_KEY=key)

        def cli(*args):
            return subprocess.run([daemon.bin, *args], env=env, capture_output=True, text=True,
                                  timeout=T)
        r = cli("keys", "list")
        assert r.returncode == 0 and kid in r.stdout and key not in r.stdout, r
        r = cli("audit", "--limit", "5")
        assert r.returncode == 0 and "ROUTE" in r.stdout.upper(), r
        r = cli("usage", "--by", "key", "--from", "2000-01-01")
        assert r.returncode == 0, r
        for args in (("sandbox", "list"), ("keys", "create", "more", "--auditor"),
                     ("keys", "revoke", kid)):
            r = cli(*args)
            assert r.returncode == 4 and "auditor key" in r.stderr, (args, r)
        r = admin_cli(daemon, "keys", "set", kid, "--read-write")
        assert r.returncode != 0 and "auditor" in r.stderr, r
    finally:
        admin_cli(daemon, "keys", "revoke", kid)


# ---- the Unix socket: root is the admin, others need a key ----


@pytest.fixture(scope="module")
def open_socket():
    """A daemon of its own whose socket is where other users can reach it."""
    d = FakeDaemon(conftest.WR_AGENT, ["--host-name", "api.example.test"])
    sockdir = tempfile.mkdtemp(prefix="wr-sock-")
    os.chmod(sockdir, 0o755)
    d.socket_path = os.path.join(sockdir, "wr.sock")
    d.admin = wrclient.Client(unix_path=d.socket_path)
    yield from serve_checked(d)


def as_nobody(sock_path, key=None):
    """GET /v1/sandboxes on the socket as uid 65534; the HTTP status."""
    code = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "h='GET /v1/sandboxes HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n'\n"
        "h+=('Authorization: Bearer '+sys.argv[2]+'\\r\\n') if len(sys.argv)>2 else ''\n"
        "s.sendall((h+'\\r\\n').encode()); print(s.makefile().readline().split()[1])\n")
    args = ["python3", "-c", code, sock_path] + ([key] if key else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=T,
                       preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def test_other_users_on_the_socket_need_a_key(open_socket):
    d = open_socket
    assert as_nobody(d.socket_path) == 401
    assert as_nobody(d.socket_path, "wr_" + "c" * 52) == 401
    assert as_nobody(d.socket_path, d.key) == 200
    assert d.admin.request("GET", "/v1/keys").status == 200  # root, no key: the admin


def test_host_name_lets_a_name_in(open_socket):
    d = open_socket
    assert get(d.port, "/v1/sandboxes", key=d.key, host=f"api.example.test:{d.port}")[0] == 200
    assert get(d.port, "/v1/sandboxes", key=d.key, host=f"other.example.test:{d.port}")[0] == 403


def test_keys_survive_a_restart(open_socket):
    d = open_socket
    k = d.make_key()
    d.proc.terminate()
    d.proc.wait(timeout=30)
    d.start(clean=False)
    assert d.client.with_key(k["key"]).request("GET", "/v1/sandboxes").status == 200


def test_the_cli_never_hands_its_key_to_a_sandbox(daemon):
    k = daemon.make_key()
    env = daemon.cli_env(RUNTIME_API_KEY=k["key"])
    r = subprocess.run([daemon.bin, "sandbox", "run", "--memory", "256", "--", "sh", "-c",
                        "env; tr '\\0' '\\n' < /proc/1/environ"], env=env, capture_output=True,
                       text=True, timeout=T)
    assert r.returncode == 0, r.stderr
    assert "PATH=" in r.stdout  # it did print its environment
    assert k["key"] not in r.stdout + r.stderr and "RUNTIME_API_KEY" not in r.stdout
    daemon.admin.request("POST", f"/v1/keys/{k['id']}/revoke")
