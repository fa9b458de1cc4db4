"""Prometheus metrics at GET /metrics (docs/api.md, "Metrics"; issue 13, point 3).

Against the session's daemon (real sandboxes): the text is parsed by prometheus_client's
parser (the format Prometheus scrapes), the counters move by what the test did, and only the
admin and metrics keys may read it. Tests run one after another, so the deltas are exact.
"""

import os
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

import conftest


def scrape(daemon, client=None):
    r = (client or daemon.admin).request("GET", "/metrics", validate=False)
    assert r.status == 200, r
    ctype = r.headers.get("Content-Type") or r.headers.get("content-type")
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    text = r.body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families, text


def value(families, name, **labels):
    """The sample of family name (counters without _total, as the parser names them) with
    exactly these labels."""
    fam = families[name]
    want = {k: str(v) for k, v in labels.items()}
    hits = [s.value for s in fam.samples
            if s.labels == want and s.name in (name, name + "_total")]
    assert len(hits) == 1, (name, labels, fam.samples)
    return hits[0]


def hist_count(families, name):
    fam = families[name]
    (n,) = [s.value for s in fam.samples if s.name == name + "_count"]
    return n


def test_the_text_is_prometheus_and_names_follow_its_conventions(daemon):
    families, text = scrape(daemon)
    types = {name: f.type for name, f in families.items()}
    for name, t in {
        "withruntime_sandboxes": "gauge", "withruntime_sandboxes_frozen": "gauge",
        "withruntime_pool_size": "gauge", "withruntime_pool_ready": "gauge",
        "withruntime_sandbox_creates": "counter", "withruntime_sandbox_deletes": "counter",
        "withruntime_sandbox_failures": "counter", "withruntime_execs": "counter",
        "withruntime_sandbox_create_duration_seconds": "histogram",
        "withruntime_exec_duration_seconds": "histogram",
        "withruntime_files_bytes": "counter", "withruntime_proxy_bytes": "counter",
        "withruntime_egress_denials": "counter", "withruntime_key_spend_today_micros": "gauge",
        "process_resident_memory_bytes": "gauge", "process_open_fds": "gauge",
        "process_cpu_seconds": "counter",
    }.items():
        assert types.get(name) == t, (name, types.get(name))
    states = {s.labels["state"] for s in families["withruntime_sandboxes"].samples}
    assert states == {"creating", "running", "stopped", "failed", "deleting", "stopping",
                      "starting"}
    # histograms: cumulative buckets ending in +Inf, which equals the count
    for h in ("withruntime_sandbox_create_duration_seconds", "withruntime_exec_duration_seconds"):
        buckets = [(s.labels["le"], s.value) for s in families[h].samples
                   if s.name == h + "_bucket"]
        assert buckets[-1][0] == "+Inf" and buckets[-1][1] == hist_count(families, h)
        counts = [v for _, v in buckets]
        assert counts == sorted(counts)
    assert value(families, "process_resident_memory_bytes") > 1 << 20
    assert value(families, "process_open_fds") >= 3
    # every line is a comment or a sample; HELP and TYPE come once per family
    assert text.count("# TYPE withruntime_sandboxes gauge\n") == 1
    assert all(line.startswith("#") or " " in line for line in text.splitlines())


def test_counters_move_by_what_was_done(daemon, client):
    before, _ = scrape(daemon)
    sb = client.create(memory_mib=256)
    sid = sb["id"]
    try:
        during, _ = scrape(daemon)
        assert value(during, "withruntime_sandboxes", state="running") == \
            value(before, "withruntime_sandboxes", state="running") + 1
        assert client.exec(sid, "echo hi")["stdout"] == "hi\n"
        data = os.urandom(300_000)
        client.write_file(sid, "/workspace/m.bin", data)
        assert client.read_file(sid, "/workspace/m.bin") == data
        refused = client.request("POST", "/v1/sandboxes", {"memory_mib": 1})
        assert refused.status == 400, refused
    finally:
        client.delete(sid)
    after, text = scrape(daemon)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("withruntime_sandbox_creates", result="created") == 1
    assert delta("withruntime_sandbox_creates", result="refused") == 1
    assert delta("withruntime_sandbox_creates", result="failed") == 0
    assert hist_count(after, "withruntime_sandbox_create_duration_seconds") - \
        hist_count(before, "withruntime_sandbox_create_duration_seconds") == 1
    assert delta("withruntime_execs") == 1
    assert hist_count(after, "withruntime_exec_duration_seconds") - \
        hist_count(before, "withruntime_exec_duration_seconds") == 1
    assert delta("withruntime_files_bytes", direction="write") == len(data)
    assert delta("withruntime_files_bytes", direction="read") == len(data)
    assert delta("withruntime_sandbox_deletes") == 1
    assert value(after, "withruntime_sandboxes", state="running") == \
        value(before, "withruntime_sandboxes", state="running")
    # no series names a sandbox
    assert sid not in text


