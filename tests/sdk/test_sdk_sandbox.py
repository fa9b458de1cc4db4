"""Sandbox lifecycle through the SDK: create with every option, connect, list, the lease on
leaving a `with` block, stop, start, timeout, refresh, delete."""

import datetime
import os
import re
import time

import pytest

from withruntime import Conflict, InvalidRequest, NotFound, Sandbox, WithruntimeError

ID_RE = re.compile(r"^sb-[a-z2-7]{21}$")


def parse_time(s):
    return datetime.datetime.strptime(s.split(".")[0].rstrip("Z"), "%Y-%m-%dT%H:%M:%S")


def test_create_with_every_option(daemon):
    network = {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]}
    sbx = Sandbox.create(image="default", cpus=1, memory_mib=384, env={"GREETING": "hello"},
                         metadata={"owner": "sdk-test"}, timeout_seconds=600,
                         on_lease_end="delete", network=network)
    try:
        assert ID_RE.match(sbx.id)
        assert sbx.state == "running"
        assert (sbx.image, sbx.cpus, sbx.memory_mib) == ("default", 1, 384)
        assert sbx.env == {"GREETING": "hello"}
        assert sbx.metadata == {"owner": "sdk-test"}
        assert sbx.timeout_seconds == 600
        assert sbx.on_lease_end == "delete"
        # returned normalised (as given here); tests/e2e/test_egress.py checks it is enforced
        assert sbx.network == network
        # the lease starts when the create request is accepted (api/openapi.yaml, note 7;
        # src/daemon/sandbox.c sets it at create and at start), not when the sandbox is up:
        # created_at rounded down, lease_ends_at rounded up, so one second apart at most
        lease = parse_time(sbx.lease_ends_at) - parse_time(sbx.created_at)
        assert 600 <= lease.total_seconds() <= 601
        assert sbx.exec("echo $GREETING").stdout == "hello\n"
    finally:
        sbx.delete()


def test_create_defaults(sandbox):
    fresh = Sandbox.connect(sandbox.id)
    assert fresh.image == "default"
    assert fresh.cpus == 2
    assert fresh.timeout_seconds == 3600
    assert fresh.network == {"internet": False}
    assert fresh.env == {} and fresh.metadata == {}


def test_unknown_option_gets_the_daemons_error(daemon, new_sandboxes):
    with pytest.raises(InvalidRequest) as ei:
        Sandbox.create(gpu_count=1)
    assert "gpu_count" in ei.value.message
    assert ei.value.status == 400 and ei.value.code == "invalid_request"
    assert new_sandboxes() == []


def test_max_cost_micros_is_honoured_and_returned(daemon, new_sandboxes):
    with Sandbox.create(memory_mib=256, max_cost_micros=250000, on_lease_end="delete") as sbx:
        info = sbx.info
        assert info["max_cost_micros"] == 250000 and 0 <= info["cost_micros"] < 250000
    with pytest.raises(InvalidRequest) as ei:
        Sandbox.create(memory_mib=256, max_cost_micros=0)
    assert "max_cost_micros" in ei.value.message
    assert new_sandboxes() == []


def test_bad_option_value_names_the_field(daemon):
    with pytest.raises(InvalidRequest) as ei:
        Sandbox.create(cpus=4096)
    assert "cpus" in str(ei.value)
    with pytest.raises(InvalidRequest) as ei:
        Sandbox.create(on_lease_end="explode")
    assert "on_lease_end" in str(ei.value)


def test_connect_and_list(sandbox):
    again = Sandbox.connect(sandbox.id)
    assert again.id == sandbox.id
    assert again.info == sandbox.info
    listed = [s for s in Sandbox.list() if s.id == sandbox.id]
    assert len(listed) == 1 and listed[0].state == "running"
    # the connected object drives the same sandbox
    again.files.write("from-connect.txt", "x")
    assert sandbox.files.read("from-connect.txt") == b"x"


def test_list_by_metadata_and_state(daemon, new_sandboxes):
    tag = f"t{os.getpid()}-{time.monotonic_ns()}"
    a = Sandbox.create(memory_mib=256, metadata={"tag": tag, "who": "a b&c=d"})
    b = Sandbox.create(memory_mib=256, metadata={"tag": tag})
    b.stop()
    assert [s.id for s in Sandbox.list(metadata={"tag": tag})] == [a.id, b.id]
    assert [s.id for s in Sandbox.list(metadata={"tag": tag, "who": "a b&c=d"})] == [a.id]
    assert [s.id for s in Sandbox.list(metadata={"tag": tag}, state="stopped")] == [b.id]
    assert Sandbox.list(metadata={"tag": tag, "who": "a"}) == []
    with pytest.raises(InvalidRequest) as ei:
        Sandbox.list(state="asleep")
    assert "state" in ei.value.message


def test_connect_unknown_id(daemon):
    with pytest.raises(NotFound) as ei:
        Sandbox.connect("sb-" + "a" * 21)
    assert "sb-" + "a" * 21 in ei.value.message


def test_with_block_stops_by_default_and_files_survive(daemon, new_sandboxes):
    with Sandbox.create(memory_mib=256) as sbx:
        assert sbx.on_lease_end == "stop"
        sbx.files.write("kept.txt", "still here")
        sid = sbx.id
    assert sbx.state == "stopped"
    again = Sandbox.connect(sid)
    assert again.state == "stopped"
    with pytest.raises(Conflict):
        again.exec("true")
    again.start()
    assert again.state == "running"
    assert again.files.read_text("kept.txt") == "still here"
    again.delete()


