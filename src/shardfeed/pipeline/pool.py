"""The Loader's worker pools and batch ring: opening them, and releasing them safely.

Threads plan, read and (with ``workers="threads"``) build slices; with
``workers="processes"`` a :class:`~shardfeed.pipeline.workers.ProcessWorkers` pool builds
them into a ring of batch buffers in shared memory. :class:`BatchRing` decides which buffer
a batch is built in, so that a batch the caller keeps is never written into. Determinism:
none of this affects the output bytes. State: none beyond the pools themselves. Memory: the
ring holds :func:`ring_batches` batches (plus those a consumer said it holds, see
:meth:`BatchRing.reserve`); batches the caller keeps beyond them are the caller's memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Any

from shardfeed.pipeline.batching import BatchBuffer, BatchLayout, SharedBatchRing, local_ring
from shardfeed.pipeline.concurrency import BATCHES_A_SLICE
from shardfeed.pipeline.executor import CpuPool
from shardfeed.pipeline.options import LoaderOptions
from shardfeed.pipeline.produce import SliceBuilder
from shardfeed.transforms.arrays import opencv_on_callers


def thread_pool(options: LoaderOptions, limit: Callable[[], int] | None = None) -> CpuPool:
    """The loader's CPU pool: ``num_threads`` threads named ``shardfeed-loader``, at most
    ``limit()`` building at once (the slice gate's choice); OpenCV's own pool is turned off
    for the process (:func:`~shardfeed.transforms.arrays.opencv_on_callers`)."""
    opencv_on_callers()
    return CpuPool(options.num_threads, limit=limit, name="shardfeed-loader")


class BatchRing:
    """The loader's batch buffers, and the rule that keeps every batch the caller holds intact.

    A buffer is written again only when nothing made from its last batch is still alive (no
    array, view, tensor: see :meth:`BatchBuffer.held`)::

        batch k is built in the next buffer (in ring order) that is neither being
        built nor held
        threads    up to n = b + 1 buffers in process memory, b the batches built at
                   once (:func:`batches_in_flight`: ``prefetch_batches`` or more); the
                   ring starts with ``prefetch_batches + 1`` and a new buffer joins it
                   when every buffer is being built or held, while it has fewer than
                   n + reserved (see :meth:`reserve`), else the next held one's columns
                   get new memory first (the caller keeps the old memory)
        processes  n = prefetch_batches + 2 buffers in shared memory (the worker
                   processes know them by name, so there are never more); a batch is
                   handed out as the buffer's own memory while at most
                   n - prefetch_batches - 1 other buffers are held, else as a copy

    In a training loop (each batch dropped by the time the one after next is asked for) no
    column is renewed and nothing is copied. A consumer that keeps a few batches alive
    besides the one it uses (a framework's prefetch buffer holding the batches' memory)
    reserves them: the ring grows to hold them once, and they are built in again when the
    consumer lets go, instead of every batch being built in new memory (a fresh allocation
    of the batch's bytes, page faults and zeroing included, every batch). The process rule
    keeps a free buffer for every batch to build: at most ``prefetch_batches - 1`` are being
    built while the caller asks for a batch, and at most ``n - prefetch_batches`` are held.
    """

    def __init__(self, buffers: list[BatchBuffer], *, prefetch_batches: int,
                 capacity: int | None = None) -> None:
        self.buffers = buffers
        self.prefetch_batches = prefetch_batches
        self.shared = any(b.shared for b in buffers)
        # the buffers batches built at once need (they join as needed; shared: all made)
        self._base = len(buffers) if capacity is None or self.shared else capacity
        self._cursor = 0  # where the search for a free buffer starts: the ring's order
        self.limit = self._base  # buffers the ring may grow to (see reserve)

    def reserve(self, held: int) -> None:
        """Let the ring grow by up to ``held`` buffers, for batches a consumer keeps alive.

        Buffers in shared memory never grow (the worker processes know them by name): the
        hand-out rule copies instead.
        """
        if not self.shared:
            self.limit = max(self.limit, self._base + held)

    def buffer_for(self, index: int, building: Collection[int]) -> BatchBuffer:
        """The buffer to build batch ``index`` in; ``building``: the identities (``id``) of
        the buffers of batches in flight."""
        buffers = self.buffers
        n = len(buffers)
        busy = building
        idle: list[BatchBuffer] = []  # not in flight, but held by the caller
        chosen: BatchBuffer | None = None
        for step in range(n):
            buffer = buffers[(self._cursor + step) % n]
            if id(buffer) not in busy:
                if not buffer.held():
                    chosen = buffer
                    break
                idle.append(buffer)
        if chosen is None and len(self.buffers) < self.limit:
            chosen = BatchBuffer(self.buffers[0].layout)
            self.buffers.insert(self._cursor, chosen)  # built in next, then in ring order
        elif chosen is None:
            if self.shared or not idle:  # the hand-out rule makes this unreachable
                raise RuntimeError(
                    f"no free batch buffer among {n} for batch {index}: {len(building)} in "
                    "flight, the others held"
                )
            chosen = idle[0]
            chosen.renew_held()
        self._cursor = (self.buffers.index(chosen) + 1) % len(self.buffers)
        return chosen

    def hand_out(self, buffer: BatchBuffer, count: int) -> dict[str, Any]:
        """The batch of ``buffer``'s first ``count`` rows, copied only where the rule says."""
        copy = False
        if self.shared:
            others = sum(1 for b in self.buffers if b is not buffer and b.held())
            copy = others > len(self.buffers) - self.prefetch_batches - 1
        return buffer.take(count, copy=copy)


IN_FLIGHT_BYTES = 64 << 20
"""The most bytes of batch buffers that the batches built at once may hold where they are
more than ``prefetch_batches`` (see :func:`batches_in_flight`)."""


SMALL_BATCH_BYTES = 1 << 20
"""Batches of at most this many bytes may be built several a thread at once (see
:func:`batches_in_flight`), and only then does a pass join several in a slice: where a
slice's own costs weigh (28² PNGs: 203 KB at 256). Larger ones would hold more memory for
little: their work is heavy (8 images of 224² are 1.2 MB, about 40 ms of decoding on one
core)."""


def batches_in_flight(options: LoaderOptions, batch_bytes: int, *,
                      room_in_flight: Callable[[int], int] | None = None,
                      several: bool = True) -> int:
    """How many batches a pass builds at once: one a thread, up to ``BATCHES_A_SLICE`` (4)
    a thread where they are small (:data:`SMALL_BATCH_BYTES`) and no sampler's cache is
    sized for them, as many as fit in :data:`IN_FLIGHT_BYTES` of batch buffers, as many as
    the sampler's cache has room for (``room_in_flight``, below), and never fewer than
    ``prefetch_batches`` (the defaults, 4 threads and 2 prefetched: 4, or 16 batches of up
    to 1 MiB). ``several=False``: one a thread (a pass builds that many while its slices
    are within a batch: several a thread are for slices of several batches).

    Why: the slice gate cuts each batch into slices for the threads among the batches in
    flight (:func:`~shardfeed.pipeline.concurrency.largest_slice`), and a slice's own Python
    (submitting it, the gate, its plan, its hand-over) holds the GIL whatever its samples.
    With few batches in flight, many threads leave the slices small and those costs are
    paid more often an item: 28² PNGs at 16 threads and 4 batches ahead are cut into 64s,
    four a batch; with 16 in flight, a batch a slice, and the GIL held an item falls by
    about a third (``bench/predict_node.py``; Patches' 32² patches of 1566² JPEGs: by 38%);
    with 64, a slice of 4 whole batches, whose own costs are paid once for the 4 (by a
    sixth more). At any core count: ``4 × threads`` batches of ``batch_bytes`` each at
    most, and never past :data:`IN_FLIGHT_BYTES` of them (64 threads of 28² PNG batches of
    256: 52 MB), so large
    batches (the train preset's 38 MB at 256) stay at ``prefetch_batches``; which batch a
    slice builds never changes its rows.

    ``room_in_flight``: a sampler with a cache of its own (Patches' decoded images) is asked
    for room for the outputs of the batches wanted, by the positions of the epoch they lie
    in (``room_in_flight(span)``: a batch spans ``batch_size × world_size`` of them, a
    rank's outputs being every ``world_size``-th); it sizes its cache for what it grants
    (outputs further apart than its cache holds would have images decoded again), and the
    batches built at once are those granted, never fewer than ``prefetch_batches`` (it is
    asked for room for those too). Not deeper: worker processes (each its own GIL, and its
    own copy of a sampler's cache; their shared ring is fixed)."""
    prefetch = wanted = options.prefetch_batches
    if options.workers != "processes" and options.num_threads > prefetch:
        # up to BATCHES_A_SLICE a thread where batches are small, so that a slice may build
        # several, unless a sampler's cache is sized for them (Patches': one a thread)
        several = several and room_in_flight is None and batch_bytes <= SMALL_BATCH_BYTES
        most = options.num_threads * (BATCHES_A_SLICE if several else 1)
        wanted = max(prefetch, min(most, IN_FLIGHT_BYTES // max(1, batch_bytes)))
    if room_in_flight is not None:  # asked for the prefetched batches too
        span = options.batch_size * options.world_size  # a batch's positions in the epoch
        wanted = min(wanted, room_in_flight(wanted * span) // span)
    return max(prefetch, wanted)


def ring_batches(options: LoaderOptions, reserved: int = 0, in_flight: int | None = None) -> int:
    """How many batch buffers the loader holds at most (see :class:`BatchRing`), with
    ``reserved`` batches a consumer keeps alive (threads only: a shared ring never grows)
    and ``in_flight`` batches built at once (:func:`batches_in_flight`; None:
    ``prefetch_batches``)."""
    if options.workers == "processes":
        return options.prefetch_batches + 2
    return (options.prefetch_batches if in_flight is None else in_flight) + 1 + reserved


def open_ring(
    builder: SliceBuilder, layout: BatchLayout, options: LoaderOptions, in_flight: int,
) -> tuple[BatchRing, Any, SharedBatchRing | None]:
    """The ring of batch buffers (up to :func:`ring_batches` with ``in_flight`` built at
    once), the process pool, the shared ring.

    With ``workers="threads"`` the buffers are local and the other two are None.
    """
    size = ring_batches(options)
    if options.workers != "processes":
        # prefetch_batches + 1 now; more join as passes build more at once (not one that
        # reads ahead, which builds prefetch_batches)
        ring = BatchRing(local_ring(layout, size), prefetch_batches=options.prefetch_batches,
                         capacity=ring_batches(options, in_flight=in_flight))
        return ring, None, None
    from shardfeed.pipeline.workers import ProcessWorkers

    shared = SharedBatchRing(layout, size)
    try:
        processes = ProcessWorkers(
            builder, layout, shared.names, shared.buffers, processes=options.num_threads,
        )
    except BaseException:
        shared.close()  # the workers did not start: free the shared ring now
        raise
    ring = BatchRing(shared.buffers, prefetch_batches=options.prefetch_batches)
    return ring, processes, shared


def release(parts: list[Any], *, wait: bool = False) -> None:
    """Stop the loader's pools and free its shared memory.

    ``parts`` is ``[executor, processes, shared]`` (any may be None). ``wait=True``
    (``close()``) joins the worker threads and processes. The garbage collector calls it with
    ``wait=False``: a collection can run inside any allocation, including inside
    ``threading``'s own bookkeeping while it holds its internal locks, where joining a thread
    (or starting one) deadlocks; so then the pools are only told to stop, and their threads
    end by themselves once their current task has returned.
    """
    executor, processes, shared = parts
    if wait:
        current = threading.current_thread()
        pool_threads = set(getattr(executor, "_threads", ()))
        manager = getattr(getattr(processes, "pool", None), "_executor_manager_thread", None)
        wait = current not in pool_threads and current is not manager  # never join oneself
    if processes is not None:
        processes.pool.shutdown(wait=wait, cancel_futures=True)
    if executor is not None:
        executor.shutdown(wait=wait, cancel_futures=True)
    if shared is not None:
        # close() keeps any mapping a batch still views alive (see SharedBatchRing.close)
        shared.close()
