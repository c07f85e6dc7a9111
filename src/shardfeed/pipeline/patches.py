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
thread count, ranks, restores or the cache (``cache=False`` gives the same bytes). State: a
configuration fingerprint (see :meth:`Patches.state`). Memory: the decoded-image cache,
``cache_bytes`` (default: ``N + max(2, N // 8)`` decoded images of the first image's size),
plus the dataset's index (8 bytes an image). Threads work up to ``prefetch_batches ×
batch_size`` outputs ahead, which needs ``N + ceil(that / R)`` images at once; when ``R``
is small next to the batch, pass a larger ``cache_bytes`` (or images are decoded again,
with the same outputs).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import simplejpeg

from shardfeed.errors import DecodeError
from shardfeed.pipeline.image_cache import CacheStats, ImageCache
from shardfeed.pipeline.source import (
    DatasetLike,
    EpochContext,
    Sample,
    SampleKey,
    Transform,
    _schema_lengths,
    bind_transform,
)
from shardfeed.sampling.keys import PATCH_CROP, PATCH_SLOT, uniform_many
from shardfeed.sampling.patches import PatchSchedule
from shardfeed.transforms import arrays
from shardfeed.transforms.boxes import parse_size
from shardfeed.transforms.decode import decode_error, jpeg_header, sniff_format
from shardfeed.transforms.source import ImageField

__all__ = ["PatchOptions", "Patches"]

PICKS = ("stratified", "uniform")
_CACHED = "__shardfeed_cached__"  # marks a record left unread because its image is cached
_CMYK = ("CMYK", "YCCK")


@dataclass(frozen=True, slots=True)
class PatchOptions:
    """How patches are cut and cached (see :class:`Patches` for the meaning of each)."""

    size: tuple[int, int]
    scale: tuple[float, float] | None = None
    cache_images: int = 64
    refresh_every: int = 100
    pick: str = "stratified"
    reduced_decode: bool = True
    cache: bool = True
    cache_bytes: int | None = None
    mask: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", parse_size(self.size))
        for name in ("cache_images", "refresh_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}; e.g. "
                                 f"cache_images=64, refresh_every=100")
        if self.scale is not None:
            try:
                lo, hi = (float(v) for v in self.scale)
            except (TypeError, ValueError):
                raise ValueError(f"scale must be None or a pair (min, max), got "
                                 f"{self.scale!r}") from None
            if not (0.0 < lo <= hi and math.isfinite(hi)):
                raise ValueError(f"scale must satisfy 0 < min <= max, got {self.scale!r}; "
                                 "e.g. scale=(1, 4) cuts 1x to 4x the patch size and "
                                 "resizes it to size")
            object.__setattr__(self, "scale", (lo, hi))
        if self.pick not in PICKS:
            raise ValueError(f"pick must be one of {PICKS}, got {self.pick!r}")
        for name in ("reduced_decode", "cache"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.cache_bytes is not None and (
            isinstance(self.cache_bytes, bool) or not isinstance(self.cache_bytes, int)
            or self.cache_bytes < 0
        ):
            raise ValueError(f"cache_bytes must be an int >= 0 or None (derived from "
                             f"cache_images), got {self.cache_bytes!r}")
        if self.mask is not None and not isinstance(self.mask, bool):
            raise TypeError(f"mask must be None, True or False, got {self.mask!r}")

    @property
    def denominator(self) -> int:
        """The reduced decode scale ``1/d`` of every image (1: full size)."""
        if self.scale is None or not self.reduced_decode:
            return 1
        d = 1
        while d < 8 and 2 * d <= self.scale[0]:
            d *= 2
        return d

    def slack_images(self) -> int:
        """Images beyond ``cache_images`` the default byte bound allows (threads run ahead)."""
        return max(2, self.cache_images // 8)


@dataclass(frozen=True, slots=True)
class _Decoded:
    """A cached image: pixels at scale 1/d, full-size mask, the record's other features."""

    image: np.ndarray
    mask: np.ndarray | None
    meta: dict[str, Any]
    full_hw: tuple[int, int]

    @property
    def nbytes(self) -> int:
        mask = 0 if self.mask is None else self.mask.nbytes
        return self.image.nbytes + mask + 64 * (len(self.meta) + 1)


@functools.lru_cache(maxsize=256)
def _block_permutation(seed: int, epoch: int, block: int, n: int) -> np.ndarray:
    """The keyed permutation of the ``n`` slots in block ``block`` of outputs (read-only)."""
    positions = block * n + np.arange(n, dtype=np.int64)
    order = np.argsort(uniform_many(seed, epoch, positions, PATCH_SLOT, draw=1), kind="stable")
    order.flags.writeable = False
    return order


class Patches:
    """A Loader source of random patches cut from a cache of decoded images.

    ::

        patches = shardfeed.Patches(ds, size=32, cache_images=64, refresh_every=100)
        loader = shardfeed.Loader(patches, batch_size=32, shuffle=True, seed=0)
        # batch["image"]: uint8 (32, 32, 32, 3); labels and other features of each image

    Options (keyword-only): ``size`` (int or ``(h, w)``); ``scale`` (None: fixed-size crops;
    ``(lo, hi)``: crops of ``s·size`` pixels resized to ``size``); ``cache_images`` (N) and
    ``refresh_every`` (R), the schedule; ``pick`` (``"stratified"`` or ``"uniform"``, see the
    module docstring); ``reduced_decode`` (decode at 1/2, 1/4, 1/8 when every crop is
    shrunk that much); ``cache`` (False decodes for every patch: same outputs, slower);
    ``cache_bytes`` (the cache's bound; default ``N + max(2, N // 8)`` images of the first
    image's size); ``mask`` (None: cut the mask too when the dataset has one). The Loader's
    ``transform`` applies to each patch after the crop (flip, colour, normalise); it sees
    ``"image"`` (and ``"mask"``) already decoded.

    An epoch has ``(M - N + 1)·R`` outputs for ``M`` images (``len(self)``). With
    ``shuffle=False`` the images come in stored order; slots and crops stay keyed by
    ``(seed, epoch)``, so an evaluation loader at epoch 0 (e.g. a fresh ``Loader.for_eval``)
    gives the same patches every time, and later epochs other patches of the same images.
    Determinism, state and memory: see the module docstring.
    """

    kind = "patches"

    def __init__(
        self,
        dataset: DatasetLike,
        /,
        *,
        size: int | Sequence[int],
        scale: Sequence[float] | None = None,
        cache_images: int = 64,
        refresh_every: int = 100,
        pick: str = "stratified",
        reduced_decode: bool = True,
        cache: bool = True,
        cache_bytes: int | None = None,
        mask: bool | None = None,
    ) -> None:
        for name in ("read_many", "locate", "__len__"):
            if not hasattr(dataset, name):
                raise TypeError(f"Patches needs a shardfeed.Dataset; {type(dataset).__name__} "
                                f"has no {name}()")
        self.options = PatchOptions(
            size=size, scale=None if scale is None else tuple(scale),  # type: ignore[arg-type]
            cache_images=cache_images, refresh_every=refresh_every, pick=pick,
            reduced_decode=reduced_decode, cache=cache, cache_bytes=cache_bytes, mask=mask,
        )
        self.dataset: DatasetLike | None = dataset
        self._len = len(dataset)
        schema = getattr(dataset, "schema", None)
        root = getattr(dataset, "root", None)
        self._lengths = _schema_lengths(schema)
        self.schedule = PatchSchedule(self._len, cache_images=self.options.cache_images,
                                      refresh_every=self.options.refresh_every)
        self._image_field = ImageField().bound(getattr(schema, "image", None), root=root)
        self._mask_field: ImageField | None = None
        if self.options.mask is not False:
            self._mask_field = ImageField(is_mask=True).bound(getattr(schema, "mask", None),
                                                              root=root)
        n = self.schedule.max_resident
        self.cache: ImageCache[_Decoded] | None = None
        if self.options.cache:
            default = max(1, n) + self.options.slack_images()
            self.cache = ImageCache(max_bytes=self.options.cache_bytes, default_images=default)

    # -- the Source protocol ------------------------------------------------------------------

    @property
    def num_units(self) -> int:
        return self._len

    def samples_per_epoch(self, num_units: int) -> int:
        return len(PatchSchedule(num_units, cache_images=self.options.cache_images,
                                 refresh_every=self.options.refresh_every))

    def __len__(self) -> int:
        """Outputs per epoch, ``(M - N + 1)·R``."""
        return len(self.schedule)

    def bind(self, transform: Transform | None) -> Transform | None:
        ds = self.dataset
        if self.cache is not None:
            self.cache.clear()  # a new loader starts its own clock
        return bind_transform(transform, getattr(ds, "schema", None), getattr(ds, "root", None))

    def order_positions(self, seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The order position ``q`` (an index into the epoch's image order) of each output."""
        ps = np.asarray(positions, dtype=np.int64)
        lo, _ = self.schedule.windows_many(ps)
        if self.options.pick == "uniform":
            return self.schedule.pick_many(ps, uniform_many(seed, epoch, ps, PATCH_SLOT))
        n = self.schedule.cache_images
        blocks = ps // n
        within = ps - blocks * n
        slots = np.empty_like(ps)
        for block in np.unique(blocks).tolist():
            chosen = blocks == block
            slots[chosen] = _block_permutation(seed, epoch, int(block), n)[within[chosen]]
        return lo + slots

    def plan(self, ctx: EpochContext, positions: np.ndarray) -> list[Sequence[int]]:
        q = self.order_positions(ctx.seed, ctx.epoch, positions)
        units = np.asarray(ctx.order[q], dtype=np.int64)
        return [(int(u),) for u in units]

    def read(self, records: Sequence[int]) -> list[Sample]:
        """Read ``records``; images already in the cache are not read (a marker stands in)."""
        ids = [int(r) for r in records]
        cache = self.cache
        missing = ids if cache is None else [r for r in ids if r not in cache]
        read = dict(zip(missing, self._ds().read_many(missing))) if missing else {}
        return [read.get(r, {_CACHED: r}) for r in ids]

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
        sample = self._cut(decoded, rid, key.rng(PATCH_CROP))
        if transform is None:
            return sample
        return transform(sample, key.rng())

    def locate(self, record: int) -> tuple[str, int, int]:
        return self._ds().locate(record)

    def feature_lengths(self) -> Mapping[str, int | None]:
        return self._lengths

    @property
    def index_bytes(self) -> int:
        return 8 * (self._len + 1)

    def state(self) -> dict[str, Any]:
        """The configuration fingerprint: what changes outputs (not the cache settings)."""
        o = self.options
        return {
            "kind": self.kind, "records": self._len, "size": list(o.size),
            "scale": None if o.scale is None else list(o.scale),
            "cache_images": o.cache_images, "refresh_every": o.refresh_every, "pick": o.pick,
            "reduced_decode": o.reduced_decode,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        from shardfeed.errors import StateError

        expected = self.state()
        if dict(state) != expected:
            raise StateError(
                f"the saved state is for source {dict(state)!r}, but this loader reads "
                f"{expected!r}: restore it on a Loader over Patches of the same dataset and "
                "options"
            )
        if self.cache is not None:
            self.cache.clear()

    # -- cache and decode ----------------------------------------------------------------------

    @property
    def cache_bytes(self) -> int | None:
        """The cache's bound in bytes (None before the first image when it is derived)."""
        return None if self.cache is None else self.cache.max_bytes

    def cache_stats(self) -> CacheStats | None:
        """Counters of the decoded-image cache (None with ``cache=False``)."""
        return None if self.cache is None else self.cache.stats()

    def _ds(self) -> DatasetLike:
        if self.dataset is None:
            raise RuntimeError("this copy of the patch source has no dataset")
        return self.dataset

    def _decoded(self, key: SampleKey, rid: int, record: Sample) -> _Decoded:
        def load() -> tuple[_Decoded, int]:
            source = record
            if _CACHED in source:  # evicted since read: read it now
                source = self._ds().read_many([rid])[0]
            decoded = self._decode(source)
            return decoded, decoded.nbytes

        if self.cache is None:
            return load()[0]
        q = int(self.order_positions(key.seed, key.epoch, np.array([key.position]))[0])
        expires = (key.epoch, self.schedule.last_output(q))
        return self.cache.get(rid, load, expires=expires, now=(key.epoch, key.position))

    def _decode(self, record: Sample) -> _Decoded:
        field = self._image_field
        key, encoding = field.require(record)
        where = field.where(record, key)
        d = self.options.denominator
        image: np.ndarray | None = None
        full_hw = (0, 0)
        if encoding in ("auto", "path") and not isinstance(record[key], list):
            data = field.encoded_bytes(record, key, encoding)
            if sniff_format(data) == "jpeg":
                height, width, space = jpeg_header(data, where=where)
                if space not in _CMYK:
                    image = _decode_jpeg(data, d, where)
                    full_hw = (height, width)
            if image is None:
                image = field.decode_bytes(data, where, True)
        else:
            image = field.decode(record)
        if full_hw == (0, 0):
            full_hw = (int(image.shape[0]), int(image.shape[1]))
        if image.ndim == 2:
            image = image[:, :, None]
        if d > 1 and image.shape[:2] == full_hw:
            shape = (math.ceil(full_hw[1] / d), math.ceil(full_hw[0] / d))
            image = cv2.resize(image, shape, interpolation=cv2.INTER_AREA).reshape(
                shape[1], shape[0], image.shape[2])
        drop = [key] if encoding != "path" else []
        mask = None
        if self._mask_field is not None:
            found = self._mask_field.locate(record)
            if found is None and self.options.mask:
                self._mask_field.require(record)  # raises SchemaError naming the keys
            if found is not None:
                mask = self._mask_field.decode(record)
                drop.append(found[0])
                if mask.shape[:2] != full_hw:
                    raise DecodeError(
                        f"{self._mask_field.where(record, found[0])}: the mask is "
                        f"{mask.shape[0]}×{mask.shape[1]} but the image is "
                        f"{full_hw[0]}×{full_hw[1]}; a mask must have the image's size"
                    )
        meta = {k: v for k, v in record.items() if k not in drop}
        return _Decoded(np.ascontiguousarray(image), mask, meta, full_hw)

    def _cut(self, decoded: _Decoded, rid: int, rng: np.random.Generator) -> Sample:
        ph, pw = self.options.size
        d = self.options.denominator
        image = decoded.image
        height, width = int(image.shape[0]), int(image.shape[1])
        scale = self.options.scale
        if scale is None:
            ch, cw = ph, pw
        else:
            s = float(rng.uniform(scale[0], scale[1]))
            ch, cw = max(1, round(ph * s / d)), max(1, round(pw * s / d))
        ch, cw = min(ch, height), min(cw, width)
        y = int(rng.integers(0, height - ch + 1))
        x = int(rng.integers(0, width - cw + 1))
        region = image[y : y + ch, x : x + cw]
        if scale is None:
            patch = _pad(region, (ph, pw))
        else:
            patch = arrays.resize(region, (ph, pw), is_mask=False)
            if patch is region:
                patch = region.copy()
        full_h, full_w = decoded.full_hw
        fy, fx = min(y * d, full_h - 1), min(x * d, full_w - 1)
        fh, fw = min(ch * d, full_h - fy), min(cw * d, full_w - fx)
        sample = dict(decoded.meta)
        sample["image"] = patch
        if decoded.mask is not None:
            mregion = decoded.mask[fy : fy + fh, fx : fx + fw]
            if scale is None:
                sample["mask"] = _pad(mregion, (ph, pw))
            else:
                sample["mask"] = np.ascontiguousarray(
                    arrays.resize(mregion, (ph, pw), is_mask=True))
        sample["patch/box"] = np.array([fy, fx, fh, fw], dtype=np.int64)
        sample["patch/record"] = np.int64(rid)
        return sample

    # -- pickling (process workers) -------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # The dataset pickles by reopening its files; the cache travels empty.
        return dict(self.__dict__)

    def __repr__(self) -> str:
        o = self.options
        return (f"Patches({self._len} images, size={o.size}, scale={o.scale}, "
                f"cache_images={o.cache_images}, refresh_every={o.refresh_every}, "
                f"pick={o.pick!r}, cache={o.cache})")


def _decode_jpeg(data: bytes | memoryview, d: int, where: str) -> np.ndarray:
    """Decode a JPEG to RGB at scale ``1/d`` (libjpeg-turbo DCT scaling) into a new array."""
    try:
        if d == 1:
            image: np.ndarray = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True)
        else:
            height, width, _ = jpeg_header(data, where=where)
            image = simplejpeg.decode_jpeg(
                data, colorspace="RGB", fastdct=True,
                min_height=math.ceil(height / d), min_width=math.ceil(width / d),
            )
    except ValueError as exc:
        raise decode_error(data, where, f"damaged JPEG: {exc}") from None
    return image


def _pad(region: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``region`` (an image or mask crop) padded with zeros at the bottom/right to ``size``."""
    h, w = size
    if region.shape[:2] == (h, w):
        return region.copy()
    out = np.zeros((h, w) + region.shape[2:], dtype=region.dtype)
    out[: region.shape[0], : region.shape[1]] = region
    return out
