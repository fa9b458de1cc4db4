"""The egress process and the CA's signer (src/net/netproc.h), as the host sees them.

The code that parses sandboxes' network bytes (the proxy, the resolvers) runs in a process of
its own, unprivileged and under a seccomp filter, and the CA key in another that only signs;
the daemon's root process starts them, feeds them each sandbox's policy and secrets, and starts
them again when one dies. Checked against the fake internet (test_egress.py): who they run as,
what they hold, that a crash or a wedge takes egress down but never lets anything out unchecked,
and that a restart brings back every sandbox's policy, resolver and TLS interception.
"""

import os
import pwd
import signal
import stat
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import fakenet  # noqa: E402
from conftest import SandboxFactory  # noqa: E402
from test_connections import serve_own  # noqa: E402
from test_egress_bounds import wait_for  # noqa: E402
from test_egress import (ALLOW_PYPI, BLOCKED_WORDS, EgressDaemon, curl, denied,  # noqa: E402
                         lookup)


@pytest.fixture(scope="module")
def net():
    with fakenet.started() as n:
        yield n


@pytest.fixture(scope="module")
def egress(daemon, net):
    yield from serve_own(EgressDaemon(daemon, net))


@pytest.fixture
def sb(egress):
    f = SandboxFactory(egress.client)
    yield f
    f.cleanup()


def helper_pids(d):
    """{"__net": pid, "__signer": pid} of the daemon's own helper processes."""
    return d.helpers()


def status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def fd_targets(pid):
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def egress_health(d):
    return d.client.expect(200, "GET", "/v1/health").json()["network"]["egress"]


def restarted(d, before):
    """The helpers' pids once both run again, new ones, and health says so."""
    def probe():
        now = helper_pids(d)
        h = egress_health(d)
        if (len(now) == 2 and now["__net"] != before["__net"] and h["up"] and
                h["restarts"] >= 1):
            return now
        return None
    return wait_for("the egress process and its signer to be started again", probe, 30)


def test_both_run_unprivileged_under_seccomp_and_only_the_signer_holds_the_key(egress):
    pids = helper_pids(egress)
    assert set(pids) == {"__net", "__signer"}, pids
    nobody = pwd.getpwnam("nobody")
    for name, pid in pids.items():
        st = status(pid)
        assert st["Uid"].split() == [str(nobody.pw_uid)] * 4, (name, st["Uid"])
        assert st["Gid"].split() == [str(nobody.pw_gid)] * 4, (name, st["Gid"])
        assert st["Groups"].strip() == "", (name, st["Groups"])
        assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0, name
        assert st["Seccomp"] == "2" and st["NoNewPrivs"] == "1", name
    assert status(egress.proc.pid)["Uid"].split()[0] == "0"  # the daemon itself stays root
    key = os.path.join(egress.state_dir, "ca", "ca.key")
    st = os.stat(key)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600  # nobody cannot open it
    # neither holds the key's file open: the signer read it from an fd it then closed
    for pid in pids.values():
        assert not any(t.endswith("ca.key") for t in fd_targets(pid)), fd_targets(pid)
    # the signer has its socket and stdio, nothing else: no listener, no upstream socket
    sockets = [t for t in fd_targets(pids["__signer"]) if t.startswith("socket:")]
    assert len(sockets) == 1, fd_targets(pids["__signer"])
    h = egress_health(egress)
    assert h["up"] is True and h["restarts"] == 0


def test_a_crash_is_contained_and_the_restart_keeps_every_policy(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    _, _, status_code = curl(egress, sid, "https://pypi.org/simple/")
    assert status_code == 200
    before = helper_pids(egress)
    os.kill(before["__net"], signal.SIGSEGV)
    now = restarted(egress, before)
    assert now["__signer"] != before["__signer"]  # the pair starts afresh
    # the daemon answered throughout, and the same sandbox works as before: the allowed host
    # through intercepted TLS (a new signer), its name through its resolver, the rest refused
    assert egress.client.get(sid)["state"] == "running"
    _, body, status_code = curl(egress, sid, "https://pypi.org/simple/")
    assert status_code == 200, body
    assert lookup(egress, sid, "pypi.org") == [net.addr("pypi.org")]
    assert lookup(egress, sid, "evil.test") == []
    _, body, status_code = curl(egress, sid,
                                f"--resolve evil.test:80:{net.addr('evil.test')} http://evil.test/")
    assert status_code == 403 and BLOCKED_WORDS in body
    # what it refused reached the sandbox's network log through the daemon
    seen = {(e["via"], e["reason"]) for e in denied(egress, sid, "evil.test")}
    assert ("dns", "not_allowed") in seen and ("proxy", "not_allowed") in seen, seen
    # the daemon's log says which process went and how (a signal; under ASan, whose handler
    # reports the SEGV, an exit status)
    went = [line for line in egress.log_bytes().splitlines()
            if f"process=egress pid={before['__net']} ".encode() in line]
    assert went and (b"event=egress.crashed" in went[0] and b"signal=11" in went[0] or
                     b"event=egress.exited" in went[0]), [
                         line for line in egress.log_bytes().splitlines() if b"egress." in line]


def test_a_stopped_egress_process_lets_nothing_out(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    net.reset_logs()
    pid = helper_pids(egress)["__net"]
    os.kill(pid, signal.SIGSTOP)
    try:
        code, _, status_code = curl(egress, sid, "-m 3 http://pypi.org/simple/")
        assert code == 28 and status_code == 0  # curl: timed out; nobody else answered
        assert net.requests("pypi.org") == []
    finally:
        os.kill(pid, signal.SIGCONT)
    _, _, status_code = curl(egress, sid, "http://pypi.org/simple/")
    assert status_code == 200


def test_a_dead_signer_takes_the_egress_process_with_it(egress, net, sb):
    sid = sb(network=ALLOW_PYPI)["id"]
    before = helper_pids(egress)
    os.kill(before["__signer"], signal.SIGKILL)
    now = restarted(egress, before)
    assert now["__signer"] != before["__signer"]
    _, body, status_code = curl(egress, sid, "https://files.pythonhosted.org/")
    assert status_code in (200, 404), body  # through a new leaf from the new signer
    assert BLOCKED_WORDS not in body
