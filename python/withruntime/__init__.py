"""withruntime: disposable Linux sandboxes for AI agents, from Python.

    from withruntime import Sandbox
    from withruntime.tools import sandbox_tools

    with Sandbox.create(timeout_seconds=900, on_lease_end="stop") as sbx:
        print(sbx.exec("python3 -c 'print(6 * 7)'").stdout)   # 42
        tools = sandbox_tools(sbx)     # runtime_exec, runtime_read_file, ... for an agent

For asyncio, :class:`AsyncSandbox` is the same with every call a coroutine::

    async with AsyncSandbox.create(on_lease_end="delete") as sbx:
        print((await sbx.exec("echo hi")).stdout)
        tools = async_sandbox_tools(sbx)   # the same four tools, as coroutines

Both have a terminal: ``sbx.terminal()`` gives a :class:`Terminal` (``send``, ``recv``,
``resize``, ``signal``, ``eof``, ``wait``), ``await sbx.terminal()`` an :class:`AsyncTerminal`.

The daemon is found from ``RUNTIME_URL`` and ``RUNTIME_API_KEY``, else the connection saved by
``withruntime login``, else the local Unix socket (see :mod:`withruntime.client`). Standard
library only.
"""

from ._archive import DirTransfer, UnsafeArchive
from .async_client import AsyncClient
from .client import Client, Connection, resolve_connection
from .errors import (
    AuthError,
    CapacityError,
    ConfigurationError,
    CostLimit,
    Conflict,
    DaemonUnavailable,
    ExecFailed,
    FileError,
    FileTooLarge,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    SandboxError,
    ServerError,
    WithruntimeError,
)
from .sandbox import (
    CreateProgress,
    AsyncCommand,
    AsyncFiles,
    AsyncSandbox,
    Command,
    CommandOutput,
    ExecEvent,
    ExecResult,
    FileInfo,
    Files,
    Sandbox,
)
from ._terminal import AsyncTerminal, Terminal

__version__ = "0.1.0"

__all__ = [
    "Sandbox",
    "AsyncSandbox",
    "AsyncFiles",
    "AsyncCommand",
    "AsyncClient",
    "Terminal",
    "AsyncTerminal",
    "ExecResult",
    "ExecEvent",
    "CreateProgress",
    "FileInfo",
    "Files",
    "Command",
    "CommandOutput",
    "Client",
    "Connection",
    "resolve_connection",
    "WithruntimeError",
    "InvalidRequest",
    "AuthError",
    "CostLimit",
    "RateLimited",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "PayloadTooLarge",
    "SandboxError",
    "FileError",
    "FileTooLarge",
    "ExecFailed",
    "ServerError",
    "CapacityError",
    "DaemonUnavailable",
    "ConfigurationError",
    "DirTransfer",
    "UnsafeArchive",
    "__version__",
]
