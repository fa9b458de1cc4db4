"""Agent tools over one sandbox: four plain functions that any framework that reads type hints
and docstrings (Agno, and others) can give to a model.

    from agno.agent import Agent
    from withruntime.tools import sandbox_tools

    run, read, write, ls = sandbox_tools(sbx)
    agent = Agent(model=model, tools=[run, read, write, ls])

``async_sandbox_tools(sbx)`` gives the same four tools as coroutine functions over an
:class:`~withruntime.AsyncSandbox`, for agents run with ``await agent.arun(...)``; both are
made from one definition of each tool.

Each tool returns a string meant for a model: it never raises for what happens in the sandbox
(a failing command, a missing file, a stopped sandbox); it says what happened so the model can
act on it. Long output is cut to a head and a tail with a note of how much was cut; binary files
are described, not dumped. The tools never show the API key.
"""

from __future__ import annotations

import posixpath
from typing import Any, Awaitable, Callable, List, Optional, Tuple

from ._ops import async_function, steps, sync_function

from .errors import (
    Conflict,
    DaemonUnavailable,
    ExecFailed,
    FileError,
    InvalidRequest,
    NotFound,
    WithruntimeError,
)
from .sandbox import AsyncSandbox, ExecResult, FileInfo, Sandbox

__all__ = ["sandbox_tools", "async_sandbox_tools", "trim_middle"]

WORKSPACE = "/workspace"

_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE",
            15: "SIGTERM"}


