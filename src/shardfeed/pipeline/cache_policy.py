"""What a disk cache of a given size would hold: the Loader's chunk accesses replayed.

A Loader over object storage with a disk cache accesses the cache once a record a chunk of
batches (see :mod:`shardfeed.pipeline.read_ahead`). :func:`hit_rates` replays those accesses,
for the epochs asked, under two policies:

``optimal``: the policy the cache runs (Bélády's): keep what is read soonest; when a record
does not fit, evict the records read last, but only those read later than it, else do not
keep it. With records of one size it is the best any policy can do on this order; with sizes
that differ it is the usual furthest-next-use rule.

``lru``: evict the least recently read (what caches without a known future do).

Determinism: a pure function of the loader's options and the dataset's index. Memory: the
use plan of two epochs and one entry a record held.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from shardfeed.dataset.dataset import Dataset
from shardfeed.pipeline.read_ahead import (
    CHUNKS_AHEAD,
    EpochChunks,
    UsePlan,
    chunk_batches_for,
    plan_records,
)
from shardfeed.storage.disk_cache import UNKNOWN_USE


@dataclass(frozen=True, slots=True)
class Access:
    """One chunk's accesses: records in the order asked, their sizes and next uses; when."""

    ids: np.ndarray
    sizes: np.ndarray
    next_use: np.ndarray
    now: int


@dataclass(frozen=True, slots=True)
class HitRate:
    hits: int
    accesses: int

    @property
    def rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0


def accesses(loader: object, epochs: Sequence[int], *,
             carried: bool = False) -> Iterator[Access]:
    """The chunk accesses of ``loader`` (a :class:`~shardfeed.Loader` over a Dataset with
    remote shards) for whole ``epochs``, as its read-ahead makes them. ``carried``: and the
    first chunks of the epoch after the last, which the read-ahead fetches while the last
    one ends (what a Loader iterated for exactly ``epochs`` has done)."""
    from shardfeed.pipeline.loader import Loader

    if not isinstance(loader, Loader):
        raise TypeError(f"loader must be a shardfeed.Loader, got {type(loader).__name__}")
    sampler = loader.sampler
    dataset = getattr(sampler, "dataset", None)
    record_bytes = dataset.remote_record_bytes if isinstance(dataset, Dataset) else None
    if not isinstance(dataset, Dataset) or record_bytes is None:
        raise ValueError("the loader's data has no shard on object storage: nothing is cached")
    opts = loader.options
    batch = opts.batch_size

    def chunks(epoch: int) -> EpochChunks:
        ctx = loader._context(epoch)
        positions = loader._positions(0)
        per_sample = max(1, len(plan_records(sampler, ctx, positions[:1])))
        g = chunk_batches_for(opts.read_ahead, batch_size=batch, records_per_sample=per_sample,
                              mean_record_bytes=record_bytes)
        batches = len(positions) // batch if opts.drop_last else -(-len(positions) // batch)
        return EpochChunks(sampler, ctx, positions, batch_size=batch, chunk_batches=g,
                           num_batches=batches)

    if carried and epochs:
        epochs = [*epochs, epochs[-1] + 1]
    for epoch in epochs:
        current = chunks(epoch)
        uses = UsePlan(current, chunks(epoch + 1))
        last = current.num_chunks
        if carried and epoch == epochs[-1]:
            last = min(CHUNKS_AHEAD, last)
        for c in range(last):
            ids, first = np.unique(current.records(c), return_index=True)
            order = np.argsort(first, kind="stable")
            ids = ids[order]
            sizes = dataset.payload_sizes(ids)
            yield Access(ids, sizes, uses.next_use(ids, c), current.time(c))


