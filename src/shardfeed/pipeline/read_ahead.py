"""Look-ahead reads: the records of the batches to come, fetched before their batch is built.

The order of every sample is a pure function of ``(seed, epoch)``, so the Loader knows which
records every future batch reads. On data that supports it (a ``Dataset`` with shards on object
storage: ``data.read_ahead()``), a pass cuts its batches into *chunks* of ``G`` batches and
keeps the next ``ahead`` chunks fetched while a chunk's batches are built (the first chunk
is one batch, so that the first batch of a pass waits for one small fetch)::

    batches   | 0 | 1 2 3 4 | 5 6 7 8 | 9 10 11 12 | ...      G = 4, ahead = 2
    chunk     | 0 |    1    |    2    |     3      |          (one batch, then G each)
    building batch 1:   chunks 0..3 scheduled (fetched or in flight)
    batch 4 handed out: chunk 1's records dropped from memory

A chunk's records are fetched together, so neighbours in a shard share requests even when
the batches are shuffled across the whole dataset; several chunks are in flight at once.
The records of the next :data:`CHUNKS_AHEAD` chunks that lie in the holes a chunk's ranges
read over come with it and stay staged until their own chunk: on a dataset a few chunks
large, a chunk reads most of every shard, and without this each byte came several times.

Across the end of a pass: once the last chunks are scheduled, the first :data:`CHUNKS_AHEAD`
chunks of the next epoch are scheduled too, and handed to the next pass as a :class:`Carry`
(used when that pass is the next epoch from its start, with the same chunking; otherwise its
records are dropped). The next epoch's first batch then does not wait for a fetch.

With a disk cache smaller than the data, each record is given its *next use*: the global
position (``epoch * samples_per_epoch + position``) of the next chunk that reads it, in this
epoch or the next (:class:`UsePlan`). The cache keeps what is used soonest and evicts what is
used last: Bélády's policy, possible because the future is known.

Determinism: look-ahead changes when bytes arrive, never which bytes or which samples. The
cache's decisions are made in chunk order on one thread. Memory: up to ``2 * ahead + 1``
chunks of records (the chunk being built, ``ahead`` scheduled, and the next ``ahead`` chunks'
records read over, or the next epoch's first chunks), and the use plan (16 bytes a record
read, for two epochs) when the cache is smaller than the data.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from functools import partial
from typing import Any, Protocol

import numpy as np

from shardfeed.dataset.data_source import ReadsAhead
from shardfeed.pipeline.samplers import EpochContext, Sampler, SingleRecordSampler
from shardfeed.storage.daemon_threads import DaemonThreads
from shardfeed.storage.disk_cache import UNKNOWN_USE

log = logging.getLogger("shardfeed.loader")

CHUNK_TARGET_BYTES = 64 << 20
"""Record bytes a chunk aims at when ``read_ahead`` is automatic."""

MAX_CHUNK_BATCHES = 16
CHUNKS_AHEAD = 2
_EPOCH_SHIFT = 24  # a session's chunk ids: epoch << _EPOCH_SHIFT | chunk, increasing in time
READ_AHEAD_PASSES = 64
"""Passes reading ahead at once in a process (one scheduling thread each): a pass started
beyond them reads its records as its batches need them."""
_THREADS = DaemonThreads(
    "shardfeed-read-ahead", limit=READ_AHEAD_PASSES,
    why="one a loader's pass reading ahead; a pass beyond the limit reads as its batches need")
"""The threads passes schedule on: one a pass in flight, kept for the next pass (a thread a
pass would take a new malloc arena each epoch: see :mod:`shardfeed.storage.daemon_threads`)."""


class Session(Protocol):
    """What a data source's ``read_ahead()`` returns (see ``dataset/fetch_ahead.py``)."""

    wants_next_use: bool
    mean_record_bytes: float
    fetch_buffer_bytes: int  # the most the fetches in flight hold

    def schedule(self, chunk: int, idx: np.ndarray, next_use: np.ndarray | None,
                 now: int, later: Sequence[tuple[int, np.ndarray]] = ()) -> None: ...

    def release(self, chunk: int) -> None: ...

    def close(self) -> None: ...