def test_with_block_deletes_when_told(daemon):
    with Sandbox.create(memory_mib=256, on_lease_end="delete") as sbx:
        sid = sbx.id
        assert sbx.exec("true").exit_code == 0
    with pytest.raises(NotFound):
        Sandbox.connect(sid)


def test_exception_in_block_still_ends_the_lease(daemon, new_sandboxes):
    with pytest.raises(ZeroDivisionError):
        with Sandbox.create(memory_mib=256, on_lease_end="stop") as sbx:
            sid = sbx.id
            1 / 0
    assert Sandbox.connect(sid).state == "stopped"

    with pytest.raises(KeyError):
        with Sandbox.create(memory_mib=256, on_lease_end="delete") as sbx2:
            sid2 = sbx2.id
            raise KeyError("boom")
    with pytest.raises(NotFound):
        Sandbox.connect(sid2)


def test_leaving_block_after_delete_inside_is_fine(daemon):
    with Sandbox.create(memory_mib=256, on_lease_end="stop") as sbx:
        sid = sbx.id
        sbx.delete()
        assert sbx.state == "deleted"
    with pytest.raises(NotFound):
        Sandbox.connect(sid)


def test_stop_start_refresh(sandbox):
    sandbox.files.write("a.txt", "A")
    assert sandbox.stop() is sandbox
    assert sandbox.state == "stopped"
    assert sandbox.state_reason == "user"
    sandbox.stop()  # stopping a stopped sandbox is fine
    with pytest.raises(Conflict) as ei:
        sandbox.exec("true")
    assert "stopped" in ei.value.message
    other = Sandbox.connect(sandbox.id)
    other.start()
    assert other.state == "running"
    assert sandbox.state == "stopped"  # as of its last answer...
    assert sandbox.refresh().state == "running"  # ...until asked again
    assert sandbox.files.read("a.txt") == b"A"


def test_set_timeout(sandbox):
    before = parse_time(sandbox.lease_ends_at)
    sandbox.set_timeout(120)
    assert sandbox.timeout_seconds == 120
    assert parse_time(sandbox.lease_ends_at) < before
    assert Sandbox.connect(sandbox.id).timeout_seconds == 120
    with pytest.raises(InvalidRequest) as ei:
        sandbox.set_timeout(0)
    assert "timeout_seconds" in ei.value.message


def test_set_network(sandbox):
    sandbox.set_network({"internet": True, "allow": ["PyPI.org.", "*.pythonhosted.org"],
                         "deny": ["bad.pythonhosted.org"]})
    want = {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"],
            "deny": ["bad.pythonhosted.org"]}
    assert sandbox.network == want
    assert Sandbox.connect(sandbox.id).network == want
    with pytest.raises(InvalidRequest) as ei:
        sandbox.set_network({"internet": True, "allow": ["169.254.169.254"]})
    assert "network.allow[0]" in ei.value.message and "address" in ei.value.message
    assert Sandbox.connect(sandbox.id).network == want
    sandbox.set_network({"internet": False})
    assert sandbox.network == {"internet": False}


def test_delete(daemon):
    sbx = Sandbox.create(memory_mib=256)
    sbx.delete()
    assert sbx.state == "deleted"
    assert sbx.id not in {s.id for s in Sandbox.list()}
    with pytest.raises(NotFound):
        sbx.refresh()
    with pytest.raises(NotFound):
        sbx.exec("true")
    with pytest.raises(NotFound):
        sbx.delete()


def test_events_tell_the_history(daemon):
    with Sandbox.create(memory_mib=256, on_lease_end="stop") as sbx:
        pass
    states = [e.get("state") for e in sbx.events() if e.get("type") == "state"]
    assert states[0] == "creating"
    assert "running" in states
    assert states[-1] == "stopped"
    sbx.delete()


def test_repr_shows_id_and_state(sandbox):
    assert repr(sandbox) == f"Sandbox(id={sandbox.id!r}, state='running')"


def test_errors_are_one_family(daemon):
    with pytest.raises(WithruntimeError):
        Sandbox.connect("sb-" + "b" * 21)


def test_create_reports_progress(daemon):
    import asyncio

    from withruntime import AsyncSandbox, CreateProgress

    seen = []
    sbx = Sandbox.create(memory_mib=256, on_progress=seen.append)
    try:
        assert [p.stage for p in seen] == ["requesting", "running"]
        assert all(isinstance(p, CreateProgress) for p in seen)
        assert seen[1].sandbox_id == sbx.id and seen[0].sandbox_id is None
        assert 0 <= seen[0].elapsed_seconds <= seen[1].elapsed_seconds
    finally:
        sbx.delete()

    # a failed create says so, with the error it raises
    failed = []
    with pytest.raises(InvalidRequest) as e:
        Sandbox.create(memory_mib=1, on_progress=failed.append)
    assert [p.stage for p in failed] == ["requesting", "failed"] and failed[1].error is e.value

    # a callback that raises loses nothing: the sandbox is still made and returned
    def broken(_p):
        raise RuntimeError("a broken progress bar")

    sbx = Sandbox.create(memory_mib=256, on_progress=broken)
    sbx.delete()

    # the async face: the same stages
    async def main():
        got = []
        s = await AsyncSandbox.create(memory_mib=256, on_progress=got.append)
        await s.delete()
        return [p.stage for p in got], s.id

    stages, _ = asyncio.run(main())
    assert stages == ["requesting", "running"]
