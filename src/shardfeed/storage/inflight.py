"""Storage calls in flight: started off the caller's thread, waited on, abandoned at once.

A remote read must never leave a thread stuck in a wait that nothing can end: a server that
accepts connections and never answers would otherwise hold the reader (and Ctrl-C, and
``close()``, and the interpreter's exit) for as long as the client library keeps retrying.
So every attempt runs *beside* the caller, and the caller only waits on its future:

::

    caller thread                     where the attempt runs
    -------------                     ----------------------
    start_fs_call(fs, "cat_file") ->  async filesystem (s3fs, gcsfs, http): a task on
                                      fsspec's event loop; cancelling the future cancels it
                                      any other filesystem: a daemon thread; cancelling the
                                      future abandons it (it ends when its call returns)
    wait(futures + wake, timeout)     wakes on a result, on the deadline, on Ctrl-C (a
                                      signal interrupts the wait), or when ``wake`` is
                                      completed by ``close()`` or the interpreter's exit

A :class:`CallGroup` holds the ``wake`` futures of the calls running on one source:
``cancel_all()`` (the source's ``close()``) makes each of them stop waiting and cancel its
attempts. A CallGroup is also a cancel token: the calls made while it is the current one
(:func:`under`; on the threads their work was submitted to, too) join it as well, so that
``token.cancel_all()`` ends the calls of one Loader's pass, whatever sources they read
(the Loader's ``close()``), and leaves every other call alone.

:func:`interrupt_calls` ends every call in flight in the process (a Loader's epoch closed
while Ctrl-C goes up calls it, so that waiting for its workers does not mean waiting on a
dead server), and :func:`abandon_all_calls` every call now and later; it runs
when the interpreter exits, before it joins the threads of thread pools, so a pool thread
that is waiting on a dead server does not hold the exit.

Determinism: none needed (no data decided here). State: the calls in flight, kept by
:data:`~shardfeed.storage.process_state.PROCESS` (a forked child has none of its parent's).
Memory: one future per attempt in flight; on a synchronous filesystem, a daemon thread for
each attempt ever in flight at once (kept for the next: see
:mod:`shardfeed.storage.daemon_threads`).
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - registers its exit hook first (see the end)
import contextlib
import inspect
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from shardfeed.storage.daemon_threads import CANCEL, DaemonThreads
from shardfeed.storage.process_state import PROCESS

T = TypeVar("T")

__all__ = [
    "CallGroup",
    "ClosedError",
    "abandon_all_calls",
    "cancelled",
    "exiting",
    "interrupt_calls",
    "interrupts",
    "is_async",
    "start_coroutine",
    "start_fs_call",
    "start_in_thread",
    "under",
]


class ClosedError(Exception):
    """Raised inside :class:`CallGroup.enter` when the group was closed."""


def start_in_thread(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn()`` on a daemon thread (one kept for the next call: see
    :mod:`shardfeed.storage.daemon_threads`); its future.

    Daemon, because an abandoned call may never return, and a non-daemon thread would hold
    the interpreter's exit until it does. Cancelling the future abandons the call: its
    thread is free again when ``fn`` returns, and its result is dropped.
    """
    return _CALL_THREADS.submit(fn)


STORAGE_CALLS = 1024
"""Blocking storage calls in flight at once in a process (a thread each); beyond, calls wait
in order. Each call is a leaf (it starts no other call on these threads) and is left at its
deadline: obstore's client ends its request then (see ``obstore_backend``)."""
_CALL_THREADS = DaemonThreads(
    "shardfeed-storage", limit=STORAGE_CALLS,
    why="blocking storage calls in flight, each left at its deadline; beyond, calls wait")


def start_fs_call(fs: Any, method: str, /, *args: Any, **kwargs: Any) -> Future[Any]:
    """``fs.<method>(*args, **kwargs)`` started off the caller's thread; its future.

    On an fsspec async filesystem the coroutine ``fs._<method>`` runs as a task on the
    filesystem's event loop (cancelling the future cancels the task: the connection is
    dropped, nothing keeps running); on any other filesystem the method runs on a daemon
    thread (:func:`start_in_thread`).
    """
    coroutine_fn = _coroutine_method(fs, method)
    if coroutine_fn is None:
        bound = getattr(fs, method)
        return start_in_thread(lambda: bound(*args, **kwargs))
    return start_coroutine(fs, coroutine_fn(*args, **kwargs))


