"""The decoded-image cache of the patch sampler: bounded in bytes, shared by threads.

A performance device only: what it returns is exactly what the loader function returns, so
dropping an entry (or the whole cache) never changes an output, only how often images are
decoded. Each entry carries an *expiry*, the ``(epoch, position)`` of the last output that
may still use it (for patches: the end of the image's residency in the cache schedule), and
the cache keeps a *clock*, the furthest ``(epoch, position)`` any caller has asked for since
the pass began (:meth:`ImageCache.rewind`)::

    entries (least recently used first)        clock = (0, 1830)
    [img 17  exp (0, 1799)]  expired  <- evicted first: the one expired longest ago
    [img 40  exp (0, 1899)]  resident
    [img 41  exp (0, 1999)]  resident <- evicted (least recently used first) only when
                                         nothing expired is left

Among expired entries the one whose residency ended first goes first: a thread still
working behind the clock may need an entry that expired a moment ago, never one that
expired long before.

Loads are deduplicated: two threads asking for the same missing key wait on one load (a
per-key future), so an image is decoded once per residency. A load may be started ahead
on another thread (:meth:`ImageCache.load_ahead`): the key counts as being loaded from then
on. A failed load is not cached; every waiter then loads for itself and gets its own error.

Determinism: returns what ``load`` returns. State: the entries and counters (not part of any
loader state). Memory: at most ``max_bytes`` of entries (as reported by ``load``), plus the
values being loaded by threads at that moment; a derived bound is ``default_images`` times
the largest value loaded so far (and what :meth:`ImageCache.grow` added, within its bytes).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shardfeed.pipeline.expiry_index import ExpiryIndex
from shardfeed.storage.process_state import PROCESS, fail_forked

V = TypeVar("V")
K = TypeVar("K", bound=Hashable)
Clock = tuple[int, int]

__all__ = ["CacheStats", "ImageCache"]


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of an :class:`ImageCache` since it was created (or cleared).

    ``loads``: values loaded (decodes); ``hits``: requests served from the cache (including
    waits on another thread's load); ``evictions``: entries dropped to make room;
    ``uncached``: loaded values not kept because they were larger than the bound;
    ``bytes``/``peak_bytes``: bytes held now / at most; ``max_bytes``: the bound (None until
    the first load when it is derived from the loaded values).
    """

    hits: int
    loads: int
    evictions: int
    uncached: int
    entries: int
    bytes: int
    peak_bytes: int
    max_bytes: int | None


class _Entry(Generic[V]):
    __slots__ = ("expires", "nbytes", "value")

    def __init__(self, value: V, nbytes: int, expires: Clock) -> None:
        self.value = value
        self.nbytes = nbytes
        self.expires = expires


class _LoadFailed(Exception):
    """Internal: the thread loading a key failed; waiters load for themselves."""


