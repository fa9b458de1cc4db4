"""The sandbox is not the host: host files, host processes and host paths stay out of reach.

Every negative check here has a positive control beside it (the same probe finds something
planted inside the sandbox), so a probe that silently does nothing fails the test.
"""

import json
import os
import secrets
import shutil
import tempfile

import pytest

from wrclient import output


@pytest.fixture(scope="module")
def canary():
    """A file on the HOST with random contents, in a fresh temp dir. (dir, path, name, content)"""
    d = tempfile.mkdtemp(prefix="wr-canary-", dir="/tmp")
    name = f"secret-{secrets.token_hex(8)}"
    content = f"CANARY-{secrets.token_hex(16)}".encode()
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(content)
    yield d, path, name, content
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def control(client, sandbox):
    """A file planted inside the sandbox, found by the same probes. (path, name, content)"""
    name = f"control-{secrets.token_hex(8)}"
    content = f"CONTROL-{secrets.token_hex(16)}".encode()
    path = f"/workspace/ctl/{name}"
    client.write_file(sandbox, path, content)
    return path, name, content


def host_unchanged(canary):
    _, path, _, content = canary
    with open(path, "rb") as f:
        assert f.read() == content, "the host canary was modified from inside the sandbox"
    assert sorted(os.listdir(os.path.dirname(path))) == [os.path.basename(path)]


def test_cat_host_file_fails(client, sandbox, canary, control):
    _, path, _, content = canary
    r = client.exec(sandbox, f"cat {path}")
    assert r["exit_code"] != 0
    assert content not in output(r) + output(r, "stderr")
    r = client.exec(sandbox, f"cat {control[0]}")
    assert r["exit_code"] == 0 and output(r) == control[2]


def test_find_does_not_see_host_file(client, sandbox, canary, control):
    _, _, name, _ = canary
    r = client.exec(sandbox, f"find / -path /proc -prune -o -path /sys -prune -o "
                             f"\\( -name {name} -o -name {control[1]} \\) -print",
                    timeout_seconds=240)
    assert r["timed_out"] is False
    found = r["stdout"].split()
    assert found == [control[0]], r


def test_grep_does_not_find_host_contents(client, sandbox, canary, control):
    _, _, _, content = canary
    # Bounded: the usual places a leaked host directory would show up, plus the control's.
    r = client.exec(sandbox, f"grep -rlF -e {content.decode()} -e {control[2].decode()} "
                             f"/tmp /root /workspace /home /mnt /media /opt /srv /run /var/tmp "
                             f"2>/dev/null; true", timeout_seconds=240)
    assert r["timed_out"] is False
    assert r["stdout"].split() == [control[0]], r


def test_file_api_dotdot_cannot_reach_host(client, sandbox, canary, control):
    _, path, _, content = canary
    for p in [path, "../../../../../../../.." + path, "/workspace/../../../.." + path,
              "ctl/../../../../../../.." + path]:
        r = client.files("GET", sandbox, "content", path=p)
        assert content not in r.body
        assert r.status == 404, (p, r)
        r = client.files("GET", sandbox, "list", path=os.path.dirname(p))
        assert os.path.basename(path).encode() not in r.body
        assert r.status == 404, (p, r)
    # control: the same kind of path reaches the planted file
    assert client.read_file(sandbox, "../../../../.." + control[0]) == control[2]
    # writing through .. stays inside
    r = client.files("PUT", sandbox, "content", data=b"overwritten",
                     path="../../../../../.." + path)
    assert r.status == 200, r
    host_unchanged(canary)
    assert client.read_file(sandbox, path) == b"overwritten"  # it landed inside the sandbox
    client.files("DELETE", sandbox, None, 200, path=os.path.dirname(path), recursive=True)


