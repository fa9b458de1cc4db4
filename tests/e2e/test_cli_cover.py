"""The command line covers the API: stop/start/timeout/stats/events, background commands
(exec --background, commands, logs --follow, kill), --json printing the API's answers, one set
of exit codes, --help with an example on every command, shell completion and docs/cli.md, all
made from the one command table (src/cli/table.c)."""

import datetime
import functools
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import ROOT, WR_BIN

MISSING = "sb-" + "a" * 21
EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_DAEMON = 2, 3, 4, 5


def wr(daemon, *args, stdin=None, timeout=120, **env):
    return subprocess.run([WR_BIN, *args], input=stdin, capture_output=True,
                          env=daemon.cli_env(**env) if daemon else dict(os.environ),
                          timeout=timeout)


def admin(daemon, *args):
    """The CLI as the admin: root on the daemon's own socket, without a key."""
    env = dict(os.environ, RUNTIME_URL=f"unix:{daemon.socket_path}")
    env.pop("RUNTIME_API_KEY", None)
    return subprocess.run([WR_BIN, *args], capture_output=True, env=env, timeout=120)


def wait_for(pred, what, limit=60):
    deadline = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ok(r):
    assert r.returncode == 0, r
    return r.stdout.decode()


def parse_time(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)


def steady(o):
    """A sandbox object without what changes by itself: `frozen`, which the daemon flips when
    it is idle, and `cost_micros`, which the meter moves every second."""
    return {k: v for k, v in o.items() if k not in ("frozen", "cost_micros")}


# ---- the command table: help, docs, completion (no daemon) ----

def listed(help_text):
    """The command names a help text's "Commands:" list shows, and which of them are groups."""
    names, groups, on = [], [], False
    for line in help_text.splitlines():
        if line == "Commands:":
            on = True
        elif on and not line.strip():
            break
        elif on and line.startswith("  ") and not line.startswith("    "):
            words = line.split()
            names.append(words[0])
            if len(words) > 1 and words[1] == "COMMAND":
                groups.append(words[0])
    return names, groups


def every_command():
    top = ok(wr(None, "--help"))
    names, groups = listed(top)
    paths = []
    for n in names:
        paths.append([n])
        if n in groups:
            subs, _ = listed(ok(wr(None, n, "--help")))
            assert subs, n
            paths += [[n, s] for s in subs]
    return paths


def test_every_command_has_help_with_an_example():
    paths = every_command()
    # the table's commands, the new ones among them
    for want in (["sandbox", "stop"], ["sandbox", "logs"], ["sandbox", "kill"],
                 ["sandbox", "commands"], ["completion"], ["keys", "list"], ["serve"]):
        assert want in paths, paths
    for path in paths:
        r = wr(None, *path, "--help")
        assert r.returncode == 0, (path, r)
        out = r.stdout.decode()
        assert "Example" in out, (path, out)
        assert out.lower().startswith("usage:"), (path, out)
        # `help A B` says the same
        assert wr(None, "help", *path).stdout.decode() == out, path


def test_docs_cli_md_is_the_table():
    with open(os.path.join(ROOT, "docs", "cli.md")) as f:
        doc = f.read()
    made = ok(wr(None, "help", "--markdown"))
    assert doc == made, "docs/cli.md is stale: run `make docs`"
    for path in every_command():
        assert "## withruntime " + " ".join(path) + "\n" in doc, path
    # the exit codes are documented there as in --help
    assert "3    not found" in doc and "5    the daemon could not be reached" in doc


@functools.lru_cache(maxsize=1)
def bash_script():
    return subprocess.run([WR_BIN, "completion", "bash"], capture_output=True, text=True,
                          check=True).stdout


