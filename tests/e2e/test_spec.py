"""api/openapi.yaml is valid OpenAPI 3.1, covers every route and error of docs/api.md, and its
enums (states, reasons) are the daemon's own, as `withruntime serve --print-enums` prints them
(no daemon is started)."""

import json
import os
import re
import subprocess

import yaml
from openapi_spec_validator import validate

import apispec

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def load_docs():
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        return f.read()


def test_spec_is_valid_openapi_31():
    with open(apispec.SPEC_PATH) as f:
        doc = yaml.safe_load(f)
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_documented_route_is_in_the_spec():
    routes = set(re.findall(r"\b(GET|POST|PUT|DELETE|PATCH) (/v1/[^\s`?]*)", load_docs()))
    assert len(routes) >= 11, routes
    spec = apispec.spec()
    for method, path in routes:
        template, item = spec.match(path)
        assert template == path, f"{method} {path} is not a path of the spec"
        assert method.lower() in item, f"{method} {path} has no operation in the spec"


def test_every_spec_route_is_documented():
    docs = load_docs()
    spec = apispec.spec()
    for template, item in spec.doc["paths"].items():
        for method in item:
            if method in apispec.METHODS:
                assert f"{method.upper()} {template}" in docs, (method, template)


def test_every_documented_error_code_is_in_the_spec():
    docs = load_docs()
    codes = set(re.findall(r"\|\s*\d{3}\s*\|\s*`([a-z_]+)`", docs))
    codes |= set(re.findall(r"code\s+`([a-z_]+)`", docs))
    assert {"invalid_request", "not_found", "exec_failed"} <= codes
    enum = set(apispec.spec().doc["components"]["schemas"]["Error"]["properties"]["error"][
        "properties"]["code"]["enum"])
    assert codes <= enum, codes - enum


def test_spec_rejects_what_it_should():
    # the validator is not a rubber stamp
    spec = apispec.spec()
    ok = b'{"status":"ok","version":"1","driver":"gvisor","sandboxes":0}'
    spec.validate_response("GET", "/v1/health", 200, {"content-type": "application/json"}, ok)
    for status, ctype, body in [
        (200, "application/json", b'{"status":"ok"}'),
        (200, "application/json", ok[:-1] + b',"extra":1}'),
        (200, "application/json", ok.replace(b":0}", b":-1}")),
        (200, "text/plain", ok),
        (201, "application/json", ok),
        (200, "application/json", b"not json"),
    ]:
        try:
            spec.validate_response("GET", "/v1/health", status, {"content-type": ctype}, body)
        except apispec.SpecError:
            continue
        raise AssertionError(f"accepted {status} {ctype} {body!r}")


# ---- the spec's enums against the daemon's own (`withruntime serve --print-enums`) ----

def daemon_enums():
    """{"states": [...], "reasons": [...]}: every state and state_reason the daemon can report,
    as the binary under test (WR_BIN) prints them."""
    from conftest import WR_BIN
    r = subprocess.run([WR_BIN, "serve", "--print-enums"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30)
    assert r.returncode == 0, f"{WR_BIN} serve --print-enums: exit {r.returncode}: " \
        f"{r.stderr.decode(errors='replace')[-2000:]}"
    enums = json.loads(r.stdout)
    assert set(enums) >= {"states", "reasons"}, enums
    for k in ("states", "reasons"):
        assert enums[k] and len(set(enums[k])) == len(enums[k]), enums
    return enums


def schemas():
    return apispec.spec().doc["components"]["schemas"]


def test_spec_states_are_the_daemons():
    assert set(schemas()["State"]["enum"]) == set(daemon_enums()["states"])


def test_spec_reasons_are_the_daemons():
    s = schemas()
    assert set(s["StateReason"]["enum"]) == set(daemon_enums()["reasons"])
    # both places a reason is returned use that list
    assert s["Sandbox"]["properties"]["state_reason"]["$ref"].endswith("/StateReason")
    assert s["Event"]["properties"]["reason"]["$ref"].endswith("/StateReason")


def lifecycle_table(heading):
    """The first column (`name`) of the table after `heading`'s line in docs/lifecycle.md."""
    with open(os.path.join(ROOT, "docs", "lifecycle.md")) as f:
        text = f.read()
    rest = text.split(heading, 1)[1]
    names = []
    for line in rest.splitlines()[1:]:
        if not line.startswith("|"):
            if names:
                break
            continue
        m = re.match(r"\|\s*`([a-z_]+)`\s*\|", line)
        if m:
            names.append(m.group(1))
    return names


def test_lifecycle_doc_lists_the_daemons_states_and_reasons():
    enums = daemon_enums()
    assert set(lifecycle_table("| state | meaning |")) == set(enums["states"])
    assert set(lifecycle_table("| reason | when |")) == set(enums["reasons"])


def test_sdk_names_every_state():
    with open(os.path.join(ROOT, "python", "withruntime", "sandbox.py")) as f:
        src = f.read()
    doc = src.split("def state(self)", 1)[1].split('"""')[1]
    for state in daemon_enums()["states"]:
        assert f"``{state}``" in doc, state
