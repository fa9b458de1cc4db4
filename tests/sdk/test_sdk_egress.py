"""The seed's first example, verbatim, doing what it is for: an Agno agent whose sandbox may
reach only pypi.org and *.pythonhosted.org runs `pip install`, against a fake package index.

The daemon runs in a network namespace of the test's own whose only link leads to a fake
internet (tests/e2e/fakenet.py: DNS, pypi.org, files.pythonhosted.org, evil.test, with a test
CA), so nothing can leave the host; the SDK reaches it over its Unix socket through RUNTIME_URL,
as a user's program would. The model is the scripted local server (fakellm.py).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "e2e"))

import fakenet  # noqa: E402
from fakellm import FakeLLM, call, tool_messages  # noqa: E402
from test_sdk_agno import answer_from_last_tool_result, model_for, solve  # noqa: E402
from withruntime import Sandbox  # noqa: E402
from withruntime.client import Client  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WR_BIN = os.path.abspath(os.environ.get("WR_BIN", os.path.join(ROOT, "build", "withruntime")))
WR_AGENT = os.path.abspath(
    os.environ.get("WR_AGENT", os.path.join(ROOT, "build", "withruntime-agent")))
STATE_DIR = os.environ.get("WR_TEST_STATE_DIR", "/var/lib/withruntime-test")


@pytest.fixture(scope="module")
def egress_url():
    """A daemon with sandbox networking on, in fakenet's host namespace: its unix: URL."""
    images = os.path.join(STATE_DIR, "images")
    if not os.path.isdir(os.path.join(images, "default")):
        subprocess.run([WR_BIN, "--state-dir", STATE_DIR, "image", "build"], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=1800)
    tmp = tempfile.mkdtemp(prefix="wr-sdk-fakenet-")
    net = fakenet.FakeNet(tmp)
    state = tempfile.mkdtemp(prefix="wr-sdk-egress-", dir=os.path.dirname(STATE_DIR))
    proc = None
    try:
        net.start()
        os.symlink(images, os.path.join(state, "images"))
        sock = os.path.join(state, "withruntime.sock")
        log = open(os.path.join(state, "daemon.log"), "wb")
        proc = subprocess.Popen(
            ["nsenter", f"--net={net.host_ns}", WR_BIN, "serve", "--state-dir", state,
             "--listen", "none", "--socket", sock, "--agent", WR_AGENT, "--egress", "on",
             "--dns-upstream", fakenet.DNS_ADDR, "--public-ranges", fakenet.PUBLIC_RANGES,
             "--extra-ca-file", net.ca_pem],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        url = "unix:" + sock
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, open(os.path.join(state, "daemon.log")).read()[-3000:]
            try:
                Client(url).request_json("GET", "/v1/health")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url, net
        for sb in Client(url).request_json("GET", "/v1/sandboxes")["sandboxes"]:
            Client(url).request_json("DELETE", f"/v1/sandboxes/{sb['id']}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        net.stop()
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.timeout(300)
def test_solve_pip_installs_from_the_index_and_nothing_else(egress_url, monkeypatch):
    url, net = egress_url
    monkeypatch.setenv("RUNTIME_URL", url)
    monkeypatch.delenv("RUNTIME_API_KEY", raising=False)
    install = ("pip install --no-cache-dir wr-hello && "
               "python3 -c 'import wr_hello; print(wr_hello.greet())'")
    escape = "curl -sS -m 10 https://evil.test/ || echo blocked"
    script = [call("runtime_exec", command=install),
              call("runtime_exec", command=escape),
              answer_from_last_tool_result("Done:\n")]
    with FakeLLM(script) as llm:
        answer = solve(model_for(llm), "Install wr-hello from PyPI and run its greet().")
    assert llm.errors == []
    installed = tool_messages(llm.requests[1])[-1][1]
    assert installed.startswith("exit code: 0\n") and "hello from the fake index" in installed, \
        installed
    assert "blocked" in answer and "hello from evil" not in answer, answer
    # the index and the files host were reached, through the proxy; evil.test never was
    hosts = {r["host"] for r in net.requests()}
    assert {"pypi.org", "files.pythonhosted.org"} <= hosts, hosts
    assert "evil.test" not in hosts and "evil.test" not in net.dns_queries()
    # the sandbox (stopped by the example's `with`) says why evil.test was refused
    stopped = [s for s in Client(url).request_json("GET", "/v1/sandboxes")["sandboxes"]]
    assert len(stopped) == 1
    sbx = Sandbox.connect(stopped[0]["id"], client=Client(url))
    assert any(e["host"] == "evil.test" for e in sbx.network_log())
    sbx.delete()
