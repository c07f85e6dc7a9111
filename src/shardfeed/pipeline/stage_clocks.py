"""The clocks of a Loader's stage accounting (see :mod:`~shardfeed.pipeline.stage_stats`):
seconds a stage over the threads that build slices (:class:`StageClock`), the consumer's wait
and step (:class:`ConsumerClock`), and the pass iterator that drives the latter
(:class:`Timed`). A few clock reads a slice and two a batch.

Determinism: none of this changes a batch. State: counters. Memory: a few floats a thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

STAGES = ("read", "decode", "transform", "assemble")
"""The pipeline's stages, in the order a slice goes through them."""
READ, DECODE, TRANSFORM, ASSEMBLE = range(len(STAGES))
BUSY, SLICES, BATCH_STAGES = range(len(STAGES), len(STAGES) + 3)
"""The clock's other counters: seconds building slices, slices built, seconds in the batch
stages (an adapter's: the GPU decode), whose batches are handed over after the slices."""


class StageClock:
    """Seconds a stage, summed over the threads that build slices, and the seconds they were
    busy. Each thread adds to accumulators of its own (registered once), so :meth:`add`
    takes no lock; :meth:`totals` sums them. Thread-safe."""

    __slots__ = ("_all", "_done", "_local", "_lock")

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[tuple[threading.Thread, list[float]]] = []
        self._done = [0.0] * (BATCH_STAGES + 1)  # the rows of threads that ended
        self._lock = threading.Lock()

    def mine(self) -> list[float]:
        """This thread's accumulators: one a stage, then busy seconds, slices and batch
        stages' seconds."""
        acc: list[float] | None = getattr(self._local, "acc", None)
        if acc is None:
            acc = [0.0] * (BATCH_STAGES + 1)
            with self._lock:
                self._fold()
                self._all.append((threading.current_thread(), acc))
            self._local.acc = acc
        return acc

    def add(self, stage: int, seconds: float) -> None:
        self.mine()[stage] += seconds

    def totals(self) -> list[float]:
        """The stages' seconds, busy seconds and slices, over every thread so far."""
        with self._lock:
            self._fold()
            rows = [acc for _, acc in self._all]
            out = list(self._done)
        for acc in rows:
            for k, value in enumerate(acc):
                out[k] += value
        return out

    def _fold(self) -> None:
        """The rows of finished threads added into the base row once (threads come and go:
        a pass's run-ahead thread). Under the lock."""
        for _, acc in [row for row in self._all if not row[0].is_alive()]:
            for k, value in enumerate(acc):
                self._done[k] += value
        self._all = [row for row in self._all if row[0].is_alive()]

    def __reduce__(self) -> tuple[Any, ...]:
        return (StageClock, ())  # a worker process counts for itself (not collected)


class ConsumerClock:
    """The consumer's wait for each batch and its time between batches (one thread at a time
    iterates a loader's pass)."""

    __slots__ = ("_asked", "_began", "_first", "_returned", "batches", "samples", "start_wait",
                 "step", "wait")

    def __init__(self) -> None:
        self.wait = self.step = self.start_wait = 0.0
        self.batches = self.samples = 0
        self._returned: float | None = None  # when the last batch was handed out
        self._asked = 0.0
        self._first = True  # the next batch is a pass's first
        self._began: float | None = None

    def asked(self) -> None:
        """The consumer asks for the next batch."""
        now = time.perf_counter()
        if self._returned is not None:
            self.step += now - self._returned
        began = self._began
        if began is not None:  # a pass's first batch: its wait began with the pass
            self._began = None
            now = began
        self._asked = now

    def handed(self, samples: int) -> None:
        """The batch asked for is handed out (``samples`` rows)."""
        now = time.perf_counter()
        waited = now - self._asked
        self.wait += waited
        if self._first:  # a pass's first batch: made after the pass began
            self.start_wait += waited
            self._first = False
        self.batches += 1
        self.samples += samples
        self._returned = now

    def new_pass(self, began: float) -> None:
        """A pass begins (one left early, by ``break``, never said it ended): the wait for
        its first batch counts from ``began`` (the pass's set-up, before its iterator is
        handed out, included)."""
        self._returned = None
        self._first = True
        self._began = began

    def ended(self) -> None:
        """The pass ended (the next ``asked`` starts no step)."""
        now = time.perf_counter()
        self.wait += now - self._asked
        self._returned = None
        self._first = True


class Timed:
    """A pass's iterator that tells a :class:`ConsumerClock` when its consumer asks for a
    batch and when it gets one; anything else is the iterator's."""

    __slots__ = ("after", "clock", "inner")

    def __init__(self, inner: Iterator[dict[str, Any]], clock: ConsumerClock,
                 after: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.clock = clock
        self.after = after  # called after each batch handed out (a report's tick)

    def __iter__(self) -> Timed:
        return self

    def __next__(self) -> dict[str, Any]:
        clock = self.clock
        clock.asked()
        try:
            batch = next(self.inner)
        except BaseException:
            clock.ended()
            raise
        rows = 0
        for value in batch.values():
            with contextlib.suppress(TypeError):  # a scalar: the next value has the rows
                rows = len(value)
                break
        clock.handed(rows)
        if self.after is not None:
            self.after()
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)



__all__ = ["ASSEMBLE", "BATCH_STAGES", "BUSY", "DECODE", "READ", "SLICES", "STAGES",
           "TRANSFORM", "ConsumerClock", "StageClock", "Timed"]
