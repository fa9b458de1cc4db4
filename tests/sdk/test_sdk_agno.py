"""The seed's examples, verbatim, with the real Agno and the real openai client talking to a
scripted OpenAI-compatible server on 127.0.0.1, and real sandboxes.

`solve` and `supervised` below are copied unchanged from seed/examples.md (a test checks that).
"""

import asyncio
import builtins
import os
import re
import uuid

import pytest
from agno.models.openai import OpenAIChat
from agno.team import Team

from fakellm import FakeLLM, call, calls, say, system_text, tool_messages, tool_names

# ---- verbatim from seed/examples.md, section 1 ----
from agno.agent import Agent
from withruntime import Sandbox
from withruntime.tools import sandbox_tools

def solve(model, task: str) -> str:
    with Sandbox.create(
        network={"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]},
        timeout_seconds=900,
        on_lease_end="stop",
    ) as sbx:
        agent = Agent(
            model=model,
            tools=sandbox_tools(sbx),
            instructions="Use the Linux sandbox for any code. Check exit codes.",
        )
        return str(agent.run(task).content)
# ---- end of section 1 ----

# ---- verbatim from seed/examples.md, section 2 ----
from agno.agent import Agent
from agno.tools import tool
from withruntime import Sandbox
from withruntime.tools import sandbox_tools

def supervised(model, task: str) -> str:
    with Sandbox.create(timeout_seconds=1800, on_lease_end="stop") as sbx:
        run, read, write, ls = sandbox_tools(sbx)
        agent = Agent(model=model, tools=[tool(requires_confirmation=True)(run), read, write, ls])
        response = agent.run(task)
        while response.is_paused:
            for requirement in response.active_requirements:
                if requirement.needs_confirmation:
                    command = requirement.tool_execution.tool_args["command"]
                    if input(f"Run `{command}`? [y/N] ").lower() == "y":
                        requirement.confirm()
                    else:
                        requirement.reject()
            response = agent.continue_run(response)
        return str(response.content)
# ---- end of section 2 ----

TOOL_NAMES = {"runtime_exec", "runtime_read_file", "runtime_write_file", "runtime_list_files"}
HERE = os.path.dirname(os.path.abspath(__file__))


def model_for(llm):
    return OpenAIChat(id="gpt-4o", base_url=llm.base_url, api_key="test")


def answer_from_last_tool_result(prefix):
    """A scripted turn: the model's final answer quotes the tool result it was sent."""
    def turn(request):
        results = tool_messages(request)
        assert results, "the model was not sent a tool result"
        return say(prefix + results[-1][1])
    return turn


def test_examples_are_verbatim():
    seed = os.path.join(HERE, "..", "..", "..", "shared", "seed", "examples.md")
    if not os.path.exists(seed):
        # CI lays shared/ beside the clone and sets CI: there a missing file is a failure, not
        # a reason to skip the one check that the examples are the seed's, unchanged.
        if os.environ.get("CI"):
            pytest.fail(f"seed examples not found at {seed} (CI is set)")
        pytest.skip(f"seed examples not found at {seed}")
    with open(seed) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    with open(__file__) as f:
        me = f.read()
    assert len(blocks) == 2
    for block in blocks:
        assert block in me


def test_solve(new_sandboxes):
    token = uuid.uuid4().hex[:12]
    command = f"python3 -c 'print(6 * 7)' | tee answer-{token}.txt; cat /etc/hostname"
    script = [call("runtime_exec", command=command),
              answer_from_last_tool_result("The sandbox said:\n")]
    with FakeLLM(script) as llm:
        answer = solve(model_for(llm), "What is 6 * 7? Compute it.")
    assert llm.errors == []

    # what the model saw: the four tools, runtime_exec with a required command
    first = llm.requests[0]
    assert set(tool_names(first)) == TOOL_NAMES
    spec = next(t["function"] for t in first["tools"]
                if t["function"]["name"] == "runtime_exec")
    assert spec["parameters"]["required"] == ["command"]
    assert set(spec["parameters"]["properties"]) == {"command", "cwd", "timeout_seconds"}
    assert "Check exit codes." in system_text(first)

    # the tool result the model got back: the command ran in a sandbox (hostname "sandbox")
    result = tool_messages(llm.requests[1])[-1][1]
    assert result == "exit code: 0\nstdout:\n42\nsandbox\nstderr: (empty)"
    assert answer == "The sandbox said:\n" + result

    # leaving the with-block stopped the sandbox; its files are still there
    (sbx,) = new_sandboxes()
    assert sbx.state == "stopped"
    assert sbx.network == {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]}
    assert sbx.timeout_seconds == 900
    assert not os.path.exists(f"/workspace/answer-{token}.txt")
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
    script = [call("runtime_exec", command=command),
              answer_from_last_tool_result("Result: ")]
    with FakeLLM(script) as llm:
        answer = supervised(model_for(llm), "Make a file.")
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
        assert "rejected" in result.lower()
        assert "exit code" not in result
        assert not sbx.files.exists(f"made-{token}.txt")


