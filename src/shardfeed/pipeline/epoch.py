"""One pass over the rest of an epoch: ordered parallel batches, a bounded number at once.

::

    batch k  = positions share[k*B : (k+1)*B]           (this rank's share of the epoch)
    slices   = pieces of ~B/num_threads positions       (one task each, any thread)
               or up to 4 whole batches, built in turn (small, light batches)
    buffer   = ring.buffer_for(k)                       (preallocated, reused)

    submitted: k .. k+b-1 while the caller holds batch k-1

Batches come out in order; at most ``b`` batches are being built while the caller holds one
more: ``prefetch_batches``, or one a thread where they fit in 64 MiB, up to 4 a thread
while the slices hold several (see :func:`~shardfeed.pipeline.pool.batches_in_flight`).
A slice of several batches is submitted once there is room for all of them; a data error
in one of them is raised where that batch is handed out, after the batches before it. A
yielded batch's large arrays are the ring's memory, and the ring never writes into memory
the caller still holds (see :class:`~shardfeed.pipeline.pool.BatchRing`): a batch the
caller keeps stays what it was.

Determinism: a batch is a function of its positions; threads only change when it is ready.
State: kept by the Loader (it commits each batch as it is handed out). Memory: the ring.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from shardfeed.errors import TooManyErrorsError
from shardfeed.pipeline.batch_stage import BatchKeys, BatchStage
from shardfeed.pipeline.batching import BatchBuffer
from shardfeed.pipeline.concurrency import SliceGate
from shardfeed.pipeline.executor import CpuPool
from shardfeed.pipeline.pool import BatchRing
from shardfeed.pipeline.produce import TooManyBadSamples
from shardfeed.pipeline.read_ahead import Carry, ReadAhead
from shardfeed.pipeline.samplers import EpochContext
from shardfeed.pipeline.stage_clocks import BATCH_STAGES, StageClock
from shardfeed.storage.inflight import CallGroup, interrupt_calls, under

SliceFn = Callable[[EpochContext, np.ndarray, BatchBuffer, int], int]
"""``build_slice(ctx, positions, buffer, first_row) -> bad samples met``."""


def _held() -> threading.Lock:
    """A lock, held: a batch's :attr:`_Pending.ready`."""
    lock = threading.Lock()
    lock.acquire()
    return lock


def _let_go(lock: threading.Lock, future: Future[Any] | None = None) -> None:
    """Release ``lock`` once (a failed slice and the last slice's end may both let go; as the
    last slice's done-callback, ``future`` is that slice's)."""
    try:
        lock.release()
    except RuntimeError:  # released already
        pass


@dataclass(slots=True)
class _Pending:
    index: int
    buffer: BatchBuffer
    count: int
    # held until the batch's last slice is done (or cancelled) or a slice fails: its
    # consumer waits once a batch (each wait a wake-up under the GIL), not once a slice, and
    # a slice's error is not held up behind the slices after it (as behind a wait for the
    # last slice's future). A plain lock: its wait has no Python in it (an Event's is a
    # Condition's). The last future's callback holds the lock only: no cycle through it.
    # The batches of one slice share it (the first's wait takes it; the others' slice is
    # done by then).
    ready: threading.Lock
    futures: list[Future[Any]] = field(default_factory=list)
    part: int = -1  # where the slice builds several batches: this one's place among them


def _waking(ready: threading.Lock, run: Callable[..., Any], *args: Any) -> Any:
    """``run(*args)`` (a slice, through the gate where there is one), letting ``ready`` go
    where it raises (see :class:`_Pending`)."""
    try:
        return run(*args)
    except BaseException:
        _let_go(ready)
        raise


def _build_batches(build_slice: SliceFn, ctx: EpochContext,
                   pieces: list[tuple[np.ndarray, BatchBuffer]]) -> list[int | Exception]:
    """A slice of several whole batches: each built in turn; its bad samples met, or the
    error that ended it (the batches after it are not built: the consumer stops at it)."""
    done: list[int | Exception] = []
    for positions, buffer in pieces:
        try:
            done.append(build_slice(ctx, positions, buffer, 0))
        except Exception as exc:  # noqa: BLE001 - raised where its batch is handed out
            done.append(exc)
            break
    return done


