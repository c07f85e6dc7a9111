"""Between a Dataset and object storage: records fetched ahead of use, and the disk cache.

::

    Loader (pipeline/read_ahead.py)          RecordFetcher (here)                 storage
    -------------------------------          --------------------                 -------
    session.schedule(c, ids, next_use, now)  disk cache: uses updated; hits read  DiskCache
                                             on threads of their own; misses: kept or
                                             not (by next use), fetched on a fetch
                                             thread, coalesced                     RemoteSource
    slice threads: dataset.read_many(ids)    staged (waits for the fetch) >
                                             disk cache > fetched now
    session.release(c)                       staged records of chunk c dropped

A *session* is one pass of a Loader over an epoch: it stages the records of the chunks of
batches it schedules, in memory, until the chunk is released; those a cache as large as the
data holds are left there, for the batch's own read. Every decision of the disk
cache (what to keep, what to evict) is made by ``schedule``, in chunk order, on one thread:
the outcome does not depend on when fetches return.

Determinism: the payloads returned are the shard's bytes whatever was staged, cached or
fetched (the cache checks a CRC32C of each entry; records fetched are checked as every read).
Memory: the staged chunks (the Loader bounds how many) and the fetches in flight.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from shardfeed.dataset.reading import ReadOptions
from shardfeed.dataset.shards import ShardTable
from shardfeed.errors import StorageError
from shardfeed.storage import is_remote
from shardfeed.storage.cache_entries import Version, entry_key, object_keys
from shardfeed.storage.daemon_threads import DaemonThreads, carried
from shardfeed.storage.disk_cache import UNKNOWN_USE, DiskCache
from shardfeed.storage.process_state import PROCESS, fail_forked
from shardfeed.storage.retry import DEFAULT_DEADLINE_SECONDS

log = logging.getLogger("shardfeed.dataset")

FRAMING_BYTES = 16
"""A TFRecord's bytes beyond its payload: length (8), its CRC (4), the data's CRC (4)."""

FETCH_THREADS = 4
"""Chunks fetched at once: with the requests each fetch keeps in flight (see
``RemoteOptions.max_concurrency``), enough to hide a cloud store's time to first byte."""

CACHE_READ_RECORDS = 16
"""Records of the disk cache read in one call: the reads of a chunk (and their CRC32C checks)
run on several threads, beside the decoder, not on the scheduling one."""

_CACHE_READS = DaemonThreads("shardfeed-cache-read", limit=FETCH_THREADS,
                             why="reads of records the disk cache holds")
"""The threads that read the disk cache: not the fetch threads, whose requests take a cloud
store's latency (a hit must not wait behind a miss); kept, as every thread a pass uses."""

CACHE_WAITS = 64
"""Waits for records another fetch is writing into the disk cache at once in a process;
beyond, waits queue (each ends within its deadline, so a queued one starts in bounded time)."""
_CACHE_WAITS = DaemonThreads(
    "shardfeed-cache-wait", limit=CACHE_WAITS,
    why="waits for records another fetch is writing into the disk cache, each within its "
        "deadline")
"""The threads that wait for records another fetch is writing into the cache: neither the
fetch threads (two processes whose fetch threads all waited for each other's records would
both stall until the deadline) nor the cache-read threads."""

_Read = tuple["Future[list[bytes | None]]", int]
"""A read of the disk cache and a record's place in its result."""

NetworkRead = Callable[[np.ndarray, bool], list[bytes]]
"""``read(global record ids, ahead) -> payloads``: the Dataset's coalesced, checked read
(``ahead``: a chunk read ahead, coalesced as :data:`AHEAD_READ` says)."""

AHEAD_READ = ReadOptions(coalesce_gap_bytes=1 << 20, max_read_bytes=32 << 20)
"""How a chunk's records are grouped into requests: holes up to 1 MiB are read and dropped.
A request to object storage costs about its time to first byte (20-100 ms), in which 1 MiB
arrives many times over; a chunk holds many records of each shard, so most holes are small."""


