"""A dataset's fingerprint: a short digest that changes when its records do.

A loader state carries the fingerprint of the dataset it was saved on, and ``restore``
refuses a state from another dataset, even one with as many records. The digest is made
from what opening the dataset already holds, so it costs no extra read::

    opened from a manifest whose shards all have a records hash (what shardfeed writes)
                                the records' count and hash, in order
                                (:mod:`shardfeed.format.records_hash`): the same records in
                                the same order, however the shards were cut (one machine,
                                N workers, Ray), have the same fingerprint
    opened from another manifest  per shard: name, records, bytes, the manifest's CRC32C
    opened from TFRecord files  per shard: name, records, bytes, every record's offset
    (folder, glob, list, URLs)

A shard's name is the last part of its path, so the same shards at another place (a copy
on ``s3://``) have the same fingerprint. The text says how it was made (``manifest:`` or
``files:``): the same shards opened once through their manifest and once as bare files
have different fingerprints, and the prefix lets an error message say so.

Determinism: a pure function of the listed values. State: none. Memory: none kept; the
offsets are hashed where they lie (memory-mapped ``.idx.npy`` pages are read once).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from shardfeed.format.manifest import ShardInfo
from shardfeed.format.records_hash import combine

__all__ = ["files_fingerprint", "manifest_fingerprint", "shard_name"]

_DIGEST_BYTES = 16


def shard_name(path: str) -> str:
    """The last part of a shard's path or URL (the part that survives a copy elsewhere)."""
    return path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def manifest_fingerprint(shards: Sequence[ShardInfo]) -> str:
    """The fingerprint of a dataset opened from its manifest (see the module docstring)."""
    hashes = [(s.records_hash, int(s.records)) for s in shards]
    if shards and all(value is not None for value, _ in hashes):
        value, count = combine((int(v), n) for v, n in hashes if v is not None)
        return "records:" + _digest(json.dumps([count, value]).encode())
    rows = [[shard_name(s.path), int(s.records), int(s.bytes), s.crc32c] for s in shards]
    return "manifest:" + _digest(json.dumps(rows).encode())


def files_fingerprint(urls: Sequence[str], offsets: Sequence[np.ndarray]) -> str:
    """The fingerprint of bare TFRecord files from their ``n + 1`` record offsets each."""
    if len(urls) != len(offsets):
        raise ValueError(f"one offsets array a shard: {len(urls)} urls, {len(offsets)} arrays")
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for url, shard in zip(urls, offsets):
        array = np.ascontiguousarray(shard, dtype="<u8")
        header = [shard_name(url), int(array.size) - 1, int(array[-1]) if array.size else 0]
        digest.update(json.dumps(header).encode())
        digest.update(array.data)
    return "files:" + digest.hexdigest()


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=_DIGEST_BYTES).hexdigest()