def test_symlinks_cannot_reach_host(client, sandbox, canary, control):
    d, path, name, content = canary
    # absolute and relative symlinks to the host file and its directory, planted from inside
    r = client.exec(sandbox, f"rm -rf {d} && mkdir -p /workspace/links && cd /workspace/links && "
                             f"ln -sf {path} abs && ln -sf {d} absdir && "
                             f"ln -sf ../../../../../../../../..{path} rel && "
                             f"ln -sf {control[0]} good")
    assert r["exit_code"] == 0, r
    for link in ["links/abs", "links/rel", "/workspace/links/absdir/" + name]:
        r = client.files("GET", sandbox, "content", path=link)
        assert content not in r.body
        assert r.status == 404, (link, r)
    r = client.files("GET", sandbox, "list", path="links/absdir")
    assert name.encode() not in r.body
    assert r.status == 404, r
    r = client.files("GET", sandbox, "stat", path="links/absdir/" + name)
    assert r.status == 404, r
    # control: a symlink to a file inside is followed
    assert client.read_file(sandbox, "links/good") == control[2]
    # writing through the symlinks creates files inside, never on the host
    for link in ["links/abs", "links/rel"]:
        r = client.files("PUT", sandbox, "content", data=b"pwned", path=link)
        assert r.status in (200, 404, 422), r
    r = client.files("PUT", sandbox, "content", data=b"pwned", path="links/absdir/new")
    assert r.status in (200, 404, 422), r
    host_unchanged(canary)
    # removing through the directory symlink does not touch the host either
    r = client.files("DELETE", sandbox, None, path="links/absdir/" + name)
    assert r.status in (200, 404), r
    host_unchanged(canary)
    client.exec(sandbox, f"rm -rf /workspace/links {d}")


