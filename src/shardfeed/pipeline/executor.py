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
limit, one wake-up of one thread; a finished call starts the next on its own thread without
any wake-up. Nothing scans the threads.

Why daemon threads: a Loader never closed (a script that ends without ``close``) must not
hold the interpreter's exit; its threads wait on nothing but this pool.

Determinism: none of this changes which rows a slice builds or their bytes. State: the
queue and the threads (a forked child starts with none, see
:mod:`~shardfeed.storage.process_state`). Memory: a stack for each of ``threads`` threads.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from shardfeed.storage.daemon_threads import run_into
from shardfeed.storage.process_state import PROCESS

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

    def _reset(self) -> None:
        """No threads, no calls: when made, and in a forked child."""
        self._lock = threading.Lock()
        self._queue: deque[_Call] = deque()
        self._idle: list[_Worker] = []  # a stack: the last to go idle is woken first
        self._workers: list[_Worker] = []
        self._running = 0
        self._called = 0  # threads woken or started for a call, not yet running one
        self._shutdown = False

    @property
    def _threads(self) -> set[threading.Thread]:
        """The threads started so far (the name ``ThreadPoolExecutor`` gives them)."""
        return {w.thread for w in self._workers if w.thread is not None}

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
            self._queue.append((future, (lambda: fn(*args, **kwargs)) if args or kwargs
                                else fn))
            start = self._wake(self._startable())
        self._start_threads(start)
        return future

    def _startable(self) -> int:
        """Calls that may start now and that no thread was called for: queued ones, within
        the limit (lock held)."""
        free = max(1, self._limit()) - self._running - self._called
        return max(0, min(len(self._queue) - self._called, free))

    def _wake(self, count: int) -> int:
        """Call up to ``count`` idle threads, the last to go idle first; the new threads to
        start for the rest, within ``threads`` (lock held; started by :meth:`_start_threads`
        without it)."""
        while count > 0 and self._idle:
            worker = self._idle.pop()
            worker.called = True
            self._called += 1
            worker.wake.set()
            count -= 1
        new = max(0, min(count, self.max_threads - len(self._workers)))
        self._workers += [_Worker() for _ in range(new)]
        self._called += new
        return new

    def _start_threads(self, count: int) -> None:
        for _ in range(count):
            self._start_thread()

    def _start_thread(self) -> None:
        with self._lock:
            worker = next((w for w in self._workers if w.thread is None), None)
            if worker is None or self._shutdown:
                return
            number = self._workers.index(worker)
            worker.thread = threading.Thread(target=self._serve, args=(worker,),
                                             name=f"{self.name}_{number}", daemon=True)
        worker.thread.start()

    def _serve(self, me: _Worker) -> None:
        while True:
            with self._lock:
                if me.called:
                    me.called = False
                    self._called -= 1
                call = None
                if self._queue and self._running < max(1, self._limit()):
                    call = self._queue.popleft()
                    self._running += 1
                elif self._shutdown:
                    return
                else:
                    me.wake.clear()
                    self._idle.append(me)
            if call is None:
                me.wake.wait()
                continue
            future, fn = call
            if future.set_running_or_notify_cancel():
                run_into(future, fn)
            del call, future, fn  # an idle thread holds nothing of its last call
            with self._lock:
                self._running -= 1
                # this thread takes the next call itself: wake others only for the ones
                # beyond it that the limit lets start now (it may have been raised)
                start = self._wake(self._startable() - 1)
            self._start_threads(start)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; queued ones are dropped (their futures cancelled) with
        ``cancel_futures``, else run; ``wait``: join the threads. Never joins the calling
        thread."""
        with self._lock:
            self._shutdown = True
            dropped = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
            for worker in self._idle:
                worker.wake.set()
            self._idle.clear()
            threads = list(self._threads)
        for future, _ in dropped:
            future.cancel()
        if wait:
            current = threading.current_thread()
            for thread in threads:
                if thread is not current:
                    thread.join()


__all__ = ["CpuPool"]
