"""Operations written once, run by the sync SDK and by the async one.

Every call that talks to the daemon (``Sandbox.exec``, ``Files.write``, an agent tool, ...) is
written once, as a generator of *steps*: it yields what it needs done and gets the result sent
back in (or the error thrown in), and returns its answer::

    @operation
    def stop(self) -> "Sandbox":
        info = yield Call(self._client, "request_json", "POST", self._path + "/stop")
        return self._update(info)

Request building, argument validation and the decoding of answers live in the generator; only
the I/O lives in the two runners: :func:`run_sync` does each step with blocking calls,
:func:`run_async` awaits it. ``@operation``, ``@iteration`` and ``@class_operation`` mark such
generators on a shared base class; :func:`sync_face` and :func:`async_face` turn the marks into
plain methods on the sync class and coroutine methods on the async one (an ``@iteration`` into a
generator and an async iterator). One operation uses another with ``yield from steps(...)``.

The steps:

- :class:`Call`: a method of the object's client (``request``, ``request_json`` or
  ``stream_ndjson``), given the client of the face (a ``Client`` or an ``AsyncClient``);
- :class:`NextLine`: the next object from a ``stream_ndjson`` source (None at its end);
- :class:`ReadPiece`: ``file.read(size)`` of a caller's file object (in a thread when async,
  so a slow file does not hold the event loop);
- :class:`Emit`: a value an ``@iteration`` hands to its caller.
"""

from __future__ import annotations

import asyncio
import functools
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
    "sync_face",
    "async_face",
    "sync_function",
    "async_function",
    "steps",
    "run_sync",
    "run_async",
    "AsyncStepIterator",
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


class _Stepper:
    """Drives one operation's generator: hands out its steps, sends results or throws errors
    in, and remembers the line sources it opened so they are closed with it."""

    def __init__(self, gen: Steps) -> None:
        self.gen = gen
        self.sources: List[Any] = []
        self._value: Any = None
        self._error: Optional[BaseException] = None

    def step(self) -> Any:
        """The next step; StopIteration (with the operation's answer) when it is done."""
        value, error = self._value, self._error
        self._value = self._error = None
        if error is not None:
            return self.gen.throw(error)
        return self.gen.send(value)

    def result(self, value: Any) -> None:
        self._value = value

    def error(self, error: Exception) -> None:
        self._error = error

    def call_of(self, step: Call) -> Tuple[Callable[..., Any], bool]:
        """The client method a Call names, and whether it opens a line source."""
        return getattr(step.client, step.method), step.method == "stream_ndjson"


def _not_a_step(step: Any) -> TypeError:
    return TypeError(f"an operation yielded {step!r}, which is not a step")


# ---- the sync runner ----


def _sync_steps(gen: Steps) -> Generator[Any, None, Any]:
    """Runs an operation with blocking I/O; yields what it emits, returns its answer."""
    st = _Stepper(gen)
    try:
        while True:
            try:
                step = st.step()
            except StopIteration as done:
                return done.value
            if isinstance(step, Emit):
                yield step.value
                continue
            try:
                if isinstance(step, Call):
                    fn, opens = st.call_of(step)
                    value = fn(*step.args, **step.kwargs)
                    if opens:
                        st.sources.append(value)
                elif isinstance(step, NextLine):
                    value = next(step.source, None)
                elif isinstance(step, ReadPiece):
                    value = step.file.read(step.size)
                else:
                    raise _not_a_step(step)
            except Exception as e:  # thrown into the operation, which may handle it
                st.error(e)
            else:
                st.result(value)
    finally:
        gen.close()
        for source in st.sources:
            source.close()


def run_sync(gen: Steps) -> Any:
    """Runs an operation that emits nothing and returns its answer."""
    it = _sync_steps(gen)
    try:
        emitted = next(it)
    except StopIteration as done:
        return done.value
    it.close()
    raise TypeError(f"an operation emitted {emitted!r}; use it as an @iteration")


def iter_sync(gen: Steps) -> Generator[Any, None, None]:
    """Runs an ``@iteration`` with blocking I/O: a generator of what it emits."""
    yield from _sync_steps(gen)


# ---- the async runner ----


class _AsyncRun:
    """Runs an operation on the running event loop."""

    def __init__(self, gen: Steps) -> None:
        self._st = _Stepper(gen)
        self._closed = False

    async def next(self) -> Tuple[bool, Any]:
        """Runs until the operation emits ``(False, value)`` or returns ``(True, answer)``."""
        st = self._st
        while True:
            try:
                step = st.step()
            except StopIteration as done:
                return True, done.value
            if isinstance(step, Emit):
                return False, step.value
            try:
                if isinstance(step, Call):
                    fn, opens = st.call_of(step)
                    if opens:
                        value = fn(*step.args, **step.kwargs)
                        st.sources.append(value)
                    else:
                        value = await fn(*step.args, **step.kwargs)
                elif isinstance(step, NextLine):
                    value = await step.source.next_or_none()
                elif isinstance(step, ReadPiece):
                    loop = asyncio.get_running_loop()
                    value = await loop.run_in_executor(None, step.file.read, step.size)
                else:
                    raise _not_a_step(step)
            except Exception as e:  # thrown into the operation, which may handle it
                st.error(e)
            else:
                st.result(value)

    def abort(self) -> None:
        """Ends the operation now (a cancelled task, an abandoned iterator): closes its
        generator and drops the connections of its line sources, without waiting."""
        if self._closed:
            return
        self._closed = True
        self._st.gen.close()
        for source in self._st.sources:
            source.abort()


async def run_async(gen: Steps) -> Any:
    """Runs an operation that emits nothing and returns its answer."""
    run = _AsyncRun(gen)
    try:
        done, value = await run.next()
    finally:
        run.abort()
    if not done:
        raise TypeError(f"an operation emitted {value!r}; use it as an @iteration")
    return value


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
        self._run = _AsyncRun(gen)

    def __aiter__(self) -> "AsyncStepIterator":
        return self

    async def __anext__(self) -> Any:
        try:
            done, value = await self._run.next()
        except BaseException:
            self._run.abort()
            raise
        if done:
            self._run.abort()
            raise StopAsyncIteration
        return value

    async def aclose(self) -> None:
        """Ends the operation and closes its connection."""
        self._run.abort()

    def close(self) -> None:
        """The same as :meth:`aclose`, for code that cannot await."""
        self._run.abort()

    async def __aenter__(self) -> "AsyncStepIterator":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._run.abort()

    def __del__(self) -> None:
        try:
            self._run.abort()
        except Exception:  # noqa: BLE001 - at interpreter exit the loop may be gone
            pass


# ---- marking operations and making the faces ----


class _Op:
    """An operation's generator function on a shared base class, until a face replaces it."""

    def __init__(self, fn: Callable[..., Any], kind: str, on_class: bool) -> None:
        self.fn = fn
        self.kind = kind
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


def class_operation(fn: Callable[..., Any]) -> Any:
    """:func:`operation` for a classmethod (``Sandbox.create``)."""
    return _Op(fn, "call", True)


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
    ("async", "call"): async_function,
    ("async", "iter"): _async_iter_function,
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
