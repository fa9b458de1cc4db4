"""The async agent tools (async_sandbox_tools): to a model the same tools as the sync ones
(names, docstrings, parameters, the schema Agno builds), the same answers from a real sandbox,
and python/README.md's async examples run through `await agent.arun(...)` with the real Agno,
the real openai client and the scripted model server, the approval flow with `acontinue_run`
included. An async agent's event loop runs on while a tool's command runs.

`solve` and `supervised` below are copied unchanged from python/README.md, section "Async" (a
test checks that)."""

import asyncio
import builtins
import inspect
import os
import re
import uuid

import pytest
from agno.models.openai import OpenAIChat
from agno.tools.function import Function

from fakellm import FakeLLM, call, say, tool_messages, tool_names
from withruntime import AsyncClient, Client, Sandbox
from withruntime.tools import sandbox_tools

# ---- verbatim from python/README.md, section Async ----
from agno.agent import Agent
from withruntime import AsyncSandbox
from withruntime.tools import async_sandbox_tools

async def solve(model, task: str) -> str:
    async with AsyncSandbox.create(
        network={"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]},
        timeout_seconds=900,
        on_lease_end="stop",
    ) as sbx:
        agent = Agent(
            model=model,
            tools=async_sandbox_tools(sbx),
            instructions="Use the Linux sandbox for any code. Check exit codes.",
        )
        return str((await agent.arun(task)).content)
# ---- end ----

# ---- verbatim from python/README.md, section Async ----
import asyncio
from agno.agent import Agent
from agno.tools import tool
from withruntime import AsyncSandbox
from withruntime.tools import async_sandbox_tools

async def supervised(model, task: str) -> str:
    async with AsyncSandbox.create(timeout_seconds=1800, on_lease_end="stop") as sbx:
        run, read, write, ls = async_sandbox_tools(sbx)
        agent = Agent(model=model, tools=[tool(requires_confirmation=True)(run), read, write, ls])
        response = await agent.arun(task)
        while response.is_paused:
            for requirement in response.active_requirements:
                if requirement.needs_confirmation:
                    command = requirement.tool_execution.tool_args["command"]
                    answer = await asyncio.to_thread(input, f"Run `{command}`? [y/N] ")
                    if answer.lower() == "y":
                        requirement.confirm()
                    else:
                        requirement.reject()
            response = await agent.acontinue_run(response)
        return str(response.content)
# ---- end ----

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "..", "..", "python", "README.md")
NAMES = ["runtime_exec", "runtime_read_file", "runtime_write_file", "runtime_list_files"]
SID = "sb-" + "e" * 21


def offline_pair(**options):
    """The sync and the async tools of sandbox objects that are never called."""
    sync = sandbox_tools(Sandbox({"id": SID, "state": "running"}, Client("http://127.0.0.1:9")),
                         **options)
    asyn = async_sandbox_tools(AsyncSandbox({"id": SID, "state": "running"},
                                            AsyncClient("http://127.0.0.1:9")), **options)
    return sync, asyn


def model_for(llm):
    return OpenAIChat(id="gpt-4o", base_url=llm.base_url, api_key="test")


def answer_from_last_tool_result(prefix):
    def turn(request):
        results = tool_messages(request)
        assert results, "the model was not sent a tool result"
        return say(prefix + results[-1][1])
    return turn


