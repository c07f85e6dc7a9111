"""The records hash: what a dataset's records are, in order, whatever shards they lie in.

Packs of the same rows on one machine, on N workers or on Ray cut their shards at different
places (a Ray task writes the shards of its own block), but hold the same records in the same
order, so a loader gives the same stream on each. Their fingerprint must then be the same:
it is made from this hash, not from the shards' names and sizes. Each record contributes its
payload's length and CRC32C (both known to the writer, and kept in the record's framing), as a
polynomial over the prime field ``P = 2^61 - 1``::

    term(r)   = (length(r) · 2^32 + crc32c(r)) mod P  + 1
    hash(r_1..r_n) = Σ term(r_i) · B^(n-i)  mod P          (B a fixed constant)

    hash(A ‖ C) = hash(A) · B^|C| + hash(C)   mod P         (shards combine in order)

so a shard's hash is computed as it is written, and a dataset's from its shards' in order,
with their record counts, wherever the cuts are. This is a check against mistakes (another
dataset, records reordered or changed), not against an adversary.

Determinism: a pure function of the records' lengths and CRC32Cs in order. Memory: none
kept but two integers.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable

import numpy as np

from shardfeed.format import spec
from shardfeed.format.crc import unmask

__all__ = ["P", "RecordsHash", "combine", "hash_of_shard"]

P = (1 << 61) - 1
"""The field's prime (a Mersenne prime: every hash is an int in ``[0, P)``)."""
BASE = 0x1F3D5B79A2C4E6F1 % P
"""The polynomial's base (any fixed element of the field other than 0 and 1)."""


class RecordsHash:
    """The hash of records added one at a time (see the module docstring)."""

    __slots__ = ("count", "value")

    def __init__(self) -> None:
        self.value = 0
        self.count = 0

    def add(self, length: int, crc32c: int) -> None:
        """One more record: its payload's length and (unmasked) CRC32C."""
        self.value = (self.value * BASE + ((length << 32) | crc32c) % P + 1) % P
        self.count += 1


def combine(parts: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """The hash and record count of records given as ``(hash, count)`` parts in order."""
    value, count = 0, 0
    for part_value, part_count in parts:
        value = (value * pow(BASE, part_count, P) + part_value) % P
        count += part_count
    return value, count


def hash_of_shard(path: str, offsets: np.ndarray) -> int:
    """The hash of a local shard's records, read from their framing (the length and the
    data's masked CRC of each record at ``offsets``, its ``n + 1`` record starts)."""
    starts = np.asarray(offsets, dtype=np.int64)
    digest = RecordsHash()
    if starts.size < 2:
        return digest.value
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        data = np.frombuffer(view, dtype=np.uint8)
        try:
            lengths = _gather(data, starts[:-1], spec.LENGTH_BYTES).view("<u8").ravel()
            crcs = _gather(data, starts[1:] - spec.FOOTER_BYTES, spec.CRC_BYTES).view(
                "<u4").ravel()
            for length, crc in zip(lengths.tolist(), crcs.tolist()):
                digest.add(length, unmask(crc))
        finally:
            del data  # the mmap closes only once no array points into it
    return digest.value


def _gather(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes at each of ``starts`` (a copy: n × width)."""
    return np.ascontiguousarray(data[starts[:, None] + np.arange(width)])