class EpochRun:
    """Iterator over the batches of ``positions`` (this rank's remaining epoch positions).

    ``on_batch(count, skipped)`` is called as each batch is handed out, before it is returned,
    so that the Loader's state always describes what the caller has received. ``stages`` (the
    batch stages) run on each batch before that: a stage that raises ends the run without
    counting the batch, so the state still says it is to come.
    """

    def __init__(
        self, *, ctx: EpochContext, positions: np.ndarray, batch_size: int, drop_last: bool,
        slice_size: int, in_flight: int, ring: BatchRing, in_flight_single: int | None = None,
        executor: CpuPool, build_slice: SliceFn,
        on_batch: Callable[[int, int, bool], None], gate: SliceGate | None = None,
        stages: Sequence[BatchStage] = (), read_ahead: ReadAhead | None = None,
        clock: StageClock | None = None,
    ) -> None:
        self.ctx = ctx
        self.clock = clock  # the batch stages' seconds (see stage_stats)
        self.positions = positions
        self.batch_size = batch_size
        count = len(positions)
        self.num_batches = count // batch_size if drop_last else -(-count // batch_size)
        self.slice_size = slice_size
        self.in_flight = in_flight  # batches built at once
        # those while slices are within a batch (several a thread are for slices of several)
        self.in_flight_single = in_flight if in_flight_single is None else in_flight_single
        self.ring = ring
        self.executor = executor
        self.build_slice = build_slice
        self.gate = gate
        self.on_batch = on_batch
        self.stages = stages
        self.read_ahead = read_ahead
        self.carry: Carry | None = None  # the next epoch's chunks read ahead, once closed
        self.pending: deque[_Pending] = deque()
        self.building: set[int] = set()  # the ids of the pending batches' buffers
        self.next_submit = 0
        self.next_yield = 0
        self.closed = False
        # the pass's cancel token: its slices' storage calls, and those of the reads ahead
        # it starts, end at abandon() instead of at their deadline
        self.calls = CallGroup()
        self.adopted: tuple[CallGroup, ...] = ()  # the tokens of the reads it carried in
        self._submit_under = under(self.calls, self._submit)
        self._submit_batches_under = under(self.calls, self._submit_batches)

    def __iter__(self) -> EpochRun:
        return self

    def _slice_size(self) -> int:
        """Samples a slice: fewer slices at once, or light work, larger slices, up to a few
        whole batches (see SliceGate.slice_size)."""
        if self.gate is None:
            return self.slice_size
        return self.gate.slice_size(self.slice_size, self.batch_size, self.in_flight)

    def _pending(self, index: int, ready: threading.Lock, part: int = -1
                 ) -> tuple[_Pending, np.ndarray]:
        """Batch ``index`` pending, in its buffer, and its positions."""
        if self.read_ahead is not None:
            self.read_ahead.want(index)
        lo = index * self.batch_size
        positions = self.positions[lo : lo + self.batch_size]
        buffer = self.ring.buffer_for(index, self.building)
        buffer.reset_lists()
        buffer.keys[: len(positions)] = positions
        pending = _Pending(index, buffer, len(positions), ready, part=part)
        # pending before its slices are submitted: where a submit fails midway, the close
        # that follows cancels the slices submitted, or waits for them (they write into the
        # buffer, which the ring may hand to another batch)
        self.pending.append(pending)
        self.building.add(id(buffer))
        return pending, positions

    def _submit_batches(self, index: int, count: int) -> None:
        """Batches ``index ... index + count - 1`` as one slice, built in turn."""
        ready = _held()
        made = [self._pending(index + k, ready, part=k) for k in range(count)]
        group = [pending for pending, _ in made]
        pieces = [(positions, pending.buffer) for pending, positions in made]
        build = under(self.calls, partial(_build_batches, self.build_slice, self.ctx, pieces))
        samples = sum(pending.count for pending in group)
        if self.gate is None:
            future = self.executor.submit(_waking, ready, build)
        else:
            future = self.executor.submit(_waking, ready, self.gate.run, samples, build,
                                          self._is_closed)
        for pending in group:
            pending.futures.append(future)
        future.add_done_callback(partial(_let_go, ready))

    def _submit(self, index: int, size: int) -> None:
        pending, positions = self._pending(index, _held())
        executor = self.executor
        buffer = pending.buffer
        for start in range(0, len(positions), size):
            piece = positions[start : start + size]
            future: Future[int | None]
            if self.gate is None:
                future = executor.submit(_waking, pending.ready, under(self.calls, self.build_slice),
                                         self.ctx, piece, buffer, start)
            else:
                future = executor.submit(
                    _waking, pending.ready, self.gate.run, len(piece),
                    under(self.calls, partial(self.build_slice, self.ctx, piece, buffer, start)),
                    self._is_closed,
                )
            pending.futures.append(future)
        if pending.futures:
            pending.futures[-1].add_done_callback(partial(_let_go, pending.ready))
        else:
            _let_go(pending.ready)

    def __next__(self) -> dict[str, Any]:
        if self.closed:
            raise StopIteration
        try:
            while self.next_submit < self.num_batches and len(self.pending) < self.in_flight:
                size = self._slice_size()
                index = self.next_submit
                # several batches a slice only where more are built at once for them
                if size <= self.batch_size or self.in_flight <= self.in_flight_single:
                    size = min(size, self.batch_size)
                    if len(self.pending) >= self.in_flight_single:
                        break
                    self._submit_under(index, size)
                    self.next_submit += 1
                    continue
                # a slice of whole batches, once there is room for all of them (or for the
                # last ones of the pass, or nothing is pending)
                count = min(size // self.batch_size, self.num_batches - index)
                room = self.in_flight - len(self.pending)
                if room < count and self.pending:
                    break
                count = min(count, room)
                if count == 1:
                    self._submit_under(index, self.batch_size)
                else:
                    self._submit_batches_under(index, count)
                self.next_submit += count
        except BaseException as exc:
            closed_meanwhile = self.closed  # the pool shut down: closed by another thread
            self.close()  # a batch submitted in part: its slices cancelled or waited for
            if closed_meanwhile and isinstance(exc, RuntimeError):
                raise RuntimeError(CLOSED_MEANWHILE) from None
            raise
        if not self.pending:
            self.close()
            self.on_batch(0, 0, True)
            raise StopIteration
        head = self.pending[0]
        try:
            # the lock, unless the last slice is done (a forked child's last slice may be done
            # and never called back)
            if head.futures and not head.futures[-1].done():
                head.ready.acquire()
            if head.part < 0:
                skipped = sum(future.result() or 0 for future in head.futures)
            else:  # one of a slice's batches: its own outcome
                done = head.futures[0].result() or ()
                outcome = done[head.part] if head.part < len(done) else 0
                if isinstance(outcome, Exception):
                    raise outcome
                skipped = outcome
        except BaseException as exc:
            closed_meanwhile = self.closed  # by another thread: its error is the close
            self.close()
            if closed_meanwhile and isinstance(exc, Exception):
                raise RuntimeError(CLOSED_MEANWHILE) from exc
            raise
        try:
            self.pending.popleft()
        except IndexError:  # closed by another thread since the batch was made
            raise RuntimeError(CLOSED_MEANWHILE) from None
        self.building.discard(id(head.buffer))
        if self.closed:  # by another thread meanwhile: a slice may have skipped its rows
            raise RuntimeError(CLOSED_MEANWHILE)
        batch = self.ring.hand_out(head.buffer, head.count)
        if self.stages:
            try:
                batch = self._through_stages(batch, head.buffer, head.count)
            except BaseException:
                self.close()  # the batch is not handed out: a new pass builds it again
                raise
        self.next_yield += 1
        if self.read_ahead is not None:
            self.read_ahead.handed_out(self.next_yield - 1)
        last = self.next_yield == self.num_batches
        self.on_batch(head.count, skipped, last)
        if last:
            self.close()
        return batch

    def _through_stages(self, batch: dict[str, Any], buffer: BatchBuffer,
                        count: int) -> dict[str, Any]:
        """``batch`` through the batch stages, with the keys its rows were made with."""
        positions = buffer.keys[:count].copy()
        positions.flags.writeable = False
        keys = BatchKeys(self.ctx.seed, self.ctx.epoch, positions)
        started = time.perf_counter()
        for stage in self.stages:
            batch = stage(batch, keys)
        if self.clock is not None:
            self.clock.add(BATCH_STAGES, time.perf_counter() - started)
        return batch

    def _is_closed(self) -> bool:
        return self.closed

    def abandon(self) -> None:
        """End the storage calls of the pass's slices and of its reads ahead now (a dead
        server's would hold :meth:`close` to their deadline), those carried in from the pass
        before too: the pass is not wanted."""
        self.calls.cancel_all()
        for token in self.adopted:
            token.cancel_all()

    def close(self) -> None:
        """Cancel batches not started and wait for running slices (they write into the ring);
        closed while an exception goes up (a slice's error, the caller's), the slices'
        storage calls are abandoned first."""
        if self.closed:
            return
        self.closed = True
        futures = [f for pending in self.pending for f in pending.futures]
        for future in futures:
            future.cancel()
        error = sys.exc_info()[1]
        if error is not None:
            self.abandon()
        if isinstance(error, KeyboardInterrupt):
            interrupt_calls()  # Ctrl-C: every call in flight ends now, not at its deadline
        wait(futures)
        self.pending.clear()
        self.building.clear()
        if self.read_ahead is not None:
            carry = self.read_ahead.close()
            if carry is not None and self.calls.closed:  # its fetches ended with the pass
                carry.session.close()
                carry = None
            elif carry is not None:  # the next pass ends them if it is abandoned
                carry.calls = (self.calls, *self.adopted[:1])
            self.carry = carry


CLOSED_MEANWHILE = ("this Loader was closed (by another thread) while it made the batch; "
                    "create a new one to read again")


class HandOut:
    """The iterator the Loader hands the caller: the run's batches; an exhausted replacement
    search becomes TooManyErrorsError."""

    __slots__ = ("closed", "run")

    def __init__(self, run: EpochRun, *, closed: Callable[[], bool]) -> None:
        self.run = run
        self.closed = closed

    def __iter__(self) -> HandOut:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.closed():
            raise RuntimeError("this Loader is closed; create a new one to read again")
        try:
            batch = next(self.run)
        except TooManyBadSamples as exc:
            raise TooManyErrorsError(f"{exc}: check the data with `shardfeed verify`") from exc
        return batch