def test_host_processes_invisible(client, sandbox, daemon):
    # PID 1 inside is the commands' namespace init, not the host's init; the agent itself is
    # not visible to commands at all
    r = client.exec(sandbox, "cat /proc/1/cmdline")
    inside = output(r)
    with open("/proc/1/cmdline", "rb") as f:
        host_init = f.read()
    assert inside, r
    assert inside != host_init
    assert inside.split(b"\0")[0] == b"wr-ns-init", inside
    # no process inside is the daemon (its command line has "serve" and the state dir)
    r = client.exec(sandbox, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done")
    cmdlines = r["stdout"].splitlines()
    assert len(cmdlines) >= 2, r
    assert not any(daemon.state_dir in c for c in cmdlines), cmdlines
    host_pids = len([p for p in os.listdir("/proc") if p.isdigit()])
    assert len(cmdlines) < host_pids


def test_kernel_is_gvisor(client, sandbox):
    # gVisor's sentry prints its own boot messages in dmesg; the host kernel's log never shows.
    r = client.exec(sandbox, "dmesg 2>&1 | head -n 5; cat /proc/version")
    text = r["stdout"]
    assert "Linux version" in text, r
    with open("/proc/version") as f:
        host_version = f.read().strip()
    assert host_version not in text


# Inside the sandbox: the network interfaces, the routes, and a TCP connect to 127.0.0.1:PORT
# (the sandbox's own loopback; never any other address) before and while a listener of its own
# holds that port there.
NET_PROBE = r'''
import json, socket, sys
port = int(sys.argv[1])

def connect():
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", port))
        return "connected"
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()

out = {}
with open("/proc/net/dev") as f:
    out["interfaces"] = sorted(l.split(":")[0].strip() for l in f.read().splitlines()[2:])
with open("/proc/net/if_inet6") as f:
    out["inet6"] = sorted(l.split()[-1] for l in f.read().splitlines())
with open("/proc/net/route") as f:
    out["routes"] = [l for l in f.read().splitlines()[1:] if l.strip()]
out["daemon_port"] = connect()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(1)
out["own_listener"] = connect()
srv.close()
print(json.dumps(out))
'''


def test_internet_true_gives_one_link_to_the_gateway_only(client, make_sandbox, daemon):
    """`{"internet": true}` gives the sandbox one interface, eth0, whose only route is the
    default one to its gateway (the daemon's egress proxy and resolver; test_egress.py checks
    what gets through), no IPv6, and 127.0.0.1 is still the sandbox's own loopback: the daemon's
    port on the host is not there."""
    sb = make_sandbox(memory_mib=256, network={"internet": True})
    assert sb["network"] == {"internet": True}
    # positive control on the host: the daemon does listen on that port
    assert client.health()["status"] == "ok"
    assert daemon.url == f"http://127.0.0.1:{daemon.port}"
    r = client.exec(sb["id"], argv=["python3", "-c", NET_PROBE, str(daemon.port)],
                    timeout_seconds=30)
    assert r["exit_code"] == 0, r
    probe = json.loads(r["stdout"])
    assert probe["interfaces"] == ["eth0", "lo"], probe
    assert probe["inet6"] in ([], ["lo"]), probe
    # one default route (destination 00000000) through eth0, to an address of 10.200.0.0/16
    assert len(probe["routes"]) >= 1, probe
    default = [r.split() for r in probe["routes"] if r.split()[1] == "00000000"]
    assert len(default) == 1 and default[0][0] == "eth0", probe
    gateway = bytes.fromhex(default[0][2])[::-1]
    assert gateway[:2] == bytes([10, 200]), probe
    # 127.0.0.1 inside is the sandbox's own loopback: nothing listens there ...
    assert probe["daemon_port"] == "ConnectionRefusedError", probe
    # ... until the sandbox listens itself (the probe can connect when there is a path)
    assert probe["own_listener"] == "connected", probe


# ---- the file API resolves paths as commands see them; /proc links never reach the agent ----

def _agent_log(daemon, sid):
    path = os.path.join(daemon.state_dir, "sandboxes", sid, "agent.log")
    assert os.path.isfile(path), f"no agent log at {path}"
    return path


def _restart(client, sid):
    r = client.request("POST", f"/v1/sandboxes/{sid}/stop")
    assert r.status == 200 and r.json()["state"] == "stopped", r
    r = client.request("POST", f"/v1/sandboxes/{sid}/start")
    assert r.status == 200 and r.json()["state"] == "running", r


@pytest.mark.timeout(300)
def test_file_api_write_through_proc_fd_link_is_refused(client, make_sandbox, daemon):
    """The reproduced attack: `ln -s /proc/1/fd/2 x` then a PUT to x appended to the host's
    agent.log. Now it is refused, the log does not grow, and it stays so after stop/start."""
    sid = make_sandbox(memory_mib=256)["id"]
    log = _agent_log(daemon, sid)
    marker = f"EVIL-{secrets.token_hex(8)}\n".encode()
    payload = marker * ((8 << 20) // len(marker))
    for round_ in ("first start", "after stop/start"):
        targets = ["/proc/1/fd/2", "/proc/1/fd/1", "/proc/self/fd/2", "/dev/stderr",
                   "/proc/1/root/workspace/through-root"]
        r = client.exec(sid, " && ".join(f"ln -sfn {t} /workspace/x{i}"
                                         for i, t in enumerate(targets)))
        assert r["exit_code"] == 0, r
        for i, t in enumerate(targets):
            before = os.path.getsize(log)
            r = client.files("PUT", sid, "content", data=payload, path=f"x{i}")
            grown = os.path.getsize(log) - before
            assert r.status == 422, f"{round_}: a PUT through a link to {t} was not refused: {r!r}"
            code, msg, err_no = r.error
            assert code == "file_error" and "/proc" in msg and err_no == 40, (round_, t, r.error)
            assert grown < 64 << 10, f"{round_}: agent.log grew by {grown} bytes via {t}"
            with open(log, "rb") as f:
                assert marker not in f.read(), f"{round_}: the payload reached agent.log via {t}"
        # positive control: an ordinary symlink is followed and the write lands in the sandbox
        client.exec(sid, "ln -sfn /workspace/real.txt /workspace/ok-link")
        client.write_file(sid, "ok-link", b"through an ordinary link")
        r = client.exec(sid, "cat /workspace/real.txt")
        assert r["exit_code"] == 0 and r["stdout"] == "through an ordinary link", r
        if round_ == "first start":
            _restart(client, sid)


@pytest.mark.timeout(300)
def test_file_api_reads_see_the_commands_proc_not_the_agent(client, make_sandbox, daemon):
    sid = make_sandbox(memory_mib=256)["id"]
    with open(os.path.join(daemon.state_dir, "sandboxes", sid, "config.json")) as f:
        agent_env = json.load(f)["process"]["env"]
    assert agent_env and any(e.startswith("PATH=") for e in agent_env)
    for round_ in ("first start", "after stop/start"):
        # the same /proc as commands: /proc/1 is their namespace's init, not the agent
        r = client.exec(sid, "cat /proc/1/cmdline")
        assert r["exit_code"] == 0 and r["stdout"], r
        assert client.read_file(sid, "/proc/1/cmdline") == r["stdout"].encode()
        assert b"agent" not in client.read_file(sid, "/proc/1/cmdline")
        # the agent's environment never comes back, directly or through a planted link
        r = client.exec(sid, "ln -sfn /proc/1/environ /workspace/env && "
                             "ln -sfn /proc/1/fd/1 /workspace/fd1 && "
                             "ln -sfn /proc/1/root/etc/hostname /workspace/rootlink && "
                             "ln -sfn /proc/self/environ /workspace/selfenv")
        assert r["exit_code"] == 0, r
        for path in ("/proc/1/environ", "env"):
            data = client.read_file(sid, path)
            for e in agent_env:
                assert e.encode() not in data, f"{round_}: {path} returned the agent's {e}"
        for path in ("fd1", "rootlink", "selfenv", "/proc/1/fd/2", "/proc/self/environ"):
            r = client.files("GET", sid, "content", path=path)
            assert r.status == 422 and "/proc" in r.error[1], f"{round_}: {path}: {r!r}"
        # listing and stat through them are refused as well; plain /proc files stay readable
        r = client.files("GET", sid, "list", path="/proc/1/root")
        assert r.status == 422 and "/proc" in r.error[1], r
        r = client.files("GET", sid, "stat", path="/proc/1/cwd/")
        assert r.status == 422 and "/proc" in r.error[1], r
        assert client.read_file(sid, "/proc/version")
        if round_ == "first start":
            _restart(client, sid)


# ---- the sandbox's mounts on the host are nodev,nosuid ----

def _host_mounts_under(directory):
    """(mount point, per-mount options, fs type) of the host's mounts at or below directory."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            fstype = fields[fields.index("-") + 1]
            if point == directory or point.startswith(directory + "/"):
                out.append((point, set(fields[5].split(",")), fstype))
    return out


def test_sandbox_mounts_are_nodev_nosuid(client, make_sandbox, daemon):
    sid = make_sandbox(memory_mib=256)["id"]
    sdir = os.path.realpath(os.path.join(daemon.state_dir, "sandboxes", sid))
    mounts = _host_mounts_under(sdir)
    types = sorted(t for _, _, t in mounts)
    assert "overlay" in types and "ext4" in types, f"expected the layer and the overlay: {mounts}"
    for point, opts, fstype in mounts:
        assert {"nodev", "nosuid"} <= opts, f"{point} ({fstype}) is mounted {sorted(opts)}"
    # and the mounts runsc is asked for: /proc and the agent's bind mount are nodev,nosuid too
    with open(os.path.join(sdir, "config.json")) as f:
        spec = json.load(f)
    by_dest = {m["destination"]: set(m.get("options", [])) for m in spec["mounts"]}
    for dest in ("/proc", "/.withruntime/agent", "/sys", "/dev/shm"):
        assert {"nodev", "nosuid"} <= by_dest[dest], f"OCI mount {dest}: {by_dest[dest]}"
    # setuid still means something inside (gVisor applies it itself); the sandbox still works
    r = client.exec(sid, "cp /bin/true /workspace/t && chmod u+s /workspace/t && "
                         "stat -c %A /workspace/t && /workspace/t && echo ran")
    assert r["exit_code"] == 0 and r["stdout"] == "-rwsr-xr-x\nran\n", r


def test_the_commands_namespace_init_does_not_stay_stopped(client, sandbox):
    """`kill -STOP 1` from a command stops the commands' namespace init (wr-ns-init, PID 1 in
    their view); the agent continues it, so orphans keep being reaped."""
    script = ("for round in 1 2 3 4 5; do kill -STOP 1; done; "
              "for i in $(seq 100); do "
              "  s=$(awk '/^State/{print $2}' /proc/1/status); "
              "  [ \"$s\" != T ] && echo running && exit 0; sleep 0.1; "
              "done; echo stopped")
    r = client.exec(sandbox, script)
    assert r["stdout"] == "running\n", r
    # orphans are still reaped: a double-forked child that exits leaves no zombie
    r = client.exec(sandbox, "sh -c '(sleep 0.2 &) ; true'; sleep 1; "
                             "ps -eo stat= | grep -c '^Z' || true")
    assert r["stdout"].strip() == "0", r
