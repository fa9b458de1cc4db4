"""The four agent tools: what they are to Agno (names, schema, descriptions) and what a model
reads back from them."""

import inspect
import re
import types

import pytest
from agno.tools import tool
from agno.tools.function import Function

from withruntime import Sandbox
from withruntime.tools import sandbox_tools, trim_middle

NAMES = ["runtime_exec", "runtime_read_file", "runtime_write_file", "runtime_list_files"]
AGNO_RESERVED = {"agent", "team", "run_context", "images", "videos", "audios", "files", "self"}


def offline_sandbox():
    """A Sandbox object that is never called: enough to build tools and inspect them."""
    from withruntime import Client

    return Sandbox({"id": "sb-" + "e" * 21, "state": "running"}, Client("http://127.0.0.1:9"))


def args_section(doc):
    """The names documented in a Google-style docstring's Args: section."""
    m = re.search(r"\n\s*Args:\n(.*?)(\n\s*\n|\n\s*Returns:|$)", doc, re.S)
    assert m, "no Args: section"
    return re.findall(r"^\s{4,}(\w+):", m.group(1), re.M)


def test_four_plain_functions_in_order():
    tools = sandbox_tools(offline_sandbox())
    assert [t.__name__ for t in tools] == NAMES
    for t in tools:
        assert type(t) is types.FunctionType  # not a bound method, not a partial
        sig = inspect.signature(t)
        assert not set(sig.parameters) & AGNO_RESERVED
        hints = t.__annotations__
        for name in sig.parameters:
            assert name in hints, f"{t.__name__}.{name} has no type hint"
        assert hints.get("return") in (str, "str")
        assert args_section(t.__doc__) == list(sig.parameters), t.__name__
    run, read, write, ls = tools
    assert list(inspect.signature(run).parameters) == ["command", "cwd", "timeout_seconds"]


def test_schema_agno_builds():
    schemas = {}
    for t in sandbox_tools(offline_sandbox()):
        f = Function.from_callable(t)
        d = f.to_dict()
        schemas[d["name"]] = d
        assert d["description"] and "Args:" not in d["description"]
        for prop, spec in d["parameters"]["properties"].items():
            assert spec.get("description"), f"{d['name']}.{prop} has no description"
    assert list(schemas) == NAMES

    ex = schemas["runtime_exec"]["parameters"]
    assert set(ex["properties"]) == {"command", "cwd", "timeout_seconds"}
    assert ex["required"] == ["command"]
    assert ex["properties"]["command"]["type"] == "string"
    assert "integer" in str(ex["properties"]["timeout_seconds"])
    assert "shell command" in schemas["runtime_exec"]["description"]

    rd = schemas["runtime_read_file"]["parameters"]
    assert rd["required"] == ["path"] and set(rd["properties"]) == {"path", "offset", "length"}
    wr = schemas["runtime_write_file"]["parameters"]
    assert sorted(wr["required"]) == ["content", "path"]
    ls = schemas["runtime_list_files"]["parameters"]
    assert ls["required"] == [] and set(ls["properties"]) == {"path"}


def test_requires_confirmation_wraps_runtime_exec():
    run = sandbox_tools(offline_sandbox())[0]
    f = tool(requires_confirmation=True)(run)
    assert isinstance(f, Function)
    assert f.name == "runtime_exec" and f.requires_confirmation is True


def test_docstring_defaults_follow_the_options():
    run, read, _, _ = sandbox_tools(offline_sandbox(), default_timeout_seconds=42,
                                    max_read_bytes=1000)
    assert "Default: 42." in run.__doc__
    assert "Default and maximum: 1000." in read.__doc__


def test_trim_middle():
    text = "".join(f"{i:05d}\n" for i in range(10000))
    out = trim_middle(text, 1000)
    assert out.startswith("00000\n") and out.endswith("09999\n")
    m = re.search(r"\[\.\.\. (\d+) characters cut from the middle \((\d+) in all\) \.\.\.\]", out)
    assert m and int(m.group(2)) == len(text)
    assert int(m.group(1)) == len(text) - 1000
    assert trim_middle("short", 1000) == "short"


# ---- against a real sandbox ----

def test_exec_reports_exit_code_and_streams(sandbox):
    run = sandbox_tools(sandbox)[0]
    out = run("echo to-out; echo to-err >&2; exit 4")
    assert out.splitlines() == ["exit code: 4", "stdout:", "to-out", "stderr:", "to-err"]
    assert run("true") == "exit code: 0\nstdout: (empty)\nstderr: (empty)"


def test_exec_describes_binary_output(sandbox):
    run = sandbox_tools(sandbox)[0]
    out = run("head -c 4096 /bin/true; echo text >&2")
    assert out.splitlines()[1].startswith("stdout: binary output (4096 bytes); not shown.")
    assert "\ufffd" not in out and "\x00" not in out
    assert out.splitlines()[2:] == ["stderr:", "text"]
    # UTF-8 that is not ASCII is text.
    assert run("printf 'caf\\303\\251\\n'").splitlines()[1:3] == ["stdout:", "caf\u00e9"]


