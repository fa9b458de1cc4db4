"""Secrets bound to hosts: the sandbox holds a placeholder, the proxy puts the value in.

Against the same fake internet and daemon-in-a-namespace as test_egress.py: a secret bound to
api.github.test arrives as the real value in the Authorization header there, and only as the
placeholder at an allowed but unbound host and over plain HTTP; nothing inside the sandbox, in
the daemon's log, in its database or in an API answer holds the value. The proxy terminates
TLS to do it, so the SNI and each request's Host must agree.
"""

import json
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
        # grants and headers change without the value; a key that is not there is refused
        key = egress.make_key()
        try:
            r = subprocess.run([egress.bin, "secrets", "update", "CLI_TOKEN", "--keys",
                                key["id"], "--headers", "X-Api-Key"], capture_output=True,
                               text=True, env=env, timeout=30)
            assert r.returncode == 0 and key["id"] in r.stdout, r.stdout + r.stderr
            s = egress.client.expect(200, "GET", "/v1/secrets/CLI_TOKEN").json()
            assert s["keys"] == [key["id"]] and s["headers"] == ["X-Api-Key"], s
            r = subprocess.run([egress.bin, "secrets", "list"], capture_output=True, text=True,
                               env=env, timeout=30)
            line = [x for x in r.stdout.splitlines() if x.startswith("CLI_TOKEN")]
            assert line and line[0].split()[-1] == key["id"], r.stdout
            r = subprocess.run([egress.bin, "secrets", "update", "CLI_TOKEN", "--keys",
                                "key_NOSUCHKEY0000000"], capture_output=True, text=True,
                               env=env, timeout=30)
            assert r.returncode == 3 and "no key key_NOSUCHKEY0000000" in r.stderr, r.stderr  # 404
            r = subprocess.run([egress.bin, "secrets", "update", "CLI_TOKEN", "--keys", ""],
                               capture_output=True, text=True, env=env, timeout=30)
            assert r.returncode == 0 and "the admin's sandboxes only" in r.stdout, r.stdout
        finally:
            egress.client.request("POST", f"/v1/keys/{key['id']}/revoke")
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


# ---- who may use a secret (owners and grants) ----


@pytest.fixture
def two_keys(egress):
    """Keys A and B on the egress daemon: clients with each (over its Unix socket)."""
    made = [egress.make_key(), egress.make_key()]
    yield [(k["id"], egress.client.with_key(k["key"])) for k in made]
    for k in made:
        egress.client.request("POST", f"/v1/keys/{k['id']}/revoke")


def put_secret(c, name, hosts, **fields):
    r = c.expect(200, "PUT", f"/v1/secrets/{name}", {"value": VALUE, "hosts": hosts, **fields})
    assert VALUE not in r.body.decode()
    return r.json()


def test_a_key_uses_only_the_secrets_granted_to_it(egress, net, two_keys):
    (a_id, ka), (b_id, kb) = two_keys
    c = egress.client
    s = put_secret(c, "GRANTED_TOKEN", HOSTS)
    assert s["keys"] == [] and s["headers"] == []
    made = []

    def create(client, body):  # deleted by the admin at the end, even if a refusal let it in
        r = client.request("POST", "/v1/sandboxes", body)
        if r.status == 201:
            made.append(r.json()["id"])
        return r

    try:
        # the admin's alone until granted; the answer is the same as for a name that is not there
        r = create(ka, {"secrets": ["GRANTED_TOKEN"]})
        assert r.status == 404 and "no secret GRANTED_TOKEN that this key may use" in r.error[1], r
        r2 = create(ka, {"secrets": ["NO_SUCH_TOKEN"]})
        assert r2.status == 404
        assert r2.error[1].replace("NO_SUCH_TOKEN", "X") == r.error[1].replace("GRANTED_TOKEN", "X")
        # granted to A: A's sandbox gets the value, B still may not attach it
        s = c.expect(200, "PATCH", "/v1/secrets/GRANTED_TOKEN", {"keys": [a_id]}).json()
        assert s["keys"] == [a_id] and s["hosts"] == HOSTS
        r = create(kb, {"secrets": ["GRANTED_TOKEN"]})
        assert r.status == 404 and "that this key may use" in r.error[1], r
        r = create(ka, {"network": POLICY, "secrets": ["GRANTED_TOKEN"]})
        assert r.status == 201, r
        sid = r.json()["id"]
        auth = "-H \"Authorization: Bearer $GRANTED_TOKEN\" https://api.github.test/"
        _, _, status = curl(egress, sid, auth)
        assert status == 200 and last_auth(net, "api.github.test") == f"Bearer {VALUE}"
        # the grant taken back: the running sandbox's next request carries the placeholder
        c.expect(200, "PATCH", "/v1/secrets/GRANTED_TOKEN", {"keys": []})
        _, _, status = curl(egress, sid, auth)
        sent = last_auth(net, "api.github.test")
        assert status == 200 and sent.startswith("Bearer wr-placeholder-"), sent
        # granted again, then the key revoked: its grants go with it
        c.expect(200, "PATCH", "/v1/secrets/GRANTED_TOKEN", {"keys": [a_id]})
        curl(egress, sid, auth)
        assert last_auth(net, "api.github.test") == f"Bearer {VALUE}"
        c.expect(200, "POST", f"/v1/keys/{a_id}/revoke")
        curl(egress, sid, auth)
        assert last_auth(net, "api.github.test").startswith("Bearer wr-placeholder-")
    finally:
        for sid in made:
            c.request("DELETE", f"/v1/sandboxes/{sid}")
        c.request("DELETE", "/v1/secrets/GRANTED_TOKEN")