def bash_complete(*words):
    """What the bash completion offers for the words typed (the last one being completed)."""
    script = bash_script()
    arr = " ".join("'" + w + "'" for w in ["withruntime", *words])
    prog = (script + f"\nCOMP_WORDS=({arr}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ));"
            "_withruntime; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r
    return sorted(w for w in r.stdout.split("\n") if w)


def test_bash_completion():
    assert bash_complete("sandbox", "st") == ["start", "stats", "stop"]
    assert bash_complete("sa") == ["sandbox"]
    assert bash_complete("--state-dir", "/tmp/x", "sandbox", "lo") == ["logs"]
    assert bash_complete("sandbox", "logs", "--f") == ["--follow"]
    assert bash_complete("sandbox", "kill", "--signal", "K") == ["KILL"]
    assert bash_complete("usage", "--by", "") == ["day", "key", "minute", "sandbox"]
    assert bash_complete("completion", "") == ["--help", "bash", "zsh"]
    assert bash_complete("sandbox", "exec", "--b") == ["--background"]
    # after `--` the words are the sandbox command's: nothing of ours is offered
    assert bash_complete("sandbox", "run", "--", "--") == []


def test_the_options_completion_offers_are_the_commands_own():
    """Each option the table offers for a command is one the command takes: given (with a
    value if it wants one) before --help, the command prints its help or complains about the
    value, never that the option is unknown. Nothing reaches a daemon."""
    env = dict(os.environ, RUNTIME_URL="http://127.0.0.1:1")
    checked = 0
    for path in every_command():
        offered = [w for w in bash_complete(*path, "--") if w.startswith("--") and w != "--help"]
        for opt in offered:
            after = bash_complete(*path, opt, "")
            if after and all(w.startswith("-") for w in after):
                args = [opt]  # a flag: what follows it is more options
            else:
                args = [opt, after[0] if after else "1"]  # a value: one of its words, or any
            r = subprocess.run([WR_BIN, *path, *args, "--help"], capture_output=True, env=env,
                               timeout=30)
            assert b"unknown option" not in r.stderr and b"unrecognized" not in r.stderr, \
                (path, args, r)
            assert r.returncode in (0, EXIT_USAGE), (path, args, r)
            checked += 1
    assert checked > 80, checked


def test_zsh_completion_loads(tmp_path):
    zsh = shutil.which("zsh")
    assert zsh, "zsh is not installed (scripts/setup.sh --tests installs it)"
    script = subprocess.run([WR_BIN, "completion", "zsh"], capture_output=True, text=True,
                            check=True).stdout
    assert "'logs:''print a background command'\\''s output'" in script
    (tmp_path / "wr.zsh").write_text(script)
    r = subprocess.run([zsh, "-f", "-c", "autoload -U compinit && compinit -u -D && "
                        f"source {tmp_path}/wr.zsh && whence -w _withruntime"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "_withruntime: function" in r.stdout, r


def test_usage_errors_exit_2_before_anything_is_sent():
    # RUNTIME_URL points nowhere: a usage error is found before the daemon is looked for
    env = dict(os.environ, RUNTIME_URL="http://127.0.0.1:1")
    for args in (["nope"], ["sandbox", "nope"], ["sandbox"], ["sandbox", "stop"],
                 ["sandbox", "timeout", MISSING, "soon"], ["sandbox", "timeout", MISSING, "2d"],
                 ["sandbox", "logs", MISSING], ["sandbox", "kill", "--signal", "", MISSING, "c"],
                 ["sandbox", "stats", "--bogus", MISSING], ["completion", "fish"],
                 ["sandbox", "exec", "--json", MISSING, "--", "true"],
                 ["usage", "--sandbox", "sb-" + "A" * 21], ["usage", "--sandbox", MISSING + "a"],
                 ["usage", "--sandbox", "xx-" + "a" * 21]):
        r = subprocess.run([WR_BIN, *args], capture_output=True, env=env, timeout=30)
        assert r.returncode == EXIT_USAGE, (args, r)
        assert b"--help" in r.stderr, (args, r)


def test_size_flags_say_their_range():
    env = dict(os.environ, RUNTIME_URL="http://127.0.0.1:1")
    for flag, value, want in (("--cpus", "0", b"from 1 to 1024, got '0'"),
                              ("--memory", "64", b"from 128 to 65536, got '64'"),
                              ("--disk", "1", b"from 64 to 1048576, got '1'")):
        r = subprocess.run([WR_BIN, "sandbox", "create", flag, value], capture_output=True,
                           env=env, timeout=30)
        assert r.returncode == EXIT_USAGE and want in r.stderr, (flag, r)


# ---- against the daemon ----

def test_exit_codes_for_missing_refused_and_unreachable(daemon, client, sandbox):
    for args in (["get", MISSING], ["stop", MISSING], ["stats", MISSING],
                 ["events", MISSING], ["commands", MISSING], ["timeout", MISSING, "10m"],
                 ["logs", sandbox, "cmd-999999"], ["cat", sandbox, "no/such/file"],
                 ["exec", MISSING, "--", "true"]):
        r = wr(daemon, "sandbox", *args)
        assert r.returncode == EXIT_NOT_FOUND, (args, r)
        assert r.stderr.strip(), (args, r)
    # refused: a bad network policy (400), a read-only key changing something (403)
    r = wr(daemon, "sandbox", "create", "--allow", "10.0.0.1")
    assert r.returncode == EXIT_REFUSED and b"10.0.0.1" in r.stderr, r
    # an image with no recipe is said not to exist, not to be built with a command that fails
    r = wr(daemon, "sandbox", "create", "--image", "ubuntu")
    assert r.returncode == EXIT_NOT_FOUND and b"no image named 'ubuntu'" in r.stderr, r
    assert b"image build" not in r.stderr, r
    ro = daemon.make_key(read_only=True)
    r = wr(daemon, "sandbox", "create", RUNTIME_API_KEY=ro["key"])
    assert r.returncode == EXIT_REFUSED, r
    r = wr(daemon, "sandbox", "list", RUNTIME_API_KEY=ro["key"])
    assert r.returncode == 0, r
    r = wr(daemon, "sandbox", "list", RUNTIME_URL="http://127.0.0.1:1")
    assert r.returncode == EXIT_DAEMON and r.stderr.strip(), r
    # a malformed RUNTIME_URL is the caller's mistake, not an unreachable daemon
    for url in ("127.0.0.1:7070", "ftp://127.0.0.1/", "http://[::1"):
        r = wr(daemon, "sandbox", "list", RUNTIME_URL=url)
        assert r.returncode == EXIT_USAGE and b"RUNTIME_URL" in r.stderr, (url, r)


def test_exec_passes_more_than_16_mib(daemon, sandbox):
    """A terminal gets all of a command's output: the CLI streams it, past the 16 MiB that a
    whole answer holds, with no warning."""
    r = wr(daemon, "sandbox", "exec", sandbox, "--", "head", "-c", "20000000", "/dev/zero")
    assert r.returncode == 0 and len(r.stdout) == 20000000, (r.returncode, r.stderr)
    assert r.stderr == b"", r.stderr


def test_stop_start_and_timeout(daemon, client, make_sandbox):
    sid = make_sandbox(memory_mib=256)["id"]
    client.write_file(sid, "kept.txt", b"still here")

    r = wr(daemon, "sandbox", "stop", sid)
    assert ok(r).split() == [sid, "stopped"]
    assert client.get(sid)["state"] == "stopped"
    # a stopped sandbox refuses an exec: the daemon's 409, said and exited with
    r = wr(daemon, "sandbox", "exec", sid, "--", "true")
    assert r.returncode == EXIT_REFUSED and b"stopped" in r.stderr, r
    # ... and tells a CLI user the command that starts it, not the API's route
    assert f"start it with 'withruntime sandbox start {sid}'".encode() in r.stderr, r
    assert b"POST" not in r.stderr, r

    r = wr(daemon, "sandbox", "start", "--json", sid)
    sb = json.loads(ok(r))
    assert sb["id"] == sid and sb["state"] == "running"
    assert client.get(sid)["state"] == "running"
    assert client.read_file(sid, "kept.txt") == b"still here"

    before = datetime.datetime.now(datetime.timezone.utc)
    out = ok(wr(daemon, "sandbox", "timeout", sid, "2h"))
    after = datetime.datetime.now(datetime.timezone.utc)
    got = client.get(sid)
    assert out.split() == [sid, "lease", "ends", "at", got["lease_ends_at"]]
    ends = parse_time(got["lease_ends_at"])
    assert before + datetime.timedelta(seconds=7199) <= ends
    assert ends <= after + datetime.timedelta(seconds=7201)
    assert got["timeout_seconds"] == 7200
    sb = json.loads(ok(wr(daemon, "sandbox", "timeout", "--json", sid, "90s")))
    assert sb["timeout_seconds"] == 90
    assert parse_time(sb["lease_ends_at"]) < ends


def test_get_stats_events_and_their_json(daemon, client, sandbox):
    out = ok(wr(daemon, "sandbox", "get", sandbox))
    fields = dict(line.split(None, 1) for line in out.splitlines())
    assert fields["id"] == sandbox and fields["state"] == "running"
    got = json.loads(ok(wr(daemon, "sandbox", "get", "--json", sandbox)))
    assert steady(got) == steady(client.get(sandbox))

    out = ok(wr(daemon, "sandbox", "stats", sandbox))
    assert re.search(r"^CPU\s+\d+\.\d{3} s$", out, re.M), out
    assert re.search(r"^MEMORY\s+\d+\.\d MiB$", out, re.M), out
    assert re.search(r"^STATE\s+running$", out, re.M), out
    st = json.loads(ok(wr(daemon, "sandbox", "stats", "--json", sandbox)))
    api = client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/stats").json()
    assert set(st) == set(api) and st["id"] == sandbox and st["state"] == "running"

    out = ok(wr(daemon, "sandbox", "events", sandbox))
    lines = out.splitlines()
    assert lines[0].split() == ["AT", "TYPE", "STATE", "REASON", "DETAIL"]
    assert any(ln.split()[1:4] == ["state", "running", "created"] for ln in lines[1:]), out
    ev = json.loads(ok(wr(daemon, "sandbox", "events", "--json", sandbox)))
    api = client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/events").json()
    assert ev["id"] == sandbox and ev["events"] == api["events"][:len(ev["events"])]
    assert len(lines) - 1 == len(ev["events"])

    listed = json.loads(ok(wr(daemon, "sandbox", "list", "--json")))
    api = client.expect(200, "GET", "/v1/sandboxes").json()
    assert [steady(s) for s in listed["sandboxes"]] == \
        [steady(s) for s in api["sandboxes"]]


# Interleaved stdout and stderr over a few seconds, a byte that is not UTF-8, no final newline,
# and an exit status of its own.
SCRIPT = ("for i in $(seq 1 25); do echo out$i; echo err$i >&2; sleep 0.1; done; "
          "printf '\\377\\376'; printf tail; exit 3")
WANT_OUT = b"".join(b"out%d\n" % i for i in range(1, 26)) + b"\xff\xfetail"
WANT_ERR = b"".join(b"err%d\n" % i for i in range(1, 26))


def test_background_logs_follow_prints_each_byte_once(daemon, client, sandbox):
    r = wr(daemon, "sandbox", "exec", "--background", sandbox, "--", "sh", "-c", SCRIPT)
    cid = ok(r).strip()
    assert re.fullmatch(r"cmd-\d+", cid), r
    # followed while it runs: every byte once, each stream to its own, its status at the end
    r = wr(daemon, "sandbox", "logs", "--follow", sandbox, cid)
    assert r.returncode == 3, r
    assert r.stdout == WANT_OUT
    assert r.stderr == WANT_ERR

    # read again at the end: the same bytes, and exit 0 (no --follow)
    r = wr(daemon, "sandbox", "logs", sandbox, cid)
    assert r.returncode == 0 and r.stdout == WANT_OUT and r.stderr == WANT_ERR, r
    got = json.loads(ok(wr(daemon, "sandbox", "logs", "--json", sandbox, cid)))
    api = client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/commands/{cid}/output").json()
    assert got == api and got["exit_code"] == 3 and got["stdout_next_offset"] == len(WANT_OUT)

    one = json.loads(ok(wr(daemon, "sandbox", "commands", "--json", sandbox, cid)))
    assert one == client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/commands/{cid}").json()
    assert one["state"] == "exited" and one["exit_code"] == 3
    out = ok(wr(daemon, "sandbox", "commands", sandbox, cid))
    assert re.search(r"^exit_code\s+3$", out, re.M), out


def test_logs_say_what_was_dropped_and_follow_with_a_read_only_key(daemon, client, sandbox):
    # 3 MB at once: a background command keeps the last MiB of it
    cid = ok(wr(daemon, "sandbox", "exec", "--background", sandbox, "--", "sh", "-c",
                "head -c 3000000 /dev/zero | tr '\\0' x; echo done >&2")).strip()
    client.expect(200, "POST", f"/v1/sandboxes/{sandbox}/commands/{cid}/wait",
                  {"timeout_seconds": 60})
    api = client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/commands/{cid}/output").json()
    assert api["state"] == "exited" and api["stdout_offset"] > 0, api
    r = wr(daemon, "sandbox", "logs", sandbox, cid)
    assert r.returncode == 0, r
    assert r.stdout == b"x" * (3000000 - api["stdout_offset"])
    assert r.stderr == b"withruntime: %d bytes of stdout were dropped before they were read " \
        b"(a background command keeps its last MiB)\ndone\n" % api["stdout_offset"], r.stderr

    # a read-only key (seeing the tests' key's sandboxes) may not POST /wait: it follows anyway
    ro = daemon.make_key(read_only=True, owner_id=client.get(sandbox)["key_id"])
    cid = ok(wr(daemon, "sandbox", "exec", "--background", sandbox, "--", "sh", "-c",
                "for i in 1 2 3; do echo $i; sleep 0.5; done; exit 4")).strip()
    r = wr(daemon, "sandbox", "logs", "--follow", sandbox, cid, RUNTIME_API_KEY=ro["key"])
    assert r.returncode == 4 and r.stdout == b"1\n2\n3\n" and r.stderr == b"", r


def test_kill_ends_a_background_command_with_its_signal(daemon, client, sandbox):
    r = wr(daemon, "sandbox", "exec", "--background", "--json", sandbox, "--",
           "sh", "-c", "echo started; exec sleep 300")
    cmd = json.loads(ok(r))
    cid = cmd["id"]
    assert cmd["state"] == "running" and cmd["argv"][0] == "sh"
    wait_for(lambda: client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/commands/{cid}")
             .json()["stdout_bytes"] > 0, "its first line")

    assert ok(wr(daemon, "sandbox", "kill", "-s", "sigkill", sandbox, cid)).split() == [cid]
    r = wr(daemon, "sandbox", "logs", "-f", sandbox, cid)
    assert r.returncode == 128 + 9 and r.stdout == b"started\n", r
    one = client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/commands/{cid}").json()
    assert one["state"] == "exited" and one["signal"] == 9

    # it is listed so; a second kill is refused: it is not running
    out = ok(wr(daemon, "sandbox", "commands", sandbox))
    line = next(ln for ln in out.splitlines() if ln.startswith(cid + " "))
    assert line.split()[1:3] == ["exited", "sig9"], line
    listed = json.loads(ok(wr(daemon, "sandbox", "commands", "--json", sandbox)))
    assert listed == client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/commands").json()
    r = wr(daemon, "sandbox", "kill", sandbox, cid)
    assert r.returncode == EXIT_REFUSED and b"not running" in r.stderr, r

    # TERM by default, to a command that runs on
    cid = ok(wr(daemon, "sandbox", "exec", "--background", sandbox, "--", "sleep", "300")).strip()
    assert ok(wr(daemon, "sandbox", "kill", sandbox, cid)).split() == [cid]
    r = wr(daemon, "sandbox", "logs", "--follow", sandbox, cid)
    assert r.returncode == 128 + 15, r


def test_admin_reads_print_the_apis_json(daemon, client):
    keys = json.loads(ok(admin(daemon, "keys", "list", "--json")))
    api = daemon.admin.expect(200, "GET", "/v1/keys").json()
    assert [k["id"] for k in keys["keys"]] == [k["id"] for k in api["keys"]]
    audit = json.loads(ok(admin(daemon, "audit", "--json", "--limit", "5")))
    assert audit == daemon.admin.expect(200, "GET", "/v1/audit", query={"limit": "5"}).json()
    usage = json.loads(ok(wr(daemon, "usage", "--json", "--by", "day")))
    assert usage["group_by"] == "day" and "total_micros" in usage
    images = json.loads(ok(wr(daemon, "--state-dir", daemon.state_dir, "image", "list",
                              "--json")))
    api = client.expect(200, "GET", "/v1/images").json()
    assert [i["name"] for i in images["images"]] == [i["name"] for i in api["images"]]


def test_network_policy_and_log(daemon, client, sandbox):
    out = ok(wr(daemon, "sandbox", "network", sandbox))
    assert out.split() == ["internet", "no"], out
    out = ok(wr(daemon, "sandbox", "network", "--allow", "PyPI.org", "--deny", "evil.test",
                sandbox))
    assert out.splitlines() == ["internet  yes", "allow     pypi.org", "deny      evil.test"]
    assert client.get(sandbox)["network"] == {"internet": True, "allow": ["pypi.org"],
                                              "deny": ["evil.test"]}
    net = json.loads(ok(wr(daemon, "sandbox", "network", "--json", sandbox)))
    assert net == client.get(sandbox)["network"]
    # a bad entry: the daemon names it, nothing changes
    r = wr(daemon, "sandbox", "network", "--allow", "127.0.0.1", sandbox)
    assert r.returncode == EXIT_REFUSED and b"127.0.0.1" in r.stderr, r
    assert client.get(sandbox)["network"] == net
    net = json.loads(ok(wr(daemon, "sandbox", "network", "--no-internet", "--json", sandbox)))
    assert net == {"internet": False} == client.get(sandbox)["network"]

    out = ok(wr(daemon, "sandbox", "network-log", sandbox))
    assert out.splitlines()[0].split() == ["TIME", "VIA", "HOST", "PORT", "REASON"], out
    log = json.loads(ok(wr(daemon, "sandbox", "network-log", "--json", sandbox)))
    api = client.expect(200, "GET", f"/v1/sandboxes/{sandbox}/network/log").json()
    assert log == api
    assert f"({api['total']} denied since the daemon started)" in out