class _Optimal:
    """The cache's policy in memory: what :class:`~shardfeed.storage.disk_cache.DiskCache`
    decides, with heaps instead of SQL."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: dict[int, tuple[int, int, int]] = {}  # record -> (next use, seq, size)
        self.by_use: list[tuple[int, int, int]] = []  # (-next use, seq, record); stale skipped
        self.soonest: list[tuple[int, int]] = []  # (next use, record): finds uses passed
        self.total = self.counter = 0

    def _push(self, r: int, use: int, seq: int, size: int) -> None:
        self.held[r] = (use, seq, size)
        heapq.heappush(self.by_use, (-use, seq, r))
        heapq.heappush(self.soonest, (use, r))

    def look(self, r: int, use: int) -> bool:
        """An access: True (a hit: its next use is now ``use``) or False."""
        if r not in self.held:
            return False
        _, seq, size = self.held[r]
        self._push(r, use, seq, size)
        return True

    def passed(self, now: int) -> None:
        """Entries whose next use is before ``now`` count as read last."""
        while self.soonest and self.soonest[0][0] < now:
            use, r = heapq.heappop(self.soonest)
            if r in self.held and self.held[r][0] == use:
                _, seq, size = self.held[r]
                self.held[r] = (UNKNOWN_USE, seq, size)
                heapq.heappush(self.by_use, (-UNKNOWN_USE, seq, r))

    def _victims(self, use: int, need: int) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Entries read after ``use``, read last first, until ``need`` bytes are freed (all
        of them when that is not possible), and the heap items taken out."""
        victims: list[int] = []
        popped: list[tuple[int, int, int]] = []
        freed = 0
        while freed < need and self.by_use:
            item = heapq.heappop(self.by_use)
            neg, seq, v = item
            entry = self.held.get(v)
            if entry is None or entry[0] != -neg or entry[1] != seq or v in victims:
                continue
            popped.append(item)
            if -neg <= use:
                break
            victims.append(v)
            freed += entry[2]
        return (victims if freed >= need else []), popped

    def admit(self, r: int, use: int, size: int, now: int) -> None:
        use = UNKNOWN_USE if use < now else min(use, UNKNOWN_USE)
        if size > self.capacity:
            return
        need = self.total + size - self.capacity
        victims, popped = self._victims(use, need) if need > 0 else ([], [])
        for item in popped:
            if item[2] not in victims:
                heapq.heappush(self.by_use, item)
        if need > 0 and not victims:
            return
        for v in victims:
            self.total -= self.held.pop(v)[2]
        self.counter += 1
        self._push(r, use, self.counter, size)
        self.total += size


def replay_optimal(seq: Sequence[Access], capacity: int) -> HitRate:
    """Hits of the cache's own policy (see the module docstring) over ``seq``: each chunk's
    records looked up (hits take their new next use), uses that have passed marked, then
    the misses admitted in order."""
    cache = _Optimal(capacity)
    hits = looked = 0
    for access in seq:
        ids, uses = access.ids.tolist(), access.next_use.tolist()
        looked += len(ids)
        found = [cache.look(r, use) for r, use in zip(ids, uses)]
        hits += sum(found)
        cache.passed(access.now)
        for r, use, size, hit in zip(ids, uses, access.sizes.tolist(), found):
            if not hit:
                cache.admit(r, use, size, access.now)
    return HitRate(hits, looked)


def replay_lru(seq: Sequence[Access], capacity: int) -> HitRate:
    """Hits of a least-recently-used cache of ``capacity`` bytes over ``seq``."""
    held: OrderedDict[int, int] = OrderedDict()
    total = hits = looked = 0
    for access in seq:
        for r, size in zip(access.ids.tolist(), access.sizes.tolist()):
            looked += 1
            if r in held:
                hits += 1
                held.move_to_end(r)
                continue
            if size > capacity:
                continue
            while total + size > capacity:
                total -= held.popitem(last=False)[1]
            held[r] = size
            total += size
    return HitRate(hits, looked)


def hit_rates(loader: object, *, cache_bytes: int, epochs: Sequence[int],
              carried: bool = False) -> dict[str, HitRate]:
    """``{"optimal": ..., "lru": ...}`` for a cache of ``cache_bytes`` that starts empty and
    serves ``loader`` for ``epochs`` (e.g. ``range(3)``); ``carried``: see :func:`accesses`."""
    seq = list(accesses(loader, epochs, carried=carried))
    return {"optimal": replay_optimal(seq, cache_bytes), "lru": replay_lru(seq, cache_bytes)}


__all__ = ["Access", "HitRate", "accesses", "hit_rates", "replay_lru", "replay_optimal"]