@dataclass(slots=True)
class _Staged:
    """A record of a session: its fetch or its read of the disk cache (whose result is None
    at its place where the entry was found gone or damaged), its place there, its last chunk."""

    future: Future[list[Any]]
    at: int
    last: int
    filling: bool = False  # being written into the cache: kept staged until it is there


class RecordFetcher:
    """The staged records and the disk cache of one Dataset's remote shards. Thread-safe."""

    def __init__(self, table: ShardTable, network: NetworkRead, *,
                 cache: DiskCache | None, sizes: Sequence[int],
                 versions: Sequence[Version],
                 wait_seconds: float = DEFAULT_DEADLINE_SECONDS) -> None:
        self._table = table
        self._network = network
        self.cache = cache
        self.wait_seconds = wait_seconds
        """How long a read waits for a record another fetch is writing into the cache: the
        read's deadline (``deadline_seconds``); then it fetches the record itself."""
        remote = [is_remote(u) for u in table.urls]
        self._remote = np.asarray(remote, dtype=bool)
        self._objects = object_keys(table.urls, sizes, versions, remote)
        records = table.counts.astype(np.int64)
        self.remote_bytes = sum(int(sizes[k]) for k in range(len(remote)) if remote[k])
        remote_records = int(records[self._remote].sum()) if len(records) else 0
        self.mean_record_bytes = self.remote_bytes / max(1, remote_records)
        self._sessions: list[AheadSession] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        PROCESS.at_fork(self, RecordFetcher._forked)
        self.staged_hits = 0

    # -- keys -----------------------------------------------------------------------------

    def keys_of(self, idx: np.ndarray) -> tuple[list[str | None], np.ndarray, list[str]]:
        """The cache key of each record (None: a local shard), its payload size and its
        shard's URL."""
        shard, local = self._table.shard_of(idx)
        keys: list[str | None] = []
        sizes = np.empty(len(idx), dtype=np.int64)
        objects, urls = self._objects, self._table.urls
        for i, (k, r) in enumerate(zip(shard.tolist(), local.tolist())):
            offsets = self._table.offsets_view(k)
            start = int(offsets[r])
            sizes[i] = int(offsets[r + 1]) - start - FRAMING_BYTES
            keys.append(entry_key(objects[k], r, start) if objects[k] else None)
        return keys, sizes, [urls[k] for k in shard.tolist()]

    def riders(self, fetch: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """The positions in ``candidates`` of the records a fetch of ``fetch`` reads over: each
        lies whole in a gap of at most ``AHEAD_READ.coalesce_gap_bytes`` between two records of
        ``fetch`` in one shard (the coalesced ranges' holes)."""
        if len(fetch) < 2 or not len(candidates):
            return np.empty(0, dtype=np.int64)
        f_start, f_end = self._spans(fetch)
        c_start, c_end = self._spans(candidates)
        order = np.argsort(f_start, kind="stable")
        f_start, f_end = f_start[order], f_end[order]
        after = np.clip(np.searchsorted(f_start, c_start), 1, len(f_start) - 1)
        gap_from, gap_to = f_end[after - 1], f_start[after]
        inside = ((gap_from <= c_start) & (c_end <= gap_to)
                  & (gap_to - gap_from <= AHEAD_READ.coalesce_gap_bytes))
        return np.flatnonzero(inside)

    def _spans(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where records ``idx`` start and end, as one number for every byte of every shard
        (shard ``k``'s bytes from ``k << 42``: no gap between shards is ever small)."""
        shard, local = self._table.shard_of(idx)
        start = np.empty(len(idx), dtype=np.int64)
        end = np.empty(len(idx), dtype=np.int64)
        for k in np.unique(shard).tolist():
            at = np.flatnonzero(shard == k)
            offsets = self._table.offsets_view(k)
            r = local[at]
            start[at] = offsets[r] + (k << 42)
            end[at] = offsets[r + 1] + (k << 42)
        return start, end

    # -- reading --------------------------------------------------------------------------

    def read(self, idx: np.ndarray) -> list[bytes]:
        """Payloads of records ``idx``: staged by a session, else from the disk cache, else
        fetched now. Without a session these reads are the cache's accesses (what is fetched
        is offered to it as used at an unknown time); with one, its chunks are, and these
        reads only take what the cache holds."""
        out: list[bytes | None] = [None] * len(idx)
        sessions = list(self._sessions)
        for session in sessions:
            session.peek(idx, out)
        missing = [i for i, v in enumerate(out) if v is None]
        if len(missing) < len(idx):
            with self._lock:
                self.staged_hits += len(idx) - len(missing)
        if not missing:
            return out  # type: ignore[return-value]
        cache = self.cache
        if cache is not None:
            missing = self._from_cache(cache, idx, missing, out, count=not sessions)
        ids = idx[missing]
        if missing:
            fetched = self._network(ids, False)
            for i, data in zip(missing, fetched):
                out[i] = data
            if cache is not None and not sessions:
                keys, _, urls = self.keys_of(ids)
                cache.put_many([(key, url, d, UNKNOWN_USE)
                                for key, url, d in zip(keys, urls, fetched) if key is not None])
        return out  # type: ignore[return-value]

    def _from_cache(self, cache: DiskCache, idx: np.ndarray, missing: list[int],
                    out: list[bytes | None], *, count: bool) -> list[int]:
        """Fill ``out`` at ``missing`` from the cache; the positions still missing."""
        keys, _, _ = self.keys_of(idx[missing])
        remote = [j for j, key in enumerate(keys) if key is not None]
        got = cache.get_many([k for k in keys if k is not None], count=count) if remote else []
        for j, data in zip(remote, got):
            if isinstance(data, bytes):
                out[missing[j]] = data
        return [i for i in missing if out[i] is None]

    # -- sessions -------------------------------------------------------------------------

    def session(self) -> AheadSession:
        """A new session (one pass of a Loader); close it when the pass ends."""
        session = AheadSession(self)
        with self._lock:
            self._sessions.append(session)
        return session

    def _forget(self, session: AheadSession) -> None:
        with self._lock:
            if session in self._sessions:
                self._sessions.remove(session)

    def _forked(self) -> None:
        """In a forked child (the fork rule, :mod:`~shardfeed.storage.process_state`): new
        locks, no pool (its threads stayed in the parent), and the fetches that were staged
        ended with an error (a session that needs one reads it again)."""
        self._lock = threading.Lock()
        self._pool = None
        for session in self._sessions:
            session._lock = threading.Lock()
            fail_forked([entry.future for entry in session._staged.values()],
                        "a read ahead of the records")

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=FETCH_THREADS,
                                                thread_name_prefix="shardfeed-ahead")
            return self._pool

    def stats(self) -> dict[str, Any]:
        """Records served from sessions' staging, and the disk cache's counters."""
        out: dict[str, Any] = {"staged_hits": self.staged_hits}
        if self.cache is not None:
            c = self.cache.counters
            out.update(cache_hits=c.hits, cache_misses=c.misses, cache_corrupt=c.corrupt,
                       cache_admitted=c.admitted, cache_bypassed=c.bypassed,
                       cache_evicted=c.evicted, cache_bytes_written=c.bytes_written,
                       cache_stepped_aside=c.stepped_aside)
        return out

    def close(self) -> None:
        for session in list(self._sessions):
            session.close()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if self.cache is not None:
            self.cache.close()


class AheadSession:
    """The records one pass of a Loader asked for ahead of use (see the module docstring)."""

    def __init__(self, fetcher: RecordFetcher) -> None:
        self._fetcher = fetcher
        cache = fetcher.cache
        self.wants_next_use = cache is not None and cache.max_bytes < fetcher.remote_bytes
        self.stages_hits = self.wants_next_use
        """Whether records the cache holds are read at scheduling and staged. With a cache that
        holds all the remote data nothing this pass keeps evicts them: the batch that needs
        them reads them when it is built, as from a local file (no staging memory); another
        process that evicts one meanwhile costs a request, not a wrong byte."""
        self.mean_record_bytes = fetcher.mean_record_bytes
        self.fetch_buffer_bytes = FETCH_THREADS * AHEAD_READ.max_read_bytes * 2  # ranges, records
        self._staged: dict[int, _Staged] = {}
        self._released = -1  # the last chunk released
        self._lock = threading.Lock()
        self.closed = False

    def schedule(self, chunk: int, idx: np.ndarray, next_use: np.ndarray | None,
                 now: int, later: Sequence[tuple[int, np.ndarray]] = ()) -> None:
        """Stage records ``idx`` (read by chunk ``chunk``, whose global position is ``now``;
        next read at ``next_use``, global positions, None: unknown) and let the disk cache
        decide what it keeps. ``later``: the next chunks, ``(chunk, idx)``: their records
        that lie in the holes this fetch reads over come with it and stay staged for them
        (a chunk of a dataset not much larger than it reads most of each shard).

        Call in chunk order from one thread. Every record of the chunk is an access of the
        cache, staged already or not, so the cache's decisions depend on the chunks only
        (:mod:`shardfeed.pipeline.cache_policy` replays them). Returns once the cache's part
        is done and the fetch of the rest is started.
        """
        ids, first = np.unique(idx, return_index=True)
        order = np.argsort(first, kind="stable")
        ids = ids[order]  # in the order asked
        uses = (np.full(len(ids), UNKNOWN_USE, dtype=np.int64) if next_use is None
                else np.asarray(next_use, dtype=np.int64)[first[order]])
        staged = self._touch(ids, chunk)
        if staged is None:
            return
        f = self._fetcher
        kept: dict[int, str] = {}  # position in ids -> key reserved in the cache
        held: dict[int, _Read | None] = {}  # -> its read and place (None: read when built)
        if f.cache is not None:
            kept, held = self._cache_part(ids, uses, now, staged)
        fetch = [j for j, r in enumerate(ids.tolist()) if j not in held and r not in staged]
        riders, rider_chunks = self._riders(ids, fetch, later) if fetch and later else ([], [])
        future = self._start_fetch(ids[fetch], [kept.get(j) for j in fetch], riders)
        self._fill_staged(ids, kept, staged)
        at_of = {j: n for n, j in enumerate(fetch)}
        entries = {}
        for j, r in enumerate(ids.tolist()):
            read = held.get(j, (future, at_of.get(j, -1)))  # every record not held is fetched
            if r not in staged and read is not None and read[0] is not None:
                entries[r] = _Staged(read[0], read[1], chunk)
        if future is not None:
            for n, (r, last) in enumerate(zip(riders, rider_chunks)):
                entries.setdefault(r, _Staged(future, len(fetch) + n, last))
        with self._lock:
            if not self.closed:
                for r, entry in entries.items():
                    self._staged.setdefault(r, entry)

    def _touch(self, ids: np.ndarray, chunk: int) -> dict[int, _Staged] | None:
        """The records of ``ids`` staged already, now kept until chunk ``chunk`` too (None:
        the session is closed)."""
        with self._lock:
            if self.closed:
                return None
            staged = {}
            for r in ids.tolist():
                entry = self._staged.get(r)
                if entry is not None:
                    entry.last = chunk
                    staged[r] = entry
        return staged

    def _start_fetch(self, ids: np.ndarray, keys: list[str | None],
                     riders: list[int]) -> Future[list[bytes]] | None:
        """Fetch records ``ids`` (writing those with a reserved key into the cache) and
        ``riders`` after them; None when there is nothing to fetch."""
        if not len(ids):
            return None
        f = self._fetcher
        future = f._executor().submit(  # under the pass's cancel token: ended with it
            carried(self._fetch), np.concatenate([ids, np.asarray(riders, dtype=np.int64)]),
            keys + [None] * len(riders))
        reserved = [key for key in keys if key is not None]
        if reserved and f.cache is not None:  # cancelled when the Dataset closes
            future.add_done_callback(partial(_abandon_if_cancelled, f.cache, reserved))
        return future

    def _riders(self, ids: np.ndarray, fetch: list[int],
                later: Sequence[tuple[int, np.ndarray]]) -> tuple[list[int], list[int]]:
        """The records of ``later`` chunks (not staged yet) in the holes of this fetch, and
        the chunk of each (the first that reads it)."""
        asked = set(ids.tolist())
        cands: dict[int, int] = {}
        with self._lock:
            for chunk, idx in later:
                for r in idx.tolist():
                    if r not in asked and r not in self._staged and r not in cands:
                        cands[r] = chunk
        if not cands:
            return [], []
        records = np.fromiter(cands, dtype=np.int64, count=len(cands))
        inside = self._fetcher.riders(ids[fetch], records).tolist()
        riders = records[inside].tolist()
        return riders, [cands[r] for r in riders]

    def _cache_part(self, ids: np.ndarray, uses: np.ndarray, now: int,
                    staged: dict[int, _Staged]
                    ) -> tuple[dict[int, str], dict[int, _Read | None]]:
        """Look the chunk's records up, start reading those held and not staged (on
        :data:`_CACHE_READS`, :data:`CACHE_READ_RECORDS` a read), then reserve room for the
        misses the cache keeps. Their keys by position, and the read and place of each record
        held (None: read by the batch that needs it, see :attr:`stages_hits`)."""
        f = self._fetcher
        cache = f.cache
        assert cache is not None
        keys, sizes, urls = f.keys_of(ids)
        remote = [j for j, key in enumerate(keys) if key is not None]
        rows = cache.look_up([keys[j] for j in remote],  # type: ignore[misc]
                             next_use=[int(uses[j]) for j in remote])
        ready, asked, coming = [], [], []
        for j, row in zip(remote, rows):
            if row is not None and int(ids[j]) in staged:
                continue  # held, or on its way into the cache: its bytes are staged
            if row is not None and row[1]:
                ready.append((j, row[0]))
            elif row is not None:  # on its way into the cache by another fetch: awaited
                coming.append((j, row[0]))
            else:
                asked.append((j, keys[j]))
        cache.tally(len(remote) - len(asked) - len(coming), len(asked) + len(coming))
        held: dict[int, _Read | None] = {}
        if not self.stages_hits:
            held.update((j, None) for j, _ in ready)
            ready = []
        for lo in range(0, len(ready), CACHE_READ_RECORDS):
            part = ready[lo : lo + CACHE_READ_RECORDS]
            read = _CACHE_READS.submit(
                partial(cache.read_entries, [(keys[j], size) for j, size in part]))  # type: ignore[misc]
            held.update((j, (read, n)) for n, (j, _) in enumerate(part))
        decided = cache.reserve([(key, urls[j], int(sizes[j]), int(uses[j]))  # type: ignore[misc]
                                 for j, key in asked], now=now)
        # refused because another fetch reserved it since the look-up: awaited as well
        refused = [(j, key) for (j, key), ok in zip(asked, decided) if not ok]
        if refused:
            again = cache.look_up([key for _, key in refused])  # type: ignore[misc]
            coming += [(j, row[0]) for (j, _), row in zip(refused, again) if row is not None]
        for lo in range(0, len(coming), CACHE_READ_RECORDS):
            part = coming[lo : lo + CACHE_READ_RECORDS]
            wait = _CACHE_WAITS.submit(
                partial(cache.await_entries, [(keys[j], size) for j, size in part],  # type: ignore[misc]
                        seconds=f.wait_seconds, stop=self._is_closed))
            held.update((j, (wait, n)) for n, (j, _) in enumerate(part))
        return {j: key for (j, key), ok in zip(asked, decided) if ok}, held  # type: ignore[misc]

    def _fill_staged(self, ids: np.ndarray, kept: dict[int, str],
                     staged: dict[int, _Staged]) -> None:
        """Records staged earlier that the cache now keeps: written once their bytes are here;
        until then they stay staged (else a later chunk would find them neither there nor in
        the cache, and fetch them again)."""
        for j, key in kept.items():
            entry = staged.get(int(ids[j]))
            if entry is not None:
                entry.filling = True
                self._fill_when_here(int(ids[j]), entry, key)

    def _fill_when_here(self, record: int, entry: _Staged, key: str) -> None:
        """Write a record staged by an earlier chunk into the cache once its fetch is done
        (on the thread that finishes it: no fetch thread waits for it); a fetch that failed or
        was cancelled gives the reservation up."""
        cache = self._fetcher.cache
        assert cache is not None

        def fill(future: Future[list[bytes]]) -> None:
            try:
                if future.cancelled() or future.exception() is not None:
                    data = None
                else:
                    data = future.result()[entry.at]
                if data is None:
                    cache.abandon([key])
                else:
                    self._fill(cache, [(key, data)])
            finally:
                with self._lock:
                    entry.filling = False
                    if entry.last <= self._released and self._staged.get(record) is entry:
                        del self._staged[record]

        entry.future.add_done_callback(fill)

    def _fetch(self, ids: np.ndarray, keys: list[str | None]) -> list[bytes]:
        """Fetch records ``ids``; write those with a reserved key into the cache."""
        cache = self._fetcher.cache
        reserved = [k for k in keys if k is not None]
        try:
            payloads = self._fetcher._network(ids, True)
        except BaseException:
            if cache is not None and reserved:
                cache.abandon(reserved)
            raise
        if cache is not None and reserved:
            self._fill(cache, [(k, d) for k, d in zip(keys, payloads) if k is not None])
        return payloads

    @staticmethod
    def _fill(cache: DiskCache, items: list[tuple[str, bytes]]) -> None:
        for n, (key, data) in enumerate(items):
            cache.fill(key, data)  # a full disk: the cache steps aside, says so once
            if cache.aside is not None:
                cache.abandon([k for k, _ in items[n + 1 :]])
                return

    def peek(self, idx: np.ndarray, out: list[bytes | None]) -> None:
        """Fill ``out[i]`` (where None) with the staged payload of ``idx[i]``, waiting for its
        fetch. A fetch that failed on storage raises its StorageError; one that failed
        otherwise leaves the record to the caller's own read (which names the record)."""
        with self._lock:
            entries = [(i, self._staged.get(r)) for i, r in enumerate(idx.tolist())
                       if out[i] is None]
        for i, entry in entries:
            if entry is None:
                continue
            try:
                out[i] = entry.future.result()[entry.at]
            except StorageError:
                raise
            except Exception as exc:  # noqa: BLE001 - the direct read names the fault
                log.debug("read-ahead fetch failed (%s); reading the record directly", exc)

    def release(self, chunk: int) -> None:
        """Drop the records no chunk after ``chunk`` asked for."""
        with self._lock:
            self._released = max(self._released, chunk)
            for r in [r for r, e in self._staged.items() if e.last <= chunk and not e.filling]:
                del self._staged[r]

    def _is_closed(self) -> bool:
        return self.closed

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._staged.clear()
        self._fetcher._forget(self)


def _abandon_if_cancelled(cache: DiskCache, keys: list[str], future: Future[Any]) -> None:
    """Give up the reservations of a fetch that never ran (they would stay reserved, and so
    be fetched again, by every later Dataset of this process)."""
    if future.cancelled():
        cache.abandon(keys)


__all__ = ["AHEAD_READ", "FETCH_THREADS", "AheadSession", "RecordFetcher"]
