"""Crop-aware decode: decode + crop + resize (+ flip) fused, the fast path for training.

For a JPEG the op reads only the header, draws the crop box in full-image coordinates, and
decodes at the smallest DCT scale (1/2, 1/4, 1/8) at which the crop still has at least the
output's pixels, so a crop that will be shrunk 2× or more costs a fraction of a full decode.
The decode goes into a per-thread scratch buffer (no allocation per image) and the final
resize writes into the caller's array (``out=``, a slot of the batch) when given.

Where the optional region decoder is installed and it costs less (see
:mod:`~shardfeed.transforms.decode.region`), only the crop's rows and columns are decoded, to
the very pixels the whole decode gives there.

Other encodings (PNG, raw, CMYK JPEG) are decoded whole, then cropped the same way: the box
is drawn from the same generator calls, so the geometry does not depend on the encoding.
Whatever the scale, an image whose header claims more than ``max_pixels`` pixels is refused
before decoding (a progressive JPEG holds full-size coefficients even for a 1/8 decode).

EXIF orientation (``exif_orientation``, see :mod:`~shardfeed.transforms.decode.orientation`):
ignored by default, so every path cuts the stored pixels. With ``"apply"``, a tagged JPEG's
box is drawn in the turned image's height and width (swapped for orientations 5-8), mapped
back to the stored image, decoded there (as a region, or at a DCT scale) and turned: the
pixels of the turned image cut at the box, whichever path decodes them.

With ``image_dtype="uint16"`` the decoded pixels (the JPEG's scaled decode or region, an 8-bit
PNG: widened ×257; a 16-bit PNG: as stored) are cropped and resized as 16-bit samples, and
the output is uint16: the same boxes, and the same work, on samples twice as wide.

The batch form (:meth:`CropDecoderBase.apply_batch`, used by the Loader's batch path; see
:mod:`~shardfeed.transforms.decode.crop_rows`) runs the same draws and pixel work for each row
of a slice, writing each image into its batch row: the same bytes as sample by sample, without
a sample dict per image.

::

    full image (H×W)          decoded at 1/d             output
    +-----------------+       +--------+                +------+
    |    +------+     |  -->  |  +--+  |  -- resize --> |      |   (flipped if drawn)
    |    | box  |     |       |  +--+  |                |      |
    |    +------+     |       +--------+                +------+
    +-----------------+
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import cv2
import numpy as np

from shardfeed.sampling.crop_draws import RowKeys
from shardfeed.transforms import arrays
from shardfeed.transforms import placement as place
from shardfeed.transforms.base import ArraySpec, Sample, Specs
from shardfeed.transforms.boxes import (
    Box,
    center_box,
    check_range,
    compiled_draws_agree,
    parse_size,
    random_resized_box,
    resized_boxes,
    scale_denominator,
    scaled_box,
)
from shardfeed.transforms.decode.crop_rows import crop_rows_into
from shardfeed.transforms.decode.image import (
    CMYK_SPACES,
    Where,
    check_pixels,
    decode_jpeg_scratch,
    jpeg_header,
    sniff_format,
    widen_to_uint16,
)
from shardfeed.transforms.decode.ops import DecodeOptions, DecoderBase
from shardfeed.transforms.decode.orientation import (
    orient,
    orientation_of,
    oriented_size,
    stored_box,
)
from shardfeed.transforms.decode.region import decode_region, region_pays
from shardfeed.transforms.decode.warp import scaled_warp

_BOXES = place.BoxFields()
"""Boxes moved with the crop unless ``boxes=`` names others: the key ``boxes`` and its
``box_labels`` (as the array ops' default)."""

if TYPE_CHECKING:
    from typing_extensions import Unpack


class CropDraw(NamedTuple):
    """The keyed draws of one crop-aware decode: the box (full-image pixels) and the flip."""

    box: Box
    flip: bool


class CropDecoderBase(DecoderBase):
    """Decode the crop box that :meth:`_box` picks, resized to ``size`` (subclass hook).

    The other keyword options (:class:`DecodeOptions`) go to :class:`DecoderBase` unchanged.
    """

    __slots__ = ("boxes", "hflip", "max_denominator", "size")
    accepts_out = True

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        hflip: float = 0.0,
        reduced_decode: bool = True,
        boxes: place.BoxFields | None = None,
        **options: Unpack[DecodeOptions],
    ) -> None:
        super().__init__(**options)
        self.boxes = _BOXES if boxes is None else boxes
        self.size = parse_size(size)
        if not 0.0 <= float(hflip) <= 1.0:
            raise ValueError(f"hflip is a probability in [0, 1], got {hflip!r}")
        self.hflip = float(hflip)
        self.max_denominator = 8 if reduced_decode else 1

    def _box(self, height: int, width: int, rng: np.random.Generator) -> Box:
        raise NotImplementedError

    @property
    def draws_random(self) -> bool:
        """Whether the op draws: a random box (subclasses) or a flip (``hflip > 0``)."""
        return self.hflip > 0.0

    def draw(self, height: int, width: int, rng: np.random.Generator) -> CropDraw:
        """The crop box and flip for a ``height``×``width`` image, drawn from ``rng`` (the box
        first, then the flip): the op's only use of its generator. The pixel work that
        applies them is separate, so another backend can apply the same draws."""
        return CropDraw(self._box(height, width, rng), self._draw_flip(rng))

    def __call__(
        self, sample: Sample, rng: np.random.Generator, /, *, out: np.ndarray | None = None
    ) -> Sample:
        field = self.image_field
        key, encoding = field.require(sample)
        if encoding in ("auto", "path") and not isinstance(sample[key], list):
            data = field.encoded_bytes(sample, key, encoding)
            image, drawn, image_hw = self._crop_encoded(data, rng, field.where_lazy(sample, key),
                                                        out, from_record=encoding != "path")
        else:
            full, key = self._decode_full(sample)
            image, drawn, image_hw = self._crop_decoded(full, rng, out)
        return self._with_mask(sample, image, drawn, image_hw, key)

    def apply_batch(
        self, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
        out: Mapping[str, np.ndarray],
    ) -> dict[str, Any] | None:
        """Each row's encoded image drawn, decoded, cropped, resized and flipped straight into
        its batch row (see :meth:`TransformBase.apply_batch` and
        :func:`~shardfeed.transforms.decode.crop_rows.crop_rows_into`): the draws and pixel
        work of ``__call__``, in the same order, from each row's generator."""
        if place.has_boxes(columns, self.boxes):
            return None  # rows with boxes go one by one (_with_mask moves them)
        return crop_rows_into(self, columns, rngs, out)

    def _boxes_in_batch(self) -> bool:
        """Whether :meth:`_boxes` draws (subclass hook; here never)."""
        return False

    def _boxes(self, keys: RowKeys, rows: np.ndarray, heights: np.ndarray,
               widths: np.ndarray) -> np.ndarray | None:
        """The ``(y, x, h, w, flip)`` draws of ``rows`` from ``keys``, all at once, as
        :meth:`draw` makes them one by one; None to leave the rows to :meth:`draw`."""
        return None

    def _crop_encoded(
        self, data: bytes | memoryview, rng: np.random.Generator, where: Where,
        out: np.ndarray | None, *, from_record: bool = False,
    ) -> tuple[np.ndarray, CropDraw, tuple[int, int]]:
        """The output image of encoded ``data``, the draws, and the full image's (H, W): a
        JPEG decoded at reduced scale where it can be, any other image decoded whole.
        ``from_record``: as :meth:`ImageField.decode_bytes`'s (a stored file path said)."""
        field = self.image_field
        if sniff_format(data) == "jpeg":
            height, width, space = jpeg_header(data, where=where)
            check_pixels(height, width, max_pixels=field.max_pixels, where=where,
                         nbytes=len(data))
            if space not in CMYK_SPACES:
                turn = orientation_of(data, field.exif_orientation)
                height, width = oriented_size(height, width, turn)
                drawn = self.draw(height, width, rng)
                image = self._jpeg_crop(data, drawn.box, height, width, where, drawn.flip, out)
                return image, drawn, (height, width)
        decoded = field.decode_bytes(data, where, self.fast_dct, self.fast_upsample,
                                     from_record=from_record)
        return self._crop_decoded(self._fix_channels(decoded), rng, out)

    def _crop_decoded(
        self, full: np.ndarray, rng: np.random.Generator, out: np.ndarray | None
    ) -> tuple[np.ndarray, CropDraw, tuple[int, int]]:
        """The output image of a decoded image, the draws, and its (H, W)."""
        height, width = arrays.spatial_shape(full, is_mask=False)
        drawn = self.draw(height, width, rng)
        region = arrays.crop(full, drawn.box, is_mask=False)
        return self._resize_flip(region, drawn.flip, out), drawn, (height, width)

    def _with_mask(self, sample: Sample, image: np.ndarray, drawn: CropDraw,
                   image_hw: tuple[int, int], key: str) -> Sample:
        """The sample with ``image``, its mask and its boxes cropped by the same draws."""
        if place.has_boxes(sample, self.boxes):
            box, (out_h, out_w) = drawn.box, self.size
            moved = place.shift_scale(-box.x, -box.y, out_w / box.w, out_h / box.h, self.size)
            if drawn.flip:
                moved = place.then(moved, place.hflip(out_h, out_w))
            place.apply_to_boxes(sample, moved, self.boxes, op=type(self).__name__)
        mask, mask_key = self._mask_crop(sample, drawn.box, image_hw, drawn.flip)
        return self._finish(sample, image, mask, [key, mask_key])

    def _draw_flip(self, rng: np.random.Generator) -> bool:
        # Always draw (when flips are on) so later draws do not depend on the outcome.
        return self.hflip > 0.0 and bool(rng.random() < self.hflip)

    def _jpeg_crop(
        self,
        data: bytes | memoryview,
        box: Box,
        height: int,
        width: int,
        where: Where,
        flip: bool,
        out: np.ndarray | None,
    ) -> np.ndarray:
        """The output of JPEG ``data`` for ``box`` (of the ``height``×``width`` image as the
        op sees it: turned where ``exif_orientation="apply"`` and the JPEG is tagged)."""
        out_h, out_w = self.size
        d, turn, stored_h, stored_w, stored = self._stored(data, box, height, width)
        if self._region_pays(d, stored_h, stored_w, stored):
            region = decode_region(data, stored, fast_dct=self.fast_dct,
                                   fast_upsample=self.fast_upsample)
            if region is not None:  # the very pixels of the whole decode, sliced
                return self._from_region(region, turn, flip, out)
        decoded = decode_jpeg_scratch(
            data,
            height=stored_h,
            width=stored_w,
            denominator=d,
            mode="gray" if self.channels == "gray" else "rgb",
            where=where,
            fast_dct=self.fast_dct,
            fast_upsample=self.fast_upsample,
            max_pixels=self.image_field.max_pixels,
        )
        # Turned (a new array) where the tag applies; uint16: widened out of the scratch
        # buffer (a new array) before any resampling.
        decoded = self._widened(orient(decoded, turn))
        dh, dw = decoded.shape[:2]
        if d > 1 and not (box.h >= 2 * d * out_h and box.w >= 2 * d * out_w):
            # Less than 2× left to shrink: one linear warp from the exact (sub-pixel) box in
            # the scaled image, the flip folded in. Rounding the box to whole scaled pixels
            # instead would shift the output by up to half a pixel.
            return self._warp(decoded, box, d, flip, out)
        region = arrays.crop(decoded, scaled_box(box, d, dh, dw), is_mask=False)
        # The region views the thread's scratch buffer: resize copies it out before any
        # other decode on this thread can overwrite it.
        return self._resize_flip(region, flip, out, force_copy=True)

    def _stored(self, data: bytes | memoryview, box: Box, height: int,
                width: int) -> tuple[int, int, int, int, Box]:
        """For crop ``box`` of the ``height``×``width`` image as the op sees it: the DCT
        scale ``d`` it decodes at, the image's turn, the stored image's height and width,
        and the box in the stored image."""
        out_h, out_w = self.size
        d = scale_denominator(box.h, box.w, out_h, out_w, max_denominator=self.max_denominator)
        turn = orientation_of(data, self.image_field.exif_orientation)
        stored_h, stored_w = oriented_size(height, width, turn)
        return d, turn, stored_h, stored_w, stored_box(box, height, width, turn)

    def _region_pays(self, d: int, stored_h: int, stored_w: int, stored: Box) -> bool:
        """Whether the crop ``stored`` (of the stored image, at DCT scale ``1/d``) is decoded
        as a region (see :func:`~shardfeed.transforms.decode.region.region_pays`)."""
        return self.channels == "rgb" and region_pays(stored_h, stored_w, stored, d)

    def _region_box(self, data: bytes | memoryview, box: Box, height: int,
                    width: int) -> tuple[Box, int] | None:
        """The box of the stored image to decode as a region for crop ``box`` (of the
        ``height``×``width`` image as the op sees it) and the image's turn, or None where
        :meth:`_jpeg_crop` decodes it otherwise: its rule, for a batch of rows."""
        d, turn, stored_h, stored_w, stored = self._stored(data, box, height, width)
        return (stored, turn) if self._region_pays(d, stored_h, stored_w, stored) else None

    def _from_region(self, region: np.ndarray, turn: int, flip: bool,
                     out: np.ndarray | None) -> np.ndarray:
        """The output of a decoded region (turned, widened, resized, flipped)."""
        return self._resize_flip(self._widened(orient(region, turn)), flip, out)

    def _widened(self, decoded: np.ndarray) -> np.ndarray:
        """A JPEG's 8-bit pixels as the op's images: as they are for ``image_dtype="uint8"``,
        widened ×257 into a new uint16 array for ``"uint16"``."""
        return decoded if self.image_dtype == "uint8" else widen_to_uint16(decoded)

    def _warp(
        self, decoded: np.ndarray, box: Box, d: int, flip: bool, out: np.ndarray | None
    ) -> np.ndarray:
        """Box ``box`` of the image ``decoded`` at scale ``1/d``, sampled at the box's exact
        (sub-pixel) pixel centres, flipped where ``flip``
        (:func:`~shardfeed.transforms.decode.warp.scaled_warp`)."""
        if out is not None:
            self._check_out(out, decoded.dtype)
        return scaled_warp(decoded, box, d, self.size, flip, out)

    def _check_out(self, out: np.ndarray, dtype: np.dtype[Any]) -> None:
        """ValueError unless ``out`` is size × channels of the image's ``dtype`` (a cast
        would cut uint16 samples to their low byte without a word)."""
        c = self._channel_count()
        if out.shape != self.size + (c,):
            raise ValueError(
                f"out has shape {out.shape}, expected {self.size + (c,)} (size × channels)"
            )
        if out.dtype != dtype:
            raise ValueError(
                f"out is {out.dtype} but the op makes {dtype} images (image_dtype="
                f"{self.image_dtype!r}); pass an out of that dtype (see output_spec)"
            )

    def _resize_flip(
        self, region: np.ndarray, flip: bool, out: np.ndarray | None, force_copy: bool = False
    ) -> np.ndarray:
        if out is not None:
            self._check_out(out, region.dtype)
            if (region.ndim == 3 and region.shape[2] != 1 and region.dtype == out.dtype
                    and out.flags.c_contiguous):
                # What arrays.resize + arrays.hflip do for this case, without their checks
                # (a few µs that matter on small images): resize into out, flip in place.
                h, w = self.size
                interpolation = arrays.interpolation_for(
                    (region.shape[0], region.shape[1]), self.size, is_mask=False
                )
                cv2.resize(region, (w, h), dst=out, interpolation=interpolation)
                if flip:
                    cv2.flip(out, 1, dst=out)
                return out
        result = arrays.resize(region, self.size, is_mask=False, out=out)
        if result is region and (force_copy or flip):
            result = region.copy()
        if flip:
            # In place (cv2.flip swaps mirrored pixels pairwise): no second image-sized array.
            result = arrays.hflip(result, is_mask=False, out=result)
        return result

    def _mask_crop(
        self, sample: Sample, box: Box, image_hw: tuple[int, int], flip: bool
    ) -> tuple[np.ndarray | None, str | None]:
        mask, mask_key = self._decode_mask(sample)
        if mask is None:
            return None, None
        self._check_mask_size(sample, mask, mask_key, image_hw)
        region = arrays.crop(mask, box, is_mask=True)
        resized = arrays.resize(region, self.size, is_mask=True)
        if resized is region:
            resized = region.copy()
        if flip:
            resized = arrays.hflip(resized, is_mask=True)
        return resized, mask_key

    def output_spec(self, specs: Specs) -> Specs:
        """Image ``size``×C (C = 3, or 1 for gray) of ``image_dtype``; mask ``size``
        (``mask_dtype``)."""
        result = dict(specs)
        h, w = self.size
        result["image"] = ArraySpec((h, w, self._channel_count()), self._dtype(self.image_field))
        if self.mask is not False and (self.mask or self.mask_field.key is not None):
            result["mask"] = ArraySpec((h, w), self._dtype(self.mask_field))
        return result


