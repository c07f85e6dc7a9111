"""Daemon threads kept for the next call: the threads that run storage calls and look-ahead.

A :class:`DaemonThreads` runs each submitted call on an idle thread of its own, or on a new
one when none is idle (up to ``limit``; beyond it calls wait in order). A thread that has
finished its call waits for the next instead of ending.

Why kept, not started a call: glibc gives each new thread one of a bounded number of malloc
arenas (8 a core) in turn once a process has that many threads. Threads started anew for
every epoch or request therefore land on a different arena each time, and each arena grows
to hold the buffers of the calls that ran there: a process that reads a cached dataset
epoch after epoch took some 80 MB more each epoch, never given back, and paid a page fault
for every fresh page. Kept threads keep their arenas, whose free memory the next call reuses.

Why daemon: a call to a server that stalls may never return, and a non-daemon thread would
hold the interpreter's exit until it does (see :mod:`shardfeed.storage.inflight`).

Determinism: none needed. State: the idle threads and the calls queued for them (a forked
child starts with none: the parent's threads did not follow, see
:mod:`~shardfeed.storage.process_state`). Memory: a thread's stack (reserved, mostly
untouched) for each thread ever busy at once.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from shardfeed.storage.process_state import PROCESS, fail_forked

CANCEL: contextvars.ContextVar[Any] = contextvars.ContextVar("shardfeed_cancel", default=None)
"""The cancel token (a :class:`~shardfeed.storage.inflight.CallGroup`) of the work running
in this context: the storage calls made under it stop waiting when it is cancelled (see
``inflight``). A call submitted here runs under its submitter's token."""

T = TypeVar("T")

_Call = tuple["Future[Any]", "Callable[[], Any]"]


class DaemonThreads:
    """Daemon threads named ``name`` running submitted calls, at most ``limit`` at once
    (beyond it calls wait in order, or :meth:`try_submit` says no); ``why`` says what the
    threads do and what keeps them under the limit (the thread inventory shows it: see
    :func:`pools`). Thread-safe."""

    def __init__(self, name: str, *, limit: int, why: str) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.name = name
        self.limit = limit
        self.why = why
        self._reset()
        PROCESS.at_fork(self, DaemonThreads._reset)
        with PROCESS.lock:
            PROCESS.pools[self] = name

    def _reset(self) -> None:
        """No threads, no calls: when made, and in a forked child (the parent's threads did
        not follow the fork: the calls they had, queued or running, end with an error)."""
        left: set[Future[Any]] = getattr(self, "_inflight", set())
        self._lock = threading.Lock()
        self._inflight: set[Future[Any]] = set()  # submitted, not yet run to the end
        self._handed: queue.SimpleQueue[_Call] = queue.SimpleQueue()  # each promised an idle thread
        self._backlog: collections.deque[_Call] = collections.deque()  # waiting for a thread
        self._threads = 0
        self._idle = 0  # threads waiting on _handed and not yet promised a call
        fail_forked(list(left), f"a call of {self.name}")

    def submit(self, fn: Callable[[], T], *, future: Future[T] | None = None) -> Future[T]:
        """Run ``fn()`` on one of the threads; its future (cancelling it before the call
        starts drops the call). ``future``: a new one of the caller's (e.g. one whose
        ``cancel`` also ends the call), instead of a plain Future. At the limit, the call
        waits for a thread, after the calls that waited before it."""
        started = self._start(fn, Future() if future is None else future, wait=True)
        assert started is not None
        return started

    def try_submit(self, fn: Callable[[], T]) -> Future[T] | None:
        """:meth:`submit`, or None (nothing started) where every thread is busy and the
        limit is reached: for work the caller can do without (a look-ahead)."""
        return self._start(fn, Future(), wait=False)

    def _start(self, fn: Callable[[], T], future: Future[T], *, wait: bool) -> Future[T] | None:
        fn = carried(fn)
        with self._lock:
            self._inflight.add(future)
            if self._idle:
                self._idle -= 1  # this call is that idle thread's: none waits behind another
                self._handed.put((future, fn))
                return future
            if self._threads >= self.limit:
                if not wait:
                    self._inflight.discard(future)
                    return None
                self._backlog.append((future, fn))
                return future
            self._threads += 1
        threading.Thread(target=self._serve, args=((future, fn),), name=self.name,
                         daemon=True).start()
        return future

    def _serve(self, call: _Call) -> None:
        while True:
            future, fn = call
            if future.set_running_or_notify_cancel():
                run_into(future, fn)
            with self._lock:  # done, and the next call taken, in one step
                self._inflight.discard(future)
                waiting = self._backlog.popleft() if self._backlog else None
                if waiting is None:
                    self._idle += 1
            del call, future, fn  # an idle thread holds nothing of its last call
            call = self._handed.get() if waiting is None else waiting

    @property
    def threads(self) -> int:
        """Threads started so far (busy or idle)."""
        return self._threads

    @property
    def busy(self) -> int:
        """Threads running a call now."""
        with self._lock:
            return self._threads - self._idle  # a call handed to an idle thread counts


def carried(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, to be run on another thread under this thread's cancel token (:data:`CANCEL`):
    a call a thread of the package's runs for work of a Loader's pass ends when the pass is
    abandoned. Each call of the result needs one of its own (a context runs on one thread at
    a time)."""
    if CANCEL.get() is None:
        return fn
    return functools.partial(contextvars.copy_context().run, fn)


def pools() -> list[DaemonThreads]:
    """Every kept thread pool of the package in this process (those of modules imported so
    far), by name."""
    with PROCESS.lock:
        found = list(PROCESS.pools)
    return sorted(found, key=lambda pool: pool.name)


def run_into(future: Future[T], fn: Callable[[], T]) -> None:
    """Run ``fn()`` and hand its result or exception to ``future``. The caller may have
    cancelled the future meanwhile (abandoned the call): then the outcome has nobody to go
    to (InvalidStateError), and is dropped."""
    try:
        result = fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
        try:
            future.set_exception(exc)
        except InvalidStateError:
            pass
    else:
        try:
            future.set_result(result)
        except InvalidStateError:
            pass


__all__ = ["DaemonThreads", "pools", "run_into"]