def open_session(sampler: Sampler) -> Session | None:
    """The look-ahead session of the sampler's data source, or None (local data, or a data
    source without ``read_ahead``)."""
    data = getattr(sampler, "dataset", None)  # SamplerBase's; a process copy has None
    return data.read_ahead() if isinstance(data, ReadsAhead) else None


def plan_records(sampler: Sampler, ctx: EpochContext, positions: np.ndarray) -> np.ndarray:
    """The records the outputs at ``positions`` read, one array, in the order of the plan."""
    if isinstance(sampler, SingleRecordSampler):
        return np.asarray(sampler.single_records(ctx, positions), dtype=np.int64)
    plans = sampler.plan(ctx, positions)
    return np.fromiter(itertools.chain.from_iterable(plans), dtype=np.int64)


class EpochChunks:
    """One pass's batches cut into chunks: one batch, then ``chunk_batches`` each (a small
    first chunk: the first batch waits for one small fetch, not a large one; the others large,
    so that records near each other in a shard share requests)."""

    def __init__(self, sampler: Sampler, ctx: EpochContext, positions: np.ndarray, *,
                 batch_size: int, chunk_batches: int, num_batches: int) -> None:
        self.sampler = sampler
        self.ctx = ctx
        self.positions = positions
        self.batch_size = batch_size
        self.chunk_batches = chunk_batches
        self.count = min(len(positions), num_batches * batch_size)
        batches = -(-self.count // batch_size)
        starts = [0]
        while starts[-1] < batches:
            starts.append(starts[-1] + (1 if len(starts) == 1 else chunk_batches))
        self._starts = np.asarray(starts, dtype=np.int64)  # first batch of each chunk, + end
        self.num_chunks = len(starts) - 1

    def chunk_of(self, batch: int) -> int:
        return int(np.searchsorted(self._starts, batch, side="right")) - 1

    def is_last_batch(self, batch: int) -> bool:
        """Whether ``batch`` is the last batch of its chunk."""
        return batch + 1 in self._starts[1:]

    def bounds(self, chunk: int) -> tuple[int, int]:
        lo, hi = self._starts[chunk], self._starts[chunk + 1]
        return int(lo) * self.batch_size, min(int(hi) * self.batch_size, self.count)

    def records(self, chunk: int) -> np.ndarray:
        lo, hi = self.bounds(chunk)
        return plan_records(self.sampler, self.ctx, self.positions[lo:hi])

    def time(self, chunk: int) -> int:
        """The chunk's global position: when its records are first needed."""
        lo, _ = self.bounds(chunk)
        return self.ctx.epoch * self.ctx.total + int(self.positions[lo])


class UsePlan:
    """When each record is read next, over this pass and the next epoch's."""

    def __init__(self, current: EpochChunks, following: EpochChunks | None) -> None:
        self._cur = _uses(current)
        self._next = _uses(following) if following is not None else None

    def next_use(self, idx: np.ndarray, chunk: int) -> np.ndarray:
        """For records ``idx`` read by ``chunk``: the time of the next chunk that reads each
        (:data:`UNKNOWN_USE` when none within the two epochs)."""
        keys, times, span = self._cur
        out = np.full(len(idx), UNKNOWN_USE, dtype=np.int64)
        at = np.searchsorted(keys, idx * span + chunk, side="right")
        ok = at < len(keys)
        found = np.zeros(len(idx), dtype=bool)
        found[ok] = keys[at[ok]] // span == idx[ok]
        out[found] = times[keys[at[found]] % span]
        if self._next is not None and not found.all():
            keys2, times2, span2 = self._next
            rest = ~found
            at2 = np.searchsorted(keys2, idx[rest] * span2, side="left")
            ok2 = at2 < len(keys2)
            hit = np.zeros(len(at2), dtype=bool)
            hit[ok2] = keys2[at2[ok2]] // span2 == idx[rest][ok2]
            where = np.flatnonzero(rest)[hit]
            out[where] = times2[keys2[at2[hit]] % span2]
        return out


def _uses(chunks: EpochChunks) -> tuple[np.ndarray, np.ndarray, int]:
    """Sorted keys ``record * span + chunk`` of every read of a pass, and each chunk's time."""
    span = chunks.num_chunks + 1
    parts = [np.unique(chunks.records(c)) * span + c for c in range(chunks.num_chunks)]
    keys = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    times = np.asarray([chunks.time(c) for c in range(chunks.num_chunks)], dtype=np.int64)
    return keys, times, span


def chunk_batches_for(option: int | None, *, batch_size: int, records_per_sample: float,
                      mean_record_bytes: float) -> int:
    """Batches a chunk: ``read_ahead`` (batches ahead) halved, or sized to
    :data:`CHUNK_TARGET_BYTES` when automatic (None)."""
    if option is not None:
        return max(1, -(-option // CHUNKS_AHEAD))
    batch_bytes = max(1.0, batch_size * records_per_sample * mean_record_bytes)
    return int(min(MAX_CHUNK_BATCHES, max(1, round(CHUNK_TARGET_BYTES / batch_bytes))))


class Carry:
    """The next epoch's first chunks, scheduled on ``session`` before its pass began."""

    def __init__(self, session: Session, chunks: EpochChunks, scheduled: int,
                 uses: UsePlan | None) -> None:
        self.session = session
        self.chunks = chunks
        self.scheduled = scheduled
        self.uses = uses
        self.calls: tuple[Any, ...] = ()
        """The cancel tokens its fetches run under (the passes that started them): the pass
        that takes the carry ends them too when it is abandoned."""

    def fits(self, chunks: EpochChunks) -> bool:
        """Whether the carried chunks are the first chunks of ``chunks``."""
        mine = self.chunks
        if (mine.sampler is not chunks.sampler or mine.ctx.epoch != chunks.ctx.epoch
                or mine.batch_size != chunks.batch_size or self.scheduled > chunks.num_chunks):
            return False
        if any(mine.bounds(c) != chunks.bounds(c) for c in range(self.scheduled)):
            return False
        _, hi = chunks.bounds(self.scheduled - 1)
        return bool(np.array_equal(mine.positions[:hi], chunks.positions[:hi]))


Following = Callable[[int], "EpochChunks | None"]
"""``following(k)``: the chunks of the pass ``k`` epochs after this one, from its start."""


class ReadAhead:
    """Keeps the next :data:`CHUNKS_AHEAD` chunks of a pass scheduled on ``session``, the
    next epoch's first chunks included once the pass nears its end.

    ``want(batch)`` (the batch being submitted for building) and ``handed_out(batch)`` are
    called by the epoch run from the iterating thread; scheduling runs on one thread of its
    own. ``want`` returns once the batch's own chunk is scheduled: a batch read before that
    would fetch its records one by one, around the disk cache (a loaded machine can starve the
    scheduling thread for a whole pass). A failure there is logged and ends the look-ahead:
    reads go on directly.
    """

    def __init__(self, session: Session, chunks: EpochChunks, *, following: Following,
                 carry: Carry | None = None) -> None:
        self.session = session
        self.chunks = chunks
        self._following = following
        self._carried = 0  # chunks of the next epoch scheduled
        self._next: EpochChunks | None = None
        self._next_uses: UsePlan | None = None
        self._target = -1
        self._cond = threading.Condition()
        self._closed = False
        self._job: Future[None] | None = None  # the scheduling thread's run
        self._runner: threading.Thread | None = None
        self.uses: UsePlan | None = None
        self._planned: dict[int, np.ndarray] = {}  # records of the chunks after the last scheduled
        self._start = 0
        self._done = -1  # the last chunk of this pass scheduled
        if carry is not None:
            self._start, self._target, self.uses = carry.scheduled, carry.scheduled - 1, carry.uses
            self._done = carry.scheduled - 1

    def want(self, batch: int) -> None:
        """Batch ``batch`` is being submitted: have the chunks up to :data:`CHUNKS_AHEAD`
        after its own scheduled. Returns once its own chunk is (the first call schedules the
        first chunk itself)."""
        own = self.chunks.chunk_of(batch)
        target = min(own + CHUNKS_AHEAD, self.chunks.num_chunks - 1 + CHUNKS_AHEAD)
        with self._cond:
            if self._closed:
                return
            if target <= self._target:
                self._cond.wait_for(lambda: self._closed or self._done >= own)
                return
            first = self._job is None
            self._target = max(target, self._target)
        if first and self._start == 0:
            try:
                if self.session.wants_next_use:
                    self.uses = UsePlan(self.chunks, self._following(1))
                self.schedule(0)
                with self._cond:
                    self._done = 0
            except Exception as exc:  # noqa: BLE001 - see _run
                self._stop(exc)
                return
        with self._cond:
            if self._job is None and not self._closed:
                self._job = _THREADS.try_submit(self._run)
                if self._job is None:  # READ_AHEAD_PASSES passes already: read on demand
                    log.info("read-ahead off for this pass: %d passes read ahead already",
                             READ_AHEAD_PASSES)
                    self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._closed or self._done >= own)

    def handed_out(self, batch: int) -> None:
        if self.chunks.is_last_batch(batch):
            self.session.release(self._id(self.chunks.chunk_of(batch)))

    def _id(self, chunk: int, epochs_on: int = 0) -> int:
        return (self.chunks.ctx.epoch + epochs_on) << _EPOCH_SHIFT | chunk

    def _run(self) -> None:
        self._runner = threading.current_thread()
        try:
            chunk = max(1, self._start)
            last = self.chunks.num_chunks - 1 + CHUNKS_AHEAD
            while chunk <= last:
                with self._cond:
                    self._cond.wait_for(partial(self._ready, chunk))
                    if self._closed:
                        return
                if chunk < self.chunks.num_chunks:
                    self.schedule(chunk)
                    with self._cond:
                        self._done = chunk
                        self._cond.notify_all()
                elif not self._schedule_next(chunk - self.chunks.num_chunks):
                    return
                chunk += 1
        except Exception as exc:  # noqa: BLE001 - look-ahead is an optimisation: read on
            self._stop(exc)
        finally:
            with self._cond:  # no batch waits for a chunk that will never be scheduled
                self._closed = self._closed or self._done < self.chunks.num_chunks - 1
                self._cond.notify_all()

    def _schedule_next(self, chunk: int) -> bool:
        """Schedule the next epoch's chunk ``chunk``; False when there is none."""
        if self._next is None:
            self._next = self._following(1)
            if self._next is not None and self.session.wants_next_use:
                self._next_uses = UsePlan(self._next, self._following(2))
        nxt = self._next
        if nxt is None or chunk >= nxt.num_chunks:
            return False
        ids = nxt.records(chunk)
        uses = self._next_uses.next_use(ids, chunk) if self._next_uses is not None else None
        self.session.schedule(self._id(chunk, 1), ids, uses, nxt.time(chunk))
        with self._cond:
            self._carried = chunk + 1
        return True

    def _ready(self, chunk: int) -> bool:
        return self._closed or chunk <= self._target

    def _stop(self, exc: Exception) -> None:
        log.warning("read-ahead stopped (%s: %s); records are read as batches need them",
                    type(exc).__name__, exc)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def schedule(self, chunk: int) -> None:
        """Schedule chunk ``chunk``, offering the session the records of the
        :data:`CHUNKS_AHEAD` chunks after it (those its fetch reads over come with it)."""
        ids = self._records(chunk)
        uses = self.uses.next_use(ids, chunk) if self.uses is not None else None
        later = [(self._id(c), self._records(c))
                 for c in range(chunk + 1, min(chunk + 1 + CHUNKS_AHEAD, self.chunks.num_chunks))]
        self.session.schedule(self._id(chunk), ids, uses, self.chunks.time(chunk), later)
        for c in [c for c in self._planned if c <= chunk]:
            del self._planned[c]

    def _records(self, chunk: int) -> np.ndarray:
        """The records of chunk ``chunk``, computed once while it is within reach."""
        ids = self._planned.get(chunk)
        if ids is None:
            ids = self._planned[chunk] = self.chunks.records(chunk)
        return ids

    def close(self) -> Carry | None:
        """Stop; the next epoch's chunks scheduled so far as a :class:`Carry` (the session
        stays open for it), else None (the session is closed)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._job is not None and self._runner is not threading.current_thread():
            wait([self._job])
        if self._carried and self._next is not None:
            self.session.release(self._id(self.chunks.num_chunks))  # this pass's records
            return Carry(self.session, self._next, self._carried, self._next_uses)
        self.session.close()
        return None


def staging_bytes(sampler: Sampler, ctx: EpochContext, positions: np.ndarray, *,
                  option: int | None, batch_size: int) -> int:
    """The most memory the look-ahead of a pass holds (0 where there is none): the chunks
    staged (the one being built, :data:`CHUNKS_AHEAD` ahead, and as many of the next epoch
    near the end of a pass) by the mean record size, and the fetches in flight."""
    if option == 0 or len(positions) == 0:
        return 0
    session = open_session(sampler)
    if session is None:
        return 0
    try:
        per_sample = max(1, len(plan_records(sampler, ctx, positions[:1])))
        g = chunk_batches_for(option, batch_size=batch_size, records_per_sample=per_sample,
                              mean_record_bytes=session.mean_record_bytes)
        chunk = g * batch_size * per_sample * session.mean_record_bytes
        return int((2 * CHUNKS_AHEAD + 1) * chunk) + session.fetch_buffer_bytes
    finally:
        session.close()


def read_ahead_for(sampler: Sampler, ctx: EpochContext, positions: np.ndarray, *,
                   option: int | None, batch_size: int, num_batches: int,
                   following: Callable[[int], tuple[EpochContext, np.ndarray, int]],
                   carry: Carry | None = None) -> ReadAhead | None:
    """The look-ahead of one pass (None: turned off with ``read_ahead=0``, nothing to read,
    or data that is not fetched from object storage). ``following(k)``: the context,
    positions and batches of the pass ``k`` epochs on. ``carry``: what the previous pass
    scheduled of this one (used if it fits, else its session is closed)."""
    session = None if option == 0 or num_batches == 0 else open_session(sampler)
    if session is None:
        if carry is not None:
            carry.session.close()
        return None
    per_sample = max(1, len(plan_records(sampler, ctx, positions[:1])))
    g = chunk_batches_for(option, batch_size=batch_size, records_per_sample=per_sample,
                          mean_record_bytes=session.mean_record_bytes)
    chunks = EpochChunks(sampler, ctx, positions, batch_size=batch_size, chunk_batches=g,
                         num_batches=num_batches)

    def later(k: int) -> EpochChunks | None:
        ctx2, positions2, batches = following(k)
        if batches == 0:
            return None
        return EpochChunks(sampler, ctx2, positions2, batch_size=batch_size, chunk_batches=g,
                           num_batches=batches)

    if carry is not None and carry.fits(chunks):
        session.close()
        return ReadAhead(carry.session, chunks, following=later, carry=carry)
    if carry is not None:
        carry.session.close()
    return ReadAhead(session, chunks, following=later)


__all__ = [
    "CHUNKS_AHEAD",
    "CHUNK_TARGET_BYTES",
    "Carry",
    "EpochChunks",
    "ReadAhead",
    "UsePlan",
    "chunk_batches_for",
    "open_session",
    "plan_records",
    "read_ahead_for",
    "staging_bytes",
]
