"""The command line, pointed at the test daemon with RUNTIME_URL."""

import hashlib
import json
import os
import re
import subprocess

ID_RE = re.compile(r"^sb-[a-z2-7]{21}$")


def wr(daemon, *args, stdin=None, timeout=180):
    return subprocess.run([daemon.bin, *args], input=stdin, capture_output=True,
                          env=daemon.cli_env(), timeout=timeout)


def ids(client):
    return {s["id"] for s in client.list()}


def test_run_prints_42(daemon, client):
    before = ids(client)
    r = wr(daemon, "sandbox", "run", "--", "python3", "-c", "print(6 * 7)")
    assert r.returncode == 0, r
    assert r.stdout == b"42\n"
    # run deletes its sandbox
    assert ids(client) == before


def test_run_trial_flag_from_the_seed(daemon):
    r = wr(daemon, "sandbox", "run", "--trial", "--", "python3", "-c", "print(6 * 7)")
    assert r.returncode == 0, r
    assert r.stdout == b"42\n"


def test_run_exit_code_propagates(daemon):
    r = wr(daemon, "sandbox", "run", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7, r
    assert r.stdout == b""


def test_run_stderr_goes_to_stderr(daemon):
    r = wr(daemon, "sandbox", "run", "--", "sh", "-c", "echo out; echo err >&2; echo out2")
    assert r.returncode == 0, r
    assert r.stdout == b"out\nout2\n"
    assert r.stderr == b"err\n"


def test_run_binary_stdout(daemon):
    r = wr(daemon, "sandbox", "run", "--", "sh", "-c", r"printf '\377\000\376'")
    assert r.returncode == 0, r
    assert r.stdout == b"\xff\x00\xfe"


def test_run_stdin(daemon):
    r = wr(daemon, "sandbox", "run", "--stdin", "--", "sh", "-c", "tr a-z A-Z",
           stdin=b"shout this\n")
    assert r.returncode == 0, r
    assert r.stdout == b"SHOUT THIS\n"


def test_run_not_found_is_127(daemon, client):
    before = ids(client)
    r = wr(daemon, "sandbox", "run", "--", "no-such-program-xyz")
    assert r.returncode == 127, r
    assert r.stderr  # says why
    assert ids(client) == before


def test_sandbox_round_trip(daemon, client):
    r = wr(daemon, "sandbox", "create", "--memory", "512", "--disk", "300", "--env", "WHO=cli",
           "--metadata", "from=test")
    assert r.returncode == 0, r
    sid = r.stdout.decode().strip()
    assert ID_RE.match(sid), r.stdout
    try:
        # list shows it
        r = wr(daemon, "sandbox", "list")
        assert r.returncode == 0, r
        rows = [ln.split() for ln in r.stdout.decode().splitlines()]
        assert any(row and row[0] == sid and row[1] == "running" for row in rows), r.stdout
        assert rows[0][5] == "OWNER", rows[0]
        # ... and filters by metadata and state
        r = wr(daemon, "sandbox", "list", "--metadata", "from=test", "--state", "running")
        assert [row[0] for row in (ln.split() for ln in r.stdout.decode().splitlines()[1:])
                if row[0] == sid] == [sid], r
        r = wr(daemon, "sandbox", "list", "--metadata", "from=elsewhere")
        assert sid.encode() not in r.stdout, r
        r = wr(daemon, "sandbox", "list", "--metadata", "novalue")
        assert r.returncode == 2 and b"KEY=VALUE" in r.stderr, r
        r = wr(daemon, "sandbox", "list", "--json")
        assert r.returncode == 0, r
        listed = json.loads(r.stdout)
        listed = listed["sandboxes"] if isinstance(listed, dict) else listed
        assert sid in [s["id"] for s in listed]

        # get --json prints the sandbox object, the same as the API's
        r = wr(daemon, "sandbox", "get", "--json", sid)
        assert r.returncode == 0, r
        sb = json.loads(r.stdout)
        # but for what changes by itself (the meter's cost, the idle freezer's flag)
        volatile = ("cost_micros", "frozen")
        assert {k: v for k, v in sb.items() if k not in volatile} == \
            {k: v for k, v in client.get(sid).items() if k not in volatile}
        assert sb["env"] == {"WHO": "cli"} and sb["metadata"] == {"from": "test"}
        assert sb["memory_mib"] == 512 and sb["disk_mib"] == 300

        # exec
        r = wr(daemon, "sandbox", "exec", sid, "--", "sh", "-c",
               'echo "$WHO" > note.txt; cat note.txt; pwd; echo oops >&2; exit 3')
        assert r.returncode == 3, r
        assert r.stdout == b"cli\n/workspace\n"
        assert r.stderr == b"oops\n"

        # write from stdin, cat back byte-exact
        blob = os.urandom(200_000) + b"\x00end"
        r = wr(daemon, "sandbox", "write", sid, "dir/blob.bin", "-", stdin=blob)
        assert r.returncode == 0, r
        r = wr(daemon, "sandbox", "cat", sid, "/workspace/dir/blob.bin")
        assert r.returncode == 0, r
        assert r.stdout == blob
        assert client.read_file(sid, "dir/blob.bin") == blob

        # more than one upload may carry (8 MiB) goes in pieces, from a pipe too; cat streams
        big = os.urandom((70 << 20) + 123)
        r = wr(daemon, "sandbox", "write", sid, "dir/big.bin", stdin=big)
        assert r.returncode == 0, r
        r = wr(daemon, "sandbox", "cat", sid, "dir/big.bin")
        assert r.returncode == 0 and r.stdout == big
        # a smaller file in pieces replaces it whole: no old tail is left
        smaller = big[:(9 << 20) + 5][::-1]
        r = wr(daemon, "sandbox", "write", sid, "dir/big.bin", "-", stdin=smaller)
        assert r.returncode == 0, r
        r = wr(daemon, "sandbox", "exec", sid, "--", "sha256sum", "dir/big.bin")
        assert r.stdout.split()[0].decode() == hashlib.sha256(smaller).hexdigest(), r
        client.files("DELETE", sid, None, 200, path="dir/big.bin")

        # ls shows what is there
        r = wr(daemon, "sandbox", "ls", sid)
        assert r.returncode == 0, r
        names = [ln.split()[-1] for ln in r.stdout.decode().splitlines()[1:] if ln.strip()]
        assert "note.txt" in names and "dir" in names, r.stdout
        r = wr(daemon, "sandbox", "ls", "--json", sid, "dir")
        assert r.returncode == 0, r
        listing = json.loads(r.stdout)
        entries = listing["entries"] if isinstance(listing, dict) else listing
        assert [(e["name"], e["size"]) for e in entries] == [("blob.bin", len(blob))]
        # a file, or a symlink to one, is one row, as ls(1) shows it; a missing path is an error
        r = wr(daemon, "sandbox", "exec", sid, "--", "ln", "-s", "note.txt", "link")
        assert r.returncode == 0, r
        r = wr(daemon, "sandbox", "ls", sid, "note.txt")
        assert r.returncode == 0, r
        assert r.stdout.decode().splitlines()[1].split()[::4] == ["file", "note.txt"], r.stdout
        r = wr(daemon, "sandbox", "ls", sid, "link")
        assert r.returncode == 0, r
        assert r.stdout.decode().splitlines()[1].split()[-3:] == ["link", "->", "note.txt"]
        r = wr(daemon, "sandbox", "ls", "--json", sid, "/workspace/note.txt")
        assert r.returncode == 0 and json.loads(r.stdout)["type"] == "file", r
        r = wr(daemon, "sandbox", "ls", sid, "nowhere")
        assert r.returncode == 3 and r.stdout == b"" and b"nowhere" in r.stderr, r  # not found

        # cat of a missing file fails, saying so
        r = wr(daemon, "sandbox", "cat", sid, "missing.txt")
        assert r.returncode != 0 and r.stdout == b""
        assert b"missing.txt" in r.stderr or b"not found" in r.stderr.lower()
    finally:
        r = wr(daemon, "sandbox", "rm", sid)
    assert r.returncode == 0, r
    assert r.stdout.decode().split() == [sid]
    assert sid not in ids(client)
    r = wr(daemon, "sandbox", "get", sid)
    assert r.returncode == 3  # not found
    assert sid.encode() in r.stderr or b"not found" in r.stderr.lower()


def test_doctor(daemon):
    # doctor checks this host against the test's state directory (where the image is built)
    r = wr(daemon, "--state-dir", daemon.state_dir, "doctor")
    assert r.returncode == 0, r
    assert b"gvisor" in (r.stdout + r.stderr).lower()


def test_cli_reports_unreachable_daemon(daemon):
    env = daemon.cli_env(RUNTIME_URL="http://127.0.0.1:1")
    r = subprocess.run([daemon.bin, "sandbox", "list"], capture_output=True, env=env,
                       timeout=60)
    assert r.returncode == 5  # the daemon could not be reached
    assert r.stderr.strip()


def test_create_takes_a_network_policy(daemon, client):
    r = wr(daemon, "sandbox", "create", "--memory", "256", "--allow", "PyPI.org",
           "--allow", "*.pythonhosted.org", "--deny", "bad.pythonhosted.org", "--json")
    assert r.returncode == 0, r
    sb = json.loads(r.stdout)
    try:
        assert sb["network"] == {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"],
                                 "deny": ["bad.pythonhosted.org"]}
    finally:
        client.delete(sb["id"])
    # a bad entry: the daemon's message names it, nothing is created
    before = ids(client)
    r = wr(daemon, "sandbox", "run", "--allow", "10.0.0.1", "--", "true")
    assert r.returncode == 4, r  # refused by the daemon (400)
    assert b"network.allow[0]" in r.stderr and b"10.0.0.1" in r.stderr, r.stderr
    assert ids(client) == before


def test_planted_names_reach_the_terminal_escaped(daemon, client, sandbox):
    """A file name made in a sandbox with terminal escapes (OSC to retitle the window, CSI to
    clear the screen, a carriage return, a C1 CSI) is shown escaped, not sent to the terminal;
    --json stays exact JSON."""
    name = "evil\x1b]0;pwned\x07\x1b[2J\rX\u009b31m"
    where = f"/tmp/planted-{os.getpid()}"
    client.write_file(sandbox, f"{where}/{name}", b"x", parents="true")
    raw = [b"\x1b", b"\x07", b"\r", "\u009b".encode()]
    r = wr(daemon, "sandbox", "ls", sandbox, where)
    assert r.returncode == 0, r
    assert not any(c in r.stdout for c in raw), r.stdout
    assert b"evil\\x1b]0;pwned\\x07\\x1b[2J\\rX\\u009b31m" in r.stdout, r.stdout
    r = wr(daemon, "sandbox", "ls", "--json", sandbox, where)
    assert [e["name"] for e in json.loads(r.stdout)["entries"]] == [name], r.stdout
    # an error that quotes the path
    r = wr(daemon, "sandbox", "cat", sandbox, f"{where}/{name}/more")
    assert r.returncode != 0 and b"evil\\x1b]0;pwned" in r.stderr, r.stderr
    assert not any(c in r.stderr for c in raw), r.stderr


def test_state_dir_finds_its_daemon_on_another_socket():
    """A daemon serving a state directory on a socket of its own (serve --socket): the CLI
    given that --state-dir uses it, and never starts a second daemon for the directory."""
    import conftest
    import wrclient
    from test_failures import FakeDaemon, serve_checked

    d = FakeDaemon(conftest.WR_AGENT)
    d.socket_path = os.path.join(d.tmp, "elsewhere.sock")
    d.admin = wrclient.Client(unix_path=d.socket_path)
    run = serve_checked(d)
    next(run)
    try:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RUNTIME_URL", "RUNTIME_API_KEY", "WITHRUNTIME_STATE_DIR")}
        env["HOME"] = d.tmp  # no saved login either
        r = subprocess.run([d.bin, "--state-dir", d.state_dir, "sandbox", "list"], env=env,
                           capture_output=True, timeout=60)
        assert r.returncode == 0, r
        assert b"started the daemon" not in r.stderr, r.stderr
        assert not os.path.exists(os.path.join(d.state_dir, "withruntime.sock"))
        with open(os.path.join(d.state_dir, "daemon.lock")) as f:
            assert f.read() == f"{d.proc.pid} {d.socket_path}\n"
        assert d.proc.poll() is None
    finally:
        next(run, None)
