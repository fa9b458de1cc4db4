"""api/openapi.yaml is valid OpenAPI 3.1 and covers every route and error of docs/api.md.
(No daemon needed.)"""

import os
import re

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
