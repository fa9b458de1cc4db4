"""A scripted OpenAI-compatible chat server on 127.0.0.1, for driving real Agno agents.

The openai client posts to ``{base_url}/chat/completions``; with ``base_url=server.base_url``
(``http://127.0.0.1:PORT/v1``) that is ``/v1/chat/completions``. Each request is recorded, and
answered by the script:

- a list: its items answer the requests in order;
- a callable ``f(request_json) -> item``: answers each request (for teams, where several agents
  talk to the same server and the answer depends on who asks).

An item is an assistant message: ``say("text")``, ``call("tool", arg=...)``, or a callable taking
the request and returning one of those (to answer with something computed from the request, such
as the tool output the model was just sent). When the script has no answer left the server
answers 500, so the test fails where the script and the agent disagree.
"""

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_ids = itertools.count(1)


def say(text):
    """An assistant message with a final answer."""
    return {"role": "assistant", "content": text}


def call(name, **arguments):
    """An assistant message asking for one tool call."""
    return calls((name, arguments))


def calls(*pairs):
    """An assistant message asking for several tool calls: ``calls(("name", {...}), ...)``."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{next(_ids)}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for name, args in pairs
        ],
    }


def tool_messages(request):
    """The tool results in a recorded request: a list of (tool_call_id, content)."""
    return [(m.get("tool_call_id"), _content_text(m.get("content")))
            for m in request.get("messages", []) if m.get("role") == "tool"]


def system_text(request):
    """All system (and developer) message text of a recorded request."""
    return "\n".join(_content_text(m.get("content")) for m in request.get("messages", [])
                     if m.get("role") in ("system", "developer"))


def tool_names(request):
    """The names of the tools offered in a recorded request."""
    return [t["function"]["name"] for t in request.get("tools", []) or []]


def _content_text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


class FakeLLM:
    """Use as a context manager: ``with FakeLLM(script) as llm: OpenAIChat(base_url=llm.base_url)``."""

    def __init__(self, script):
        self._script = script
        self._pos = 0
        self._lock = threading.Lock()
        self.requests = []   # the JSON bodies, in arrival order
        self.errors = []     # what went wrong on the server side
        self._server = None
        self._thread = None

    @property
    def base_url(self):
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def _next(self, request):
        with self._lock:
            self.requests.append(request)
            if callable(self._script):
                item = self._script(request)
            elif self._pos < len(self._script):
                item = self._script[self._pos]
                self._pos += 1
            else:
                item = None
        if callable(item):
            item = item(request)
        return item

    def start(self):
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    llm.errors.append(f"unexpected path {self.path}")
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    request = json.loads(raw)
                except ValueError:
                    llm.errors.append("request body is not JSON")
                    self._send(400, {"error": {"message": "bad JSON"}})
                    return
                try:
                    message = llm._next(request)
                except Exception as e:  # a script bug: fail the request visibly
                    llm.errors.append(f"script raised {e!r}")
                    message = None
                if message is None:
                    llm.errors.append(f"no scripted answer for request #{len(llm.requests)}")
                    self._send(500, {"error": {"message": "the script has no answer left",
                                               "type": "server_error"}})
                    return
                if request.get("stream"):
                    self._stream(request, message)
                    return
                self._send(200, {
                    "id": f"chatcmpl-{next(_ids)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": request.get("model", "gpt-4o"),
                    "choices": [{"index": 0, "message": message, "logprobs": None,
                                 "finish_reason": "tool_calls" if message.get("tool_calls")
                                 else "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                })

            def _stream(self, request, message):
                """The same answer as server-sent chunks, for callers that ask to stream."""
                cid = f"chatcmpl-{next(_ids)}"
                base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": request.get("model", "gpt-4o")}
                delta = {"role": "assistant"}
                if message.get("content") is not None:
                    delta["content"] = message["content"]
                if message.get("tool_calls"):
                    delta["tool_calls"] = [dict(tc, index=i)
                                           for i, tc in enumerate(message["tool_calls"])]
                chunks = [
                    dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": None}]),
                    dict(base, choices=[{"index": 0, "delta": {},
                                         "finish_reason": "tool_calls"
                                         if message.get("tool_calls") else "stop"}]),
                ]
                body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
                body += b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