def start_coroutine(fs: Any, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
    """Run ``coroutine`` on the event loop of the async filesystem ``fs``; its future
    (cancelling it cancels the task)."""
    import asyncio

    try:
        loop = fs.loop
        if _running_loop() is loop:  # waiting here would block the loop the call needs
            raise RuntimeError(
                "a storage call cannot wait inside fsspec's own event loop; call it from "
                "another thread"
            )
    except BaseException:
        coroutine.close()  # it will never run; closed, it draws no "never awaited" warning
        raise
    return asyncio.run_coroutine_threadsafe(coroutine, loop)


def _running_loop() -> Any:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def is_async(fs: Any) -> bool:
    """True for fsspec filesystems whose operations are coroutines on an event loop."""
    return bool(getattr(fs, "async_impl", False)) and not getattr(fs, "asynchronous", False)


def _coroutine_method(fs: Any, method: str) -> Callable[..., Any] | None:
    if not is_async(fs):
        return None
    found = getattr(fs, "_" + method, None)
    return found if found is not None and inspect.iscoroutinefunction(found) else None


class CallGroup:
    """The calls running on one source; :meth:`cancel_all` stops them all at once.

    Each call holds a ``wake`` future (never run) while it waits; completing it wakes the
    call, which then cancels its attempts and raises. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakes: set[Future[None]] = set()
        self.closed = False

    def enter(self) -> Future[None]:
        """A new call's ``wake`` future (ClosedError if the group was closed); the call
        joins the current cancel token too (rung at once where it was cancelled)."""
        wake: Future[None] = Future()
        with self._lock:
            if self.closed:
                raise ClosedError
            self._wakes.add(wake)
        with PROCESS.lock:
            PROCESS.wakes.add(wake)
        token = CANCEL.get()
        if token is not None and token is not self and not token._join(wake):
            _ring(wake)
        if PROCESS.exiting.is_set():
            _ring(wake)
        return wake

    def leave(self, wake: Future[None]) -> None:
        """The call is over."""
        with self._lock:
            self._wakes.discard(wake)
        token = CANCEL.get()
        if token is not None and token is not self:
            with token._lock:
                token._wakes.discard(wake)
        with PROCESS.lock:
            PROCESS.wakes.discard(wake)

    def _join(self, wake: Future[None]) -> bool:
        """A call made under this token joins it; False where it was cancelled."""
        with self._lock:
            if self.closed:
                return False
            self._wakes.add(wake)
            return True

    def cancel_all(self) -> None:
        """Close the group: every call running on it stops waiting now, later ones fail."""
        with self._lock:
            self.closed = True
            wakes = list(self._wakes)
        for wake in wakes:
            _ring(wake)


def under(token: CallGroup, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run with ``token`` as the current cancel token: the storage calls it makes,
    and those of the work it submits to the package's threads, end when
    ``token.cancel_all()`` runs."""

    def run(*args: Any, **kwargs: Any) -> T:
        reset = CANCEL.set(token)
        try:
            return fn(*args, **kwargs)
        finally:
            CANCEL.reset(reset)

    return run


def cancelled() -> bool:
    """Whether the current cancel token was cancelled (a call's error says so)."""
    token = CANCEL.get()
    return token is not None and bool(token.closed)


def _ring(wake: Future[None]) -> None:
    # Completing the future wakes concurrent.futures.wait(); cancelling it would not (a
    # cancelled future only notifies waiters through set_running_or_notify_cancel).
    with contextlib.suppress(InvalidStateError):
        wake.set_result(None)


def interrupt_calls() -> None:
    """Make every storage call in flight in the process stop waiting and fail now (calls
    started later run as usual). For Ctrl-C: threads waiting on a dead server end at once."""
    with PROCESS.lock:
        PROCESS.interrupts += 1
        wakes = list(PROCESS.wakes)
    for wake in wakes:
        _ring(wake)


def interrupts() -> int:
    """How many times :func:`interrupt_calls` ran (a call compares before and after)."""
    return PROCESS.interrupts


def abandon_all_calls() -> None:
    """Make every storage call in the process stop waiting and fail now (and any started
    later). Runs when the interpreter exits."""
    PROCESS.exiting.set()
    with PROCESS.lock:
        wakes = list(PROCESS.wakes)
    for wake in wakes:
        _ring(wake)


def exiting() -> bool:
    """True once :func:`abandon_all_calls` ran."""
    return PROCESS.exiting.is_set()


# The interpreter joins the threads of every ThreadPoolExecutor (a Dataset's shard readers)
# before it exits, and a Loader's CPU pool waits for its running slices (see
# pipeline/executor.py, whose hook calls this one first); a worker waiting on a dead server
# would hold the exit (after Ctrl-C, say) until its deadline. threading's exit hooks run in reverse order of
# registration and before those joins, and concurrent.futures registered its own when
# imported above, so this one runs first. The hook is a private (but stable since Python
# 3.9) part of threading; without it the exit waits for the deadline, nothing worse.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(abandon_all_calls)
del _register
