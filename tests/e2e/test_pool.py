"""The warm pool (serve --pool N; daemon/pool.h): a create of the default image and size claims
a sandbox started ahead, which is indistinguishable from a cold one and carries nothing from
before its claim.

A daemon of its own with the real driver and --pool 2. Whether a create was a claim is read
from what the daemon says (health's pool count, its log's pool.claimed line), never from how
long it took: speed is bench/pool.py's business.
"""

import os
import time

import pytest

import conftest
from test_failures import FakeDaemon, serve_checked

T = 60


class PoolDaemon(FakeDaemon):
    """The real driver (not fake), its own state directory, a pool of 2."""

    def serve_argv(self):
        argv = conftest.Daemon.serve_argv(self)
        return argv[:argv.index("--pool")] + ["--pool", "2"] + self.extra_args

    def assert_alive(self):
        assert self.proc.poll() is None, f"the daemon died:\n{self.log_tail()}"

    def ready(self):
        return self.req("GET", "/v1/health").json()["pool"]["ready"]

    def wait_ready(self, n=2):
        deadline = time.monotonic() + T
        while self.ready() < n:
            assert time.monotonic() < deadline, f"the pool never had {n} ready"
            time.sleep(0.05)

    def claimed(self, sid):
        """Whether the daemon says it answered this create from the pool."""
        return f"event=pool.claimed sandbox={sid}".encode() in self.log_bytes()


@pytest.fixture(scope="module")
def pd():
    yield from serve_checked(PoolDaemon(conftest.WR_AGENT))


def run(c, sid, cmd):
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/exec", {"command": cmd}).json()
    assert r["exit_code"] == 0, r
    return r["stdout"]


def events(c, sid):
    ev = c.expect(200, "GET", f"/v1/sandboxes/{sid}/events").json()["events"]
    return [(e["state"], e.get("reason")) for e in ev if e["type"] == "state"]


def test_health_shows_the_pool_filling(pd):
    pd.wait_ready(2)
    h = pd.req("GET", "/v1/health").json()
    assert h["pool"] == {"size": 2, "ready": 2} and h["sandboxes"] == 0
    assert pd.req("GET", "/v1/sandboxes").json()["sandboxes"] == []  # entries are nobody's


def test_a_default_create_is_a_claim_that_looks_cold(pd):
    pd.wait_ready(2)
    k = pd.make_key()
    c = pd.client.with_key(k["key"])
    body = {"env": {"GREETING": "hi"}, "metadata": {"team": "x"}, "timeout_seconds": 120,
            "on_lease_end": "delete", "max_cost_micros": 10**6}
    warm = c.expect(201, "POST", "/v1/sandboxes", body).json()
    cold = c.expect(201, "POST", "/v1/sandboxes", dict(body, cpus=1)).json()  # not the pool's
    try:
        assert pd.claimed(warm["id"]) and not pd.claimed(cold["id"])
        # the same fields, the user's settings, a lease from the claim
        assert set(warm) == set(cold)
        for f in ("env", "metadata", "timeout_seconds", "on_lease_end", "max_cost_micros",
                  "key_id", "network", "state", "image", "memory_mib", "disk_mib"):
            assert warm[f] == cold[f], f
        assert warm["key_id"] == k["id"] and warm["cost_micros"] == 0
        lease = time.mktime(time.strptime(warm["lease_ends_at"], "%Y-%m-%dT%H:%M:%SZ"))
        made = time.mktime(time.strptime(warm["created_at"], "%Y-%m-%dT%H:%M:%SZ"))
        assert 120 <= lease - made <= 121
        assert events(c, warm["id"]) == events(c, cold["id"]) == [("creating", "user"),
                                                                  ("running", "created")]
        # inside: the user's environment, the same files, nothing running but the agent
        for sid in (warm["id"], cold["id"]):
            assert "GREETING=hi" in run(c, sid, "env").splitlines()
            assert run(c, sid, "hostname") == sid + "\n"  # its own id, as a cold one's
        for cmd in ("ls -A /workspace /tmp /tmp/.withruntime", "ps -eo comm=", "ls -A /root",
                    "env | grep -v ^HOSTNAME= | sort"):
            assert run(c, warm["id"], cmd) == run(c, cold["id"], cmd), cmd
    finally:
        for sid in (warm["id"], cold["id"]):
            c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_nothing_passes_from_one_claim_to_the_next(pd):
    pd.wait_ready(2)
    c = pd.client
    a = c.expect(201, "POST", "/v1/sandboxes", {}).json()["id"]
    assert pd.claimed(a)
    run(c, a, "echo secret > /workspace/a.txt; echo t > /tmp/t; (sleep 1000 &) ; true")
    c.expect(200, "DELETE", f"/v1/sandboxes/{a}")
    pd.wait_ready(2)
    b = c.expect(201, "POST", "/v1/sandboxes", {}).json()["id"]
    try:
        assert pd.claimed(b) and b != a
        assert run(c, b, "ls -A /workspace /tmp; ps -eo comm=") .count("sleep") == 0
        assert "a.txt" not in run(c, b, "ls -A /workspace")
        assert run(c, b, "cat /tmp/t 2>/dev/null || echo none") == "none\n"
        assert c.request("GET", f"/v1/sandboxes/{a}").status == 404
    finally:
        c.request("DELETE", f"/v1/sandboxes/{b}")


