"""Patches' decodes ahead of its slices: the threads that run them, and which images they
decode.

A slice of :class:`~shardfeed.pipeline.patches.Patches` starts the decodes of its images,
and of the images the next outputs of its stride (its rank's) need up to
:data:`LOOK_AHEAD_IMAGES` refreshes past it, on :data:`DECODE_AHEAD_THREADS` threads of their
own, so decodes run while slices cut patches (see the Patches module's doc for the bound
that keeps an image decoded ahead from pushing out one an output still needs).

Determinism: none of this changes an output; it decides only when an image is decoded. State:
:class:`LookAhead`, how far each stride's slices looked, for a pass (a sampler's copy in
another process starts without it). Memory: the threads' images, counted in
``Patches.cache_bytes``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from shardfeed.pipeline.cores import usable_cores
from shardfeed.pipeline.image_cache import ImageCache
from shardfeed.pipeline.samplers import EpochContext
from shardfeed.sampling.patches import PatchSchedule
from shardfeed.storage.daemon_threads import DaemonThreads
from shardfeed.transforms.decode.patches import DecodedImage

__all__ = ["DECODE_AHEAD_THREADS", "LOOK_AGAIN", "LOOK_AHEAD_IMAGES", "LookAhead", "decode_ahead"]

DECODE_AHEAD_THREADS = max(1, min(4, usable_cores()))
"""Threads decoding the images slices need next (see :func:`decode_ahead`), one image
each at most: their images are counted in
:attr:`~shardfeed.pipeline.patches.Patches.cache_bytes`."""
LOOK_AHEAD_IMAGES = 2 * DECODE_AHEAD_THREADS + 2
"""Refreshes past a slice whose outputs' images are decoded ahead (see :class:`LookAhead`):
enough to keep every decode thread busy while slices wait for none (6 on 2 cores, 10 from 4).
``bench_tf_bridge.py``'s patch set (96 JPEGs of 1024x768, N=8, R=32, batch 16, 2 threads, 2
cores), three interleaved rounds of 5 s: 2 refreshes 8,799 / 8,604 / 8,624 patches/s, 4
8,787 / 9,548 / 8,932, 6 9,841 / 9,666 / 9,549 (1.5 -> 1.66 cores busy); 10 beyond 6 within
the noise."""
LOOK_AGAIN = 4
"""A stride's slices look ahead again once a quarter of their horizon (``LOOK_AHEAD_IMAGES``
refreshes past the slice) is past where they looked: three quarters of it stay looked at,
and a slice of 64 outputs of 1566² JPEGs (R=100) looks every fourth time or so. On 2 cores
(``bench/predict_node.py``'s Patches, the node's slices) the look took ~60 µs of a slice's
~1.1 ms of thread CPU, most of it under the GIL."""
_DECODERS = DaemonThreads(
    "shardfeed-patch-decode", limit=DECODE_AHEAD_THREADS,
    why="Patches' decodes of the images slices need next, one image each (cache_bytes counts "
        "them)")
"""Kept for the process and shared by every Patches (no threads a sampler left behind)."""


def decode_ahead(cache: ImageCache[DecodedImage], epoch: int, q: np.ndarray, units: np.ndarray,
                 *, load: Callable[[int, None], tuple[DecodedImage, int]],
                 last_output: Callable[[int], int]) -> None:
    """Start decoding, on :data:`DECODE_AHEAD_THREADS` threads of their own, the images
    ``units`` (order positions ``q``: a slice's, then those of the outputs after it,
    :meth:`LookAhead.outputs`) that are neither cached nor on their way, each with ``load``
    and expiring after ``last_output`` of its order position. The slice waits for its new
    images side by side instead of decoding them one after another, and the decodes of the
    images after it run while this slice cuts its patches. Measured on 2 cores, against the
    decodes of the slice's own images only (with the per-patch order position in plain
    integers): ``bench_light_work.py``'s Patches set, medians of 3 runs of 5 windows, 4,459
    -> 6,124 patches/s at 1 thread, 4,030 -> 6,518 at 2, 4,155 -> 7,900 at 16; 96 JPEGs of
    1024x768, ``Patches(size=32, cache_images=8, refresh_every=32)``, batch 16
    (``bench_tf_bridge.py``'s set), medians of 3 runs of 5 epochs, 3,847 -> 7,171 at 1
    thread, 4,273 -> 6,937 at 2; decodes per epoch unchanged. The cache decides as for any
    load; a decode that fails here is decoded again by the sample that needs it, which
    names the record."""
    # each image once (it has one order position an epoch), in the order of first need
    wanted = dict(zip(units.tolist(), q.tolist()))
    for rid in cache.unknown(wanted):  # most are cached already: one look for them all
        cache.load_ahead(rid, functools.partial(load, rid, None),
                         expires=(epoch, last_output(wanted[rid])), run=_DECODERS.submit)


class LookAhead:
    """How far the slices of each stride of a pass looked ahead (one entry: the stride of
    the last slice), so that each output is looked ahead for once a pass."""

    __slots__ = ("_looked",)

    def __init__(self) -> None:
        self._looked: dict[tuple[int, int, int, int], int] = {}

    def reset(self) -> None:
        """Forget it all (a new pass, a restore, a new loader)."""
        self._looked = {}

    def outputs(self, ctx: EpochContext, positions: np.ndarray, *, schedule: PatchSchedule,
                cache: ImageCache[DecodedImage], slack: int,
                order_positions: Callable[[int, int, np.ndarray], np.ndarray]) -> tuple[
            np.ndarray, np.ndarray]:
        """The order positions and images of the outputs after ``positions`` (same stride)
        up to the end of ``LOOK_AHEAD_IMAGES`` refreshes past the slice, fewer where the
        cache's bound would not hold them beside the slice's images and ``slack`` images of
        threads working ahead; only those past where a slice of the same stride looked, and
        none until a ``LOOK_AGAIN``-th of that horizon is past it."""
        empty = np.empty(0, dtype=np.int64)
        if len(positions) < 2 or not cache.largest_bytes:
            return empty, empty
        bound = cache.max_bytes
        if bound is None:
            return empty, empty
        stride = int(positions[1] - positions[0])
        if stride < 1 or not (positions[1:] - positions[:-1] == stride).all():
            return empty, empty  # not one rank's run of outputs (a wrap, a replacement)
        r, n = schedule.refresh_every, schedule.cache_images
        first, last = int(positions[0]), int(positions[-1])
        held = n + last // r - first // r  # order positions the slice's outputs span
        room = bound // cache.largest_bytes - held - slack
        images = min(LOOK_AHEAD_IMAGES, room)
        if images < 1:
            return empty, empty
        end = min((last // r + images + 1) * r, len(schedule), ctx.total)
        start = last + stride
        # the outputs of this stride up to ``looked`` were looked ahead for by an earlier
        # slice (their images are cached or on their way): only those past it are new
        run = (ctx.seed, ctx.epoch, stride, last % stride)
        looked = self._looked.get(run, 0)
        if looked > start:
            # an earlier slice of the stride looked past this one's outputs: look again once
            # a LOOK_AGAIN-th of the horizon is new, not at every slice (a look is two order
            # position calls and a pass over the images), so the rest stays looked at
            if (end - looked) * LOOK_AGAIN < end - start:
                return empty, empty
            start += -(-(looked - start) // stride) * stride
        if end > looked:
            self._looked = {run: end}
        ahead = np.arange(start, end, stride, dtype=np.int64)
        if not len(ahead):
            return empty, empty
        aq = order_positions(ctx.seed, ctx.epoch, ahead)
        return aq, np.asarray(ctx.order[aq], dtype=np.int64)
