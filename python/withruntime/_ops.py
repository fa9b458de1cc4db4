"""Operations written once, run by the sync SDK and by the async one.

Every call that talks to the daemon (``Sandbox.exec``, ``Files.write``, an agent tool, ...) is
written once, as a generator of *steps*: it yields what it needs done and gets the result sent
back in (or the error thrown in), and returns its answer::

    @operation
    def stop(self) -> "Sandbox":
        info = yield from steps(self._client.request_json, "POST", self._path + "/stop")
        return self._update(info)

Request building, argument validation and the decoding of answers live in the generators; only
the I/O lives in the clients (``Client._exchange`` blocks, ``AsyncClient._exchange`` is
awaited) and in the runner, which does each step with a blocking call (:func:`run_sync`) or
awaits it (:func:`run_async`). ``@operation``, ``@iteration``, ``@class_operation`` and
``@class_context_operation`` mark such generators on a shared base class; :func:`sync_face`
and :func:`async_face` turn the marks into plain methods on the sync class and coroutine
methods on the async one (an ``@iteration`` into a generator and an async iterator). One
operation runs another's steps with ``yield from steps(obj.method, ...)``.

The steps:

- :class:`Call`: a method of a client that does I/O (``_exchange``, ``stream_ndjson``),
  awaited when it gives an awaitable;
- :class:`NextLine`: the next object from a ``stream_ndjson`` source (None at its end);
- :class:`ReadPiece`: ``file.read(size)`` of a caller's file object (in a thread when async,
  so a slow file does not hold the event loop);
- :class:`Emit`: a value an ``@iteration`` hands to its caller.
"""

from __future__ import annotations

import asyncio
import collections.abc
import functools
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional, Tuple

__all__ = [
    "Call",
    "NextLine",
    "ReadPiece",
    "Emit",
    "operation",
    "iteration",
    "class_operation",
    "context_operation",
    "class_context_operation",
    "AwaitableContext",
    "sync_face",
    "async_face",
    "sync_function",
    "async_function",
    "steps",
    "run_sync",
    "run_async",
    "AsyncStepIterator",
    "Steps",
]

Steps = Generator[Any, Any, Any]


@dataclass
class Call:
    """Calls ``getattr(client, method)(*args, **kwargs)``: awaited when the client is async.
    ``stream_ndjson`` gives a line source for :class:`NextLine`, closed when the operation
    ends."""

    client: Any
    method: str
    args: Tuple[Any, ...] = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)

    def __init__(self, client: Any, method: str, *args: Any, **kwargs: Any) -> None:
        self.client = client
        self.method = method
        self.args = args
        self.kwargs = kwargs


@dataclass
class NextLine:
    """The next object of a line source that a ``stream_ndjson`` :class:`Call` gave."""

    source: Any


@dataclass
class ReadPiece:
    """``file.read(size)``."""

    file: Any
    size: int


@dataclass
class Emit:
    """A value an ``@iteration`` yields to its caller."""

    value: Any


def _not_a_step(step: Any) -> TypeError:
    return TypeError(f"an operation yielded {step!r}, which is not a step")


class _Run:
    """Runs one operation: hands its steps to the I/O, sends each result (or throws each error)
    back in, and keeps the line sources it opened so they are closed with it.

    :meth:`next` is a coroutine for both runners: on an event loop (``in_loop``) it awaits each
    step; for the sync runner every step is a blocking call that gives its value at once, so
    the coroutine never suspends and :func:`_sync_await` runs it without a loop."""

    def __init__(self, gen: Steps, in_loop: bool) -> None:
        self.gen = gen
        self.in_loop = in_loop
        self.sources: List[Any] = []
        self.closed = False

    def _do(self, step: Any) -> Any:
        """Starts a step: its value, or (in_loop) something to await for it."""
        if isinstance(step, Call):
            value = getattr(step.client, step.method)(*step.args, **step.kwargs)
            if step.method == "stream_ndjson":
                self.sources.append(value)
            return value
        if isinstance(step, NextLine):
            return step.source.next_or_none() if self.in_loop else next(step.source, None)
        if isinstance(step, ReadPiece):
            if self.in_loop:
                loop = asyncio.get_running_loop()
                return loop.run_in_executor(None, step.file.read, step.size)
            return step.file.read(step.size)
        raise _not_a_step(step)

    async def next(self) -> Tuple[bool, Any]:
        """Runs until the operation emits ``(False, value)`` or returns ``(True, answer)``."""
        value: Any = None
        error: Optional[Exception] = None
        while True:
            try:
                step = self.gen.throw(error) if error is not None else self.gen.send(value)
            except StopIteration as done:
                return True, done.value
            if isinstance(step, Emit):
                return False, step.value
            value, error = None, None
            try:
                value = self._do(step)
                if self.in_loop and inspect.isawaitable(value):
                    value = await value
            except Exception as e:  # thrown into the operation, which may handle it
                value, error = None, e

    def close(self) -> None:
        """Ends the operation now (done, failed, cancelled, or abandoned): closes its generator
        and the connections of its line sources, without waiting."""
        if self.closed:
            return
        self.closed = True
        self.gen.close()
        for source in self.sources:
            source.close()


