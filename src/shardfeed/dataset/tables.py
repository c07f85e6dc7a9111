"""The shard table a :class:`~shardfeed.dataset.dataset.Dataset` opens with: indexes found,
checked, or built.

From a manifest (:func:`table_from_manifest`) each shard's size is checked against the
manifest at once and its index is loaded on first use; from bare TFRecord files
(:func:`table_from_files`) every index is found and checked at once, and those missing are
built (with a progress bar past :data:`PROGRESS_AFTER_BYTES`, or when a size is unknown).

Determinism: the table is a pure function of the files. State: none beyond the table.
Memory: 8 bytes a record of index (memory-mapped when ``mmap``, else arrays), 16 bytes a
shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shardfeed.dataset.shards import (
    RERUN_HINT,
    ShardTable,
    _local_size,
    build_index,
    check_offsets,
    find_index,
)
from shardfeed.errors import FormatError
from shardfeed.format.manifest import Manifest
from shardfeed.storage.calls import scoped
from shardfeed.storage.files import retry_policy, storage_scope
from shardfeed.storage.retry import RetryPolicy

PROGRESS_AFTER_BYTES = 64 << 20
"""Building indexes shows a progress bar when more than this much must be scanned."""


def table_from_manifest(
    urls: Sequence[str], manifest: Manifest, *, build: bool, mmap: bool, policy: RetryPolicy
) -> ShardTable:
    """The table of a manifest's shards: sizes checked now, each index loaded on first use.

    ``policy`` governs reading an index from object storage; ``build=False`` makes a missing
    index a FormatError instead of a scan of the shard.
    """
    shards = manifest.shards
    urls = list(urls)
    for url, shard in zip(urls, shards):
        size = _local_size(url)
        if size is not None and size != shard.bytes:
            raise FormatError(
                f"shard '{url}' is {size} bytes but the manifest says {shard.bytes}; the "
                f"shard changed after indexing: {RERUN_HINT}"
            )

    storage_options = scoped(None)  # the Dataset's: an index is loaded later, elsewhere

    def load(k: int) -> np.ndarray:
        url, info = urls[k], shards[k]
        with retry_policy(policy), storage_scope(storage_options):
            offsets = find_index(url, mmap=mmap)
        if offsets is None:
            if not build:
                raise FormatError(
                    f"shard '{url}' has no index (.idx.npy or .idx); {RERUN_HINT}"
                )
            offsets = build_index(url, progress=None)
        check_offsets(url, offsets, size=None, records=info.records,
                      manifest_bytes=info.bytes)
        return offsets

    return ShardTable(urls, [s.records for s in shards], [None] * len(urls), load)


def table_from_files(urls: Sequence[str], *, build: bool, mmap: bool) -> ShardTable:
    """The table of bare TFRecord files: every index found and checked, missing ones built."""
    found: list[np.ndarray | None] = []
    sizes: list[int | None] = []
    for url in urls:
        size = _local_size(url)
        offsets = find_index(url, mmap=mmap)
        if offsets is not None:
            check_offsets(url, offsets, size=size)
        elif not build:
            raise FormatError(f"file '{url}' has no index (.idx.npy or .idx); {RERUN_HINT}")
        found.append(offsets)
        sizes.append(size)
    missing = [k for k, off in enumerate(found) if off is None]
    if missing:
        _build_missing(urls, found, sizes, missing)
    offsets_all = [off for off in found if off is not None]

    def never(k: int) -> np.ndarray:  # every index is loaded at open
        raise AssertionError(k)

    counts = [len(off) - 1 for off in offsets_all]
    return ShardTable(urls, counts, offsets_all, never)


def _build_missing(urls: Sequence[str], found: list[np.ndarray | None],
                   sizes: list[int | None], missing: list[int]) -> None:
    """Build the indexes of files ``missing`` into ``found``, with a bar when it takes long."""
    total = sum(sizes[k] or 0 for k in missing)
    bar: Any = None
    if total > PROGRESS_AFTER_BYTES or any(sizes[k] is None for k in missing):
        from tqdm.auto import tqdm

        bar = tqdm(total=total or None, unit="B", unit_scale=True, delay=1.0,
                   desc=f"indexing {len(missing)} file(s)")
    try:
        for k in missing:
            found[k] = build_index(urls[k], progress=None if bar is None else bar.update)
    finally:
        if bar is not None:
            bar.close()