def trim_middle(text: str, limit: int) -> str:
    """Keeps the first and last parts of ``text`` (about 60% and 40% of ``limit`` characters)
    and says how much was cut between them."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = int(limit * 0.6)
    tail = limit - head
    cut = len(text) - head - tail
    return (f"{text[:head]}\n[... {cut} characters cut from the middle "
            f"({len(text)} in all) ...]\n{text[len(text) - tail:]}")


def _abs(path: str) -> str:
    if not path:
        return WORKSPACE
    return path if path.startswith("/") else posixpath.join(WORKSPACE, path)


def _error_text(e: WithruntimeError, what: str) -> str:
    """What a model is told when the sandbox (not the command) failed."""
    if isinstance(e, DaemonUnavailable):
        return (f"error: {what} failed: the sandbox service could not be reached ({e.message}). "
                f"Try again in a moment.")
    if isinstance(e, Conflict):
        return (f"error: {what} failed: the sandbox is not running ({e.message}). "
                f"It cannot run commands or touch files until it is started again.")
    if isinstance(e, ExecFailed):
        return f"error: the command could not start: {e.message}"
    if isinstance(e, InvalidRequest):
        return f"error: {what} was refused: {e.message}"
    return f"error: {what} failed: {e.message}"


def _exec_report(r: ExecResult, timeout: float, max_chars: int) -> str:
    lines = [f"exit code: {r.exit_code}"]
    if r.timed_out:
        lines.append(f"note: the command timed out after {timeout:g} seconds and was killed")
    elif r.signal is not None:
        name = _SIGNALS.get(r.signal, f"signal {r.signal}")
        lines.append(f"note: the command was killed by {name} ({r.signal})")
    for label, text, raw, truncated in (
            ("stdout", r.stdout, r.stdout_bytes, r.stdout_truncated),
            ("stderr", r.stderr, r.stderr_bytes, r.stderr_truncated)):
        if not text:
            lines.append(f"{label}: (empty)")
            continue
        if _as_text(raw, False, truncated) is None:
            # Replacement characters and NULs would only cost the model tokens and mislead it.
            more = "at least " if truncated else ""
            lines.append(f"{label}: binary output ({more}{len(raw)} bytes); not shown. Redirect it "
                         f"to a file and inspect that, e.g. `CMD > out.bin; file out.bin; "
                         f"xxd out.bin | head`.")
            continue
        lines.append(f"{label}:")
        lines.append(trim_middle(text, max_chars).rstrip("\n"))
        if truncated:
            lines.append(f"note: {label} was longer than the sandbox keeps; only its first part "
                         f"was captured (redirect to a file and read parts of it)")
    return "\n".join(lines)


def _entry_line(e: FileInfo) -> str:
    if e.type == "directory":
        return f"{e.name}/  (directory)"
    if e.type == "symlink":
        return f"{e.name} -> {e.target or '?'}  (symlink)"
    if e.type == "file":
        return f"{e.name}  ({e.size} bytes)"
    return f"{e.name}  ({e.type})"


def _as_text(data: bytes, mid_start: bool, mid_end: bool) -> Optional[Tuple[str, int]]:
    """``data`` as UTF-8 text and the number of bytes skipped at its start, or None when it
    looks binary. A read that starts (``mid_start``) or stops (``mid_end``) inside the file may
    split a character; the split pieces are left out rather than taken for binary."""
    if b"\x00" in data:
        return None
    skip = 0
    if mid_start:
        while skip < min(3, len(data)) and (data[skip] & 0xC0) == 0x80:
            skip += 1
    body = data[skip:]
    try:
        return body.decode("utf-8"), skip
    except UnicodeDecodeError as e:
        if mid_end and e.start >= len(body) - 3 and e.reason == "unexpected end of data":
            try:
                return body[:e.start].decode("utf-8"), skip
            except UnicodeDecodeError:
                return None
        return None


_TOOLS_DOC = """Returns the four tools for ``sbx``, in this order: ``runtime_exec``,
    ``runtime_read_file``, ``runtime_write_file``, ``runtime_list_files``.

    Args:
        sbx: The sandbox the tools act on.
        default_timeout_seconds: A command's timeout when the model gives none.
        max_output_chars: Characters of each of stdout and stderr shown to the model; longer
            output keeps its head and tail.
        max_read_bytes: Most bytes ``runtime_read_file`` returns in one call.
        max_list_entries: Most entries ``runtime_list_files`` shows.
    """


def sandbox_tools(
    sbx: Sandbox,
    *,
    default_timeout_seconds: int = 300,
    max_output_chars: int = 12000,
    max_read_bytes: int = 48000,
    max_list_entries: int = 300,
) -> List[Callable[..., str]]:
    if not isinstance(sbx, Sandbox):
        raise TypeError(f"sandbox_tools needs a Sandbox, not {type(sbx).__name__} (for an "
                        f"AsyncSandbox use async_sandbox_tools)")
    return [sync_function(t) for t in _tools(sbx, default_timeout_seconds, max_output_chars,
                                             max_read_bytes, max_list_entries)]


sandbox_tools.__doc__ = _TOOLS_DOC + """
    Each is a plain function (a closure over ``sbx``) named after its tool, with type hints and
    a Google-style docstring, safe to call from several threads at once.
    """


def async_sandbox_tools(
    sbx: AsyncSandbox,
    *,
    default_timeout_seconds: int = 300,
    max_output_chars: int = 12000,
    max_read_bytes: int = 48000,
    max_list_entries: int = 300,
) -> List[Callable[..., Awaitable[str]]]:
    if not isinstance(sbx, AsyncSandbox):
        raise TypeError(f"async_sandbox_tools needs an AsyncSandbox, not {type(sbx).__name__} "
                        f"(for a Sandbox use sandbox_tools)")
    return [async_function(t) for t in _tools(sbx, default_timeout_seconds, max_output_chars,
                                              max_read_bytes, max_list_entries)]


async_sandbox_tools.__doc__ = _TOOLS_DOC + """
    Each is a coroutine function with the same name, parameters, type hints and docstring as
    the one :func:`sandbox_tools` gives (so a model sees the same schema), for agents run with
    ``await agent.arun(...)``: the event loop runs on while a command runs. Wrap one in
    ``agno.tools.tool(requires_confirmation=True)`` as the sync ones.
    """


def _tools(
    sbx: Any,
    default_timeout_seconds: int,
    max_output_chars: int,
    max_read_bytes: int,
    max_list_entries: int,
) -> List[Callable[..., Any]]:
    """The four tools as operations (generators of steps, see ``_ops``), run by
    :func:`sandbox_tools` with blocking calls and by :func:`async_sandbox_tools` as
    coroutines."""

    def runtime_exec(command: str, cwd: Optional[str] = None,
                     timeout_seconds: Optional[int] = None) -> str:
        """Run a shell command in the Linux sandbox and report its exit code, stdout and stderr.

        The command runs with /bin/sh -c in a Debian Linux sandbox that has python3, pip, git,
        curl and build tools. Files persist between calls; /workspace is the working directory.
        A failing command is reported with its exit code, not raised. Long output is cut to its
        beginning and end.

        Args:
            command: The shell command to run, for example "python3 main.py" or "ls -la".
            cwd: Directory to run in; a relative path is taken under /workspace. Default: /workspace.
            timeout_seconds: Seconds before the command is killed. Default: 300.

        Returns:
            The exit code, stdout and stderr of the command, or an error message.
        """
        timeout = timeout_seconds if timeout_seconds and timeout_seconds > 0 \
            else default_timeout_seconds
        try:
            r = yield from steps(sbx.exec, command, cwd=cwd, timeout_seconds=timeout)
        except WithruntimeError as e:
            return _error_text(e, "running the command")
        return _exec_report(r, timeout, max_output_chars)

    def runtime_read_file(path: str, offset: Optional[int] = None,
                          length: Optional[int] = None) -> str:
        """Read a text file from the Linux sandbox.

        Returns the file's text. A long file is returned in parts: the answer then says which
        bytes it shows and the offset to read on from. Binary files are described, not shown.

        Args:
            path: The file to read; a relative path is taken under /workspace.
            offset: Byte offset to start reading at, to read a long file in parts. Default: 0.
            length: Maximum number of bytes to read. Default and maximum: 48000.

        Returns:
            The file's text, or a note saying why it cannot be shown.
        """
        full = _abs(path)
        start = offset if offset and offset > 0 else 0
        want = length if length and 0 < length < max_read_bytes else max_read_bytes
        try:
            st = yield from steps(sbx.files.stat, full)
            if st.type == "directory":
                return f"error: {st.path} is a directory; use runtime_list_files to see what is in it"
            # One byte more than shown tells whether more follows (a symlink's stat has no size).
            data = yield from steps(sbx.files.read, full, offset=start or None,
                                    length=want + 1)
        except NotFound:
            return f"error: {full} does not exist"
        except WithruntimeError as e:
            return _error_text(e, f"reading {full}")
        more = len(data) > want
        data = data[:want]
        size = f" of {st.size}" if st.type == "file" else ""
        decoded = _as_text(data, start > 0, more)
        if decoded is None:
            sized = f" ({st.size} bytes)" if st.type == "file" else ""
            return (f"{st.path} is a binary file{sized}; not shown. Inspect it with "
                    f"runtime_exec, e.g. `file {st.path}` or `xxd {st.path} | head`.")
        if not data:
            if start:
                return f"(nothing at offset {start}: {st.path} is {st.size} bytes long)"
            return f"({st.path} is an empty file)"
        text, skipped = decoded
        if more or start:
            start += skipped
            end = start + len(text.encode("utf-8"))
            note = f"[{st.path}: bytes {start}-{end}{size}"
            note += f"; read on with offset={end}]" if more else "; the end of the file]"
            return f"{text}\n{note}"
        return text

    def runtime_write_file(path: str, content: str) -> str:
        """Write a text file in the Linux sandbox, creating or replacing it.

        Missing parent directories are created.

        Args:
            path: The file to write; a relative path is taken under /workspace.
            content: The complete new text of the file.

        Returns:
            What was written, or an error message.
        """
        full = _abs(path)
        try:
            info = yield from steps(sbx.files.write, full, content)
        except WithruntimeError as e:
            return _error_text(e, f"writing {full}")
        return f"wrote {info.size} bytes to {info.path}"

    def runtime_list_files(path: Optional[str] = None) -> str:
        """List a directory in the Linux sandbox: names, types and sizes.

        Args:
            path: The directory to list; a relative path is taken under /workspace. Default: /workspace.

        Returns:
            One line per entry (directories end in /), or an error message.
        """
        full = _abs(path or WORKSPACE)
        try:
            entries = yield from steps(sbx.files.list, full)
        except NotFound:
            return f"error: {full} does not exist"
        except FileError as e:
            if e.errno == 20:  # ENOTDIR: say what it is instead
                try:
                    st = yield from steps(sbx.files.stat, full)
                    return f"{st.path} is not a directory: {_entry_line(st)}"
                except WithruntimeError:
                    pass
            return _error_text(e, f"listing {full}")
        except WithruntimeError as e:
            return _error_text(e, f"listing {full}")
        if not entries:
            return f"{full} is empty"
        entries.sort(key=lambda e: (e.type != "directory", e.name))
        shown = entries[:max_list_entries]
        count = "1 entry" if len(entries) == 1 else f"{len(entries)} entries"
        lines = [f"{full} ({count}):"] + [_entry_line(e) for e in shown]
        if len(entries) > len(shown):
            lines.append(f"[... {len(entries) - len(shown)} more entries not shown; use "
                         f"runtime_exec with ls or find to see them]")
        return "\n".join(lines)

    # The docstrings state the defaults; keep them true when the caller changed them.
    runtime_exec.__doc__ = (runtime_exec.__doc__ or "").replace(
        "Default: 300.", f"Default: {default_timeout_seconds}.")
    runtime_read_file.__doc__ = (runtime_read_file.__doc__ or "").replace(
        "Default and maximum: 48000.", f"Default and maximum: {max_read_bytes}.")
    for fn in (runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files):
        fn.__qualname__ = fn.__name__
    return [runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files]
