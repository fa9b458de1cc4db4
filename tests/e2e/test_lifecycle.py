"""Stop, start, leases and the event history (docs/lifecycle.md)."""

import datetime
import time

import pytest

UNKNOWN = "sb-aaaaaaaaaaaaaaaaaaaaa"


def parse_time(s):
    return datetime.datetime.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")


def post(client, sid, action, body=None, expect=200):
    r = client.request("POST", f"/v1/sandboxes/{sid}/{action}", body)
    assert r.status == expect, r
    return r


def wait_for(pred, what, limit=60):
    """Polls pred() (a bounded wait for a state change, not a speed check)."""
    deadline = time.monotonic() + limit
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def events(client, sid):
    return client.expect(200, "GET", f"/v1/sandboxes/{sid}/events").json()["events"]


def test_stop_keeps_files_and_start_brings_them_back(client, make_sandbox):
    sid = make_sandbox(memory_mib=256)["id"]
    client.write_file(sid, "kept.txt", b"still here")
    client.exec(sid, "mkdir -p /opt/made && echo inside > /opt/made/f")

    sb = post(client, sid, "stop").json()
    assert sb["state"] == "stopped"
    assert sb["state_reason"] == "user"
    assert client.get(sid)["state"] == "stopped"

    # a stopped sandbox runs nothing and says why
    r = client.request("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
    assert r.status == 409, r
    assert r.error[0] == "conflict" and "stopped" in r.error[1]
    r = client.files("GET", sid, "content", path="kept.txt")
    assert r.status == 409 and r.error[0] == "conflict"

    # stopping again changes nothing
    assert post(client, sid, "stop").json()["state"] == "stopped"

    sb = post(client, sid, "start").json()
    assert sb["state"] == "running"
    assert "state_reason" not in sb
    assert client.read_file(sid, "kept.txt") == b"still here"
    assert client.exec(sid, "cat /opt/made/f")["stdout"] == "inside\n"
    # starting a running sandbox is a no-op
    assert post(client, sid, "start").json()["state"] == "running"

    states = [(e["state"], e["reason"]) for e in events(client, sid)]
    assert states[0][0] == "creating"
    assert ("running", "created") in states
    assert ("stopped", "user") in states
    assert states[-1][0] == "running"
    assert states.index(("stopped", "user")) < len(states) - 1


def test_stop_ends_every_process(client, make_sandbox):
    sid = make_sandbox(memory_mib=256)["id"]
    r = client.request("POST", f"/v1/sandboxes/{sid}/exec",
                       {"command": "sleep 1000", "background": True})
    assert r.status == 201, r
    cid = r.json()["id"]
    post(client, sid, "stop")
    cmd = client.expect(200, "GET", f"/v1/sandboxes/{sid}/commands/{cid}").json()
    assert cmd["state"] == "failed" and cmd["error"]
    post(client, sid, "start")
    r = client.exec(sid, "cat /proc/[0-9]*/comm")
    assert r["stdout"].strip(), r
    assert "sleep" not in r["stdout"].split()


def test_start_gives_a_fresh_lease(client, make_sandbox):
    sb = make_sandbox(memory_mib=256, timeout_seconds=600)
    sid = sb["id"]
    post(client, sid, "stop")
    # the next whole second, so the new lease cannot round to the old one
    time.sleep(1.1)
    again = post(client, sid, "start").json()
    assert parse_time(again["lease_ends_at"]) > parse_time(sb["lease_ends_at"])
    assert again["timeout_seconds"] == 600


def test_set_timeout_moves_the_lease(client, make_sandbox):
    sid = make_sandbox(memory_mib=256)["id"]
    before = datetime.datetime.utcnow().replace(microsecond=0)
    sb = post(client, sid, "timeout", {"timeout_seconds": 100}).json()
    assert sb["timeout_seconds"] == 100
    ends = parse_time(sb["lease_ends_at"])
    assert before + datetime.timedelta(seconds=99) <= ends <= \
        datetime.datetime.utcnow() + datetime.timedelta(seconds=102)
    assert client.get(sid)["lease_ends_at"] == sb["lease_ends_at"]
    sb = post(client, sid, "timeout", {"timeout_seconds": 86400}).json()
    assert sb["timeout_seconds"] == 86400


@pytest.mark.parametrize("body,field", [
    ({}, "timeout_seconds"),
    ({"timeout_seconds": 0}, "timeout_seconds"),
    ({"timeout_seconds": 86401}, "timeout_seconds"),
    ({"timeout_seconds": "10"}, "timeout_seconds"),
    ({"timeout_seconds": 10, "extra": 1}, "extra"),
])
def test_set_timeout_bad_bodies(client, sandbox, body, field):
    r = client.request("POST", f"/v1/sandboxes/{sandbox}/timeout", body)
    assert r.status == 400, r
    assert r.error[0] == "invalid_request" and field in r.error[1]


def test_lease_end_stops(client, make_sandbox):
    # a long lease while the test sets up (however slow the create), then a 2 s one
    sid = make_sandbox(memory_mib=256, timeout_seconds=600, on_lease_end="stop")["id"]
    client.write_file(sid, "f", b"x")
    # positive control: running, with its file, until the short lease is set
    assert client.read_file(sid, "f") == b"x"
    assert post(client, sid, "timeout", {"timeout_seconds": 2}).json()["state"] == "running"
    sb = wait_for(lambda: (lambda s: s if s["state"] == "stopped" else None)(client.get(sid)),
                  "the lease to stop the sandbox")
    assert sb["state_reason"] == "lease_ended"
    assert ("stopped", "lease_ended") in [(e["state"], e["reason"])
                                          for e in events(client, sid)]
    # files survive; starting it again works
    post(client, sid, "start")
    assert client.read_file(sid, "f") == b"x"


def test_lease_end_deletes(client, make_sandbox):
    sid = make_sandbox(memory_mib=256, timeout_seconds=600, on_lease_end="delete")["id"]
    assert client.exec(sid, "echo alive")["stdout"] == "alive\n"  # positive control
    assert post(client, sid, "timeout", {"timeout_seconds": 2}).json()["state"] == "running"
    wait_for(lambda: client.request("GET", f"/v1/sandboxes/{sid}").status == 404,
             "the lease to delete the sandbox")
    assert sid not in {s["id"] for s in client.list()}


def test_delete_stopped_sandbox(client, make_sandbox):
    sid = make_sandbox(memory_mib=256)["id"]
    post(client, sid, "stop")
    assert client.delete(sid)["deleted"] is True
    assert client.request("GET", f"/v1/sandboxes/{sid}").status == 404


@pytest.mark.parametrize("action", ["stop", "start", "timeout"])
def test_lifecycle_unknown_sandbox(client, action):
    body = {"timeout_seconds": 10} if action == "timeout" else None
    r = client.request("POST", f"/v1/sandboxes/{UNKNOWN}/{action}", body)
    assert r.status == 404 and r.error[0] == "not_found"


@pytest.mark.parametrize("action", ["stop", "start", "timeout"])
def test_lifecycle_wrong_method(client, action):
    r = client.request("GET", f"/v1/sandboxes/{UNKNOWN}/{action}")
    assert r.status == 405, r
    assert r.headers["allow"].strip() == "POST"
