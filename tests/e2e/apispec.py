"""Checks real responses against api/openapi.yaml.

The operation is looked up by method + path template; the status must be one the spec lists for
it; the body must match the schema for the response's Content-Type (NDJSON: every line matches).
A path that matches no template must answer as `x-unmatched-route` says; a template that lacks
the method, as `x-unmatched-method` says (including its required headers). HEAD answers as the
GET (but a WebSocket's, `x-websocket`), without a body.
"""

import json
import os
import re

import jsonschema
import referencing
import yaml

SPEC_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "api", "openapi.yaml")
SPEC_URI = "urn:withruntime:openapi"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


class SpecError(AssertionError):
    pass


class Spec:
    def __init__(self, path=SPEC_PATH):
        with open(path, "rb") as f:
            self.doc = yaml.safe_load(f)
        resource = referencing.Resource.from_contents(
            self.doc, default_specification=referencing.jsonschema.DRAFT202012
        )
        self.registry = referencing.Registry().with_resource(SPEC_URI, resource)
        self.routes = []
        for template, item in self.doc["paths"].items():
            regex = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
            self.routes.append((re.compile(regex), template, item))
        self._validators = {}

    def deref(self, node):
        """Follows a local $ref outside schemas (responses, parameters)."""
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            assert ref.startswith("#/"), ref
            node = self.doc
            for part in ref[2:].split("/"):
                node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def _validator(self, pointer):
        v = self._validators.get(pointer)
        if v is None:
            schema = {"$ref": SPEC_URI + "#" + pointer}
            v = jsonschema.Draft202012Validator(schema, registry=self.registry)
            self._validators[pointer] = v
        return v

    def schema_validate(self, pointer, instance, what):
        errors = sorted(self._validator(pointer).iter_errors(instance), key=lambda e: e.path)
        if errors:
            msgs = "; ".join(
                f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"[:300]
                for e in errors[:5]
            )
            raise SpecError(f"{what}: body does not match {pointer}: {msgs}\nbody: "
                            f"{json.dumps(instance)[:1000]}")

    def validate_request_body(self, method, path, body):
        """Checks a request body we mean to be valid against the spec (keeps tests and spec in
        step)."""
        template, item = self.match(path)
        assert template, f"no route for {path}"
        op = item[method.lower()]
        media = op["requestBody"]["content"]["application/json"]["schema"]
        pointer = self._pointer_of(media, f"/paths/{_esc(template)}/{method.lower()}"
                                   "/requestBody/content/application~1json/schema")
        self.schema_validate(pointer, body, f"request {method} {path}")

    def match(self, path):
        path = path.split("?", 1)[0]
        for regex, template, item in self.routes:
            if regex.match(path):
                return template, item
        return None, None

    def _pointer_of(self, schema_node, fallback):
        if isinstance(schema_node, dict) and set(schema_node) == {"$ref"}:
            return schema_node["$ref"][1:]
        return fallback

    def validate_response(self, method, path, status, headers, body):
        """Raises SpecError unless (status, headers, body) is what the spec allows for this
        request. headers: a dict with lower-case keys. body: bytes (for NDJSON, the whole
        stream)."""
        method = method.lower()
        what = f"{method.upper()} {path} -> {status}"
        template, item = self.match(path)
        if method == "head":
            if body:
                raise SpecError(f"{what}: a HEAD answered with a body: {body[:200]!r}")
            body = None
            if item is not None and _has_head(item):
                method = "get"
        if template is None:
            resp = self.deref(self.doc["x-unmatched-route"])
            resp_ptr = self.doc["x-unmatched-route"]["$ref"][1:]
            allowed = {"404": resp}
            ptrs = {"404": resp_ptr}
        elif method not in item:
            resp = self.deref(self.doc["x-unmatched-method"])
            resp_ptr = self.doc["x-unmatched-method"]["$ref"][1:]
            allowed = {"405": resp}
            ptrs = {"405": resp_ptr}
            if str(status) == "405":
                allow = headers.get("allow", "")
                got = {m.strip().lower() for m in allow.split(",") if m.strip()}
                want = {m for m in item if m in METHODS} | ({"head"} if _has_head(item) else set())
                if got != want:
                    raise SpecError(f"{what}: Allow header {allow!r}, spec has {sorted(want)}")
        else:
            op = item[method]
            allowed = {}
            ptrs = {}
            base = f"/paths/{_esc(template)}/{method}/responses"
            for code, r in op["responses"].items():
                allowed[code] = self.deref(r)
                ptrs[code] = r["$ref"][1:] if "$ref" in r else f"{base}/{code}"
        code = str(status)
        if code not in allowed:
            raise SpecError(f"{what}: status not in the spec (allowed: {sorted(allowed)}); "
                            f"body: {body[:500]!r}")
        resp = allowed[code]
        for name, h in (resp.get("headers") or {}).items():
            h = self.deref(h)
            if h.get("required") and name.lower() not in headers:
                raise SpecError(f"{what}: header {name} missing")
        content = resp.get("content") or {}
        if not content or body is None:
            return
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in content:
            raise SpecError(f"{what}: Content-Type {ctype!r} not in the spec "
                            f"({sorted(content)})")
        schema_ptr = f"{ptrs[code]}/content/{_esc(ctype)}/schema"
        if ctype == "application/json":
            try:
                doc = json.loads(body)
            except ValueError as e:
                raise SpecError(f"{what}: body is not JSON ({e}): {body[:300]!r}")
            self.schema_validate(schema_ptr, doc, what)
        elif ctype == "application/x-ndjson":
            for line in body.split(b"\n"):
                if line.strip():
                    self.validate_stream_line(schema_ptr, line, what)

    def validate_stream_line(self, schema_ptr, line, what):
        try:
            doc = json.loads(line)
        except ValueError as e:
            raise SpecError(f"{what}: stream line is not JSON ({e}): {line[:300]!r}")
        self.schema_validate(schema_ptr, doc, what + " (stream line)")
        return doc


def _has_head(item):
    """Whether a path answers HEAD: wherever it answers GET, but a WebSocket's."""
    return "get" in item and not item["get"].get("x-websocket")


def _esc(s):
    return s.replace("~", "~0").replace("/", "~1")


_SPEC = None


def spec():
    global _SPEC
    if _SPEC is None:
        _SPEC = Spec()
    return _SPEC
