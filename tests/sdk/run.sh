#!/usr/bin/env bash
# Installs the SDK (python/) and the SDK tests' requirements, then runs the SDK tests against a
# real daemon (tests/sdk/conftest.py starts it; see there for WR_BIN, WR_AGENT and
# WR_TEST_STATE_DIR). Extra arguments go to pytest. Where pip refuses to install into the
# system's Python (PEP 668), a virtual environment under build/venv is used instead.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}

managed=$("$PY" -c 'import os, sysconfig
print(int(os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))')
if [ "$managed" = 1 ] && [ -z "${VIRTUAL_ENV:-}" ]; then
    if [ ! -x "$ROOT/build/venv/bin/python" ]; then
        "$PY" -m venv "$ROOT/build/venv"
    fi
    PY="$ROOT/build/venv/bin/python"
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
"$PY" -m pip install --quiet -r "$ROOT/tests/sdk/requirements.txt"
# A fresh install of the package as users get it (pip install ./python) ...
"$PY" -m pip install --quiet --force-reinstall --no-deps "$ROOT/python"
# ... which must import from outside the source tree, with its type marker.
(cd / && "$PY" -c 'import os, withruntime, withruntime.tools
d = os.path.dirname(withruntime.__file__)
assert os.path.exists(os.path.join(d, "py.typed")), "py.typed is not installed"
assert [f.__name__ for f in withruntime.tools.sandbox_tools(withruntime.Sandbox(
    {"id": "sb-x"}, withruntime.Client("http://127.0.0.1:9")))] == [
    "runtime_exec", "runtime_read_file", "runtime_write_file", "runtime_list_files"]')

cd "$ROOT"
exec "$PY" -m pytest tests/sdk "$@"
