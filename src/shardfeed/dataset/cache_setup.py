"""A Dataset's disk cache: opened with its bound, each shard keyed by what names its bytes,
and what a cache folder holds of a dataset's shards (``Dataset.cached_in``).

A shard's key holds its URL, size and version: the manifest's checksum, else (bare shards on
object storage) what the store says changes when the shard is rewritten (ETag, generation or
version id, else its modification time). A remote shard with none of these is never cached,
and a warning says so once a Dataset. The fetching itself: :mod:`fetch_ahead`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardfeed.dataset.fetch_ahead import NetworkRead, RecordFetcher
from shardfeed.dataset.shard_versions import cache_versions
from shardfeed.dataset.shards import ShardTable
from shardfeed.storage import is_remote
from shardfeed.storage.cache_entries import Version, object_keys
from shardfeed.storage.disk_cache import DiskCache
from shardfeed.storage.retry import DEFAULT_DEADLINE_SECONDS


def shard_versions(urls: Sequence[str], checksums: Sequence[int | None]) -> list[Version]:
    """What names each shard's bytes in the disk cache's keys: its checksum from the manifest
    and what the store says changes when it is rewritten (ETag, generation or version id,
    else its modification time; one listing a folder): see
    :func:`shardfeed.dataset.shard_versions.cache_versions`. None for a local shard (never
    cached), or where neither names the bytes (then the shard is not cached either)."""
    return cache_versions(urls, checksums)


def open_fetcher(table: ShardTable, network: NetworkRead, *, cache_dir: Any,
                 cache_bytes: int | None, sizes: Sequence[int],
                 checksums: Sequence[int | None],
                 versions: Sequence[Version] | None = None, trust_cache_dir: bool = False,
                 wait_seconds: float = DEFAULT_DEADLINE_SECONDS) -> RecordFetcher | None:
    """The fetcher of a Dataset (None: no remote shard, nothing to fetch ahead or cache).

    ``cache_dir`` (None: no disk cache) holds at most ``cache_bytes`` (None: the remote
    shards' bytes, at most half the free space of the folder's disk; ``versions``: the
    shards' versions in its keys, listed already, else listed here); ``trust_cache_dir``
    opens a folder other users can write (see :mod:`shardfeed.storage.cache_folder`). With a
    cache, shards without a checksum are keyed by their version on the store (see
    :func:`shard_versions`), and a record another process is fetching into it is awaited for
    at most ``wait_seconds`` (the read's deadline).
    """
    if cache_bytes is not None and (isinstance(cache_bytes, bool)
                                    or not isinstance(cache_bytes, int) or cache_bytes < 0):
        raise ValueError(f"cache_bytes must be an int >= 0 (bytes), got {cache_bytes!r}")
    if cache_bytes is not None and cache_dir is None:
        raise ValueError("cache_bytes bounds the disk cache: give cache_dir too")
    remote = [k for k, u in enumerate(table.urls) if is_remote(u)]
    if not remote:
        return None
    cache = None
    listed, versions = versions, list(checksums)
    if cache_dir is not None:
        if cache_bytes is None:
            import os
            import shutil

            folder = os.fspath(cache_dir)
            os.makedirs(folder, mode=0o700, exist_ok=True)
            cache_bytes = min(sum(int(sizes[k]) for k in remote),
                              shutil.disk_usage(folder).free // 2)
        cache = DiskCache(cache_dir, max_bytes=cache_bytes, trust_folder=trust_cache_dir)
        versions = shard_versions(table.urls, checksums) if listed is None else list(listed)
        _say_uncached(table.urls, versions)
    return RecordFetcher(table, network, cache=cache, sizes=sizes, versions=versions,
                         wait_seconds=wait_seconds)


def _say_uncached(urls: Sequence[str], versions: Sequence[Version]) -> None:
    """Warn (once a Dataset) about remote shards the cache cannot key: never cached."""
    bare = [u for u, v in zip(urls, versions) if v is None and is_remote(u)]
    if bare:
        import warnings

        shown = ", ".join(f"'{u}'" for u in bare[:3]) + (", ..." if len(bare) > 3 else "")
        warnings.warn(
            f"{len(bare)} shard(s) ({shown}) have no checksum in a manifest and their store "
            "gives no ETag or generation, and no modification time a minute old (a rewrite "
            "within its second would keep it): they are read from storage, never from the "
            "disk cache (a rewritten shard would be served stale). Open the dataset through "
            "a manifest with checksums (shardfeed index) to cache them",
            RuntimeWarning, stacklevel=4)


def cached_in(table: ShardTable, cache_dir: Any, *, sizes: Sequence[int],
              checksums: Sequence[int | None], trust_cache_dir: bool = False
              ) -> dict[str, Any]:
    """What folder ``cache_dir`` holds of these shards: ``records`` and ``bytes`` in all and
    ``shards`` (url, records, cached, bytes each; local shards are never cached). The folder is
    only read (its bound is left as its users set it)."""
    urls = table.urls
    cache = DiskCache.existing(cache_dir, trust_folder=trust_cache_dir)
    try:
        objects = object_keys(urls, sizes, shard_versions(urls, checksums),
                              [is_remote(u) for u in urls])
        held = cache.held([o for o in objects if o])
    finally:
        cache.close()
    found = iter(held)
    shards = []
    for k, url in enumerate(urls):
        n, size = next(found) if objects[k] else (0, 0)
        shards.append({"url": url, "records": int(table.counts[k]), "cached": n, "bytes": size})
    return {"path": str(cache.path), "records": sum(s["cached"] for s in shards),
            "bytes": sum(s["bytes"] for s in shards), "shards": shards}


__all__ = ["cached_in", "open_fetcher", "shard_versions"]
