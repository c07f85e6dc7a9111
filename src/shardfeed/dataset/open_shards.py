"""The open shards of a Dataset, and the threads that read several remote shards at once.

::

    read_many([...]) -> records of shards 3, 9, 14
        local shards :  caller: pread 3 -> pread 9 -> pread 14      (page cache: no waiting)
                        or, compiled part built: one gather from the mapped files
        remote shards:  caller: GET 3  |  pool: GET 9  |  pool: GET 14   (latency overlaps)

A remote shard is opened with ``open_source(url, **source_options)`` on first use and its size
is checked against its index then (one HEAD, which pins its version: see
:mod:`~shardfeed.dataset.shard_versions`); local shards were checked when the dataset was
opened, and every read from their maps is checked against the files they were then.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from shardfeed.dataset.shard_versions import ShardVersions
from shardfeed.dataset.shards import ShardTable, check_offsets
from shardfeed.format import native
from shardfeed.storage import is_remote, open_source
from shardfeed.storage.base import ByteSource, PinnedSource
from shardfeed.storage.daemon_threads import carried
from shardfeed.storage.local import LocalSource
from shardfeed.storage.process_state import PROCESS
from shardfeed.storage.versions import ObjectVersion

T = TypeVar("T")
R = TypeVar("R")

_OPEN_LOCKS = 64
"""First opens of shards whose numbers differ mod this run at the same time."""
MAX_OPEN_LOCAL = 256
"""Local shards kept open at once (a file descriptor each); the least recently used idle
one is closed past this, so datasets of thousands of shards stay within the usual limit
of 1,024 descriptors a process."""
MAPPED_RESIDENT_BYTES = 64 << 20
"""Bytes gathered from mapped shards after which their pages are dropped from this process
(``madvise(MADV_DONTNEED)``; the page cache keeps them): read pages of a map count in the
process's resident memory, which would otherwise grow to the dataset's size."""


def _madvise_dropped(m: mmap.mmap) -> None:
    m.madvise(mmap.MADV_DONTNEED)


def check_source_options(options: Mapping[str, Any] | None, *, source: Any = None
                         ) -> dict[str, Any]:
    """``source_options=`` checked now (a TypeError/ValueError naming the bad option), as a
    plain dict for ``open_source(url, **options)``: by the backend that reads ``source``'s
    scheme where one is registered (the options it declares), else as fsspec's
    :class:`~shardfeed.storage.remote.RemoteOptions`."""
    if options is None:
        return {}
    from shardfeed.storage.backends import backend_for
    from shardfeed.storage.remote import RemoteOptions

    listed = source if isinstance(source, (list, tuple)) else [source]
    first = next((os.fspath(s) for s in listed if isinstance(s, (str, os.PathLike))), None)
    backend = None if first is None or not is_remote(first) else backend_for(
        first, options.get("storage_options") if isinstance(options, Mapping) else None)
    if backend is not None and isinstance(options, Mapping):
        unknown = sorted(set(options) - set(backend.options))
        if unknown:
            raise TypeError(
                f"source_options has option(s) {unknown} that the {backend.name} backend of "
                f"'{first}' does not take (it takes: {', '.join(backend.options) or 'none'})")
        if "storage_options" not in backend.options:  # its own options, checked by it
            return dict(options)
        policy_options = {k: v for k, v in options.items()
                          if k in RemoteOptions.__dataclass_fields__}
        RemoteOptions.from_mapping(policy_options, what="source_options")
        return dict(options)
    RemoteOptions.from_mapping(options, what="source_options")
    return dict(options)


_ALL_LOADED = np.ones(0, dtype=bool)
"""Stands for a gather's "every shard's offsets loaded" (then it looks no more)."""


