"""Sandbox lifecycle through the API: create, get, list, delete; health and images."""

import datetime
import os
import re
import time

import pytest

import wrclient

ID_RE = re.compile(r"^sb-[a-z2-7]{21}$")


def parse_time(s):
    return datetime.datetime.strptime(s.split(".")[0].rstrip("Z"), "%Y-%m-%dT%H:%M:%S")


def assert_lease(sb):
    """The lease runs timeout_seconds from when the sandbox started (after created_at)."""
    lease = parse_time(sb["lease_ends_at"]) - parse_time(sb["created_at"])
    extra = lease - datetime.timedelta(seconds=sb["timeout_seconds"])
    assert datetime.timedelta(0) <= extra <= datetime.timedelta(seconds=30), sb


def test_health(client, make_sandbox):
    h = client.health()
    assert h["status"] == "ok"
    assert h["version"]
    assert h["driver"] == "gvisor"
    assert h["sandboxes"] == len(client.list())
    make_sandbox(memory_mib=256)
    assert client.health()["sandboxes"] == h["sandboxes"] + 1


def test_health_over_unix_socket(daemon):
    c = wrclient.Client(unix_path=daemon.socket_path)
    r = c.request("GET", "/v1/health")
    assert r.status == 200
    assert r.json()["status"] == "ok"


def test_images_lists_default(client):
    images = client.expect(200, "GET", "/v1/images").json()["images"]
    names = [i["name"] for i in images]
    assert "default" in names
    default = images[names.index("default")]
    assert default["size_bytes"] > 50 * 1024 * 1024  # a Debian root with python3


def test_create_get_list_delete(client, make_sandbox):
    before = {s["id"] for s in client.list()}
    t0 = datetime.datetime.utcnow().replace(microsecond=0) - datetime.timedelta(seconds=5)
    sb = make_sandbox()
    assert ID_RE.match(sb["id"])
    assert sb["id"] not in before
    assert sb["state"] == "running"
    # documented defaults
    assert sb["image"] == "default"
    assert sb["cpus"] == 2
    assert sb["memory_mib"] == 4096
    assert sb["env"] == {}
    assert sb["metadata"] == {}
    assert sb["timeout_seconds"] == 3600
    assert sb["on_lease_end"] == "stop"
    assert sb["network"] == {"internet": False}
    created = parse_time(sb["created_at"])
    assert t0 <= created <= datetime.datetime.utcnow() + datetime.timedelta(seconds=5)
    assert_lease(sb)

    got = client.get(sb["id"])
    assert got == sb

    listed = client.list()
    assert [s for s in listed if s["id"] == sb["id"]] == [sb]

    # the sandbox answers
    r = client.exec(sb["id"], "echo alive")
    assert r["stdout"] == "alive\n"

    d = client.delete(sb["id"])
    assert d == {"id": sb["id"], "deleted": True}
    assert client.request("GET", f"/v1/sandboxes/{sb['id']}").status == 404
    assert sb["id"] not in {s["id"] for s in client.list()}
    assert client.request("DELETE", f"/v1/sandboxes/{sb['id']}").status == 404
    assert client.request("POST", f"/v1/sandboxes/{sb['id']}/exec",
                          {"command": "true"}).status == 404


def test_events(client, make_sandbox):
    sb = make_sandbox(memory_mib=256)
    ev = client.expect(200, "GET", f"/v1/sandboxes/{sb['id']}/events").json()
    assert ev["id"] == sb["id"]
    events = ev["events"]
    assert events, ev
    assert events[-1]["state"] == "running"
    assert events[-1]["type"] == "state"
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    assert parse_time(events[0]["at"]) >= parse_time(sb["created_at"]) - \
        datetime.timedelta(seconds=1)
    client.delete(sb["id"])
    r = client.request("GET", f"/v1/sandboxes/{sb['id']}/events")
    assert r.status == 404


def test_create_with_every_field(client, make_sandbox):
    fields = {
        "image": "default",
        "cpus": 1,
        "memory_mib": 512,
        "env": {"GREETING": "hello", "EMPTY": ""},
        "metadata": {"owner": "e2e", "ticket": "42"},
        "timeout_seconds": 120,
        "on_lease_end": "delete",
        "network": {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]},
    }
    sb = make_sandbox(**fields)
    for k, v in fields.items():
        assert sb[k] == v, k
    assert_lease(sb)
    assert client.get(sb["id"]) == sb