class ImageCache(Generic[V]):
    """A thread-safe, byte-bounded cache of decoded images keyed by record id.

    ``max_bytes``: the bound on the bytes of cached values. ``None`` derives it from the loaded
    values: ``default_images`` times the largest loaded so far, and the values
    :meth:`grow` adds (it grows when a larger one comes, never shrinks until :meth:`clear`;
    pass ``max_bytes`` for a bound fixed from the start).

    Determinism, state and memory: see the module docstring.
    """

    def __init__(self, *, max_bytes: int | None = None, default_images: int = 1) -> None:
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
        ):
            raise ValueError(f"max_bytes must be an int >= 0 or None, got {max_bytes!r}")
        if isinstance(default_images, bool) or not isinstance(default_images, int) or (
            default_images < 1
        ):
            raise ValueError(f"default_images must be an int >= 1, got {default_images!r}")
        self._configured = max_bytes
        self._default_images = default_images
        self._more: tuple[int, int] = (0, 0)  # (images, at most bytes): see grow()
        self._reset()
        PROCESS.at_fork(self, ImageCache._forked)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Entry[V]] = OrderedDict()
        self._expiring = ExpiryIndex()  # the entries' keys by expiry (see _victim)
        self._pending: dict[Hashable, Future[V]] = {}
        self._max_bytes: int | None = self._configured
        self._clock: Clock = (-1, -1)
        self._bytes = 0
        self._peak = 0
        self._largest = 0
        self._hits = 0
        self._loads = 0
        self._evictions = 0
        self._uncached = 0

    def _forked(self) -> None:
        """In a forked child: a new lock (a parent's thread may have held it), and the loads
        that were on the parent's threads failed, so that their waiters load for themselves
        (the fork rule, :mod:`~shardfeed.storage.process_state`)."""
        self._lock = threading.Lock()
        pending = self._pending
        self._pending = {}
        fail_forked(pending.values(), "a decode", error=_LoadFailed)

    # -- pickling (process workers get an empty cache of the same configuration) ----------------

    def __getstate__(self) -> dict[str, Any]:
        return {"max_bytes": self._configured, "default_images": self._default_images,
                "more": self._more}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._configured = state["max_bytes"]
        self._default_images = state["default_images"]
        self._more = state.get("more", (0, 0))
        self._reset()
        PROCESS.at_fork(self, ImageCache._forked)

    # -- queries -----------------------------------------------------------------------------

    @property
    def max_bytes(self) -> int | None:
        """The bound in bytes now (a derived one: None until the first load, then
        ``default_images`` times the largest value loaded)."""
        return self._max_bytes

    def grow(self, images: int, *, most_bytes: int) -> None:
        """Let a derived bound hold up to ``images`` more values, of at most ``most_bytes``
        in all: ``default_images`` times the largest value loaded, plus ``images`` times it
        within ``most_bytes`` (checked again as larger values come). Never lowered (loaders
        sharing the cache get the most any asked for); the bound grows at once where a value
        was loaded. A bound given as ``max_bytes`` stays as it is."""
        with self._lock:
            more = self._more
            self._more = (max(more[0], images), max(more[1], most_bytes))
            if self._configured is None and self._largest:
                self._max_bytes = max(self._max_bytes or 0, self._derived(self._largest))

    def _derived(self, largest: int) -> int:
        """The derived bound with ``largest`` the largest value (lock held)."""
        images, most = self._more
        return self._default_images * largest + min(images * largest, most)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    @property
    def largest_bytes(self) -> int:
        """The largest value loaded so far, in bytes (0 before the first)."""
        return self._largest

    def known(self, key: Hashable) -> bool:
        """Whether ``key`` is cached or being loaded (a :meth:`get` now would not load it)."""
        with self._lock:
            return key in self._entries or key in self._pending

    def unknown(self, keys: Iterable[K]) -> list[K]:
        """The keys of ``keys`` that are not :meth:`known`, in their order (one hold of the
        lock for all)."""
        with self._lock:
            entries, pending = self._entries, self._pending
            return [key for key in keys if key not in entries and key not in pending]

    def stats(self) -> CacheStats:
        """The counters now (see :class:`CacheStats`)."""
        with self._lock:
            return CacheStats(
                hits=self._hits, loads=self._loads, evictions=self._evictions,
                uncached=self._uncached, entries=len(self._entries), bytes=self._bytes,
                peak_bytes=self._peak, max_bytes=self._max_bytes,
            )

    def clear(self) -> None:
        """Drop every entry and counter (loads in flight still complete and are kept)."""
        with self._lock:
            self._entries.clear()
            self._expiring.reset()
            self._bytes = 0
            self._peak = 0
            self._hits = self._loads = self._evictions = self._uncached = 0
            self._clock = (-1, -1)
            self._pending = {}
            self._max_bytes = self._configured

    def rewind(self) -> None:
        """A new pass of the loader, whose outputs may come before the last pass's (an epoch
        read again): the clock set back to the start, and the entries kept, expired (the new
        pass makes those it uses live again; the others go first). Left ahead, the clock
        would take the new pass's entries for expired and evict the ones needed next; left
        live, the last pass's entries would push out the new pass's."""
        with self._lock:
            self._clock = (-1, -1)
            for entry in self._entries.values():
                entry.expires = (-1, -1)
            self._expiring.reset(self._entries, (-1, -1))

    # -- the one operation ---------------------------------------------------------------------

    def get(
        self,
        key: Hashable,
        load: Callable[[], tuple[V, int]],
        *,
        expires: Clock,
        now: Clock,
    ) -> V:
        """The value of ``key``: cached, or ``load()`` (which returns ``(value, nbytes)``).

        ``expires``: the last ``(epoch, position)`` that may use the value; ``now``: the
        ``(epoch, position)`` asking (advances the clock). Exceptions of ``load`` propagate
        and leave nothing cached.
        """
        while True:
            with self._lock:
                entry = self._hit(key, expires, now)
                if entry is not None:
                    return entry.value
                future = self._pending.get(key)
                owner = future is None
                if future is None:
                    future = Future()
                    self._pending[key] = future
            if owner:
                return self._load(key, future, load, expires)
            try:
                value = future.result()
            except _LoadFailed:
                continue  # the loading thread failed: load (and fail) on our own
            with self._lock:
                self._hits += 1
            return value

    def get_many(
        self,
        keys: Sequence[Hashable],
        load_of: Callable[[int], Callable[[], tuple[V, int]]],
        *,
        expires: Sequence[Clock],
        now: Sequence[Clock],
        uses: Sequence[int] | None = None,
    ) -> list[V]:
        """``[get(keys[i], load_of(i), expires=expires[i], now=now[i]) for i ...]``, in that
        order and with the same effects, the cached values taken under one hold of the lock
        (a slice's patches: one lookup for the run of hits, not one each). ``uses``: key
        ``i`` stands for ``uses[i]`` lookups at ``now[i]`` (a slice's outputs of one image,
        asked for once): the effects are those of the key repeated so, but for a value too
        large for the bound: loaded once for all its lookups, counted as one load and no
        hit."""
        out: list[V] = []
        count, at = len(keys), 0
        entries = self._entries
        while at < count:
            with self._lock:
                # _hit() inlined: a slice asks for tens of images, most of them cached (64
                # cached keys on 2 cores: 28.2 µs before, 12.6-13.7 in three runs)
                clock, hits = self._clock, 0
                while at < count:
                    key, when = keys[at], now[at]
                    if when > clock:  # noqa: PLR1730 (with max(): 24-27 µs)
                        clock = when
                    entry = entries.get(key)
                    if entry is None:
                        break
                    entries.move_to_end(key)
                    if expires[at] > entry.expires:
                        self._expiring.move(key, entry.expires, expires[at])
                        entry.expires = expires[at]
                    hits += 1 if uses is None else uses[at]
                    out.append(entry.value)
                    at += 1
                self._clock = clock
                self._hits += hits
            if at < count:  # not cached: as get() (loads it, or waits for its load)
                out.append(self.get(keys[at], load_of(at), expires=expires[at], now=now[at]))
                if uses is not None and uses[at] > 1:  # the key's other lookups: hits
                    with self._lock:
                        self._hit(keys[at], expires[at], now[at], uses[at] - 1)
                at += 1
        return out

    def _hit(self, key: Hashable, expires: Clock, now: Clock,
             hits: int = 1) -> _Entry[V] | None:
        """Under the lock: the clock advanced to ``now``, and ``key``'s entry, used (moved
        last, its expiry extended, ``hits`` counted), or None where it is not cached."""
        self._clock = max(self._clock, now)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            if expires > entry.expires:
                self._expiring.move(key, entry.expires, expires)
                entry.expires = expires
            self._hits += hits
        return entry

    def load_ahead(
        self,
        key: Hashable,
        load: Callable[[], tuple[V, int]],
        *,
        expires: Clock,
        run: Callable[[Callable[[], object]], object],
    ) -> bool:
        """Have ``run`` load ``key`` later (on another thread), unless it is cached or being
        loaded; False then. The key counts as being loaded from this call on, so a :meth:`get`
        meanwhile waits for that load instead of starting its own. The clock is left alone
        (loading ahead is not a use); a failed load is not cached, and its waiters load for
        themselves."""
        with self._lock:
            if key in self._entries or key in self._pending:
                return False
            future: Future[V] = Future()
            self._pending[key] = future

        def load_now() -> object:
            return self._load(key, future, load, expires)

        try:
            run(load_now)
        except BaseException:
            self._failed(key, future)
            raise
        return True

    def _load(
        self, key: Hashable, future: Future[V], load: Callable[[], tuple[V, int]],
        expires: Clock,
    ) -> V:
        try:
            value, nbytes = load()
        except BaseException:
            self._failed(key, future)
            raise
        with self._lock:
            if self._pending.get(key) is future:
                del self._pending[key]
            self._loads += 1
            self._insert(key, value, int(nbytes), expires)
        future.set_result(value)
        return value

    def _failed(self, key: Hashable, future: Future[V]) -> None:
        """The load of ``key`` failed: nothing cached, its waiters load for themselves."""
        with self._lock:
            if self._pending.get(key) is future:
                del self._pending[key]
        future.set_exception(_LoadFailed())

    def _insert(self, key: Hashable, value: V, nbytes: int, expires: Clock) -> None:
        # Called with the lock held.
        self._largest = max(self._largest, nbytes)
        bound = self._configured
        if bound is None:
            # Derived: default_images of the largest value so far. Sizing it from the first
            # value alone left larger images uncached (decoded again for every output).
            bound = max(self._max_bytes or 0, self._derived(self._largest))
            self._max_bytes = bound
        if nbytes > bound:
            self._uncached += 1
            return
        replaced = self._entries.pop(key, None)
        if replaced is not None:  # loaded again meanwhile (a clear() during its load)
            self._expiring.remove(key, replaced.expires)
            self._bytes -= replaced.nbytes
        while self._bytes + nbytes > bound and self._entries:
            victim = self._victim()
            dropped = self._entries.pop(victim)
            self._expiring.remove(victim, dropped.expires)
            self._bytes -= dropped.nbytes
            self._evictions += 1
        self._entries[key] = _Entry(value, nbytes, expires)
        self._expiring.add(key, expires)
        self._bytes += nbytes
        self._peak = max(self._peak, self._bytes)

    def _victim(self) -> Hashable:
        """The entry expired longest ago (the least recently used of those whose expiry is
        the earliest), else the least recently used one."""
        earliest = self._expiring.earliest_before(self._clock)
        if earliest is None:
            return next(iter(self._entries))
        if len(earliest) == 1:
            return next(iter(earliest))
        return next(key for key in self._entries if key in earliest)
