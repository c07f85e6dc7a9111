"""The Loader's memory bound: what it holds at most, by part, and how each part is estimated.

=================================  ========================================================
part                               what it counts
=================================  ========================================================
``batch_bytes × ring_batches``     the batch buffers (prefetched and being built): array
                                   columns, and list columns estimated from the first sample
``work_bytes_per_thread``          a slice of parsed records and a batch row a thread
``decode_bytes_per_thread``        one decode at its peak a thread: ``max_pixels`` × the
                                   decode's peak bytes a pixel (decode ops, Patches)
``index_bytes``                    the dataset's offsets and the epoch's order
``cache_bytes``                    the sampler's cache (the decoded images of Patches)
``fixed_bytes``                    what any loader holds beyond these (:func:`fixed_bytes`)
``stage_bytes``                    what the batch stages say they hold (``memory_bytes()``)
``read_ahead_bytes``               records read ahead from object storage and the fetches in
                                   flight (by the mean record size; 0 on local data)
``device_bytes``                   GPU memory, apart from the total (host memory): set by an
                                   adapter that decodes on the device (``shardfeed.torch``)
=================================  ========================================================

Determinism: pure arithmetic on sizes. State: none. Memory: none held.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfeed.pipeline.batching import BatchLayout
from shardfeed.pipeline.concurrency import largest_slice
from shardfeed.pipeline.options import LoaderOptions
from shardfeed.pipeline.samplers import Sample
from shardfeed.transforms.base import TransformBase
from shardfeed.transforms.decode.image import SCRATCH_KEEP_BYTES

# The per-record, per-thread and per-loader terms below were measured as the peak RSS growth
# of loaders over four epochs beyond all their other terms, on datasets of small images
# (where nothing else hides them), at 1 to 32 threads and batches of 16 to 512.

#: Per record of a slice, beyond its encoded bytes: its parsed features (a dict, small arrays,
#: Python objects), the parser's scratch, and the heap the thread keeps after freeing them
#: (glibc keeps a thread's freed memory in its own arena). Measured: up to 24 kB a record with
#: slices of 2 to 32 records, less a record in larger slices (7 kB at 256).
RECORD_OVERHEAD_BYTES = 24 << 10
#: A worker thread's own cost: its stack pages, its malloc arena's first heap, the decoders'
#: per-thread state (measured with slices of 2 records: 50 kB).
THREAD_FIXED_BYTES = 128 << 10
#: The loader's own cost: the epoch run, futures and batch dicts of the batches in flight,
#: Python's object arenas (measured with one thread and small batches: 0.4 MB in a warm
#: environment, up to 1.1 MB in a freshly installed one; counted with room to spare).
LOADER_FIXED_BYTES = 2 << 20
#: One worker process of ``workers="processes"``: a Python interpreter with NumPy, OpenCV and
#: shardfeed imported (measured resident size: 63 MB, shared library pages included).
PROCESS_FIXED_BYTES = 64 << 20
#: The resource tracker process that ``workers="processes"`` starts once (measured: 12.4 MB).
TRACKER_FIXED_BYTES = 12 << 20


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """The memory a Loader will hold at most, in bytes, by part.

    ``work_bytes_per_thread`` is estimated from the first sample of the epoch (its record's
    encoded bytes times the slice length, plus a batch row): datasets whose records are much
    larger than the first one raise that term in proportion. ``decode_bytes_per_thread`` is
    the decode's bound: the transform's (or sampler's) declared ``decode_bytes``, from its
    ``max_pixels`` (a larger image is refused before decoding); for a transform that
    declares none, the first sample's decoded image. ``cache_bytes`` is the sampler's own
    bound on what it caches (the decoded images of :class:`Patches`; 0 for samplers that cache
    nothing). ``fixed_bytes`` is what the loader holds whatever the data
    (:func:`fixed_bytes`).
    """

    batch_bytes: int
    ring_batches: int
    work_bytes_per_thread: int
    threads: int
    index_bytes: int
    cache_bytes: int = 0
    decode_bytes_per_thread: int = 0
    fixed_bytes: int = 0
    stage_bytes: int = 0
    device_bytes: int = 0
    read_ahead_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (self.batch_bytes * self.ring_batches
                + (self.work_bytes_per_thread + self.decode_bytes_per_thread) * self.threads
                + self.index_bytes + self.cache_bytes + self.fixed_bytes + self.stage_bytes
                + self.read_ahead_bytes)


def declared_decode_bytes(transform: TransformBase | None, source: Any) -> int | None:
    """The most memory one decode holds, as the transform and the source declare it
    (``decode_bytes``; the larger of the two); None when neither declares one."""
    declared = [value for value in (None if transform is None else transform.decode_bytes,
                                    getattr(source, "decode_bytes", None))
                if isinstance(value, int)]
    return max(declared) if declared else None


def decode_bytes_per_thread(transform: TransformBase | None, source: Any, records: list[Sample]) -> int:
    """One thread's decode term: the declared bound, else the first sample's decoded image."""
    declared = declared_decode_bytes(transform, source)
    return decoded_bytes(records) if declared is None else declared


def fixed_bytes(*, threads: int, processes: int, decode_bytes: int) -> int:
    """What a loader holds whatever its data: :data:`LOADER_FIXED_BYTES`,
    :data:`THREAD_FIXED_BYTES` a thread, :data:`PROCESS_FIXED_BYTES` a worker process (and
    :data:`TRACKER_FIXED_BYTES` once with any), and the JPEG scratch buffer each decoding
    thread keeps (at most :data:`~shardfeed.transforms.decode.image.SCRATCH_KEEP_BYTES`, less when
    ``decode_bytes`` bounds the decodes lower), counted also for the calling thread, which
    builds the first sample to learn the batch layout."""
    scratch = min(SCRATCH_KEEP_BYTES, decode_bytes)
    workers = processes * PROCESS_FIXED_BYTES + (TRACKER_FIXED_BYTES if processes else 0)
    return (LOADER_FIXED_BYTES + threads * THREAD_FIXED_BYTES + workers
            + (threads + 1) * scratch)


def work_bytes(records: list[Sample], *, slice_size: int, row_bytes: int) -> int:
    """One thread's working memory beside its decode: a slice of parsed records, a batch row.

    ``records`` are the records of the epoch's first sample (empty when they could not be
    read); their encoded bytes and :data:`RECORD_OVERHEAD_BYTES` each count ``slice_size``
    times.
    """
    encoded = sum(payload_bytes(r) for r in records)
    return slice_size * (encoded + RECORD_OVERHEAD_BYTES * max(1, len(records))) + row_bytes


def list_bytes(sample: Mapping[str, Any], names: list[str]) -> int:
    """The bytes a batch row's list columns (``names``: bytes, strings, ragged values) hold,
    estimated from ``sample``: what a batch keeps beside its arrays."""
    return sum(object_bytes(sample.get(name)) for name in names)


def object_bytes(value: Any) -> int:
    """The memory of one sample value kept in a batch list (CPython object sizes)."""
    if isinstance(value, bytes):
        return 33 + len(value)
    if isinstance(value, str):
        return 49 + len(value.encode("utf-8"))
    if isinstance(value, np.ndarray):
        return 112 + value.nbytes
    if isinstance(value, (list, tuple)):
        return 56 + 8 * len(value) + sum(object_bytes(v) for v in value)
    return 32


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


def batch_bytes(layout: BatchLayout, sample: Sample) -> int:
    """A batch buffer's bytes: its array columns, and its list columns estimated from
    ``sample`` (a row of the batch)."""
    lists = [f.name for f in layout.fields if not f.is_array]
    return layout.batch_bytes() + layout.batch_size * list_bytes(sample, lists)


def loader_budget(
    options: LoaderOptions, layout: BatchLayout, sample: Sample, records: list[Sample], *,
    index_bytes: int, num_units: int, decode_bytes: int, cache_bytes: int, ring_batches: int,
    in_flight: int, stage_bytes: int, read_ahead_bytes: int = 0,
) -> MemoryBudget:
    """A loader's budget from its options, batch layout and first sample (and its records);
    ``in_flight``: the batches built at once
    (:func:`~shardfeed.pipeline.pool.batches_in_flight`)."""
    row_bytes = layout.batch_bytes() // options.batch_size
    if options.order_method == "exact":
        index_bytes += order_index_bytes(num_units)
    threads = options.num_threads
    processes = threads if options.workers == "processes" else 0
    return MemoryBudget(
        batch_bytes=batch_bytes(layout, sample),
        ring_batches=ring_batches,
        work_bytes_per_thread=work_bytes(
            records, row_bytes=row_bytes,
            # the largest slice the gate may cut (light work and many threads: larger
            # slices); one of several batches builds them in turn, a batch's records at once
            slice_size=min(options.batch_size,
                           largest_slice(options.slice_size(), options.batch_size, in_flight,
                                         threads, sum(payload_bytes(r) for r in records))),
        ),
        threads=threads,
        index_bytes=index_bytes,
        cache_bytes=cache_bytes,
        decode_bytes_per_thread=decode_bytes,
        fixed_bytes=fixed_bytes(threads=threads, processes=processes, decode_bytes=decode_bytes),
        stage_bytes=stage_bytes, read_ahead_bytes=read_ahead_bytes,
    )
