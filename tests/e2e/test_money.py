"""Money: metering, cost caps, daily limits and usage (docs/api.md, "Usage and costs").

A daemon of its own (the fake driver) whose meter reads its clock from a file the tests move
(`serve --meter-clock FILE`): no time passes for the meter unless a test says so, so an "hour"
takes no time and every amount is exact. The seed's prices are the defaults: a vCPU-hour
$0.025, a GiB-hour $0.0075, CPU billed at no less than 2.5 % of each vCPU.
"""

import calendar
import concurrent.futures
import os
import subprocess
import time

import pytest

import conftest
from test_failures import FakeDaemon, serve_checked
from test_keys import admin_cli

T = 60
HOUR = 3600 * 1000
# 2026-06-01 00:00:00 UTC: a day boundary far from the real clock's.
BASE = calendar.timegm((2026, 6, 1, 0, 0, 0)) * 1000
DAY = "2026-06-01"


def price(cpu_usec, mem_mib_ms):
    """The seed's prices, rounded down as the daemon does."""
    return cpu_usec * 25000 // 3_600_000_000 + mem_mib_ms * 7500 // (1024 * 3_600_000)


class MeterDaemon(FakeDaemon):
    def __init__(self):
        super().__init__(conftest.WR_AGENT)
        self.clock_path = os.path.join(self.tmp, "clock")
        self.now = BASE
        self.set_clock(BASE)
        self.extra_args += ["--meter-clock", self.clock_path]

    def set_clock(self, ms):
        self.now = ms
        tmp = self.clock_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{ms}\n")
        os.rename(tmp, self.clock_path)

    def advance(self, ms):
        self.set_clock(self.now + ms)


@pytest.fixture(scope="module")
def md():
    yield from serve_checked(MeterDaemon())