class DecodeRandomResizedCrop(CropDecoderBase):
    """Decode a random crop (Inception-style) resized to ``size``, with an optional flip.

    ``scale``: the crop's area as a fraction of the image, uniform in this range; ``ratio``:
    its aspect ratio w/h, log-uniform; ``hflip``: probability of a left-right flip. JPEGs
    decode at reduced DCT scale when the crop will be shrunk ≥ 2× (``reduced_decode=False``
    turns that off). Output: ``sample["image"]`` size×C uint8 (uint16 with
    ``image_dtype="uint16"``), ``sample["mask"]`` size class ids (nearest neighbour) with
    the same crop and flip. See :class:`DecoderBase` for the options that say where the
    image is.

    Determinism: box then flip, drawn from the generator in that order; the same key gives
    the same output. State: none. Memory: one per-thread scratch buffer of the largest
    decoded (scaled) image, plus the output (uint16: plus that decode widened).
    """

    __slots__ = ("ratio", "scale")
    draws_random = True

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        hflip: float = 0.0,
        reduced_decode: bool = True,
        boxes: place.BoxFields | None = None,
        **options: Unpack[DecodeOptions],
    ) -> None:
        super().__init__(size, hflip=hflip, reduced_decode=reduced_decode, boxes=boxes,
                         **options)
        self.scale = check_range(scale, name="scale", low=0.0, high=1.0)
        self.ratio = check_range(ratio, name="ratio", low=0.0, high=float("inf"))

    def _box(self, height: int, width: int, rng: np.random.Generator) -> Box:
        return random_resized_box(height, width, rng, scale=self.scale, ratio=self.ratio)

    def _boxes_in_batch(self) -> bool:
        return compiled_draws_agree()

    def _boxes(self, keys: RowKeys, rows: np.ndarray, heights: np.ndarray,
               widths: np.ndarray) -> np.ndarray | None:
        return resized_boxes(keys, rows, heights, widths, scale=self.scale, ratio=self.ratio,
                             hflip=self.hflip)