def test_grants_name_keys_in_use_that_own_their_sandboxes(egress, two_keys):
    (a_id, _), _ = two_keys
    c = egress.client
    of_a = egress.make_key(owner_id=a_id)
    try:
        for keys, words, status in (
                (["key_NOSUCHKEY0000000"], "no key key_NOSUCHKEY0000000", 404),
                ([of_a["id"]], f"grant {a_id}", 400), ("key_x", "keys", 400)):
            r = c.request("PUT", "/v1/secrets/BAD_GRANT",
                          {"value": VALUE, "hosts": HOSTS, "keys": keys})
            assert r.status == status and words in r.error[1], r
        assert c.request("GET", "/v1/secrets/BAD_GRANT").status == 404
        r = c.request("PATCH", "/v1/secrets/NOPE", {"keys": []})
        assert r.status == 404, r
        # a key cannot read, set or change secrets at all
        _, kb = two_keys[1]
        assert kb.request("GET", "/v1/secrets").status == 403
        assert kb.request("PATCH", "/v1/secrets/NOPE", {"keys": []}).status == 403
    finally:
        c.request("POST", f"/v1/keys/{of_a['id']}/revoke")


# ---- where the value goes: credential fields, safe methods, the bound port ----


def test_only_credential_fields_get_the_value(egress, net, sb):
    c = egress.client
    put_secret(c, "FIELD_TOKEN", ["api.github.test", "*.example.test"], headers=["X-Api-Key"])
    try:
        sid = sb(network={"internet": True, "allow": ["api.github.test", "*.example.test"]},
                 secrets=["FIELD_TOKEN"])["id"]
        _, ph, _ = run(egress, sid, "printf %s \"$FIELD_TOKEN\"")
        assert ph.startswith("wr-placeholder-")
        hdrs = ("-H \"Authorization: Bearer $FIELD_TOKEN\" -H \"X-Api-Key: $FIELD_TOKEN\" "
                "-H \"X-Echo: $FIELD_TOKEN\" -H \"Origin: https://$FIELD_TOKEN.test\"")
        _, _, status = curl(egress, sid, f"{hdrs} 'https://api.github.test/p?t='\"$FIELD_TOKEN\"")
        assert status == 200
        got = net.requests("api.github.test")[-1]
        h = got["headers"]
        assert h["authorization"] == f"Bearer {VALUE}" and h["x-api-key"] == VALUE, h
        assert h["x-echo"] == ph and h["origin"] == f"https://{ph}.test", h
        assert got["path"] == f"/p?t={ph}", got["path"]
        # methods that echo or carry no credential get none
        for method in ("TRACE", "OPTIONS"):
            _, _, status = curl(egress, sid, f"-X {method} {hdrs} https://api.github.test/")
            got = net.requests("api.github.test")[-1]
            assert got["method"] == method and VALUE not in json.dumps(got["headers"]), got
        # the placeholder as a name under a wildcard binding: Host and SNI stay as sent
        name = f"{ph}.example.test"
        net.set_dns(name, net.addr("example.test"))
        _, body, status = curl(egress, sid, f"{hdrs} https://{name}/")
        assert status == 200, body
        got = net.requests("example.test")[-1]
        assert got["headers"]["host"] == name and got["sni"] == name, got
        assert got["headers"]["authorization"] == f"Bearer {VALUE}", got
    finally:
        c.request("DELETE", "/v1/secrets/FIELD_TOKEN")


def test_a_binding_holds_for_its_port_only(egress, net, sb):
    c = egress.client
    put_secret(c, "PORT_8443", ["api.github.test:8443"])
    put_secret(c, "PORT_DEFAULT", ["api.github.test"])
    try:
        policy = {"internet": True, "allow": ["api.github.test", "api.github.test:8443"]}
        sid = sb(network=policy, secrets=["PORT_8443", "PORT_DEFAULT"])["id"]
        _, phs, _ = run(egress, sid, "printf '%s %s' \"$PORT_8443\" \"$PORT_DEFAULT\"")
        ph8443, ph443 = phs.split()
        auth = "-H \"Authorization: Bearer $PORT_8443 $PORT_DEFAULT\""
        _, body, status = curl(egress, sid, f"{auth} https://api.github.test:8443/")
        assert status == 200, body
        got = net.requests("api.github.test")[-1]
        assert got["port"] == 8443
        assert got["headers"]["authorization"] == f"Bearer {VALUE} {ph443}", got
        _, body, status = curl(egress, sid, f"{auth} https://api.github.test/")
        got = net.requests("api.github.test")[-1]
        assert status == 200 and got["port"] == 443
        assert got["headers"]["authorization"] == f"Bearer {ph8443} {VALUE}", got
    finally:
        c.request("DELETE", "/v1/secrets/PORT_8443")
        c.request("DELETE", "/v1/secrets/PORT_DEFAULT")