def test_examples_are_the_readmes():
    with open(README) as f:
        text = f.read()
    section = text[text.index("\n## Async\n"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    with open(__file__) as f:
        me = f.read()
    assert len(blocks) == 3
    for block in blocks[:2]:
        assert block in me


def test_the_model_sees_the_same_tools():
    for options in ({}, {"default_timeout_seconds": 42, "max_read_bytes": 1000}):
        sync, asyn = offline_pair(**options)
        assert [t.__name__ for t in asyn] == [t.__name__ for t in sync] == NAMES
        for s, a in zip(sync, asyn):
            assert inspect.iscoroutinefunction(a) and not inspect.iscoroutinefunction(s)
            assert a.__doc__ == s.__doc__ and a.__qualname__ == s.__qualname__
            assert inspect.signature(a) == inspect.signature(s)
            assert a.__annotations__ == s.__annotations__
            assert Function.from_callable(a).to_dict() == Function.from_callable(s).to_dict()
        if options:
            assert "Default: 42." in asyn[0].__doc__
            assert "Default and maximum: 1000." in asyn[1].__doc__
    spec = Function.from_callable(asyn[0]).to_dict()
    assert spec["parameters"]["required"] == ["command"]
    assert set(spec["parameters"]["properties"]) == {"command", "cwd", "timeout_seconds"}
    wrapped = tool(requires_confirmation=True)(asyn[0])
    assert isinstance(wrapped, Function)
    assert wrapped.name == "runtime_exec" and wrapped.requires_confirmation is True
    with pytest.raises(TypeError):
        async_sandbox_tools(Sandbox({"id": SID}, Client("http://127.0.0.1:9")))
    with pytest.raises(TypeError):
        sandbox_tools(AsyncSandbox({"id": SID}, AsyncClient("http://127.0.0.1:9")))


def test_the_same_answers_as_the_sync_tools(sandbox):
    sandbox.files.write("img.bin", bytes(range(256)) * 40)
    sandbox.files.write("long.txt", "".join(f"line {i}: é\n" for i in range(400)))
    sandbox.files.mkdir("d")
    calls_ = [
        (0, ("echo to-out; echo to-err >&2; exit 4",), {}),
        (0, ("echo partial; sleep 30",), {"timeout_seconds": 1}),
        (0, ("kill -9 $$",), {}),
        (0, ("seq 1 100000",), {}),
        (0, ("pwd",), {"cwd": "d"}),
        (0, ("true",), {"cwd": "/no/such/dir"}),
        (2, ("pkg/mod.py", "print('hi')\n"), {}),
        (1, ("pkg/mod.py",), {}),
        (1, ("missing.txt",), {}),
        (1, ("d",), {}),
        (1, ("img.bin",), {}),
        (1, ("long.txt",), {"offset": 995}),
        (3, (), {}),
        (3, ("pkg",), {}),
        (3, ("pkg/mod.py",), {}),
        (3, ("missing",), {}),
    ]

    async def main():
        sbx = await AsyncSandbox.connect(sandbox.id)
        sync = sandbox_tools(sandbox, max_output_chars=2000, max_read_bytes=1000)
        asyn = async_sandbox_tools(sbx, max_output_chars=2000, max_read_bytes=1000)
        for i, args, kw in calls_:
            got = await asyn[i](*args, **kw)
            assert got == sync[i](*args, **kw), (NAMES[i], args)
        await sbx.stop()
        for i, args in ((0, ("echo hi",)), (1, ("pkg/mod.py",)), (2, ("x", "y")), (3, ())):
            got = await asyn[i](*args)
            assert got.startswith("error:") and "not running" in got
            assert got == sync[i](*args)

    asyncio.run(main())


def test_solve(new_sandboxes):
    token = uuid.uuid4().hex[:12]
    command = f"python3 -c 'print(6 * 7)' | tee answer-{token}.txt; cat /etc/hostname"
    script = [call("runtime_exec", command=command),
              answer_from_last_tool_result("The sandbox said:\n")]
    with FakeLLM(script) as llm:
        answer = asyncio.run(solve(model_for(llm), "What is 6 * 7? Compute it."))
    assert llm.errors == []
    first = llm.requests[0]
    assert set(tool_names(first)) == set(NAMES)
    spec = next(t["function"] for t in first["tools"]
                if t["function"]["name"] == "runtime_exec")
    assert spec["parameters"]["required"] == ["command"]
    result = tool_messages(llm.requests[1])[-1][1]
    assert result == "exit code: 0\nstdout:\n42\nsandbox\nstderr: (empty)"
    assert answer == "The sandbox said:\n" + result
    (sbx,) = new_sandboxes()
    assert sbx.state == "stopped"
    assert sbx.network == {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]}
    sbx.start()
    assert sbx.files.read_text(f"answer-{token}.txt") == "42\n"


@pytest.mark.parametrize("reply", ["y", "n"])
def test_supervised(new_sandboxes, monkeypatch, reply):
    token = uuid.uuid4().hex[:12]
    command = f"touch made-{token}.txt && echo made"
    prompts = []

    def fake_input(prompt=""):
        prompts.append(prompt)
        return reply

    monkeypatch.setattr(builtins, "input", fake_input)
    script = [call("runtime_exec", command=command), answer_from_last_tool_result("Result: ")]
    with FakeLLM(script) as llm:
        answer = asyncio.run(supervised(model_for(llm), "Make a file."))
    assert llm.errors == []
    assert prompts == [f"Run `{command}`? [y/N] "]
    result = tool_messages(llm.requests[-1])[-1][1]
    assert answer == "Result: " + result
    (sbx,) = new_sandboxes()
    assert sbx.state == "stopped"
    sbx.start()
    if reply == "y":
        assert result == "exit code: 0\nstdout:\nmade\nstderr: (empty)"
        assert sbx.files.exists(f"made-{token}.txt")
    else:
        assert "rejected" in result.lower() and "exit code" not in result
        assert not sbx.files.exists(f"made-{token}.txt")


def test_the_event_loop_runs_while_a_tool_command_runs(sandbox):
    # The tool's command waits for a file that another task of the same event loop writes only
    # after it saw the command start: the command ends (before its timeout) only if the loop ran
    # that task, round trip after round trip, while the tool was waiting for the command.
    command = ("touch started; n=0; while [ ! -e go ]; do n=$((n+1)); [ $n -gt 400 ] && exit 9; "
               "sleep 0.05; done; echo met")
    script = [call("runtime_exec", command=command, timeout_seconds=60),
              answer_from_last_tool_result("")]

    async def main(llm):
        sbx = await AsyncSandbox.connect(sandbox.id)
        helper = await AsyncSandbox.connect(sandbox.id)
        order = []

        async def release():
            while not await helper.files.exists("started"):
                pass
            order.append("saw the command start")
            await helper.files.write("go", "")
            order.append("released it")

        agent = Agent(model=model_for(llm), tools=async_sandbox_tools(sbx))
        release_task = asyncio.create_task(release())
        out = await agent.arun("Wait for go.")
        order.append("the run ended")
        await release_task
        return out.content, order

    with FakeLLM(script) as llm:
        content, order = asyncio.run(main(llm))
    assert llm.errors == []
    assert content == "exit code: 0\nstdout:\nmet\nstderr: (empty)"
    assert order == ["saw the command start", "released it", "the run ended"]