def wait_for(what, fn, timeout=T):
    """Polls fn until it returns something true (the meter runs on the daemon's 250 ms tick)."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def cost_of(c, sid):
    return c.get(sid)["cost_micros"]


def usage(c, group_by="sandbox", frm=DAY, to="2026-06-09"):
    r = c.request("GET", "/v1/usage", query={"from": frm, "to": to, "group_by": group_by})
    assert r.status == 200, r
    return r.json()


def settled(md, c, sid):
    """Waits until the sandbox's cost stops changing at the current clock (one meter pass
    after the clock moved), and returns it."""
    seen = []

    def steady():
        seen.append(cost_of(c, sid))
        return len(seen) >= 8 and len(set(seen[-8:])) == 1

    wait_for("the meter to settle", steady)
    return seen[-1]


def test_an_idle_hour_costs_the_seeds_price(md):
    k = md.make_key()
    c = md.client.with_key(k["key"])
    sb = c.expect(201, "POST", "/v1/sandboxes", {"cpus": 2, "memory_mib": 4096}).json()
    sid = sb["id"]
    try:
        assert sb["cost_micros"] == 0 and sb["max_cost_micros"] is None
        md.advance(HOUR)
        wait_for("a charge", lambda: cost_of(c, sid) > 0)
        assert settled(md, c, sid) == 31250  # $0.03125: 30,000 memory + 1,250 CPU floor
        u = usage(c)
        rows = {r["sandbox_id"]: r for r in u["rows"]}
        assert rows[sid]["cost_micros"] == 31250 and u["total_micros"] == 31250
        assert rows[sid]["memory_mib_ms"] == 4096 * HOUR
        assert rows[sid]["cpu_usec"] == 2 * HOUR * 1000 * 25 // 1000
        by_key = usage(c, "key")["rows"]
        assert by_key == [{"key_id": k["id"], "cost_micros": 31250, "cpu_usec": 180_000_000,
                           "memory_mib_ms": 4096 * HOUR}]
        by_day = usage(c, "day")["rows"]
        assert [r["day"] for r in by_day] == [DAY] and by_day[0]["cost_micros"] == 31250
        # the admin's view of the key: today's spend (the meter's today)
        assert md.admin.request("GET", f"/v1/keys/{k['id']}").json()["spent_today_micros"] == 31250
        # a stopped sandbox costs nothing
        c.expect(200, "POST", f"/v1/sandboxes/{sid}/stop")
        stopped_at = cost_of(c, sid)
        md.advance(HOUR)
        time.sleep(1.5)  # several meter passes: none may charge a stopped sandbox
        assert cost_of(c, sid) == stopped_at
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_busy_cpu_is_billed_as_measured(md):
    k = md.make_key()
    c = md.client.with_key(k["key"])
    sid = c.expect(201, "POST", "/v1/sandboxes", {"cpus": 2, "memory_mib": 256}).json()["id"]
    try:
        spin = "timeout 2 sh -c 'while :; do :; done'"
        r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/exec",
                     {"command": f"{spin} & {spin}; s=$?; wait; exit $s",
                      "timeout_seconds": 30}).json()
        assert r["exit_code"] == 124, r  # both loops ran until timeout stopped them
        md.advance(3000)
        wait_for("a charge", lambda: cost_of(c, sid) > 0)
        cost = settled(md, c, sid)
        row = {r["sandbox_id"]: r for r in usage(c)["rows"]}[sid]
        # measured: more than the floor (0.15 s in 3 s), at most both vCPUs for the 3 s
        assert 150_000 < row["cpu_usec"] <= 2 * 3000 * 1000, row
        assert row["memory_mib_ms"] == 256 * 3000
        assert cost == row["cost_micros"] == price(row["cpu_usec"], row["memory_mib_ms"]), row
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_max_cost_micros_stops_the_sandbox_at_its_cap(md):
    k = md.make_key()
    c = md.client.with_key(k["key"])
    for bad in (0, -1, None, "5", 10**13):
        r = c.request("POST", "/v1/sandboxes", {"max_cost_micros": bad})
        assert r.status == 400 and "max_cost_micros" in r.error[1], (bad, r)
    sb = c.expect(201, "POST", "/v1/sandboxes",
                  {"cpus": 2, "memory_mib": 4096, "max_cost_micros": 1000}).json()
    sid = sb["id"]
    try:
        assert sb["max_cost_micros"] == 1000
        md.advance(60_000)  # a minute: 520 of the 1000
        wait_for("a charge", lambda: cost_of(c, sid) > 0)
        assert settled(md, c, sid) == 31250 * 60 // 3600
        c.expect(200, "POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
        md.advance(10 * 60_000)  # ten minutes would cost 5,208: it stops at the cap
        s = wait_for("the cap to stop it",
                     lambda: (lambda s: s if s["state"] == "stopped" else None)(c.get(sid)))
        assert s["state_reason"] == "cost_cap" and s["cost_micros"] == 1000, s
        r = c.request("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
        assert r.status == 402 and r.error[0] == "cost_limit" and "max_cost_micros" in r.error[1]
        r = c.request("POST", f"/v1/sandboxes/{sid}/start")
        assert r.status == 402 and r.error[0] == "cost_limit", r
        md.advance(HOUR)
        time.sleep(1)
        assert cost_of(c, sid) == 1000
        assert sum(r["cost_micros"] for r in usage(c)["rows"] if r["sandbox_id"] == sid) == 1000
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_a_keys_daily_limit(md):
    k = md.make_key(daily_limit_micros=2000)
    c = md.client.with_key(k["key"])
    a = c.expect(201, "POST", "/v1/sandboxes", {"cpus": 2, "memory_mib": 4096}).json()["id"]
    b = c.expect(201, "POST", "/v1/sandboxes", {"cpus": 1, "memory_mib": 512}).json()["id"]
    try:
        md.advance(20 * 60_000)  # twenty minutes of both: far past $0.002
        for sid in (a, b):
            s = wait_for("the limit to stop it",
                         lambda: (lambda s: s if s["state"] == "stopped" else None)(c.get(sid)))
            assert s["state_reason"] == "daily_limit", s
        spent = md.admin.request("GET", f"/v1/keys/{k['id']}").json()["spent_today_micros"]
        # up to the limit, never past it (what the first one stopped still held is not spent)
        assert 2000 - 250 <= spent <= 2000
        assert sum(r["cost_micros"] for r in usage(c)["rows"]) == spent
        for method, path, body in (("POST", "/v1/sandboxes", {}),
                                   ("POST", f"/v1/sandboxes/{a}/start", None),
                                   ("POST", f"/v1/sandboxes/{a}/exec", {"command": "true"})):
            r = c.request(method, path, body)
            assert r.status == 402 and r.error[0] == "cost_limit", (path, r)
        msg = c.request("POST", "/v1/sandboxes", {}).error[1]
        assert "daily limit of $0.002000 (spent $0.00" in msg, msg  # dollars, as it is set
        assert "micro" not in msg, msg
        # the key cannot raise its own limit, on any route; the admin can
        r = c.request("PATCH", f"/v1/keys/{k['id']}", {"daily_limit_micros": 10**9})
        assert r.status == 403
        assert md.admin.request("PATCH", f"/v1/keys/{k['id']}",
                                {"daily_limit_micros": 10**6}).status == 200
        c.expect(200, "POST", f"/v1/sandboxes/{a}/start")
        c.expect(200, "POST", f"/v1/sandboxes/{a}/exec", {"command": "true"})
        # back to $0.002, spent: stopped again; a new UTC day starts afresh
        md.admin.request("PATCH", f"/v1/keys/{k['id']}", {"daily_limit_micros": 2000})
        md.advance(60_000)  # what is left of the $0.002 lasts seconds
        wait_for("the limit to stop it", lambda: c.get(a)["state"] == "stopped")
        assert c.request("POST", f"/v1/sandboxes/{a}/start").status == 402
        md.set_clock(BASE + 24 * HOUR + 1000)
        wait_for("the new day", lambda: md.admin.request(
            "GET", f"/v1/keys/{k['id']}").json()["spent_today_micros"] == 0)
        c.expect(200, "POST", f"/v1/sandboxes/{a}/start")
        md.advance(60_000)
        wait_for("the new day's first charge", lambda: md.admin.request(
            "GET", f"/v1/keys/{k['id']}").json()["spent_today_micros"] > 0)
        # a minute of 2 vCPU / 4 GiB idle: 520.8 (priced on the sandbox's running sums, so
        # this minute's share of the rounding is 520 or 521)
        assert md.admin.request("GET", f"/v1/keys/{k['id']}").json()["spent_today_micros"] \
            in (520, 521)
    finally:
        for sid in (a, b):
            c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_fifty_creates_and_execs_at_one_below_the_limit_never_pass_it(md):
    k = md.make_key()
    c = md.client.with_key(k["key"])
    a = c.expect(201, "POST", "/v1/sandboxes", {"cpus": 1, "memory_mib": 256}).json()["id"]
    ids = [a]
    try:
        md.advance(HOUR)
        wait_for("a charge", lambda: cost_of(c, a) > 0)
        settled(md, c, a)
        c.expect(200, "POST", f"/v1/sandboxes/{a}/stop")
        spent = md.admin.request("GET", f"/v1/keys/{k['id']}").json()["spent_today_micros"]
        limit = spent + 1
        assert md.admin.request("PATCH", f"/v1/keys/{k['id']}",
                                {"daily_limit_micros": limit}).status == 200
        c.expect(200, "POST", f"/v1/sandboxes/{a}/start")  # holds the last micro-dollar

        def create(_):
            r = c.request("POST", "/v1/sandboxes", {"cpus": 1, "memory_mib": 256})
            if r.status == 201:
                ids.append(r.json()["id"])
            return r.status

        def run(_):
            r = c.request("POST", f"/v1/sandboxes/{a}/exec", {"command": "true"})
            if r.status == 500:  # running when the limit stopped it
                assert r.error[1] == "the sandbox is being stopped (daily_limit)", r
            return r.status

        with concurrent.futures.ThreadPoolExecutor(max_workers=50) as ex:
            creates = list(ex.map(create, range(50)))
            md.advance(1000)
            execs = list(ex.map(run, range(50)))
        assert creates.count(201) == 0 and set(creates) == {402}, creates
        assert set(execs) <= {200, 402, 409, 500}, execs
        md.advance(HOUR)
        wait_for("it to stop", lambda: c.get(a)["state"] == "stopped")
        assert c.get(a)["state_reason"] == "daily_limit"
        key = md.admin.request("GET", f"/v1/keys/{k['id']}").json()
        assert key["spent_today_micros"] == limit, key
        assert sum(r["cost_micros"] for r in usage(c)["rows"]) == limit
    finally:
        for sid in ids:
            c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_usage_is_scoped_to_the_key(md):
    a, b = md.make_key(), md.make_key()
    ro = md.make_key(read_only=True, owner_id=a["id"])
    ca, cb, cro = (md.client.with_key(k["key"]) for k in (a, b, ro))
    sid = ca.expect(201, "POST", "/v1/sandboxes", {"cpus": 1, "memory_mib": 256}).json()["id"]
    try:
        md.advance(60_000)
        wait_for("a charge", lambda: cost_of(ca, sid) > 0)
        assert sid in {r["sandbox_id"] for r in usage(ca)["rows"]}
        assert sid in {r["sandbox_id"] for r in usage(cro)["rows"]}  # read-only: its owner's
        assert sid not in {r["sandbox_id"] for r in usage(cb)["rows"]}
        assert sid in {r["sandbox_id"] for r in usage(md.admin)["rows"]}
        for q, word in (({"group_by": "hour"}, "group_by"), ({"from": "yesterday"}, "from"),
                        ({"to": "2026-02-31"}, "to"), ({"to": "2026-06-01T25:00:00Z"}, "to"),
                        ({"from": "2026-06-01T10:00:00"}, "from"), ({"tz": "x"}, "tz")):
            r = ca.request("GET", "/v1/usage", query=q)
            assert r.status == 400 and word in r.error[1], (q, r)
        # an empty range has nothing; RFC 3339 offsets count
        assert usage(ca, frm="2026-06-02", to=DAY)["rows"] == []
        u = usage(ca, frm="2026-06-01T02:00:00+02:00", to="2026-06-09T00:00:00.5Z")
        assert sid in {r["sandbox_id"] for r in u["rows"]}
    finally:
        ca.request("DELETE", f"/v1/sandboxes/{sid}")


def test_usage_of_one_sandbox_by_minute(md):
    """sandbox=ID counts one sandbox, group_by=minute gives a row per minute (the dashboard's
    chart asks once); another key's sandbox gives nothing; an auditor key sees every key's."""
    a, b = md.make_key(), md.make_key()
    ca, cb = md.client.with_key(a["key"]), md.client.with_key(b["key"])
    one = ca.expect(201, "POST", "/v1/sandboxes", {"cpus": 1, "memory_mib": 256}).json()["id"]
    two = ca.expect(201, "POST", "/v1/sandboxes", {"cpus": 1, "memory_mib": 512}).json()["id"]
    theirs = cb.expect(201, "POST", "/v1/sandboxes", {"cpus": 1, "memory_mib": 256}).json()["id"]
    aud = md.make_key(auditor=True)
    try:
        start = md.now
        for _ in range(3):  # three minutes, each read by the meter
            md.advance(60_000)
            settled(md, ca, one)
        ca.request("DELETE", f"/v1/sandboxes/{two}")
        frm = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start // 1000))
        to = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(md.now // 1000 + 60))
        q = {"from": frm, "to": to, "group_by": "minute", "sandbox": one}
        u = ca.expect(200, "GET", "/v1/usage", query=q).json()
        assert u["sandbox_id"] == one and u["group_by"] == "minute", u
        minutes = [r["minute"] for r in u["rows"]]
        assert len(minutes) >= 3 and minutes == sorted(minutes), minutes
        assert all(m.endswith(":00Z") for m in minutes), minutes
        by_sb = {r["sandbox_id"]: r for r in ca.expect(200, "GET", "/v1/usage", query={
            "from": frm, "to": to}).json()["rows"]}
        assert u["total_micros"] == by_sb[one]["cost_micros"] == sum(
            r["cost_micros"] for r in u["rows"]) > 0, (u, by_sb)
        assert by_sb[two]["cost_micros"] > 0  # the other sandbox is left out, not absent
        # another key's sandbox: nothing, as for one that never was
        other = cb.expect(200, "GET", "/v1/usage", query=q).json()
        assert other["rows"] == [] and other["total_micros"] == 0, other
        never = ca.expect(200, "GET", "/v1/usage", query=dict(q, sandbox="sb-" + "a" * 21)).json()
        assert never["rows"] == [] and never["total_micros"] == 0
        for bad in ("sb-x", "../sb", "SB-" + "a" * 21, ""):
            r = ca.request("GET", "/v1/usage", query=dict(q, sandbox=bad))
            assert r.status == 400 and "sandbox" in r.error[1], (bad, r)
        # the admin and an auditor key see it too, and every key's usage
        cau = md.client.with_key(aud["key"])
        for c in (md.admin, cau):
            assert c.expect(200, "GET", "/v1/usage", query=q).json()["rows"] == u["rows"]
        keyq = {"from": frm, "to": to, "group_by": "key"}
        per_key = {r["key_id"]: r["cost_micros"]
                   for r in cau.expect(200, "GET", "/v1/usage", query=keyq).json()["rows"]}
        assert per_key[a["id"]] == by_sb[one]["cost_micros"] + by_sb[two]["cost_micros"]
        assert per_key[b["id"]] > 0, per_key
        assert per_key == {r["key_id"]: r["cost_micros"] for r in md.admin.expect(
            200, "GET", "/v1/usage", query=keyq).json()["rows"]}
        assert {r["key_id"] for r in ca.expect(200, "GET", "/v1/usage", query=keyq).json()[
            "rows"]} == {a["id"]}
    finally:
        for c, sid in ((ca, one), (ca, two), (cb, theirs)):
            c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_the_cli_shows_usage_and_spend(md):
    k = md.make_key(daily_limit_micros=5_000_000)
    c = md.client.with_key(k["key"])
    sid = c.expect(201, "POST", "/v1/sandboxes", {"cpus": 2, "memory_mib": 4096}).json()["id"]
    try:
        md.advance(HOUR)
        wait_for("a charge", lambda: cost_of(c, sid) > 0)
        settled(md, c, sid)
        env = md.cli_env(RUNTIME_API_KEY=k["key"])
        r = subprocess.run([md.bin, "usage", "--from", DAY, "--to", "2026-06-03"], env=env,
                           capture_output=True, text=True, timeout=T)
        assert r.returncode == 0, r.stderr
        assert sid in r.stdout and "$0.031250" in r.stdout, r.stdout
        r = subprocess.run([md.bin, "usage", "--by", "hour"], env=env, capture_output=True,
                           text=True, timeout=T)
        assert r.returncode == 2 and "--by" in r.stderr, r
        r = admin_cli(md, "keys", "list")
        assert r.returncode == 0, r.stderr
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(k["id"]))
        assert "$5.000000" in line and "$0.031250" in line, line
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")


def test_costs_survive_a_restart(md):
    k = md.make_key()
    c = md.client.with_key(k["key"])
    sid = c.expect(201, "POST", "/v1/sandboxes", {"cpus": 1, "memory_mib": 1024}).json()["id"]
    try:
        md.advance(HOUR)
        wait_for("a charge", lambda: cost_of(c, sid) > 0)
        before = settled(md, c, sid)
        spent = md.admin.request("GET", f"/v1/keys/{k['id']}").json()["spent_today_micros"]
        md.proc.terminate()
        md.proc.wait(timeout=30)
        md.start(clean=False)
        assert cost_of(c, sid) >= before  # the stop at shutdown may add its last moment
        assert md.admin.request("GET", f"/v1/keys/{k['id']}").json()["spent_today_micros"] \
            == cost_of(c, sid) - before + spent
    finally:
        c.request("DELETE", f"/v1/sandboxes/{sid}")
