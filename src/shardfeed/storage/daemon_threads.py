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
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from shardfeed.storage.process_state import PROCESS

T = TypeVar("T")

_Call = tuple["Future[Any]", "Callable[[], Any]"]


class DaemonThreads:
    """Daemon threads named ``name`` running submitted calls, at most ``limit`` at once
    (None: no limit, so a call never waits behind one that is stuck). Thread-safe."""

    def __init__(self, name: str, limit: int | None = None) -> None:
        self.name = name
        self.limit = limit
        self._reset()
        PROCESS.at_fork(self, DaemonThreads._reset)

    def _reset(self) -> None:
        """No threads, no calls: when made, and in a forked child (the parent's threads did
        not follow the fork)."""
        self._lock = threading.Lock()
        self._handed: queue.SimpleQueue[_Call] = queue.SimpleQueue()  # each promised an idle thread
        self._backlog: collections.deque[_Call] = collections.deque()  # waiting for a thread
        self._threads = 0
        self._idle = 0  # threads waiting on _handed and not yet promised a call

    def submit(self, fn: Callable[[], T], *, future: Future[T] | None = None) -> Future[T]:
        """Run ``fn()`` on one of the threads; its future (cancelling it before the call
        starts drops the call). ``future``: a new one of the caller's (e.g. one whose
        ``cancel`` also ends the call), instead of a plain Future."""
        future = Future() if future is None else future
        with self._lock:
            if self._idle:
                self._idle -= 1  # this call is that idle thread's: none waits behind another
                self._handed.put((future, fn))
                return future
            if self.limit is not None and self._threads >= self.limit:
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
            del call, future, fn  # an idle thread holds nothing of its last call
            with self._lock:
                waiting = self._backlog.popleft() if self._backlog else None
                if waiting is None:
                    self._idle += 1
            call = self._handed.get() if waiting is None else waiting

    @property
    def threads(self) -> int:
        """Threads started so far (busy or idle)."""
        return self._threads


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


__all__ = ["DaemonThreads", "run_into"]
