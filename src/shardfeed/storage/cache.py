"""A bounded in-memory cache of whole files' bytes, least recently used out first."""

from __future__ import annotations

import threading
from collections import OrderedDict


class ByteCache:
    """Thread-safe LRU of ``key -> bytes``, bounded by the total size of the values.

    Used for small whole files read again and again (``.idx`` / ``.idx.npy`` indexes, the
    manifest) and, when asked, for whole shards of a remote dataset (see
    ``RemoteSource(cache=...)``). Keys are URLs; the cache assumes an object does not change
    while it is cached (shards and indexes are written once); ``storage.files`` functions that
    write, remove or rename a URL take the same cache and drop its entry.

    Memory: at most ``max_bytes`` of values (plus a few hundred bytes a key). A value larger
    than ``max_item_bytes`` is never stored, so one large file cannot flush many small ones.
    """

    def __init__(self, *, max_bytes: int, max_item_bytes: int | None = None) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        if max_item_bytes is None:
            max_item_bytes = max_bytes
        if (
            isinstance(max_item_bytes, bool)
            or not isinstance(max_item_bytes, int)
            or not 0 <= max_item_bytes <= max_bytes
        ):
            raise ValueError(
                f"max_item_bytes must be an int in [0, max_bytes={max_bytes}], "
                f"got {max_item_bytes!r}"
            )
        self.max_bytes = max_bytes
        self.max_item_bytes = max_item_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> bytes | None:
        """The cached bytes of ``key`` (now the most recently used), or None."""
        with self._lock:
            data = self._items.get(key)
            if data is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return data

    def put(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key``, evicting the least recently used entries to make room.

        Returns False (and stores nothing) when ``data`` is larger than ``max_item_bytes``.
        """
        data = bytes(data)
        if len(data) > self.max_item_bytes:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._total -= len(old)
            while self._items and self._total + len(data) > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._total -= len(evicted)
            self._items[key] = data
            self._total += len(data)
        return True

    def discard(self, key: str) -> None:
        """Forget ``key`` if it is cached."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._total -= len(old)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._total = 0

    @property
    def size_bytes(self) -> int:
        """Total bytes held now."""
        return self._total

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
