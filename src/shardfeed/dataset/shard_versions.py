"""The version of each shard a Dataset reads: pinned when it opens, checked on every read.

::

    shard            pinned                                 checked
    -----            ------                                 -------
    local            its file (device, inode, size, mtime)  each read: one stat a folder
                     when the Dataset opens                 (LocalFiles: a file a folder
                                                            changed in is looked at)
    object storage   ETag / generation / version id, else   each request: If-Match (or what
                     Last-Modified: the HEAD of its first   the store offers; PinnedSource)
                     read, or the listing when the Dataset
                     opens with a disk cache                each Loader pass: listed again
                                                            (records the disk cache holds)

A shard found changed raises :class:`~shardfeed.errors.ShardChangedError`: a Dataset never
reads a rewritten shard through the index and cache of its old bytes, nor the old bytes
once the store says they are gone. What no reader can tell apart is said in
docs/dataset.md (a store with only a modification time, rewritten within its second).

Determinism: none needed. State: the versions pinned. Memory: a few hundred bytes a shard.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from shardfeed.storage import files, is_remote
from shardfeed.storage.cache_entries import Version
from shardfeed.storage.versions import LocalFiles, ObjectVersion, changed_error, object_version

__all__ = ["ShardVersions", "cache_versions"]


def _listed(urls: Sequence[str]) -> list[ObjectVersion | None]:
    """The version the store names for each object of ``urls`` (one listing a folder)."""
    read_at = time.time()
    return [None if info is None else object_version(info, read_at=read_at)
            for info in files.object_infos(list(urls))]


def _cache_version(checksum: int | None, listed: ObjectVersion | None) -> Version:
    """What keys a remote shard's records in the disk cache: the manifest's checksum and the
    store's version (a checksum alone where the store names none; None, never cached, where
    its version is weak or there is neither)."""
    if listed is None:
        return checksum
    if listed.weak:
        return None
    return listed.text if checksum is None else f"crc32c={checksum};{listed.text}"


def cache_versions(urls: Sequence[str], checksums: Sequence[int | None]) -> list[Version]:
    """The disk cache's version of each shard of ``urls`` (None for a local one: never
    cached), from one listing of each folder of remote shards (see :class:`ShardVersions`)."""
    remote = [k for k, url in enumerate(urls) if is_remote(url)]
    out: list[Version] = [None] * len(urls)
    for k, listed in zip(remote, _listed([urls[k] for k in remote])):
        out[k] = _cache_version(checksums[k], listed)
    return out


class ShardVersions:
    """The pinned versions of one Dataset's shards (see the module docstring). Thread-safe.

    ``listed``: read the remote shards' versions now (one listing a folder), as a Dataset
    with a disk cache does: its cache keys need them before any shard is read.
    """

    def __init__(self, urls: Sequence[str], *, listed: bool) -> None:
        self.urls = list(urls)
        local = [k for k, url in enumerate(self.urls) if not is_remote(url)]
        self._remote = [k for k, url in enumerate(self.urls) if is_remote(url)]
        self._local_number = np.full(len(self.urls), -1, dtype=np.int64)
        self._local_number[local] = np.arange(len(local))
        self.local = LocalFiles([self.urls[k] for k in local]) if local else None
        self.listed: list[ObjectVersion | None] = [None] * len(self.urls)
        if listed and self._remote:
            for k, version in zip(self._remote, _listed([self.urls[k] for k in self._remote])):
                self.listed[k] = version

    def check_local(self, shards: Callable[[], np.ndarray] | None = None) -> None:
        """Raise ShardChangedError if a local shard was replaced since the Dataset opened
        (``shards()``: the shards just read, asked for only where the local shards lie in
        several folders; None: any). One ``stat`` a folder (see :class:`LocalFiles`)."""
        local = self.local
        if local is None:
            return
        if shards is None or local.folders == 1:
            local.check()
            return
        numbers = self._local_number[np.unique(shards())]
        local.check(numbers[numbers >= 0].tolist())

    def cache_versions(self, checksums: Sequence[int | None]) -> list[Version]:
        """The disk cache's version of each shard (see :func:`cache_versions`), from the
        versions listed when the Dataset opened."""
        out: list[Version] = [None] * len(self.urls)
        for k in self._remote:
            out[k] = _cache_version(checksums[k], self.listed[k])
        return out

    def check_listed(self) -> None:
        """List the remote shards again (one listing a folder) and raise ShardChangedError
        for the first whose version is not the one listed when the Dataset opened: the
        records its disk cache keeps of it are of the old bytes. (A shard gone raises the
        store's StorageError.)"""
        ks = [k for k in self._remote if self.listed[k] is not None]
        for k, now in zip(ks, _listed([self.urls[k] for k in ks]) if ks else []):
            before = self.listed[k]
            if before is not None and now is not None and before.differs(now):
                raise changed_error(self.urls[k], before, now)