def test_the_number_of_series_does_not_grow_with_sandboxes(daemon, client):
    def series():
        families, _ = scrape(daemon)
        return {(s.name, tuple(sorted(s.labels.items())))
                for f in families.values() for s in f.samples}

    first = series()
    ids = [client.create(memory_mib=128)["id"] for _ in range(3)]
    try:
        for sid in ids:
            client.exec(sid, "true")
        assert series() == first
    finally:
        for sid in ids:
            client.delete(sid)


def test_who_may_read_it(daemon, client):
    # a full key and a read-only key: 403, with words saying who may
    r = client.request("GET", "/metrics", validate=False)
    assert r.status == 403 and "metrics key" in r.error[1], r
    ro = daemon.make_key(read_only=True)
    r = daemon.client.with_key(ro["key"]).request("GET", "/metrics", validate=False)
    assert r.status == 403, r
    # a metrics key: /metrics over TCP, and nothing else
    mk = daemon.make_key(metrics=True)
    assert mk["metrics"] is True and daemon.make_key()["metrics"] is False
    mc = daemon.client.with_key(mk["key"])
    families, _ = scrape(daemon, mc)
    assert "withruntime_sandboxes" in families
    for method, path in (("GET", "/v1/sandboxes"), ("GET", "/v1/health"),
                         ("POST", "/v1/sandboxes")):
        r = mc.request(method, path, {} if method == "POST" else None, validate=False)
        assert r.status == 403 and "metrics key" in r.error[1], (path, r)
    # no key at all, on TCP
    with socket.create_connection(("127.0.0.1", daemon.port)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 401"), head[:80]
    # a metrics key appears in the admin's list as one, and its flag cannot be changed later
    r = daemon.admin.request("PATCH", f"/v1/keys/{mk['id']}", {"metrics": False}, validate=False)
    assert r.status == 400, r


@pytest.mark.parametrize("path", ["/metrics?x=1", "/metrics/"])
def test_odd_paths(daemon, path):
    r = daemon.admin.request("GET", path, validate=False)
    assert r.status in (400, 404), r


def test_spend_by_key_is_listed_per_owner(daemon):
    families, _ = scrape(daemon)
    keys = {s.labels["key_id"] for s in families["withruntime_key_spend_today_micros"].samples}
    assert conftest._KEYS_BY_PORT  # the session's key exists
    listed = daemon.admin.request("GET", "/v1/keys").json()["keys"]
    owners = {k["id"] for k in listed if not k["revoked_at"] and k["owner_id"] == k["id"]}
    assert keys == owners


def test_the_cli_makes_a_metrics_key(daemon):
    from test_keys import admin_cli
    r = admin_cli(daemon, "keys", "create", "--name", f"prom-{os.getpid()}", "--metrics")
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    families, _ = scrape(daemon, daemon.client.with_key(key))
    assert "withruntime_sandboxes" in families
    listed = admin_cli(daemon, "keys", "list")
    line = [ln for ln in listed.stdout.splitlines() if f"prom-{os.getpid()}" in ln]
    assert len(line) == 1 and " metrics " in line[0], listed.stdout
    r = admin_cli(daemon, "keys", "set", line[0].split()[0], "--metrics")
    assert r.returncode == 2 and "made as one" in r.stderr, r