def test_exec_cwd_and_timeout(sandbox):
    run = sandbox_tools(sandbox)[0]
    sandbox.files.mkdir("proj")
    assert "stdout:\n/workspace/proj\n" in run("pwd", cwd="proj") + "\n"
    out = run("echo partial; sleep 30", timeout_seconds=1)
    assert "exit code: -1" in out and "timed out after 1 seconds" in out
    assert "partial" in out
    assert run("kill -9 $$").splitlines()[:2] == [
        "exit code: -1", "note: the command was killed by SIGKILL (9)"]


def test_exec_trims_long_output_head_and_tail(sandbox):
    run = sandbox_tools(sandbox, max_output_chars=2000)[0]
    out = run("seq 1 100000")
    assert out.startswith("exit code: 0\nstdout:\n1\n2\n3\n")
    assert "\n100000" in out
    m = re.search(r"\[\.\.\. (\d+) characters cut from the middle \((\d+) in all\) \.\.\.\]", out)
    total = len("".join(f"{i}\n" for i in range(1, 100001)))
    assert m and int(m.group(2)) == total
    assert len(out) < 2500


def test_exec_reports_sandbox_failures(sandbox):
    run = sandbox_tools(sandbox)[0]
    out = run("true", cwd="/no/such/dir")
    assert out.startswith("error: the command could not start") and "/no/such/dir" in out
    sandbox.stop()
    out = run("echo hi")
    assert out.startswith("error:") and "not running" in out and "stopped" in out


def test_write_read_list(sandbox):
    run, read, write, ls = sandbox_tools(sandbox)
    assert write("pkg/mod.py", "print('hi')\n") == "wrote 12 bytes to /workspace/pkg/mod.py"
    assert sandbox.files.read("/workspace/pkg/mod.py") == b"print('hi')\n"
    assert read("pkg/mod.py") == "print('hi')\n"
    assert read("/workspace/pkg/mod.py") == "print('hi')\n"
    assert "stdout:\nhi" in run("python3 pkg/mod.py")
    write("pkg/data/x.txt", "")
    assert ls("pkg") == "/workspace/pkg (2 entries):\ndata/  (directory)\nmod.py  (12 bytes)"
    assert "pkg/  (directory)" in ls()
    assert ls("pkg/mod.py") == "/workspace/pkg/mod.py is not a directory: mod.py  (12 bytes)"
    assert read("pkg/data/x.txt") == "(/workspace/pkg/data/x.txt is an empty file)"
    assert ls("pkg/data") == "/workspace/pkg/data (1 entry):\nx.txt  (0 bytes)"


def test_read_reports_what_it_cannot_show(sandbox):
    _, read, _, ls = sandbox_tools(sandbox)
    assert read("missing.txt") == "error: /workspace/missing.txt does not exist"
    assert ls("missing") == "error: /workspace/missing does not exist"
    sandbox.files.mkdir("d")
    assert "is a directory" in read("d") and "runtime_list_files" in read("d")
    sandbox.files.write("img.bin", bytes(range(256)) * 40)
    out = read("img.bin")
    assert out.startswith("/workspace/img.bin is a binary file (10240 bytes); not shown")
    assert "\x00" not in out and len(out) < 300


def test_read_long_file_in_parts(sandbox):
    _, read, _, _ = sandbox_tools(sandbox, max_read_bytes=1000)
    text = "".join(f"line {i}: é\n" for i in range(400))  # multi-byte characters throughout
    sandbox.files.write("long.txt", text)
    got, offset, parts = "", None, 0
    while True:
        out = read("long.txt", offset=offset)
        parts += 1
        m = re.search(r"\n\[/workspace/long.txt: bytes (\d+)-(\d+) of (\d+)(; read on with "
                      r"offset=(\d+)\]|; the end of the file\])$", out)
        assert m, out[-200:]
        assert int(m.group(3)) == len(text.encode())
        got += out[:m.start()]
        if m.group(5) is None:
            break
        offset = int(m.group(5))
        assert parts < 20
    assert got == text
    assert parts >= len(text.encode()) // 1000


def test_list_caps_entries(sandbox):
    ls = sandbox_tools(sandbox, max_list_entries=10)[3]
    sandbox.exec("mkdir many && cd many && touch $(seq -f 'f%03g' 1 25)")
    out = ls("many")
    lines = out.splitlines()
    assert lines[0] == "/workspace/many (25 entries):"
    assert lines[1:11] == [f"f{i:03d}  (0 bytes)" for i in range(1, 11)]
    assert lines[11].startswith("[... 15 more entries not shown")


def test_the_api_key_never_reaches_the_model_or_the_sandbox(daemon, new_sandboxes):
    """The key the SDK found (RUNTIME_API_KEY, set for these tests) is sent to the daemon
    only: not in the sandbox's environment, not in what the tools return, not in their
    descriptions."""
    import os

    key = os.environ["RUNTIME_API_KEY"]
    assert key.startswith("wr_")
    with Sandbox.create(memory_mib=256, on_lease_end="delete") as sbx:
        run, read, write, ls = sandbox_tools(sbx)
        outputs = [run("env; cat /proc/1/environ | tr '\\0' '\\n'"), write("k.txt", "x"),
                   read("k.txt"), ls("/workspace")]
        outputs.append(sbx.exec("env").stdout)
        for text in outputs + [f.__doc__ or "" for f in (run, read, write, ls)]:
            assert key not in text
        assert "RUNTIME_API_KEY" not in outputs[0] and "RUNTIME_API_KEY" not in outputs[-1]
        assert key not in repr(sbx) and key not in str(sbx.info)
