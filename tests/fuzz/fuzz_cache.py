"""Cache entries of the fuzz target: an entry file of the disk cache, mutated or swapped.

::

    corpus/cache-seeds/   entry-0.rec, entry-1.rec: the files of two entries of equal size
                          (records 0 and 1 of one object), as DiskCache wrote them

An input rewrites the file of entry 0 in a fresh cache holding both entries: its own file
mutated, or entry 1's file, mutated or whole (a copied or planted file). Every read must then give entry
0's own bytes or a miss (the record is fetched again); another record's bytes, or any error
but a ShardfeedError, is a finding.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from shardfeed.storage.cache_entries import entry_key, entry_name, object_key
from shardfeed.storage.disk_cache import DiskCache

FOLDER = "cache-seeds"
HEADER_BYTES = 44
"""magic 4 · MAC 32 · length 8 (storage/cache_entries.py)"""
URL = "s3://bucket/ds/train-00000.tfrecord"
RECORD_BYTES = 96
OBJECT = object_key(URL, 2 * RECORD_BYTES, "etag-1")
KEYS = tuple(entry_key(OBJECT, part, part * RECORD_BYTES) for part in range(2))
RECORDS = tuple(bytes([17 + part]) * RECORD_BYTES for part in range(2))


def _fill(path: Path) -> DiskCache:
    cache = DiskCache(path, max_bytes=1 << 20)
    kept = cache.put_many([(key, URL, data, part) for part, (key, data)
                           in enumerate(zip(KEYS, RECORDS))])
    if kept != len(KEYS):
        raise RuntimeError(f"the seed cache kept {kept} of {len(KEYS)} entries")
    return cache


def entry_file(cache_path: Path, key: str) -> Path:
    folder, name = entry_name(key)
    return cache_path / "data" / folder / name


def build(folder: Path) -> None:
    """The two seed entry files, taken from a cache that wrote them."""
    folder.mkdir(parents=True)
    scratch = folder.parent / "cache-scratch"
    cache = _fill(scratch)
    try:
        for part, key in enumerate(KEYS):
            (folder / f"entry-{part}.rec").write_bytes(
                entry_file(cache.path, key).read_bytes())
    finally:
        cache.close()
        shutil.rmtree(scratch)


def mutate_entry(rng: random.Random, data: bytes) -> bytes:
    """Header-aware: the magic, the MAC or the length field rewritten (the rest of the file
    kept), the file cut at the header's end, or left whole (a seed of the other entry then
    stands in this one's place as it was written)."""
    choice = rng.randrange(5)
    if choice == 4:
        return data
    if choice == 3 or len(data) < HEADER_BYTES:
        return data[:HEADER_BYTES]
    start, stop = ((0, 4), (4, 36), (36, 44))[choice]
    field = bytes(rng.randrange(256) for _ in range(stop - start))
    return data[:start] + field + data[stop:]


def read_back(data: bytes, live: Path) -> None:
    """A fresh cache holding both entries, entry 0's file replaced by ``data``, read back."""
    cache = _fill(live)
    try:
        entry_file(live, KEYS[0]).write_bytes(data)
        for _ in range(2):  # the damaged entry, then the cache after it was dropped
            got = cache.get_many(list(KEYS))
            for key, want, have in zip(KEYS, RECORDS, got):
                if have is not None and have != want:
                    raise AssertionError(
                        f"entry {key} served {len(have)} bytes that are not its record")
            if got[1] is None:
                raise AssertionError("a sound entry was lost to its neighbour's damage")
    finally:
        cache.close()
