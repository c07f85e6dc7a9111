"""How many batch slices are built at once: all the threads, unless fewer measure faster.

Worker threads help when the work releases the GIL (decoding a large JPEG); when most of it
is Python that holds the GIL (small images: reading, parsing and writing a record costs as
much as decoding it), two threads fight over the GIL and build slower than one. The gate
measures instead of guessing::

    trial   slices at once   measured
    1       all threads      samples built / seconds with at least one slice running
    2       1                the same (skipped when a sample takes a thread at least
                             ``HEAVY_SAMPLE_SECONDS``: large images gain from threads)
    then    the faster one (fewer threads only when at least ``MARGIN`` faster),
            measured again every ``RECHECK_WINDOWS`` windows, as the work may change

A window is ``window_samples`` samples. Slices wait at the gate in the order they were
submitted (a ticket each), so batches still complete in order.

Determinism: none of this changes which rows are built or their bytes (a slice writes fixed
rows whichever thread builds it, whenever). State: none saved; it starts again with each
Loader. Memory: a few counters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

MARGIN = 1.15
"""Fewer threads are kept only when they build at least this much faster (noise guard)."""
RECHECK_WINDOWS = 32
"""Windows run at the chosen limit before both limits are measured again."""
HEAVY_SAMPLE_SECONDS = 500e-6
"""Work of at least this much thread time a sample (a large JPEG: about 1 ms) gains from
every thread, the decode releasing the GIL: one thread is not tried (a trial costs time)."""


class SliceGate:
    """Lets at most :attr:`limit` slices build at once, and picks the limit by measuring.

    ``threads``: the most at once (the Loader's ``num_threads``); ``adaptive=False`` keeps
    that limit (process workers, whose slices barely hold the GIL). ``clock``: seconds.
    """

    def __init__(self, threads: int, *, window_samples: int, adaptive: bool = True,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.threads = threads if adaptive else 1  # one "thread" level: nothing to choose
        self.limit = threads
        self.window_samples = max(1, window_samples)
        self._clock = clock
        self._cond = threading.Condition()
        self._active = 0
        self._next_ticket = 0
        self._waiting: set[int] = set()
        self._busy_since = 0.0
        self._busy = 0.0
        self._samples = 0
        self._trial: list[tuple[int, float]] = []  # (limit, samples a second) measured
        self._windows_left = 0  # windows at the chosen limit before measuring again
        self._settle = False  # the next window follows a change of limit: not recorded

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
                self._busy_since = self._clock()
            self._cond.notify_all()
        try:
            return None if skip() else build()
        finally:
            with self._cond:
                now = self._clock()
                self._busy += now - self._busy_since  # busy: at least one slice building
                self._busy_since = now
                self._active -= 1
                self._samples += samples
                if self._samples >= self.window_samples:
                    self._end_window()
                self._cond.notify_all()

    def _end_window(self) -> None:
        """A window's rate is in: record it in the trial, or count down to the next trial.

        The window after a change of limit only settles (slices let in under the old limit
        may still be building) and is not recorded.
        """
        rate = self._samples / self._busy if self._busy > 0 else float("inf")
        self._samples, self._busy = 0, 0.0
        if self.threads == 1:
            return
        if self._settle:
            self._settle = False
            return
        if self._windows_left > 0:
            self._windows_left -= 1
            if self._windows_left == 0:
                self._trial = []
                self._set_limit(self.threads)
            return
        self._trial.append((self.limit, rate))
        if len(self._trial) == 1:
            if self.threads / rate >= HEAVY_SAMPLE_SECONDS:
                self._windows_left = RECHECK_WINDOWS  # threads help: no trial of one
                return
            self._set_limit(1)
            return
        full = next(r for limit, r in self._trial if limit == self.threads)
        single = next(r for limit, r in self._trial if limit == 1)
        self._set_limit(1 if single >= MARGIN * full else self.threads)
        self._windows_left = RECHECK_WINDOWS

    def _set_limit(self, limit: int) -> None:
        self._settle = limit != self.limit
        self.limit = limit