class OpenShards:
    """One :class:`ByteSource` a shard, opened on first use; a pool for parallel reads.

    Thread-safe. Memory: one open source a shard in use (local shards: at most
    ``MAX_OPEN_LOCAL`` descriptors, idle ones closed least recently used first, and where
    :meth:`gather` runs, a map each with at most ``MAPPED_RESIDENT_BYTES`` read since its
    pages were last dropped; remote shards: a source each, whose threads run only during a
    read) and, for datasets with remote shards, up to ``max_concurrency`` reader threads.
    """

    def __init__(self, table: ShardTable, *, source_options: Mapping[str, Any],
                 versions: ShardVersions | None = None) -> None:
        self._table = table
        self.versions = versions  # None: no version is pinned or checked
        self._options = dict(source_options)
        self._sources: dict[int, ByteSource] = {}
        self._pins: dict[int, ObjectVersion | None] = {}  # what each remote source pinned
        self._users: dict[int, int] = {}  # reads running on each source
        self._local_lru: OrderedDict[int, None] = OrderedDict()
        self.max_open_local = MAX_OPEN_LOCAL
        local = sum(not is_remote(url) for url in table.urls)
        self._bounded = local > self.max_open_local  # else no source is ever closed early
        self._lock = threading.Lock()
        self._open_locks = [threading.Lock() for _ in range(min(_OPEN_LOCKS, table.num_shards))]
        self._closed = False
        self.remote = any(is_remote(url) for url in table.urls)
        self.max_workers = int(self._options.get("max_concurrency", 16))
        self._pool: ThreadPoolExecutor | None = None
        PROCESS.at_fork(self, OpenShards._forked)
        self._mapped_bytes = 0  # gathered since the maps' pages were last dropped
        # a gather needs every shard kept open while it reads: no early closing, none remote
        self.can_gather = native.wire is not None and not self.remote and not self._bounded
        self._every: tuple[tuple[mmap.mmap | bytes, ...], np.ndarray] | None = None
        self._every_offsets: tuple[np.ndarray, ...] = ()

    def is_open(self) -> bool:  # a map a reader still holds stays readable: it asks first
        return not self._closed

    def gather(self, shard: np.ndarray, local: np.ndarray, verify: bool) -> list[bytes] | None:
        """The payloads of records ``local[i]`` of shards ``shard[i]`` (both int64), read from
        the mapped files in one compiled call; None where a shard cannot be mapped or a
        record fails a check (the ``read_ranges`` path then reads them, or names the fault)."""
        wire = native.wire
        args = self._gather_args(shard, local)
        if args is None or wire is None:
            return None
        got = wire.gather(*args, verify)
        if not isinstance(got, list):
            return None
        # its one caller (Dataset._read_shards) checks the shards' files after every read
        self._count_mapped(sum(map(len, got)), check=False)
        return got

    def gather_columns(self, shard: np.ndarray, local: np.ndarray, verify: bool,
                       keys: tuple[bytes, ...], count: int,
                       fills: tuple[np.ndarray | None, ...]) -> list[Any] | None:
        """:meth:`gather` and the Example columns of features ``keys`` in one compiled pass
        (see ``_wire.gather_columns``; ``count``: the features every record holds, or -1 for
        any that include ``keys``): the gathered columns, a None one for a feature copied
        into its fill's rows; None where a record is not accepted (the caller reads them by
        the other path, which gives the same values or names the fault)."""
        wire = native.wire
        args = self._gather_args(shard, local)
        if args is None or wire is None:
            return None
        got = wire.gather_columns(*args, verify, keys, count, fills)
        if not isinstance(got, tuple):
            return None
        columns, read = got
        self._count_mapped(read)
        return list(columns)

    def _gather_args(self, shard: np.ndarray, local: np.ndarray) -> tuple[
        tuple[mmap.mmap | bytes, ...], tuple[np.ndarray, ...], np.ndarray, np.ndarray
    ] | None:
        """``(maps, offsets, which, records)`` of a compiled gather: every shard's map (made
        once, see :meth:`_every_map`) and the offsets of every shard read so far (those of
        ``shard`` loaded, and checked, now), with ``shard`` and ``local`` as they are; None
        where a shard cannot be mapped."""
        every = self._every or self._every_map()
        if every is None or self._closed:
            return None
        maps, loaded = every
        if loaded is not _ALL_LOADED and not loaded[shard].all():
            table = self._table
            with self._lock:  # the offsets first, then marked loaded: see the reads below
                listed = list(self._every_offsets)
                fresh = set(shard[~loaded[shard]].tolist())
                for k in fresh:
                    listed[k] = table.offsets_view(k)
                self._every_offsets = tuple(listed)
                loaded[list(fresh)] = True
                if self._every is every and loaded.all():  # no more to load: no more looks
                    self._every = (maps, _ALL_LOADED)
        offsets = self._every_offsets  # read after the check: holds every shard checked
        return (maps, offsets, shard.astype(np.int64, copy=False),
                local.astype(np.int64, copy=False))

    def _every_map(self) -> tuple[tuple[mmap.mmap | bytes, ...], np.ndarray] | None:
        """Every shard's map and which shards' offsets are loaded (``_every_offsets``: an
        empty array for a shard not yet read, whose records a gather refuses); kept for
        every later gather, which then passes the shard numbers as they are instead of
        finding which shards a slice touches. None where a shard cannot be mapped."""
        if not self.can_gather:
            return None
        maps: list[mmap.mmap | bytes] = []
        counts = self._table.counts
        for k in range(self._table.num_shards):
            if not counts[k]:  # no record to read (an empty file cannot be mapped)
                maps.append(b"")
                continue
            src = self._sources.get(k) or self._acquire(k)
            m = src.mapping() if isinstance(src, LocalSource) else None
            if m is None:  # a file system without maps: read by ranges from now on
                self.can_gather = False
                return None
            maps.append(m)
        count = self._table.num_shards
        with self._lock:
            self._every_offsets = (np.zeros(0, np.int64),) * count
            self._every = (tuple(maps), np.zeros(count, bool))
        return self._every

    def _count_mapped(self, size: int, *, check: bool = True) -> None:
        """Count bytes read from the maps (past the bound, drop their pages), and (``check``)
        check that the shards are still the files mapped: a file replaced since keeps its
        old bytes in its map (ShardChangedError)."""
        if check and self.versions is not None:
            self.versions.check_local()
        self._mapped_bytes += size  # a race loses a count at worst
        if self._mapped_bytes > MAPPED_RESIDENT_BYTES:
            self._mapped_bytes = 0
            self._drop_mapped_pages()

    def _drop_mapped_pages(self) -> None:
        """Drop the maps' pages from this process, unless all maps together are within the
        bound (then all their pages fit it: dropping them would only cost page faults)."""
        maps = [m for m in (src.mapping(create=False) for src in self.open_sources()
                            if isinstance(src, LocalSource)) if m is not None]
        if sum(len(m) for m in maps) > MAPPED_RESIDENT_BYTES:
            # without the GIL, which mmap.madvise keeps: on 2 cores, reading 1566² JPEG
            # records (945 KB) one at a time, its calls took 0.83 ms each, 52 µs a read
            drop = native.wire.drop_pages if native.wire is not None else _madvise_dropped
            for m in maps:
                drop(m)

    def read_ranges(self, k: int, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """``read_ranges`` of shard ``k``'s source (ValueError once closed)."""
        if not self._bounded:  # every shard may stay open: no use counts needed
            src = self._sources.get(k) or self._acquire(k)
            return src.read_ranges(ranges)
        src = self._acquire(k)
        try:
            return src.read_ranges(ranges)
        finally:
            self._release(k)

    def _forked(self) -> None:
        """In a forked child (the fork rule, :mod:`~shardfeed.storage.process_state`): new
        locks (a thread of the parent may have held one), the reader pool dropped (its
        threads stayed in the parent), and the remote sources dropped (their clients, threads
        and connections stayed there too; obstore's would wait for ever): each shard is
        opened again here, on first use, pinned to the version the parent read (a rewrite
        since raises ShardChangedError). Local sources are kept: their descriptors and maps
        followed the fork."""
        self._lock = threading.Lock()
        self._open_locks = [threading.Lock() for _ in self._open_locks]
        self._pool = None
        for k in [k for k in self._sources if is_remote(self._table.urls[k])]:
            del self._sources[k]
            self._local_lru.pop(k, None)
        self._users = {}  # the reads that were running are the parent's

    def _acquire(self, k: int) -> ByteSource:
        src = self._use_open(k)
        if src is not None:
            return src
        with self._open_locks[k % len(self._open_locks)]:
            src = self._use_open(k)
            if src is not None:
                return src
            src = self._open(k)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._sources[k] = src
                    self._users[k] = 1
                    if not is_remote(self._table.urls[k]):
                        self._local_lru[k] = None
                    idle = self._evict_locked()
            if closed:
                src.close()
                raise ValueError("this Dataset is closed; open a new one")
        for victim in idle:
            victim.close()
        return src

    def _use_open(self, k: int) -> ByteSource | None:
        with self._lock:
            src = self._sources.get(k)
            if src is not None:
                self._users[k] = self._users.get(k, 0) + 1
                if k in self._local_lru:
                    self._local_lru.move_to_end(k)
            return src

    def _release(self, k: int) -> None:
        with self._lock:
            left = self._users.get(k, 1) - 1
            if left:
                self._users[k] = left
                return
            self._users.pop(k, None)
            idle = self._evict_locked() if len(self._local_lru) > self.max_open_local else []
        for victim in idle:
            victim.close()

    def _evict_locked(self) -> list[ByteSource]:
        """Take idle local sources out, oldest first, until at most ``max_open_local`` stay
        open (sources in use stay whatever the count); the caller closes them unlocked."""
        excess = len(self._local_lru) - self.max_open_local
        if excess <= 0:
            return []
        idle = [k for k in self._local_lru if k not in self._users][:excess]
        victims = []
        for k in idle:
            del self._local_lru[k]
            victims.append(self._sources.pop(k))
        return victims

    def _open(self, k: int) -> ByteSource:
        if self._closed:
            raise ValueError("this Dataset is closed; open a new one")
        url = self._table.urls[k]
        if not is_remote(url):
            return open_source(url)
        src = open_source(url, **self._options)
        try:  # local shards were checked at open; remote ones on first use
            if isinstance(src, PinnedSource):  # its version from now on (and its size)
                listed = None if self.versions is None else self.versions.listed[k]
                self._pins[k] = src.pin(self._pins.get(k) or listed)
            check_offsets(url, self._table.offsets(k), size=src.size())
        except BaseException:
            src.close()
            raise
        return src

    def open_sources(self) -> list[ByteSource]:
        """The sources opened so far."""
        with self._lock:
            return list(self._sources.values())

    def run_all(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(x) for x in items]``, the items after the first on the pool at the same time.

        The first error raises (the original exception, with its traceback); calls not yet
        started are cancelled.
        """
        if len(items) < 2:
            return [fn(x) for x in items]
        pool = self._executor()
        try:
            # each under this thread's cancel token (a Loader's pass: ended with it)
            futures: list[Future[R]] = [pool.submit(carried(fn), x) for x in items[1:]]
        except RuntimeError:  # the pool was shut down under us: close() ran meanwhile
            raise ValueError("this Dataset is closed; open a new one") from None
        try:
            first = fn(items[0])
            return [first, *(f.result() for f in futures)]
        except CancelledError:
            raise ValueError("this Dataset was closed during the read; open a new one") from None
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise ValueError("this Dataset is closed; open a new one")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_workers,
                                                thread_name_prefix="shardfeed-shards")
            return self._pool

    def stats(self) -> dict[str, float]:
        """Request counters summed over the remote shards opened so far (``requests``,
        ``bytes_fetched``, ``retries``, ``seconds`` in storage calls)."""
        total: dict[str, float] = {"requests": 0, "bytes_fetched": 0, "retries": 0,
                                   "seconds": 0.0}
        for src in self.open_sources():
            stats = getattr(src, "stats", None)
            if stats is not None:
                for key, value in stats().items():
                    total[key] = total.get(key, 0) + value
        return total

    def close(self) -> None:
        """Close every source and join the pool's threads. Idempotent."""
        with self._lock:
            self._closed = True
            self._every = None
            sources, self._sources = self._sources, {}
            self._local_lru.clear()
            pool, self._pool = self._pool, None
        for k, src in sources.items():  # a closed remote source ends its reads at once
            if is_remote(self._table.urls[k]):
                src.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        for src in sources.values():  # local ones after: no pread may be running on them
            src.close()
