"""Schemathesis hooks for test_fuzz.py (loaded through SCHEMATHESIS_HOOKS in the fuzzer's
process, not by pytest).

- The fuzzer's own sandboxes are kept three at a time: the oldest is deleted when it creates a
  fourth (the test deletes the rest). A DELETE of one the hook deleted goes to a new sandbox
  instead, so a scenario that creates several and deletes the first is not answered 404 for
  what the hook did.
- A well-formed sandbox id in a generated case is replaced by WR_FUZZ_SANDBOX (a running
  sandbox the test made), and every command id by WR_FUZZ_COMMAND (a background command
  in it), so the operations reach real ones instead of answering 404 every time; malformed ids
  go through as generated. DELETE keeps its generated id (the
  shared sandbox is the test's to delete).
- A key the tests use (WR_FUZZ_KEEP_KEYS) is never revoked or changed: such a case gets a new
  key of the fuzzer's own instead.
- After a stop or a new timeout on the shared sandbox, it is given back a long lease and started
  again, so later cases still find it running.
Requests go to WR_FUZZ_URL only (the daemon on 127.0.0.1).
"""

import json
import os
import re
import urllib.error
import urllib.request

import schemathesis

URL = os.environ["WR_FUZZ_URL"]
KEY = os.environ.get("WR_FUZZ_KEY", "")  # "": the admin (the URL leads to the Unix socket)
KEEP_KEYS = set(filter(None, os.environ.get("WR_FUZZ_KEEP_KEYS", "").split(",")))
SANDBOX = os.environ.get("WR_FUZZ_SANDBOX", "")
COMMAND = os.environ.get("WR_FUZZ_COMMAND", "")
SANDBOX_ID = re.compile(r"^sb-[a-z2-7]{21}$")
_created = []  # the fuzzer's own sandboxes, oldest first
_reaped = set()  # those the hook deleted
KEEP = 3
assert URL.startswith("http://127.0.0.1:"), URL


def _call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if KEY:
        headers["Authorization"] = f"Bearer {KEY}"
    req = urllib.request.Request(URL + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@schemathesis.hook
def before_call(context, case, kwargs):
    params = case.path_parameters or {}
    if case.path.startswith("/v1/keys/{id}") and case.method.upper() != "GET" \
            and params.get("id") in KEEP_KEYS:
        # a key the tests use (found by listing keys): a key of the fuzzer's own instead
        status, body = _call("POST", "/v1/keys", {"name": f"fuzz-{len(_created)}-{id(case)}"})
        if status == 201:
            params["id"] = json.loads(body)["id"]
        return
    if COMMAND and "cid" in params:  # command ids are free-form: any unknown one is 404
        params["cid"] = COMMAND
    sid = params.get("id")
    if not SANDBOX or not isinstance(sid, str) or not SANDBOX_ID.match(sid):
        return
    deleting = case.method.upper() == "DELETE" and case.path == "/v1/sandboxes/{id}"
    if deleting:
        if sid == SANDBOX:  # a case derived from an earlier one: not this one
            params["id"] = "sb-" + "a" * 21
        elif sid in _reaped:
            status, body = _call("POST", "/v1/sandboxes", {"memory_mib": 256})
            if status == 201:
                params["id"] = json.loads(body)["id"]  # deleted by the request itself
    else:
        params["id"] = SANDBOX


@schemathesis.hook
def after_call(context, case, response):
    method, path = case.method.upper(), case.path
    if method == "POST" and path == "/v1/sandboxes" and response.status_code == 201:
        try:
            sid = response.json()["id"]
        except (ValueError, KeyError, TypeError):
            return
        _created.append(sid)
        while len(_created) > KEEP:
            old = _created.pop(0)
            _call("DELETE", f"/v1/sandboxes/{old}")
            _reaped.add(old)
    elif (SANDBOX and (case.path_parameters or {}).get("id") == SANDBOX
          and path.rsplit("/", 1)[-1] in ("stop", "timeout")):
        _call("POST", f"/v1/sandboxes/{SANDBOX}/timeout", {"timeout_seconds": 3600})
        _call("POST", f"/v1/sandboxes/{SANDBOX}/start")