def _sync_await(coro: Any) -> Any:
    """Runs a coroutine that never suspends (a sync :class:`_Run`'s ``next``)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a blocking operation waited for an event loop")


def _answer(done: bool, value: Any) -> Any:
    if not done:
        raise TypeError(f"an operation emitted {value!r}; use it as an @iteration")
    return value


def run_sync(gen: Steps) -> Any:
    """Runs an operation with blocking I/O and returns its answer."""
    run = _Run(gen, in_loop=False)
    try:
        return _answer(*_sync_await(run.next()))
    finally:
        run.close()


def iter_sync(gen: Steps) -> Generator[Any, None, None]:
    """Runs an ``@iteration`` with blocking I/O: a generator of what it emits."""
    run = _Run(gen, in_loop=False)
    try:
        while True:
            done, value = _sync_await(run.next())
            if done:
                return
            yield value
    finally:
        run.close()


async def run_async(gen: Steps) -> Any:
    """Runs an operation on the running event loop and returns its answer."""
    run = _Run(gen, in_loop=True)
    try:
        return _answer(*(await run.next()))
    finally:
        run.close()


class AsyncStepIterator:
    """What an async ``@iteration`` returns: an async iterator over what the operation emits.

    Leaving an ``async for`` early (``break``, an exception, a cancelled task) ends the
    operation and closes its connection (the daemon then stops the command of an
    ``exec_stream``): at once when the task is cancelled while it waits for the next item or
    when :meth:`aclose` is called or the ``async with`` block is left, else when the iterator is
    dropped::

        async with sbx.exec_stream("make") as events:
            async for ev in events:
                ...
    """

    def __init__(self, gen: Steps) -> None:
        self._run = _Run(gen, in_loop=True)

    def __aiter__(self) -> "AsyncStepIterator":
        return self

    async def __anext__(self) -> Any:
        try:
            done, value = await self._run.next()
        except BaseException:
            self._run.close()
            raise
        if done:
            self._run.close()
            raise StopAsyncIteration
        return value

    async def aclose(self) -> None:
        """Ends the operation and closes its connection."""
        self._run.close()

    def close(self) -> None:
        """The same as :meth:`aclose`, for code that cannot await."""
        self._run.close()

    async def __aenter__(self) -> "AsyncStepIterator":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._run.close()

    def __del__(self) -> None:
        try:
            self._run.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the loop may be gone
            pass


# ---- marking operations and making the faces ----


class _Op:
    """An operation's generator function on a shared base class, until a face replaces it."""

    def __init__(self, fn: Callable[..., Any], kind: str, on_class: bool) -> None:
        self.fn = fn
        self.kind = kind  # "call", "iter", or "enter": a call whose answer is a context manager
        self.on_class = on_class
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.fn.__qualname__} is an operation of a base class; call it on "
                        f"the sync or async class")


def operation(fn: Callable[..., Any]) -> Any:
    """Marks a generator method as an operation that returns one answer."""
    return _Op(fn, "call", False)


def iteration(fn: Callable[..., Any]) -> Any:
    """Marks a method returning a generator (of steps and :class:`Emit`) as an operation whose
    caller iterates over what it emits."""
    return _Op(fn, "iter", False)


def context_operation(fn: Callable[..., Any]) -> Any:
    """:func:`operation` whose answer is a context manager (``sbx.terminal``): the async face
    gives an :class:`AwaitableContext`, so both ``term = await sbx.terminal()`` and
    ``async with sbx.terminal() as term:`` work."""
    return _Op(fn, "enter", False)


