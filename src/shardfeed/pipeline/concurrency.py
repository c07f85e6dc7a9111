"""How many batch slices are built at once: all the threads, unless fewer measure faster.

Worker threads help when the work releases the GIL (decoding a large JPEG); when most of it
is Python that holds the GIL (small images: reading, parsing and writing a record costs as
much as decoding it), two threads fight over the GIL and build slower than one. The gate
measures instead of guessing::

    warm-up     all threads      nothing (``WARMUP_WINDOWS``: first reads, caches filling)
    trial       all threads, 1, all threads, 1 (``TRIAL_PAIRS`` pairs, one window each)
                                 samples built / wall seconds (``IDLE_GAP_SECONDS``),
                                 summed a limit (alternating cancels a drift in speed);
                                 one thread is not tried when a sample takes at least
                                 ``HEAVY_SAMPLE_SECONDS`` of thread CPU and the threads ran
                                 side by side (decodes that release the GIL);
                                 one thread is kept without a trial when a sample takes at
                                 most ``LIGHT_SAMPLE_SECONDS`` of wall time (tiny work)
    then        the faster one (fewer threads only when at least ``MARGIN`` faster),
                measured again every ``RECHECK_WINDOWS`` windows, as the work may change

A measured window is at least ``window_samples`` samples and ``MIN_WINDOW_SECONDS`` long (a
window of fast samples over in a few milliseconds is mostly noise); windows that are not
measured (warm-up, settling) and a first window of tiny work end at ``window_samples``. Slices wait at the gate in the order they were
submitted (a ticket each), so batches still complete in order.

Determinism: none of this changes which rows are built or their bytes (a slice writes fixed
rows whichever thread builds it, whenever). State: none saved; it starts again with each
Loader. Memory: a few counters.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

MARGIN = 1.05
"""Fewer threads are kept only when they build at least this much faster (noise guard)."""
MIN_WINDOW_SECONDS = 0.025
"""The shortest window measured: fast work takes more samples a window."""
RECHECK_WINDOWS = 32
"""Windows run at the chosen limit before both limits are measured again."""
WARMUP_WINDOWS = 2
"""Windows a new gate runs at every thread before measuring (the first reads of a loader open
files and fill caches, and run several times slower than the rest)."""
IDLE_GAP_SECONDS = 0.02
"""A window's time is wall time: while slices build, and while none does, up to this much a
gap. Gaps count because threads that starve the consumer of the GIL slow it down, and it then
asks for slices later (measuring only building time would favour them); longer gaps are the
consumer pausing (an evaluation, a checkpoint), which no limit causes."""
TRIAL_PAIRS = 2
"""Windows measured a limit in a trial, alternating between the two limits."""
LIGHT_SAMPLE_SECONDS = 5e-6
"""Work of at most this much wall time a sample with every thread (28×28 raw records: 2–3 µs)
is held to one slice at a time without a trial for the gate's first choice: a trial's windows
at every thread would cost a large part of a short epoch, and such work rarely gains from
threads; the rechecks every ``RECHECK_WINDOWS`` windows are full trials, which correct it."""
HEAVY_SAMPLE_SECONDS = 50e-6
"""Work of at least this much thread CPU time a sample (a 128×96 JPEG crop: about 70 µs; a
large JPEG: about 1 ms) whose threads ran side by side in the first measured window (their
CPU time at least ``PARALLEL_SHARE`` of the cores they could use, the decode releasing the
GIL) gains from every thread: one thread is not tried (a trial costs time). Heavy work that
holds the GIL keeps its threads' CPU time near one core's, and is tried."""
PARALLEL_SHARE = 0.75
"""See ``HEAVY_SAMPLE_SECONDS``: the share of ``min(threads, cores)`` cores."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it, which a
    container or ``taskset`` may set below the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class SliceGate:
    """Lets at most :attr:`limit` slices build at once, and picks the limit by measuring.

    ``threads``: the most at once (the Loader's ``num_threads``); ``adaptive=False`` keeps
    that limit (process workers, whose slices barely hold the GIL). ``clock``: seconds;
    ``min_window_seconds``: see ``MIN_WINDOW_SECONDS``.
    """

    def __init__(self, threads: int, *, window_samples: int, adaptive: bool = True,
                 clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.thread_time,
                 min_window_seconds: float = MIN_WINDOW_SECONDS) -> None:
        self.threads = threads if adaptive else 1  # one "thread" level: nothing to choose
        self.limit = threads
        self.window_samples = max(1, window_samples)
        self.min_window_seconds = min_window_seconds
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._cores = min(self.threads, usable_cores())
        self._cond = threading.Condition()
        self.fixed = False
        self._active = 0
        self._next_ticket = 0
        self._waiting: set[int] = set()
        self._busy_since = 0.0
        self._busy = 0.0  # the window's seconds: see IDLE_GAP_SECONDS
        self._idle_since: float | None = None  # when the last slice finished, none running
        self._samples = 0
        self._cpu = 0.0  # the window's thread CPU seconds, building
        self._trial: list[tuple[int, int, float]] = []  # (limit, samples, busy seconds)
        self._warmup = WARMUP_WINDOWS
        self._windows_left = 0  # windows at the chosen limit before measuring again
        self._settle = False  # the next window follows a change of limit: not recorded
        self._chosen = False  # a first choice was made (later ones are always full trials)

    def ticket(self) -> int:
        """A place in line, taken when a slice is submitted (slices enter in ticket order)."""
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            return ticket

    def run(self, ticket: int, samples: int, build: Callable[[], T],
            skip: Callable[[], bool]) -> T | None:
        """``build()`` once the gate lets ``ticket`` in; None without building if ``skip()``
        says, by then, that the slice is no longer wanted (its run was closed)."""
        with self._cond:
            self._waiting.add(ticket)
            while not (ticket == min(self._waiting) and self._active < self.limit):
                self._cond.wait()
            self._waiting.discard(ticket)
            self._active += 1
            if self._active == 1:
                now = self._clock()
                if self._idle_since is not None:  # see IDLE_GAP_SECONDS
                    self._busy += min(now - self._idle_since, IDLE_GAP_SECONDS)
                self._busy_since = now
            self._cond.notify_all()
        cpu = self._cpu_clock()
        try:
            return None if skip() else build()
        finally:
            cpu = self._cpu_clock() - cpu
            with self._cond:
                self._cpu += cpu
                now = self._clock()
                self._busy += now - self._busy_since  # at least one slice building
                self._busy_since = now
                self._active -= 1
                if self._active == 0:
                    self._idle_since = now
                self._samples += samples
                if self._samples >= self.window_samples and self._window_long_enough():
                    self._end_window()
                self._cond.notify_all()

    def _window_long_enough(self) -> bool:
        """Whether a window of ``window_samples`` or more ends now: once it lasted
        ``min_window_seconds``; sooner when it is not measured (warm-up, settling after a
        change of limit), or when it is the first choice's and its samples already took at
        most ``LIGHT_SAMPLE_SECONDS`` each (a pause would only make them look slower)."""
        if self._busy >= self.min_window_seconds or self._warmup > 0 or self._settle:
            return True
        return (not self._chosen and self.threads > 1 and not self._trial
                and self._windows_left == 0
                and self._busy <= LIGHT_SAMPLE_SECONDS * self._samples)

    def _end_window(self) -> None:
        """A window's rate is in: record it in the trial, or count down to the next trial.

        Windows of the warm-up, and the window after a change of limit (slices let in under
        the old limit may still be building), are not recorded.
        """
        samples, busy, cpu = self._samples, self._busy, self._cpu
        self._samples, self._busy, self._cpu = 0, 0.0, 0.0
        if self.threads == 1 or self.fixed:
            return
        if self._settle:
            self._settle = False
            return
        if self._warmup > 0:
            self._warmup -= 1
            return
        if self._windows_left > 0:
            self._windows_left -= 1
            if self._windows_left == 0:
                self._trial = []
                self._set_limit(self.threads)
            return
        self._trial.append((self.limit, samples, busy))
        if (len(self._trial) == 1 and cpu >= HEAVY_SAMPLE_SECONDS * samples
                and cpu >= PARALLEL_SHARE * self._cores * busy):
            self._windows_left = RECHECK_WINDOWS  # threads help: no trial of one
            return
        if (len(self._trial) == 1 and not self._chosen
                and busy <= LIGHT_SAMPLE_SECONDS * samples):
            self._chosen = True  # too little work a sample for threads to pay their hand-overs
            self._set_limit(1)
            self._windows_left = RECHECK_WINDOWS
            return
        if len(self._trial) < 2 * TRIAL_PAIRS:
            self._set_limit(1 if self.limit == self.threads else self.threads)
            return
        full = self._trial_rate(self.threads)
        single = self._trial_rate(1)
        self._set_limit(1 if single >= MARGIN * full else self.threads)
        self._windows_left = RECHECK_WINDOWS
        self._chosen = True

    def keep_all_threads(self) -> None:
        """Build with every thread from now on, with no trial: slices that may wait for data
        from object storage gain from threads whatever their work (a trial would time the
        waits, not the work)."""
        with self._cond:
            self.fixed = True
            self._set_limit(self.threads)
            self._cond.notify_all()

    def _trial_rate(self, limit: int) -> float:
        """Samples a second at ``limit`` over the trial's windows at that limit."""
        samples = sum(n for at, n, _ in self._trial if at == limit)
        busy = sum(t for at, _, t in self._trial if at == limit)
        return samples / busy if busy > 0 else float("inf")

    def _set_limit(self, limit: int) -> None:
        self._settle = limit != self.limit
        self.limit = limit
