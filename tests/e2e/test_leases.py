"""Leases that end on time, and what a lease end does to files and background commands
(docs/lifecycle.md "Leases"; issue 3).

The daemon checks leases four times a second, so a lease ends within a second of its time.
`lease_ends_at` is rounded up to the whole second (api/openapi.yaml note 7), so the real end is
at most one second before it: "on time" here means by lease_ends_at + 1.5 s, and not before
lease_ends_at - 1 s.
"""

import calendar
import time

POLL = 0.1
ON_TIME = 1.5  # seconds after lease_ends_at by which the lease must have taken effect


def epoch(ts):
    """Seconds since the epoch of an RFC 3339 UTC timestamp of the API."""
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))


def events(client, sid):
    return [(e["state"], e["reason"]) for e in
            client.expect(200, "GET", f"/v1/sandboxes/{sid}/events").json()["events"]]


def post(client, sid, action, body=None):
    return client.expect(200, "POST", f"/v1/sandboxes/{sid}/{action}", body).json()


def watch_lease(client, sid, lease_end, done, limit=30):
    """Polls GET /v1/sandboxes/{sid} until done(status, body) is true. Returns (the wall time of
    the last answer that was not done yet, the wall time of the first that was, that answer)."""
    last_before = None
    deadline = lease_end + limit
    while True:
        t = time.time()
        r = client.request("GET", f"/v1/sandboxes/{sid}")
        body = r.json()
        if done(r.status, body):
            return last_before, t, (r.status, body)
        assert r.status == 200, r
        assert body["state"] in ("running", "stopping", "deleting"), body
        last_before = t
        assert time.time() < deadline, f"the lease never ended: {body}"
        time.sleep(POLL)


def test_lease_stop_ends_on_time_and_keeps_files(client, make_sandbox):
    sb = make_sandbox(memory_mib=256, timeout_seconds=3, on_lease_end="stop")
    sid = sb["id"]
    lease_end = epoch(sb["lease_ends_at"])
    client.write_file(sid, "before-lease.txt", b"written before the lease ended\n")
    client.exec(sid, "mkdir -p /srv/kept && echo root-layer > /srv/kept/f")

    before, seen, (_, got) = watch_lease(
        client, sid, lease_end, lambda st, b: st == 200 and b["state"] == "stopped")
    assert seen <= lease_end + ON_TIME, \
        f"stopped {seen - lease_end:.2f} s after lease_ends_at {sb['lease_ends_at']}"
    # it ran until its lease: it was seen running less than a second before lease_ends_at
    assert before is not None and before >= lease_end - 1.5, \
        f"last seen running {lease_end - before:.2f} s before its lease end"
    assert got["state_reason"] == "lease_ended", got
    assert ("stopped", "lease_ended") in events(client, sid)

    # a stopped sandbox runs nothing; start brings it back with every file
    r = client.request("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
    assert r.status == 409, r
    again = post(client, sid, "start")
    assert again["state"] == "running"
    assert client.read_file(sid, "before-lease.txt") == b"written before the lease ended\n"
    assert client.exec(sid, "cat /srv/kept/f")["stdout"] == "root-layer\n"
    # the fresh lease is timeout_seconds long again: keep it from ending under the test
    post(client, sid, "timeout", {"timeout_seconds": 600})


def test_lease_delete_ends_on_time(client, make_sandbox):
    sb = make_sandbox(memory_mib=256, timeout_seconds=3, on_lease_end="delete")
    sid = sb["id"]
    lease_end = epoch(sb["lease_ends_at"])
    assert client.exec(sid, "echo alive")["stdout"] == "alive\n"

    before, seen, _ = watch_lease(client, sid, lease_end, lambda st, b: st == 404)
    assert seen <= lease_end + ON_TIME, \
        f"still there {seen - lease_end:.2f} s after lease_ends_at {sb['lease_ends_at']}"
    assert before is not None and before >= lease_end - 1.5, \
        f"gone {lease_end - before:.2f} s before its lease end"
    assert sid not in {s["id"] for s in client.list()}
    for method, route in [("GET", f"/v1/sandboxes/{sid}/events"),
                          ("POST", f"/v1/sandboxes/{sid}/start"),
                          ("DELETE", f"/v1/sandboxes/{sid}")]:
        r = client.request(method, route)
        assert r.status == 404 and r.error[0] == "not_found", r


def ps(client, sid):
    return client.exec(sid, "ps -eo args")["stdout"]


# Fetches http://127.0.0.1:8123/hello.txt inside the sandbox, retrying while nothing listens
# yet (up to argv[1] seconds): a wait on the server being up, not a guess at how long it takes.
FETCH = r'''
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
while True:
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8123/hello.txt", timeout=20).read()
              .decode(), end="")
        break
    except OSError as e:
        if time.monotonic() > deadline:
            print(f"no server: {e}", end="")
            break
        time.sleep(0.1)
'''


def test_background_server_lives_until_the_lease_ends(client, make_sandbox):
    sid = make_sandbox(memory_mib=256, timeout_seconds=600)["id"]
    # positive control: with no server, the fetch fails (and says so)
    got = client.exec(sid, argv=["python3", "-c", FETCH, "0"])
    assert got["stdout"].startswith("no server:"), got
    r = client.request("POST", f"/v1/sandboxes/{sid}/exec",
                       {"command": "exec python3 -m http.server 8123 --bind 127.0.0.1",
                        "background": True})
    assert r.status == 201, r
    cid = r.json()["id"]

    # two calls later it is still serving
    client.exec(sid, "true")
    client.write_file(sid, "hello.txt", b"served\n")
    listing = ps(client, sid)
    assert "http.server" in listing, listing
    got = client.exec(sid, argv=["python3", "-c", FETCH, "30"])
    assert got["stdout"] == "served\n", got
    cmd = client.expect(200, "GET", f"/v1/sandboxes/{sid}/commands/{cid}").json()
    assert cmd["state"] == "running", cmd

    # the lease ends: the sandbox stops and the server with it
    post(client, sid, "timeout", {"timeout_seconds": 1})
    deadline = time.monotonic() + 30
    while client.get(sid)["state"] != "stopped":
        assert time.monotonic() < deadline, "the lease did not stop the sandbox"
        time.sleep(POLL)
    assert client.get(sid)["state_reason"] == "lease_ended"
    cmd = client.expect(200, "GET", f"/v1/sandboxes/{sid}/commands/{cid}").json()
    assert cmd["state"] == "failed" and cmd["error"], cmd

    post(client, sid, "timeout", {"timeout_seconds": 600})
    post(client, sid, "start")
    listing = ps(client, sid)
    assert "ps -eo args" in listing, listing  # the listing itself worked
    assert "http.server" not in listing, listing
    assert client.read_file(sid, "hello.txt") == b"served\n"
