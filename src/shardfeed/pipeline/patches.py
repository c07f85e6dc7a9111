"""Patches: many random small crops from few large images, each image decoded once.

A cache of ``N`` decoded images; every ``R`` outputs the oldest is replaced by the next image
of the epoch's (shuffled) image order. The schedule has a closed form
(:class:`~shardfeed.sampling.patches.PatchSchedule`): the images resident at output ``p``
are the order positions ``[L - N, L)`` with ``L = N + p // R``, so output ``p`` is a pure
function of ``(seed, epoch, p)``::

    output p ──► slot s (keyed)  ──► order position q = L(p) - N + s ──► image order[q]
             └─► crop box (keyed, PATCH_CROP) ──► patch ──► user transform (keyed, AUGMENT)

Slots. ``pick="stratified"`` (default) deals the ``N`` slots out as a keyed permutation per
block of ``N`` consecutive outputs, so a batch of ``B <= N`` consecutive outputs draws on
(nearly) ``B`` different images, and every resident image is used evenly; each output's
slot is still uniform over the resident images. ``pick="uniform"`` draws every slot
independently (``PatchSchedule.pick_many``): a batch then draws on about
``N·(1 - (1 - 1/N)^B)`` images (25 of 32 for N=64, B=32).

Crops. ``scale=None``: a ``size`` crop at a uniform position (images smaller than ``size``
are padded with zeros, bottom and right). ``scale=(lo, hi)``: a square-pixel crop of
``s × size`` pixels, ``s`` uniform in ``[lo, hi]``, resized to ``size``; when ``lo >= 2`` a
JPEG is decoded at reduced DCT scale ``1/d`` (``d`` the largest of 2, 4, 8 not above ``lo``;
other encodings are shrunk by ``d`` after decoding), so the cache holds ``d²`` times smaller
images. Masks get the same box (nearest neighbour). Each sample also carries
``"patch/box"`` (``y, x, h, w`` in full-size pixels of the source image) and
``"patch/record"`` (its record id).

Determinism: output ``p`` depends only on ``(seed, epoch, p)`` and the data: not on the
thread count, ranks, restores or the cache (``cache=False`` gives the same bytes). State:
the dataset's fingerprint and the options that decide the patches (see
:meth:`Patches.state`); a restore on other ones raises StateError naming the first that
differs. Memory: the decoded-image cache, ``cache_bytes`` (default: ``N + max(2, N // 8) +
LOOK_AHEAD_IMAGES`` decoded images of the largest image decoded so far: the bound grows when a
larger image comes, so a small first image does not leave the others uncached), plus the
dataset's index (8 bytes an image). Threads build the loader's batches in flight at once,
whose outputs lie within a span of the epoch that needs ``N + ceil(span / R)`` images at
once: the default bound grows for them, to up to ``N`` images beyond ``N`` and by 1 GiB at
most (:meth:`Patches.room_in_flight`); with a stated ``cache_bytes`` the loader builds
``prefetch_batches`` at once, and when ``R`` is small next to the batch, pass a larger one
(or images are decoded again, with the same outputs).

Decoding ahead. A slice starts the decodes of its images, and of the images the next
outputs of its stride (its rank's) need up to ``LOOK_AHEAD_IMAGES`` (L: 6 on 2 cores, 10
from 4) refreshes past it, on threads of their own, so decodes run while slices cut
patches::

    outputs   ... [ slice: p0 .. p1 ] p1+W ... up to the end of refresh p1 // R + L
    images        [ window(p0) ... window(p1) ] + up to L images that enter after p1

The look-ahead takes only the room the bound leaves beyond the slice's images and the
images of the batches in flight (``max(2, N // 8)`` or more, see
:meth:`Patches.room_in_flight`; the default bound has L images for it;
a stated ``cache_bytes`` without room turns it off), so an image decoded ahead never pushes
out one an output still needs: each image is still decoded once per residency (at an
epoch's end, up to L images may be decoded for outputs a dropped last batch would have cut).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from shardfeed.dataset.data_source import DataSource
from shardfeed.errors import SchemaError
from shardfeed.format.schema import ImageInfo
from shardfeed.pipeline.batching import BatchBuffer
from shardfeed.pipeline.image_cache import CacheStats, ImageCache
from shardfeed.pipeline.native_patches import NativeImages
from shardfeed.pipeline.patch_ahead import (
    DECODE_AHEAD_THREADS,
    LOOK_AHEAD_IMAGES,
    LookAhead,
    decode_ahead,
)
from shardfeed.pipeline.patch_crops import (
    PICKS,
    PatchOptions,
    Pick,
    cut_patch,
)
from shardfeed.pipeline.patch_rows import build_patch_rows
from shardfeed.pipeline.sampler_state import check_sampler_state
from shardfeed.pipeline.samplers import (
    EpochContext,
    Sample,
    SampleKey,
    SamplerBase,
    Transform,
    bind_transform,
)
from shardfeed.sampling.keys import PATCH_CROP
from shardfeed.sampling.patches import PatchSchedule
from shardfeed.transforms.boxes import parse_size
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.orientation import ExifOrientation
from shardfeed.transforms.decode.patches import DecodedImage, decode_for_patches
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

__all__ = ["PICKS", "PatchOptions", "Patches"]

IN_FLIGHT_IMAGE_BYTES = 1 << 30
"""The most bytes of images a Patches cache grows by for the batches in flight, beyond the
``max(2, N // 8)`` images it always has (see :meth:`Patches.room_in_flight`): 145 images of
1566², 14 of 24 MP."""

_CACHED = "__shardfeed_cached__"  # marks a record left unread because its image is cached


class Patches(SamplerBase):
    """A Loader sampler of random patches cut from a cache of decoded images.

    ::

        patches = shardfeed.Patches(ds, size=32, cache_images=64, refresh_every=100)
        loader = shardfeed.Loader(patches, batch_size=32, shuffle=True, seed=0)
        # batch["image"]: uint8 (32, 32, 32, 3); labels and other features of each image

    Options (keyword-only): ``size`` (int or ``(h, w)``); ``scale`` (None: fixed-size crops;
    ``(lo, hi)``: crops of ``s·size`` pixels resized to ``size``); ``cache_images`` (N) and
    ``refresh_every`` (R), the schedule; ``pick`` (``"stratified"`` or ``"uniform"``, see the
    module docstring); ``reduced_decode`` (decode at 1/2, 1/4, 1/8 when every crop is
    shrunk that much); ``cache`` (False decodes for every patch: same outputs, slower);
    ``cache_bytes`` (the cache's bound; default ``N + max(2, N // 8) + LOOK_AHEAD_IMAGES``
    images of the largest image decoded so far, and more for the batches in flight, see
    :meth:`room_in_flight`; pass it to fix the bound from the start); ``mask`` (None:
    cut the mask too when the dataset has one); ``max_pixels``
    (the most pixels an image may have, read from its header before decoding; default 2^27:
    see :class:`~shardfeed.transforms.decode.ops.DecoderBase`); ``exif_orientation``
    (``"ignore"``, the default: patches of the stored pixels; ``"apply"``: of the photo as its
    JPEG's EXIF tag shows it, as every decode path does; docs/transforms.md). The Loader's
    ``transform`` applies to each patch after the crop (flip, colour, normalise); it sees
    ``"image"`` (and ``"mask"``) already decoded.

    An epoch has ``(M - N + 1)·R`` outputs for ``M`` images (``len(self)``); ``N`` larger
    than ``M`` raises ValueError (the epoch would be one cache fill of ``R`` patches). With
    ``shuffle=False`` the images come in stored order; slots and crops stay keyed by
    ``(seed, epoch)``, so an evaluation loader at epoch 0 (e.g. a fresh ``Loader.for_eval``)
    gives the same patches every time, and later epochs other patches of the same images.
    Determinism, state and memory: see the module docstring.
    """

    kind = "patches"
    _no_dataset = "this copy of the patch sampler has no data source"

    def __init__(
        self,
        dataset: DataSource,
        /,
        *,
        size: int | Sequence[int],
        scale: Sequence[float] | None = None,
        cache_images: int = 64,
        refresh_every: int = 100,
        pick: Pick = "stratified",
        reduced_decode: bool = True,
        cache: bool = True,
        cache_bytes: int | None = None,
        mask: bool | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        exif_orientation: ExifOrientation = "ignore",
    ) -> None:
        self._attach(dataset, needs="Patches needs a shardfeed.Dataset or another "
                     "shardfeed.DataSource")
        self.options = PatchOptions(
            size=parse_size(size), scale=None if scale is None else tuple(scale),
            cache_images=cache_images, refresh_every=refresh_every, pick=pick,
            reduced_decode=reduced_decode, cache=cache, cache_bytes=cache_bytes, mask=mask,
            max_pixels=max_pixels, exif_orientation=exif_orientation,
        )
        _check_cache_fits(self._len, self.options.cache_images, self.options.refresh_every)
        schema, root = dataset.schema, dataset.root
        if schema is not None and schema.image is None and schema.features:
            raise SchemaError(
                f"Patches cuts patches from images, and the dataset has no image feature "
                f"(image/encoded, image/raw or image/path): its features are "
                f"{sorted(schema.features)}; pack the images under one of those names "
                "(`shardfeed pack`), or read this dataset with a Loader over the Dataset itself")
        image_info: ImageInfo | None = None if schema is None else schema.image
        mask_info: ImageInfo | None = None if schema is None else schema.mask
        self.schedule = PatchSchedule(self._len, cache_images=self.options.cache_images,
                                      refresh_every=self.options.refresh_every)
        fields = ImageField(max_pixels=max_pixels, exif_orientation=exif_orientation)
        self._image_field = fields.bound(image_info, root=root)
        self._mask_field: ImageField | None = None
        if self.options.mask is not False:
            self._mask_field = ImageField(is_mask=True, max_pixels=max_pixels,
                                          exif_orientation=exif_orientation).bound(
                mask_info, root=root)
        self._native = NativeImages(self._image_field, self._mask_field,
                                    require_mask=self.options.mask,
                                    denominator=self.options.denominator, max_pixels=max_pixels)
        n = self.schedule.max_resident
        self._ahead = LookAhead()
        self.cache: ImageCache[DecodedImage] | None = None
        # images beyond N for the outputs in flight (see room_in_flight)
        self._slack = self.options.slack_images()
        self._plans_only = False  # see plan_for_processes
        if self.options.cache:
            default = max(1, n) + self._slack + LOOK_AHEAD_IMAGES
            self.cache = ImageCache(max_bytes=self.options.cache_bytes, default_images=default)

    # -- the Sampler protocol -----------------------------------------------------------------

    decodes_images = True  # its samples' pixels are its own decodes (the loader's stage figures)

    def begin_pass(self) -> None:
        """A new pass of the loader (called before its first slice): the look-ahead starts
        anew, and the cache's clock too (a pass may read an epoch again: see
        :meth:`ImageCache.rewind`)."""
        self._ahead.reset()
        if self.cache is not None:
            self.cache.rewind()

    def plan_for_processes(self, processes: bool) -> None:
        """Whether this copy only plans the slices that worker processes build (the Loader
        says so before each pass): it then starts no decode and reads no record, since each
        process's copy reads and decodes its images itself, in a cache of its own. Planned
        with decodes ahead, the parent decoded every image once more for nothing (about the
        CPU of a whole threaded pass) and shipped the records of those it had not."""
        self._plans_only = processes

    def samples_per_epoch(self, num_units: int) -> int:
        return len(PatchSchedule(num_units, cache_images=self.options.cache_images,
                                 refresh_every=self.options.refresh_every))

    def __len__(self) -> int:
        """Outputs per epoch, ``(M - N + 1)·R``."""
        return len(self.schedule)

    def bind(self, transform: Callable[..., Sample] | None) -> Transform | None:
        ds = self._ds()
        self._ahead.reset()
        if self.cache is not None:
            self.cache.clear()  # a new loader starts its own clock
        return bind_transform(transform, ds.schema, ds.root)

    def order_positions(self, seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The order position ``q`` (an index into the epoch's image order) of each output
        (:meth:`PatchSchedule.order_positions` with this sampler's ``pick``)."""
        return self.schedule.order_positions(seed, epoch, positions, pick=self.options.pick)

    def plan(self, ctx: EpochContext, positions: np.ndarray) -> list[Sequence[int]]:
        return [(u,) for u in self.plan_units(ctx, positions)[1].tolist()]

    def plan_units(self, ctx: EpochContext,
                   positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`plan` as arrays: the order position and the image of each output (int64),
        the decodes of those images, and of the next ones, started ahead."""
        positions = np.asarray(positions, dtype=np.int64)
        q = self.order_positions(ctx.seed, ctx.epoch, positions)
        units = np.asarray(ctx.order[q], dtype=np.int64)
        if self.cache is not None and not self._plans_only:
            self._decode_ahead(ctx, positions, q, units)
        return q, units

    def read(self, records: Sequence[int]) -> list[Sample]:
        """Read ``records``; images already in the cache, or being decoded, are not read (a
        marker stands in)."""
        ids = [int(r) for r in records]
        if self._plans_only:  # the worker processes read and decode them
            return [{_CACHED: r} for r in ids]
        read = self.read_uncached(ids)
        return [read.get(r, {_CACHED: r}) for r in ids]

    def read_uncached(self, ids: list[int]) -> dict[int, Sample]:
        """The records of ``ids`` whose images are neither cached nor being decoded (all of
        them without a cache), read in one call; none where the compiled call reads and
        decodes them (:mod:`~.native_patches`: each load reads its own)."""
        if self._native.enabled:
            return {}
        missing = ids if self.cache is None else self.cache.unknown(ids)
        return dict(zip(missing, self._ds().read_many(missing))) if missing else {}

    def make_sample(
        self,
        key: SampleKey,
        record_ids: Sequence[int],
        records: Sequence[Sample],
        transform: Transform | None,
    ) -> Sample:
        rid = int(record_ids[0])
        record = records[0]
        decoded = self._decoded(key, rid, record)
        sample = cut_patch(decoded, rid, key.rng(PATCH_CROP), self.options)
        if transform is None:
            return sample
        return transform(sample, key.rng())

    def build_rows(self, ctx: EpochContext, positions: np.ndarray, buffer: BatchBuffer,
                   first_row: int, transform: Transform | None = None) -> bool:
        """The outputs of ``positions`` written into rows ``first_row...`` of ``buffer``: the
        batch path (:func:`~.patch_rows.build_patch_rows`), the bytes of the sample path."""
        return build_patch_rows(self, ctx, positions, buffer, first_row, transform)

    def room_in_flight(self, span: int) -> int:
        """Room in the cache for the outputs of the batches a loader builds at once, which
        lie within ``span`` positions of the epoch (a rank's outputs are every
        ``world_size``-th: :func:`~shardfeed.pipeline.pool.batches_in_flight`): the span
        granted, for which the default bound grows by an image a refresh it spans, up to
        ``N`` images in all beyond ``N`` and, beyond the ``max(2, N // 8)`` it always has,
        :data:`IN_FLIGHT_IMAGE_BYTES` of images (of the largest decoded, checked again as
        larger ones come: :meth:`~shardfeed.pipeline.image_cache.ImageCache.grow`).

        Outputs that far apart need ``N + ceil(span / R)`` images at once; with fewer,
        slices built ahead would push out images that slices behind them still need, and
        decode them again. The node bench's Patches (``N`` = 64, ``R`` = 100, batches of
        256, 16 threads, one rank) get 16 batches at once, not 4: 41 images beyond N, where
        it had 8 (33 more images of 1566², 243 MB), and the GIL held a patch falls by 38%
        (``bench/predict_node.py``: a batch a slice, where 4 batches at once cut each into
        four). A bound given as ``cache_bytes`` stays as it is and grants none (the loader
        builds ``prefetch_batches`` at once); without a cache (``cache=False``) all of it is
        granted. Called when a loader lays out its batches (its first batch, or
        ``memory_budget()``); the bound never shrinks again."""
        if self.cache is None:
            return span
        if self.options.cache_bytes is not None:
            return 0
        r, floor = self.options.refresh_every, self.options.slack_images()
        largest = self.cache.largest_bytes  # the probe sample's image, at least
        room = min(self.options.cache_images,
                   floor + IN_FLIGHT_IMAGE_BYTES // largest) if largest else floor
        images = min(-(-span // r), max(floor, room))
        if images > self._slack:
            self._slack = images
            self.cache.grow(images - floor, most_bytes=IN_FLIGHT_IMAGE_BYTES)
        return min(span, images * r)

    def state(self) -> dict[str, Any]:
        """What decides the patches: the dataset and the options (not the cache settings)."""
        o = self.options
        return {
            "kind": self.kind, "records": self._len, "dataset": self._fingerprint,
            "size": list(o.size),
            "scale": None if o.scale is None else list(o.scale),
            "cache_images": o.cache_images, "refresh_every": o.refresh_every, "pick": o.pick,
            "reduced_decode": o.reduced_decode,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        check_sampler_state(state, self.state(), sampler="Patches")
        self._ahead.reset()
        if self.cache is not None:
            self.cache.clear()

    # -- cache and decode ----------------------------------------------------------------------

    @property
    def decode_bytes(self) -> int:
        """The most memory one image's decode holds while it runs (``max_pixels``)."""
        return self.options.decode_bytes

    @property
    def cache_bytes(self) -> int | None:
        """The cache's bound in bytes now (a derived one: None before the first image, then
        growing with the largest image decoded), and the images being decoded ahead of the
        slices (``DECODE_AHEAD_THREADS`` of the largest image decoded)."""
        if self.cache is None or self.cache.max_bytes is None:
            return None
        return self.cache.max_bytes + DECODE_AHEAD_THREADS * self.cache.largest_bytes

    def cache_stats(self) -> CacheStats | None:
        """Counters of the decoded-image cache (None with ``cache=False``)."""
        return None if self.cache is None else self.cache.stats()

    def _load(self, rid: int, record: Sample | None) -> tuple[DecodedImage, int]:
        """Image ``rid`` decoded from ``record`` (read now where None, or a marker: by the
        compiled call where it applies)."""
        source = record
        if source is None or _CACHED in source:  # evicted since read, or not read: read now
            native = self._native.load(self._ds(), rid)
            if native is not None:
                return native, native.nbytes
            source = self._ds().read_many([rid])[0]
        options = self.options
        decoded = decode_for_patches(
            source, image_field=self._image_field, mask_field=self._mask_field,
            denominator=options.denominator, max_pixels=options.max_pixels,
            require_mask=options.mask)
        return decoded, decoded.nbytes

    def _decoded(self, key: SampleKey, rid: int, record: Sample,
                 q: int | None = None) -> DecodedImage:
        """Image ``rid`` for output ``key`` (order position ``q``, found where None)."""
        if self.cache is None:
            return self._load(rid, record)[0]
        if q is None:
            q = self.schedule.order_position(key.seed, key.epoch, key.position,
                                              pick=self.options.pick)
        expires = (key.epoch, self.schedule.last_output(q))
        return self.cache.get(rid, functools.partial(self._load, rid, record),
                              expires=expires, now=(key.epoch, key.position))

    def _decode_ahead(self, ctx: EpochContext, positions: np.ndarray, q: np.ndarray,
                      units: np.ndarray) -> None:
        """:func:`~.patch_ahead.decode_ahead` of the slice's images and those of the outputs
        after it (:meth:`_look_ahead`)."""
        cache = self.cache
        assert cache is not None
        ahead_q, ahead_units = self._look_ahead(ctx, positions)
        decode_ahead(cache, ctx.epoch, np.concatenate([q, ahead_q]),
                     np.concatenate([units, ahead_units]), load=self._load,
                     last_output=self.schedule.last_output)

    def _look_ahead(self, ctx: EpochContext, positions: np.ndarray) -> tuple[
            np.ndarray, np.ndarray]:
        """:meth:`~.patch_ahead.LookAhead.outputs` of ``positions``."""
        if self.cache is None:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty
        return self._ahead.outputs(ctx, positions, schedule=self.schedule, cache=self.cache,
                                   slack=self._slack,
                                   order_positions=self.order_positions)

    # -- pickling (process workers) -------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # The dataset pickles by reopening its files; the cache travels empty, and so does
        # what the look-ahead knows of it.
        return {**self.__dict__, "_ahead": LookAhead(), "_plans_only": False}

    def __repr__(self) -> str:
        o = self.options
        return (f"Patches({self._len} images, size={o.size}, scale={o.scale}, "
                f"cache_images={o.cache_images}, refresh_every={o.refresh_every}, "
                f"pick={o.pick!r}, cache={o.cache})")


def _check_cache_fits(images: int, cache_images: int, refresh_every: int) -> None:
    """ValueError when the cache is larger than the dataset (an epoch of one cache fill)."""
    if not 0 < images < cache_images:
        return
    half = max(1, images // 2)
    raise ValueError(
        f"cache_images={cache_images} is more than the {images} images of the dataset: the "
        f"cache would hold every image at once and an epoch would be only "
        f"refresh_every={refresh_every} patches; pass cache_images={images} or fewer (an "
        f"epoch has (images - cache_images + 1) x refresh_every patches: cache_images={half} "
        f"gives {(images - half + 1) * refresh_every}), or use a dataset of more images"
    )
