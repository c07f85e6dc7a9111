"""The Loader's memory bound: what it holds at most, by part, and how each part is estimated.

Determinism: pure arithmetic on sizes. State: none. Memory: none held.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfeed.pipeline.samplers import Sample


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """The memory a Loader will hold at most, in bytes, by part.

    ``work_bytes_per_thread`` is estimated from the first sample of the epoch (its record's
    encoded bytes times the slice length, plus its decoded image): datasets whose images are
    much larger than the first one raise that term in proportion. ``cache_bytes`` is the
    sampler's own bound on what it caches (the decoded images of :class:`Patches`; 0 for
    samplers that cache nothing).
    """

    batch_bytes: int
    ring_batches: int
    work_bytes_per_thread: int
    threads: int
    index_bytes: int
    cache_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (self.batch_bytes * self.ring_batches
                + self.work_bytes_per_thread * self.threads + self.index_bytes
                + self.cache_bytes)


def work_bytes(records: list[Sample], *, slice_size: int, row_bytes: int) -> int:
    """One thread's working memory: a slice of encoded records, a decoded image, a batch row.

    ``records`` are the records of the epoch's first sample (empty when they could not be
    read); their encoded bytes count ``slice_size`` times.
    """
    encoded = sum(payload_bytes(r) for r in records)
    return slice_size * encoded + decoded_bytes(records) + row_bytes


def order_index_bytes(num_units: int) -> int:
    """The bytes of an exact epoch permutation of ``num_units`` units (int32 or int64)."""
    return 4 * num_units if num_units < 2**31 else 8 * num_units


def payload_bytes(record: Mapping[str, Any]) -> int:
    """The bytes of a parsed record's byte strings and arrays (its encoded payload)."""
    total = 0
    for value in record.values():
        if isinstance(value, (bytes, bytearray, memoryview)):
            total += len(value)
        elif isinstance(value, list):
            total += sum(len(v) for v in value if isinstance(v, (bytes, bytearray)))
        elif isinstance(value, np.ndarray):
            total += value.nbytes
    return total


def decoded_bytes(records: list[Sample]) -> int:
    """The decoded image bytes of records that store ``image/height`` and ``image/width``.

    ``image/channels`` defaults to 3; records without both dimensions count 0.
    """
    total = 0
    for record in records:
        dims = []
        for key in ("image/height", "image/width"):
            value = record.get(key)
            if value is None:
                break
            dims.append(int(np.asarray(value).reshape(-1)[0]))
        if len(dims) == 2:
            channels = record.get("image/channels")
            c = int(np.asarray(channels).reshape(-1)[0]) if channels is not None else 3
            total += math.prod(dims) * c
    return total
