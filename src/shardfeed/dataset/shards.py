"""The global record index over many shards, built lazily from per-shard offset arrays.

::

    shard            0            1         2
    records      [0 .. 999] [1000 .. 1499] [1500 .. 2999]       starts = [0, 1000, 1500, 3000]
    record i  ->  shard k = searchsorted(starts, i, "right") - 1,  local = i - starts[k]
              ->  bytes [offsets_k[local], offsets_k[local + 1])

Each shard's offsets are its ``.idx.npy`` memory-mapped (8 bytes a record, paged in on use),
its ``.idx`` text parsed, or a scan of the file when it has no index yet. With a manifest
the per-shard arrays are loaded on first use, so opening costs one ``stat`` per shard.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable, Sequence

import numpy as np

from shardfeed.errors import FormatError, StorageError
from shardfeed.format import spec as S
from shardfeed.format.framing import scan
from shardfeed.format.index import (
    load_binary_index,
    parse_binary_index,
    parse_text_index,
    read_text_index,
    write_binary_index,
    write_text_index,
)
from shardfeed.storage import files, index_cache, is_remote

log = logging.getLogger("shardfeed.dataset")

RERUN_HINT = "re-run `shardfeed index` on it (or `shardfeed pack --resume` for packed data)"


def _local_size(url: str) -> int | None:
    """Size of a local file, None for URLs; StorageError if the file is missing or cannot be
    looked at, FormatError if it is not a regular file (a folder, a pipe, a device)."""
    if is_remote(url):
        return None
    path = url.removeprefix("file://")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise StorageError(
            f"file '{url}' does not exist; check the path, or rebuild the manifest with "
            "`shardfeed index` if the shards were moved"
        ) from None
    except OSError as exc:  # a name too long, a file where a folder should be, no access
        raise StorageError(f"cannot look at file '{url}' ({exc.strerror}); check the path, "
                           "or rebuild the manifest with `shardfeed index`") from None
    if not stat.S_ISREG(info.st_mode):
        raise FormatError(f"'{url}' is not a regular file, so not a shard; check the path, "
                          "or rebuild the manifest with `shardfeed index`")
    return info.st_size


MAX_MAPPED_INDEXES = 128
"""Datasets of more shards than this read their ``.idx.npy`` files into memory instead of
mapping them: every mapping holds a file descriptor, and a process may have 1,024."""


def find_index(url: str, *, mmap: bool = True) -> np.ndarray | None:
    """The offsets of ``url`` from its ``.idx.npy`` or ``.idx`` file, or None if it has none.

    ``mmap``: map a local ``.idx.npy`` (pages read on use; holds a file descriptor) rather
    than read it. Remote indexes cost one GET (no existence check first), through the
    optional cache of :func:`shardfeed.storage.set_index_cache`.
    """
    if is_remote(url):
        return _find_remote_index(url)
    binary = S.binary_index_path(url)
    if _exists(binary):
        return load_binary_index(binary, mmap=mmap)
    text = S.text_index_path(url)
    if _exists(text):
        return read_text_index(text)
    return None


def _find_remote_index(url: str) -> np.ndarray | None:
    binary = _read_if_exists(S.binary_index_path(url))
    if binary is not None:
        return parse_binary_index(binary, path=S.binary_index_path(url))
    text = _read_if_exists(S.text_index_path(url))
    if text is not None:
        return parse_text_index(text, path=S.text_index_path(url))
    return None


def _read_if_exists(url: str) -> bytes | None:
    """The whole object in one request (through the index cache), or None if it does not
    exist."""
    return files.read_if_exists(url, cache=index_cache())


def _exists(url: str) -> bool:
    """True if the index file ``url`` exists; FormatError if something else is there (a
    folder, a pipe that would block the reader, a device)."""
    if is_remote(url):
        return files.exists(url)
    try:
        info = os.stat(url.removeprefix("file://"))
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise StorageError(f"cannot look at file '{url}' ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise FormatError(f"'{url}' is not a regular file, so not an index; delete it and "
                          f"{RERUN_HINT}")
    return True


def build_index(url: str, *, progress: Callable[[int], object] | None) -> np.ndarray:
    """Scan ``url`` for its records; write ``.idx`` and ``.idx.npy`` beside it when it is a
    writable local file, else keep the offsets in memory only."""
    offsets = scan(url, progress=progress)
    if is_remote(url):
        log.info("indexed %s (%d records); index kept in memory", url, len(offsets) - 1)
        return offsets
    try:
        write_text_index(S.text_index_path(url), offsets)
        write_binary_index(S.binary_index_path(url), offsets)
        log.info("indexed %s (%d records); wrote %s", url, len(offsets) - 1,
                 S.binary_index_path(url))
    except (StorageError, OSError) as exc:
        log.info("indexed %s (%d records); cannot write its index (%s), kept in memory",
                 url, len(offsets) - 1, exc)
    return offsets


def check_offsets(url: str, offsets: np.ndarray, *, size: int | None,
                  records: int | None = None, manifest_bytes: int | None = None) -> None:
    """Raise FormatError if an index does not describe the file as it is now."""
    end = int(offsets[-1])
    if records is not None and len(offsets) - 1 != records:
        raise FormatError(
            f"shard '{url}': the manifest says {records} records but its index has "
            f"{len(offsets) - 1}; the shard changed after indexing: {RERUN_HINT}"
        )
    if manifest_bytes is not None and end != manifest_bytes:
        raise FormatError(
            f"shard '{url}': the manifest says {manifest_bytes} bytes but its index ends at "
            f"byte {end}; the shard changed after indexing: {RERUN_HINT}"
        )
    if size is not None and size != end:
        raise FormatError(
            f"shard '{url}' is {size} bytes but its index ends at byte {end}; the file "
            f"changed after indexing: delete its .idx/.idx.npy and {RERUN_HINT}"
        )


class ShardTable:
    """Record ``i`` → (shard, record in shard, byte range); thread-safe lazy index loading.

    Memory: 8 bytes a record for the offsets (memory-mapped when they come from ``.idx.npy``)
    plus 8 bytes a shard for the cumulative counts.
    """

    def __init__(
        self,
        urls: Sequence[str],
        counts: Sequence[int],
        offsets: Sequence[np.ndarray | None],
        loader: Callable[[int], np.ndarray],
    ) -> None:
        self.urls = list(urls)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.starts = np.zeros(len(self.urls) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=self.starts[1:])
        self._offsets: list[np.ndarray | None] = list(offsets)
        self._views: list[np.ndarray | None] = [None] * len(self._offsets)
        self._loader = loader
        # striped locks: shards whose numbers differ mod 64 load their indexes at once
        self._locks = [threading.Lock() for _ in range(min(64, max(1, len(self.urls))))]

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def num_shards(self) -> int:
        return len(self.urls)

    def offsets(self, shard: int) -> np.ndarray:
        """The n+1 offsets of one shard, loading (and checking) them on first use."""
        arr = self._offsets[shard]
        if arr is None:
            with self._locks[shard % len(self._locks)]:
                arr = self._offsets[shard]
                if arr is None:
                    arr = self._loader(shard)
                    self._offsets[shard] = arr
        return arr

    def offsets_view(self, shard: int) -> np.ndarray:
        """:meth:`offsets` as a plain ndarray over the same memory (no copy): indexing a
        ``np.memmap`` runs Python code (``__getitem__``, ``__array_finalize__``) on every
        call, which costs more than the lookup itself when a read asks for a few records."""
        view = self._views[shard]
        if view is None:  # two threads may both make one: equal views, either is kept
            view = self.offsets(shard).view(np.ndarray)
            self._views[shard] = view
        return view

    def shard_of(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, record within shard) for already bounds-checked global indices."""
        shard = self.starts.searchsorted(indices, side="right") - 1  # np.searchsorted's
        # wrappers cost more than the search for a read of a few records
        return shard, indices - self.starts[shard]

    def index_bytes(self) -> int:
        """Bytes the index takes: loaded offset arrays (mapped or not) + cumulative counts."""
        loaded = sum(a.nbytes for a in self._offsets if a is not None)
        return int(loaded + self.starts.nbytes + self.counts.nbytes)