def class_operation(fn: Callable[..., Any]) -> Any:
    """:func:`operation` for a classmethod (``Sandbox.list``)."""
    return _Op(fn, "call", True)


def class_context_operation(fn: Callable[..., Any]) -> Any:
    """:func:`class_operation` whose answer is a context manager (``Sandbox.create``): the async
    face gives an :class:`AwaitableContext`, so both ``sbx = await AsyncSandbox.create()`` and
    ``async with AsyncSandbox.create() as sbx:`` work."""
    return _Op(fn, "enter", True)


class AwaitableContext(collections.abc.Coroutine):  # type: ignore[type-arg]
    """A call of an async operation whose answer is an async context manager: a coroutine (await
    it, or give it to ``asyncio.create_task``, ``gather``, ``run``) for the answer, which can
    also be used in ``async with`` directly (the answer's ``__aenter__`` and ``__aexit__`` run
    around the block)."""

    def __init__(self, coro: Any) -> None:
        self._coro = coro
        self._entered: Any = None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()  # type: ignore[no-any-return]

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, *args: Any) -> Any:
        return self._coro.throw(*args)

    def close(self) -> None:
        self._coro.close()

    async def __aenter__(self) -> Any:
        self._entered = await self._coro
        return await self._entered.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._entered.__aexit__(*exc)


def sync_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function that runs the operation ``fn`` with blocking I/O."""

    def run(*args: Any, **kwargs: Any) -> Any:
        return run_sync(fn(*args, **kwargs))

    return functools.update_wrapper(run, fn)


def async_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A coroutine function that runs the operation ``fn`` on the running event loop."""

    async def run(*args: Any, **kwargs: Any) -> Any:
        return await run_async(fn(*args, **kwargs))

    return functools.update_wrapper(run, fn)


def _async_enter_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> AwaitableContext:
        return AwaitableContext(run_async(fn(*args, **kwargs)))

    return functools.update_wrapper(run, fn)


def _sync_iter_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return iter_sync(fn(*args, **kwargs))

    return functools.update_wrapper(run, fn)


def _async_iter_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return AsyncStepIterator(fn(*args, **kwargs))

    return functools.update_wrapper(run, fn)


_FACES = {
    ("sync", "call"): sync_function,
    ("sync", "iter"): _sync_iter_function,
    ("sync", "enter"): sync_function,
    ("async", "call"): async_function,
    ("async", "iter"): _async_iter_function,
    ("async", "enter"): _async_enter_function,
}


def _make_face(cls: type, face: str, rename: Mapping[str, str]) -> type:
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, rename)) + r")\b") if rename else None
    for base in reversed(cls.__mro__):
        for name, attr in list(vars(base).items()):
            if not isinstance(attr, _Op):
                continue
            method = _FACES[(face, attr.kind)](attr.fn)
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            if pattern is not None:
                method.__annotations__ = {
                    k: pattern.sub(lambda m: rename[m.group(1)], v) if isinstance(v, str) else v
                    for k, v in attr.fn.__annotations__.items()}
            setattr(cls, name, classmethod(method) if attr.on_class else method)
    cls._face = face  # type: ignore[attr-defined]
    return cls


def sync_face(cls: type) -> type:
    """Class decorator: every operation of the class's bases becomes a blocking method."""
    return _make_face(cls, "sync", {})


def async_face(**rename: str) -> Callable[[type], type]:
    """Class decorator: every operation of the class's bases becomes a coroutine method (an
    ``@iteration`` a method returning an :class:`AsyncStepIterator`). ``rename`` maps names in
    the operations' annotations to the async names (``Sandbox="AsyncSandbox"``)."""

    def make(cls: type) -> type:
        return _make_face(cls, "async", rename)

    return make


def steps(method: Any, *args: Any, **kwargs: Any) -> Steps:
    """The steps of a face's operation, to run inside another operation:
    ``info = yield from steps(sbx.files.stat, path)``."""
    fn = getattr(method, "__func__", method)
    owner = getattr(method, "__self__", None)
    gen_fn = getattr(fn, "__wrapped__", None)
    if gen_fn is None or owner is None:
        raise TypeError(f"{method!r} is not an operation of a sandbox, file or command object")
    return gen_fn(owner, *args, **kwargs)  # type: ignore[no-any-return]
