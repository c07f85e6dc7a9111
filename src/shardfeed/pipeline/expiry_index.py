"""Which cached key expired longest ago: the decoded-image cache's keys by expiry.

:class:`~shardfeed.pipeline.image_cache.ImageCache` evicts, among its entries whose expiry is
before its clock, the one whose expiry is earliest (the least recently used of those that
share it). Found by looking at every entry, that took 27 µs of CPU an insert, with the
cache's lock and the GIL held, for the ~70 images of a Patches cache on 2 cores (a decode
thread inserts one an image). This index keeps the keys of each expiry and a heap of the
expiries, so the earliest is the heap's first live one.

Determinism: the same victim as the look at every entry (see
``tests/pipeline/test_image_cache.py``). State: none beyond the cache's entries. Memory: a
set a distinct expiry and a heap of at most a few times as many expiries (rebuilt when
stale ones outnumber them).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

Clock = tuple[int, int]

__all__ = ["ExpiryIndex"]


class ExpiryIndex:
    """The keys of each expiry, the earliest expiry found in O(log n).

    Not thread-safe: the cache calls it under its lock."""

    __slots__ = ("_heap", "_keys")

    def __init__(self) -> None:
        self._keys: dict[Clock, set[Hashable]] = {}
        self._heap: list[Clock] = []  # every expiry with keys, and stale ones (dropped lazily)

    def add(self, key: Hashable, expires: Clock) -> None:
        keys = self._keys.get(expires)
        if keys is not None:
            keys.add(key)
            return
        self._keys[expires] = {key}
        heap = self._heap
        if len(heap) > 4 * len(self._keys) + 64:  # mostly stale: start again from the live
            heap[:] = self._keys
            heapq.heapify(heap)
        else:
            heapq.heappush(heap, expires)

    def remove(self, key: Hashable, expires: Clock) -> None:
        keys = self._keys.get(expires)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys[expires]  # its heap item is dropped when it comes first

    def move(self, key: Hashable, old: Clock, new: Clock) -> None:
        """``key``'s expiry changed from ``old`` to ``new``."""
        self.remove(key, old)
        self.add(key, new)

    def reset(self, keys: Iterable[Hashable] = (), expires: Clock = (-1, -1)) -> None:
        """Forget every key; then ``keys``, all expiring at ``expires``."""
        live = set(keys)
        self._keys = {expires: live} if live else {}
        self._heap = [expires] if live else []

    def earliest_before(self, clock: Clock) -> set[Hashable] | None:
        """The keys of the earliest expiry, where it is before ``clock``; else None."""
        heap, keys_of = self._heap, self._keys
        while heap:
            keys = keys_of.get(heap[0])
            if keys:
                return keys if heap[0] < clock else None
            heapq.heappop(heap)  # stale: no key has this expiry any more
        return None