def test_entries_are_nobodys(pd):
    """An entry's id (its directory is on the host) is not found, not listed, not deleted."""
    pd.wait_ready(2)
    entries = os.listdir(os.path.join(pd.state_dir, "sandboxes"))
    assert len(entries) >= 2
    for sid in entries:
        assert pd.req("GET", f"/v1/sandboxes/{sid}").status == 404
        assert pd.req("DELETE", f"/v1/sandboxes/{sid}").status == 404
        assert pd.req("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"}).status == 404
    assert pd.ready() == 2


def test_the_pool_refills_and_bursts_never_fail(pd):
    pd.wait_ready(2)
    c = pd.client
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as ex:
        rs = list(ex.map(lambda _: c.request("POST", "/v1/sandboxes", {}), range(6)))
    ids = [r.json()["id"] for r in rs if r.status == 201]
    try:
        assert [r.status for r in rs] == [201] * 6, rs
        assert sum(pd.claimed(s) for s in ids) == 2  # two warm, four cold
        pd.wait_ready(2)
    finally:
        for sid in ids:
            c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_a_restart_discards_the_entries(pd):
    pd.wait_ready(2)
    old = set(os.listdir(os.path.join(pd.state_dir, "sandboxes")))
    pd.proc.terminate()
    assert pd.proc.wait(timeout=60) == 0
    assert os.listdir(os.path.join(pd.state_dir, "sandboxes")) == []  # destroyed at shutdown
    assert pd.mounts() == []
    pd.start(clean=False)
    assert pd.req("GET", "/v1/sandboxes").json()["sandboxes"] == []
    pd.wait_ready(2)
    assert not old & set(os.listdir(os.path.join(pd.state_dir, "sandboxes")))


def test_a_shutdown_while_the_pool_fills_leaves_nothing(pd):
    """SIGTERM while a refill is being created: the daemon waits for it, then destroys it."""
    pd.proc.terminate()
    assert pd.proc.wait(timeout=60) == 0
    pd.start(clean=False)
    boxes = os.path.join(pd.state_dir, "sandboxes")
    deadline = time.monotonic() + T
    while not (os.listdir(boxes) and pd.ready() == 0):  # the first entry is being made
        assert time.monotonic() < deadline, "no refill seen"
        time.sleep(0.01)
    pd.proc.terminate()
    assert pd.proc.wait(timeout=120) == 0
    assert os.listdir(boxes) == [] and pd.mounts() == []
    pd.start(clean=False)
