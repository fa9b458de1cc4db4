"""Secrets bound to hosts: the sandbox holds a placeholder, the proxy puts the value in.

Against the same fake internet and daemon-in-a-namespace as test_egress.py: a secret bound to
api.github.test arrives as the real value in the Authorization header there, and only as the
placeholder at an allowed but unbound host and over plain HTTP; nothing inside the sandbox, in
the daemon's log, in its database or in an API answer holds the value. The proxy terminates
TLS to do it, so the SNI and each request's Host must agree.
"""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import wrclient  # noqa: E402
from test_egress import BLOCKED_WORDS, curl, egress, net, run, sb  # noqa: E402,F401

VALUE = "ghp_realTOKENvalue1234567890abcdefXYZ"
HOSTS = ["api.github.test"]
POLICY = {"internet": True, "allow": ["api.github.test", "example.test", "pypi.org"]}


@pytest.fixture
def secret(egress):
    c = egress.client
    r = c.expect(200, "PUT", "/v1/secrets/GITHUB_TOKEN", {"value": VALUE, "hosts": HOSTS})
    assert r.json()["name"] == "GITHUB_TOKEN" and r.json()["hosts"] == HOSTS
    assert VALUE not in r.body.decode()
    yield "GITHUB_TOKEN"
    c.request("DELETE", "/v1/secrets/GITHUB_TOKEN")


def last_auth(net, host):
    reqs = net.requests(host)
    assert reqs, f"{host} got no request"
    return reqs[-1]["headers"].get("authorization")


def test_value_goes_only_to_the_bound_host_over_https(egress, net, sb, secret):
    s = sb(network=POLICY, secrets=[secret])
    sid = s["id"]
    assert s["secrets"] == [secret]
    code, out, _ = run(egress, sid, "printf %s \"$GITHUB_TOKEN\"")
    placeholder = out
    assert placeholder.startswith("wr-placeholder-") and VALUE not in placeholder
    auth = "-H \"Authorization: Bearer $GITHUB_TOKEN\""
    code, body, status = curl(egress, sid, f"{auth} https://api.github.test/user")
    assert status == 200, body
    assert last_auth(net, "api.github.test") == f"Bearer {VALUE}"
    # allowed but not bound: the placeholder goes as it is
    code, body, status = curl(egress, sid, f"{auth} https://example.test/")
    assert status == 200 and last_auth(net, "example.test") == f"Bearer {placeholder}"
    # the bound host over plain HTTP: never the value
    code, body, status = curl(egress, sid, f"{auth} http://api.github.test/")
    assert status == 200 and last_auth(net, "api.github.test") == f"Bearer {placeholder}"
    # a body never carries it either
    code, body, status = curl(egress, sid, f"--data \"t=$GITHUB_TOKEN\" https://api.github.test/")
    assert status == 200
    assert VALUE not in net.requests("api.github.test")[-1].get("body", "")


def test_value_is_nowhere_inside_nor_in_logs_db_or_api(egress, net, sb, secret):
    sid = sb(network=POLICY, secrets=[secret])["id"]
    curl(egress, sid, "-H \"Authorization: token $GITHUB_TOKEN\" https://api.github.test/")
    assert last_auth(net, "api.github.test") == f"token {VALUE}"
    code, out, err = run(egress, sid,
                         "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; "
                         f"grep -rl '{VALUE}' /etc /root /workspace /tmp /var /home 2>/dev/null; "
                         "true", timeout=120)
    assert "GITHUB_TOKEN=wr-placeholder-" in out
    assert VALUE not in out and VALUE not in err
    c = egress.client
    for path in (f"/v1/sandboxes/{sid}", "/v1/sandboxes", "/v1/secrets",
                 "/v1/secrets/GITHUB_TOKEN", f"/v1/sandboxes/{sid}/network/log"):
        assert VALUE not in c.expect(200, "GET", path).body.decode(), path
    assert VALUE.encode() not in egress.log_bytes()
    for name in ("withruntime.db", "withruntime.db-wal"):
        p = os.path.join(egress.state_dir, name)
        if os.path.exists(p):
            with open(p, "rb") as f:
                assert VALUE.encode() not in f.read(), f"{name} holds the value in clear"


def test_sni_and_host_must_agree(egress, net, sb):
    sid = sb(network=POLICY)["id"]
    net.reset_logs()
    code, body, status = curl(egress, sid, "-H 'Host: evil.test' https://pypi.org/")
    assert status == 403 and BLOCKED_WORDS in body and "host_mismatch" in body, body
    assert net.requests() == [], "a fronted request went out"


def test_unknown_secret_and_bad_input(egress, sb):
    c = egress.client
    r = c.request("POST", "/v1/sandboxes", {"secrets": ["NOPE"]})
    assert r.status == 404 and "NOPE" in r.error[1], r
    r = c.request("PUT", "/v1/secrets/lower", {"value": "x", "hosts": ["a.test"]})
    assert r.status == 400, r
    r = c.request("PUT", "/v1/secrets/OK", {"value": "a\nb", "hosts": ["a.test"]})
    assert r.status == 400 and "value" in r.error[1] and "a\nb" not in r.error[1], r
    r = c.request("PUT", "/v1/secrets/OK", {"value": "v", "hosts": ["127.0.0.1"]})
    assert r.status == 400 and "hosts" in r.error[1], r
    assert c.request("GET", "/v1/secrets/NOPE").status == 404
    assert c.request("DELETE", "/v1/secrets/NOPE").status == 404


def test_cli_reads_the_value_from_stdin_never_argv(egress, net, sb):
    env = dict(os.environ, RUNTIME_URL=f"unix:{egress.socket_path}")
    env.pop("RUNTIME_API_KEY", None)
    r = subprocess.run([egress.bin, "secrets", "set", "CLI_TOKEN", "--hosts", "api.github.test"],
                       input=VALUE + "\n", capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert VALUE not in r.stdout + r.stderr
    try:
        r = subprocess.run([egress.bin, "secrets", "list"], capture_output=True, text=True,
                           env=env, timeout=30)
        assert r.returncode == 0 and "CLI_TOKEN" in r.stdout and "api.github.test" in r.stdout
        assert VALUE not in r.stdout
        sid = sb(network=POLICY, secrets=["CLI_TOKEN"])["id"]
        curl(egress, sid, "-H \"Authorization: Bearer $CLI_TOKEN\" https://api.github.test/")
        assert last_auth(net, "api.github.test") == f"Bearer {VALUE}"
    finally:
        r = subprocess.run([egress.bin, "secrets", "rm", "CLI_TOKEN"], capture_output=True,
                           text=True, env=env, timeout=30)
        assert r.returncode == 0, r.stderr


def test_secrets_survive_a_daemon_restart_sealed(egress, net, sb, secret):
    egress.proc.terminate()
    egress.proc.wait(timeout=30)
    egress.start(clean=False)
    names = [s["name"] for s in egress.client.expect(200, "GET", "/v1/secrets").json()["secrets"]]
    assert secret in names
    sid = sb(network=POLICY, secrets=[secret])["id"]
    curl(egress, sid, "-H \"Authorization: Bearer $GITHUB_TOKEN\" https://api.github.test/")
    assert last_auth(net, "api.github.test") == f"Bearer {VALUE}"
    key = os.path.join(egress.state_dir, "secrets.key")
    assert os.stat(key).st_mode & 0o077 == 0
