"""An external API fuzzer that reads the spec: schemathesis, run against the session's daemon on
127.0.0.1, 25 examples per operation (every phase: examples, coverage, fuzzing, stateful), with
all of its checks. It passes when every answer is one api/openapi.yaml allows: valid requests
accepted, invalid ones refused with 4xx, no 5xx, JSON that matches its schema, and a JSON 405
for a method the spec does not declare.

It cannot pile up sandboxes: the hooks (fuzz_hooks.py) delete each sandbox it creates when it
creates the next, and point well-formed ids at one sandbox this test made, so at most two exist
at once; the test deletes what is left. Requests go to the daemon's loopback address only.
"""

import os
import shutil
import subprocess
import sys

import pytest
import yaml

import apispec

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = 25


def host_spec(path):
    """api/openapi.yaml with this host's limits put in (`x-maximum-is-host-cpus`: the daemon
    takes 1..the host's online CPUs)."""
    with open(apispec.SPEC_PATH) as f:
        doc = yaml.safe_load(f)
    cpus = os.sysconf("SC_NPROCESSORS_ONLN")
    marked = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("x-maximum-is-host-cpus"):
                node["maximum"] = cpus
                marked.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    assert marked, "no x-maximum-is-host-cpus in the spec"
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


def schemathesis_cmd():
    exe = shutil.which("schemathesis") or shutil.which("st")
    if exe is None:
        exe = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    assert os.access(exe, os.X_OK), "schemathesis is not installed (tests/requirements.txt)"
    return [exe]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(client, daemon, make_sandbox, tmp_path):
    assert daemon.url.startswith("http://127.0.0.1:")
    shared = make_sandbox(memory_mib=256, timeout_seconds=3600, on_lease_end="stop")["id"]
    r = client.request("POST", f"/v1/sandboxes/{shared}/exec",
                       {"command": "sleep 100000", "background": True})
    assert r.status == 201, r
    command = r.json()["id"]

    spec = tmp_path / "openapi.yaml"
    host_spec(spec)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update({
        "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
        "WR_FUZZ_URL": daemon.url, "WR_FUZZ_SANDBOX": shared, "WR_FUZZ_COMMAND": command,
        "SCHEMATHESIS_HOOKS": "fuzz_hooks",
        "PYTHONPATH": HERE + os.pathsep + env.get("PYTHONPATH", ""),
    })
    cmd = schemathesis_cmd() + [
        "--config-file", os.path.join(HERE, "schemathesis.toml"), "--no-color",
        "run", str(spec), "--url", daemon.url,
        "--max-examples", str(EXAMPLES), "--workers", "1", "--seed", "1",
        "--generation-database", "none", "--request-timeout", "120",
        "--checks", "all",
        # no NUL in generated strings: the spec's note 3 excludes it from every string (JSON
        # cannot carry it here), which JSON Schema cannot say once for all fields
        "--generation-allow-x00", "false",
    ]
    try:
        p = subprocess.run(cmd, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=840)
    finally:
        # what the fuzzer left (its last sandbox); the shared one is make_sandbox's
        # (not checked against the spec: this is cleanup, and must not stop half-way)
        listed = client.request("GET", "/v1/sandboxes", validate=False).json()["sandboxes"]
        for sb in listed:
            if sb["id"] != shared:
                client.request("DELETE", f"/v1/sandboxes/{sb['id']}", validate=False)
    out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
    # the whole report is kept: a failing case's body can be megabytes, and the failures come
    # before it
    report = "/tmp/wr-schemathesis-report.txt"
    with open(report, "w") as f:
        f.write(out)
    shown = "\n".join(line[:300] for line in out.splitlines())
    assert p.returncode == 0, f"schemathesis (exit {p.returncode}; all of it in {report}):\n" \
        f"{shown[:20000]}"
    assert client.health()["status"] == "ok"