class DecodeCenterCrop(CropDecoderBase):
    """Decode the center crop of evaluation: the result of "resize the shorter side to
    ``max(size) / crop_fraction``, then center-crop ``size``", computed with one resize
    (and a reduced-scale JPEG decode when the crop is ≥ 2× the output).

    Output: ``sample["image"]`` size×C uint8 (uint16 with ``image_dtype="uint16"``);
    ``sample["mask"]`` size class ids (nearest). See :class:`DecoderBase` for the options
    that say where the image is.

    Determinism: fully deterministic; draws nothing from the generator (``hflip`` is 0 by
    default). State: none. Memory: the per-thread scratch buffer, plus the output (uint16:
    plus the decode widened).
    """

    __slots__ = ("crop_fraction",)

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        crop_fraction: float = 0.875,
        hflip: float = 0.0,
        reduced_decode: bool = True,
        boxes: place.BoxFields | None = None,
        **options: Unpack[DecodeOptions],
    ) -> None:
        super().__init__(size, hflip=hflip, reduced_decode=reduced_decode, boxes=boxes,
                         **options)
        if not 0.0 < float(crop_fraction) <= 1.0:
            raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction!r}")
        self.crop_fraction = float(crop_fraction)

    def _box(self, height: int, width: int, rng: np.random.Generator) -> Box:
        return center_box(height, width, *self.size, crop_fraction=self.crop_fraction)


__all__ = ["CropDecoderBase", "CropDraw", "DecodeCenterCrop", "DecodeRandomResizedCrop"]