def team_script(member_turns, steps):
    """Leader: turn n delegates `steps[n]` (a list of (member id, task), sent in one message),
    then answers with what the members reported. Member X (told "You are X."): calls the tool
    `member_turns[X]` names, then reports the tool's result."""
    def script(request):
        results = tool_messages(request)
        if "delegate_task_to_member" in tool_names(request):
            turn = sum(1 for m in request["messages"]
                       if m.get("role") == "assistant" and m.get("tool_calls"))
            if turn < len(steps):
                return calls(*[("delegate_task_to_member", {"member_id": m, "task": t})
                               for m, t in steps[turn]])
            return say("team: " + " | ".join(r[1] for r in results))
        me = re.search(r"You are (\w+)\.", system_text(request)).group(1)
        if not results:
            name, args = member_turns[me]
            return call(name, **args)
        return say(f"{me}: {results[-1][1]}")
    return script


def test_team_members_share_a_sandbox(sandbox):
    script = team_script(
        member_turns={
            "writer": ("runtime_write_file", {"path": "shared/notes.txt",
                                              "content": "written by the writer\n"}),
            "reader": ("runtime_read_file", {"path": "/workspace/shared/notes.txt"}),
        },
        steps=[[("writer", "Write shared/notes.txt")], [("reader", "Read shared/notes.txt")]])
    with FakeLLM(script) as llm:
        members = [
            Agent(name="Writer", role="Writes files", model=model_for(llm),
                  tools=sandbox_tools(sandbox), instructions="You are writer."),
            Agent(name="Reader", role="Reads files", model=model_for(llm),
                  tools=sandbox_tools(sandbox), instructions="You are reader."),
        ]
        out = Team(members=members, model=model_for(llm)).run("Write a note, then read it.")
    assert llm.errors == []
    assert out.content == ("team: writer: wrote 22 bytes to /workspace/shared/notes.txt | "
                           "reader: written by the writer")
    assert sandbox.files.read("shared/notes.txt") == b"written by the writer\n"


def test_team_members_run_tools_at_the_same_time(sandbox):
    # Each member's command waits until the other's has started: both finish only if the two
    # tools run at once (Agno's async team runs delegated members concurrently).
    wait = "touch {me}.ready; while [ ! -e {other}.ready ]; do sleep 0.05; done; echo {me} met {other}"
    script = team_script(
        member_turns={
            "alpha": ("runtime_exec", {"command": wait.format(me="alpha", other="beta"),
                                       "timeout_seconds": 60}),
            "beta": ("runtime_exec", {"command": wait.format(me="beta", other="alpha"),
                                      "timeout_seconds": 60}),
        },
        steps=[[("alpha", "go"), ("beta", "go")]])
    with FakeLLM(script) as llm:
        members = [
            Agent(name="Alpha", role="First", model=model_for(llm), tools=sandbox_tools(sandbox),
                  instructions="You are alpha."),
            Agent(name="Beta", role="Second", model=model_for(llm), tools=sandbox_tools(sandbox),
                  instructions="You are beta."),
        ]
        out = asyncio.run(Team(members=members, model=model_for(llm)).arun("Meet."))
    assert llm.errors == []
    assert "alpha: exit code: 0\nstdout:\nalpha met beta" in out.content
    assert "beta: exit code: 0\nstdout:\nbeta met alpha" in out.content