@pytest.mark.parametrize("given, returned", [
    ({}, {"internet": False}),
    ({"internet": True}, {"internet": True}),
    ({"internet": False, "allow": []}, {"internet": False}),
    ({"internet": True, "allow": []}, {"internet": True, "allow": []}),
    ({"internet": True, "allow": ["PyPI.org.", "*.PythonHosted.ORG", "pypi.org", "x.test:8443"],
      "deny": ["Bad.PythonHosted.org"]},
     {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org", "x.test:8443"],
      "deny": ["bad.pythonhosted.org"]}),
])
def test_network_is_returned_normalised(client, make_sandbox, given, returned):
    """api/openapi.yaml NetworkOut: `internet` always present, `allow` and `deny` when given
    with internet, entries in lower case, without the trailing dot, once each, in order."""
    sb = make_sandbox(memory_mib=256, network=given)
    assert sb["network"] == returned
    assert client.get(sb["id"])["network"] == returned


def test_empty_body_creates_default_sandbox(client, make_sandbox):
    r = client.request("POST", "/v1/sandboxes", data=b"",
                       headers={"Content-Type": "application/json"})
    assert r.status == 201, r
    sb = r.json()
    make_sandbox.ids.append(sb["id"])
    assert sb["state"] == "running"
    assert sb["cpus"] == 2


def test_ids_are_unique(client, make_sandbox):
    ids = {make_sandbox(memory_mib=256)["id"] for _ in range(3)}
    assert len(ids) == 3


def test_list_is_oldest_first(client, make_sandbox):
    a = make_sandbox(memory_mib=256)["id"]
    b = make_sandbox(memory_mib=256)["id"]
    order = [s["id"] for s in client.list()]
    assert order.index(a) < order.index(b)


def test_sandboxes_do_not_share_files(client, make_sandbox):
    a = make_sandbox(memory_mib=256)["id"]
    b = make_sandbox(memory_mib=256)["id"]
    client.write_file(a, "/workspace/mine.txt", b"only in a")
    assert client.read_file(a, "/workspace/mine.txt") == b"only in a"
    r = client.files("GET", b, "content", path="/workspace/mine.txt")
    assert r.status == 404
    r = client.exec(b, "cat /workspace/mine.txt")
    assert r["exit_code"] != 0


def test_the_network_policy_of_a_sandbox_can_be_replaced(client, make_sandbox):
    sb = make_sandbox(memory_mib=256)
    sid = sb["id"]
    r = client.request("PUT", f"/v1/sandboxes/{sid}/network",
                       {"internet": True, "allow": ["PyPI.org", "*.pythonhosted.org"]})
    assert r.status == 200, r
    want = {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]}
    assert r.json()["network"] == want and r.json()["id"] == sid
    assert client.get(sid)["network"] == want
    # kept across a stop and a start
    client.expect(200, "POST", f"/v1/sandboxes/{sid}/stop")
    r = client.request("PUT", f"/v1/sandboxes/{sid}/network", {"internet": False})
    assert r.status == 200 and r.json()["network"] == {"internet": False}, r
    client.expect(200, "POST", f"/v1/sandboxes/{sid}/start")
    assert client.get(sid)["network"] == {"internet": False}
    # a bad policy changes nothing, and the message names the entry
    r = client.request("PUT", f"/v1/sandboxes/{sid}/network",
                       {"internet": True, "allow": ["pypi.org", "10.0.0.1"]})
    assert r.status == 400 and "network.allow[1]" in r.error[1] and "10.0.0.1" in r.error[1], r
    assert client.get(sid)["network"] == {"internet": False}
    r = client.request("PUT", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaaaaaaa/network", {"internet": True})
    assert r.status == 404, r


def test_list_filters_by_metadata_and_state(client, make_sandbox):
    from urllib.parse import urlencode
    tag = f"run-{os.getpid()}-{time.monotonic_ns()}"
    a = make_sandbox(memory_mib=256, metadata={"tag": tag, "team": "blue"})["id"]
    b = make_sandbox(memory_mib=256, metadata={"tag": tag, "team": "red&green=1"})["id"]
    client.request("POST", f"/v1/sandboxes/{b}/stop", {})

    def listed(**query):
        r = client.request("GET", "/v1/sandboxes", query=query)
        assert r.status == 200, r
        return [s["id"] for s in r.json()["sandboxes"]]

    assert listed(metadata=urlencode({"tag": tag})) == [a, b]
    assert listed(metadata=urlencode({"tag": tag, "team": "blue"})) == [a]
    # a value holding '&' and '=' is encoded once more, and matches whole
    assert listed(metadata=urlencode({"team": "red&green=1", "tag": tag})) == [b]
    assert listed(metadata=urlencode({"tag": tag}), state="stopped") == [b]
    assert listed(metadata=urlencode({"tag": tag, "nope": "x"})) == []
    # a filter no metadata can hold matches nothing (metadata is UTF-8 strings); a pair
    # without '=' is a key with an empty value
    for never in ("=v", "k=%ZZ", "k=%00", "k=%FF", "tag"):
        assert listed(metadata=never) == [], never
    r = client.request("GET", "/v1/sandboxes", query={"state": "asleep"})
    assert r.status == 400 and "state" in r.error[1], r
