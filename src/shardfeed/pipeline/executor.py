"""The loader's CPU pool: the threads that build slices, and the one place their number at
once is limited.

::

    submit(fn)    the call joins one queue, in order
    a thread      takes the queue's first call while fewer than limit() run; when its call
                  returns it takes the next one itself, with no hand-over to another thread
    idle threads  wait on a stack: a call that finds none running wakes the thread that
                  went idle last (its caches and malloc arena are warm)
    limit()       read each time a call could start (the slice gate's choice, see
                  :mod:`~shardfeed.pipeline.concurrency`): lowered, running calls finish and
                  no new one starts beyond it; raised, the next submit or finished call
                  wakes as many idle threads as may start

So at a limit of one, a run of slices goes through one thread in turn, as in a loader of one
thread (a slice handed from thread to thread wakes a thread that must win the GIL back, and
cost more than a second thread gained), and at any limit calls start in the order they were
submitted, so batches complete in order. Why one pool and not a pool and a lane of one
thread beside it: one thread limit, in one place, whatever the gate chooses; the inventory
(:mod:`~shardfeed.pipeline.thread_budget`) counts one set of threads.

At 16 or 64 cores: a call's start costs one lock and, when no thread is running at the
limit, one wake-up of one thread; a finished call takes the next on its own thread, in the
same locked step (no other thread may start one between them), without any wake-up.
Nothing scans the threads.

Exit: the threads are daemon threads (an idle one never holds the interpreter's exit), and
an exit hook of threading's, which runs before the interpreter stops its threads, drops every
pool's queued slices and waits for the running ones (a Loader never closed: a daemon thread
stopped inside a native call, OpenCV's say, aborts the process).

Determinism: none of this changes which rows a slice builds or their bytes. State: the
queue and the threads (a forked child starts with none, see
:mod:`~shardfeed.storage.process_state`). Memory: a stack for each of ``threads`` threads.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from shardfeed.storage.daemon_threads import run_into
from shardfeed.storage.inflight import abandon_all_calls
from shardfeed.storage.process_state import PROCESS, fail_forked

T = TypeVar("T")

_Call = tuple["Future[Any]", "Callable[[], Any]"]


class _Worker:
    __slots__ = ("called", "thread", "wake")

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.called = True  # woken (or started) for a call it has not yet taken


class CpuPool:
    """``threads`` daemon threads named ``name`` (``name_<n>``), at most ``limit()`` of them
    running a call at once (see the module doc). Thread-safe; ``limit`` is called under the
    pool's lock and must not block."""

    def __init__(self, threads: int, *, limit: Callable[[], int] | None = None,
                 name: str = "shardfeed-loader") -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.max_threads = threads
        self.name = name
        self._limit = limit or (lambda: threads)
        self._reset()
        PROCESS.at_fork(self, CpuPool._reset)
        _LIVE.add(self)

    def _reset(self) -> None:
        """No threads, no calls: when made, and in a forked child (where the calls queued or
        running on the parent's threads end with an error, see ``fail_forked``)."""
        left: set[Future[Any]] = getattr(self, "_inflight", set())
        # re-entrant: a collection inside an allocation made under it may run a Loader's
        # finalizer, which shuts this pool down on the same thread
        self._lock = threading.RLock()
        self._inflight: set[Future[Any]] = set()  # submitted, not yet run to the end
        self._queue: deque[_Call] = deque()
        self._idle: list[_Worker] = []  # a stack: the last to go idle is called first
        self._workers: list[_Worker] = []
        self._running = 0
        self._called = 0  # threads called or started for a call, not yet running one
        self._shutdown = False
        fail_forked(list(left), "a slice of the loader")

    @property
    def _threads(self) -> set[threading.Thread]:
        """The threads started so far (the name ``ThreadPoolExecutor`` gives them)."""
        with self._lock:
            return {w.thread for w in self._workers
                    if w.thread is not None and w.thread.ident is not None}

    @property
    def running(self) -> int:
        """Calls running now."""
        with self._lock:
            return self._running

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a thread of the pool, after the calls submitted
        before it; its future (cancelling it before the call starts drops the call)."""
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a pool that was shut down")
            call: _Call = (future, (lambda: fn(*args, **kwargs)) if args or kwargs else fn)
            self._queue.append(call)
            self._inflight.add(future)
            try:
                self._call(self._startable())
            except BaseException:  # not even one thread could start: the call is not queued
                self._queue.remove(call)
                self._inflight.discard(future)
                raise
        return future

    def _startable(self) -> int:
        """Calls that may start now and that no thread was called for: queued ones, within
        the limit (lock held)."""
        free = max(1, self._limit()) - self._running - self._called
        return max(0, min(len(self._queue) - self._called, free))

    def _call(self, count: int) -> None:
        """Call up to ``count`` idle threads, the last to go idle first, and start new ones
        for the rest, within ``threads`` (lock held)."""
        while count > 0 and self._idle:
            worker = self._idle.pop()
            worker.called = True
            self._called += 1
            worker.wake.set()
            count -= 1
        while count > 0 and len(self._workers) < self.max_threads:
            worker = _Worker()
            worker.thread = threading.Thread(
                target=self._serve, args=(worker,), daemon=True,
                name=f"{self.name}_{len(self._workers)}")
            self._workers.append(worker)
            self._called += 1
            try:
                worker.thread.start()
            except BaseException:
                if worker.thread.ident is not None:  # Ctrl-C after it started: it serves
                    raise
                # no thread (the system's limit, or Ctrl-C before it ran): nothing promised
                self._workers.remove(worker)
                self._called -= 1
                if self._workers:
                    return  # the running threads take the calls in turn
                raise
            count -= 1

    def _take(self, me: _Worker) -> _Call | None:
        """The next call for ``me``, or None (then ``me`` is idle, or should end where the
        pool is shut down and nothing is queued) (lock held)."""
        if me.called:
            me.called = False
            self._called -= 1
        if self._queue and self._running < max(1, self._limit()):
            self._running += 1
            call = self._queue.popleft()
            self._call(self._startable())  # a raised limit: the others' calls start too
            return call
        if not self._shutdown:
            me.wake.clear()
            self._idle.append(me)
        return None

    def _serve(self, me: _Worker) -> None:
        with self._lock:
            call = self._take(me)
        while True:
            if call is None:
                if self._shutdown:
                    return
                me.wake.wait()
                with self._lock:
                    call = self._take(me)
                continue
            future, fn = call
            if future.set_running_or_notify_cancel():
                run_into(future, fn)
            with self._lock:  # finished and the next taken in one step: no other thread
                self._inflight.discard(future)
                self._running -= 1  # may start between them (at a limit of one, say)
                call = self._take(me)
            del future, fn

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; queued ones are dropped (their futures cancelled) with
        ``cancel_futures``, else run; ``wait``: join the threads. Never joins the calling
        thread, never starts one (a garbage collector's finalizer may call it)."""
        with self._lock:
            self._shutdown = True
            dropped = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
                self._inflight.difference_update(future for future, _ in dropped)
            for worker in self._idle:
                worker.wake.set()
            self._idle.clear()
            threads = [w.thread for w in self._workers
                       if w.thread is not None and w.thread.ident is not None]
        for future, _ in dropped:
            future.cancel()
        if wait:
            current = threading.current_thread()
            for thread in threads:
                if thread is not current:
                    thread.join()


_LIVE: weakref.WeakSet[CpuPool] = weakref.WeakSet()


def _at_exit() -> None:
    """At the interpreter's exit, before it stops its threads: storage calls abandoned, then
    every pool's queued slices dropped and its running ones waited for (a daemon thread
    stopped inside a native call, OpenCV's say, aborts the process)."""
    abandon_all_calls()
    for pool in list(_LIVE):
        pool.shutdown(wait=True, cancel_futures=True)


_register = getattr(threading, "_register_atexit", None)
if _register is not None:  # threading's exit hooks run before it joins its threads
    _register(_at_exit)
del _register


__all__ = ["CpuPool"]
