"""The CPU half of a decode on another device (a GPU): each sample's crop and flip drawn, its
JPEG handed on undecoded; what that device's decoder cannot take made here.

A crop-aware decode op (:class:`~shardfeed.transforms.decode.crop.DecodeRandomResizedCrop`,
:class:`~shardfeed.transforms.decode.crop.DecodeCenterCrop`) split in two::

    here: loader threads (this transform)         on the device (e.g. shardfeed.torch.adapt)
    header read; box and flip drawn from the      region decode of each box, a batch at once;
    sample's keyed generator, as the op does      resize, flip, normalise, layout
    not a plain JPEG (PNG, CMYK, raw ...):        those rows uploaded as they are
    decoded, cropped, resized, flipped by the op
    the tail (normalise, dtype, layout): not      applied to every row (``plan.tail``)
    applied here

The draws are the op's own (same generator calls, same order, the batch form's compiled
draws included), so boxes and flips are the CPU path's for the same seed, whatever decodes the
pixels. Output of a sample:

- ``"image"``: size×size×3 uint8, the CPU path's pixels for a row made here, zeros otherwise;
- ``"plan/encoded"``: the JPEG for a device row, ``b""`` for a row made here;
- ``"plan/box"``: int32 ``(y, x, h, w)`` in full-image pixels; ``"plan/image_hw"``: int32
  ``(height, width)``; ``"plan/flip"``: uint8, 1 = flipped left-right;
- ``"plan/on_cpu"``: uint8, 1 = ``"image"`` is the row's pixels (made here);
- ``"plan/stream"``: the row's parsed code stream for the device decoder (nvImageCodec's
  ``CodeStream``, cut to the box where ``streams="region"``, whole where ``"whole"``), made here
  on the loader's threads so that the device side only decodes; None for a row made here, when
  ``streams`` is None (the device side parses it), or where the parser refused the bytes.

EXIF orientation: the device decoder is always told to keep the stored pixels (nvImageCodec
turns them by default; see :func:`~shardfeed.transforms.decode.region.no_turn`), so with the
default ``exif_orientation="ignore"`` every path gives the stored pixels. With ``"apply"``,
a JPEG whose tag turns it is made here (boxes drawn in the turned image, as the op does).

A JPEG that does not end with its end-of-image marker is made here too: the CPU path raises
the DecodeError that names its record (or skips it), where a device decoder might fill the
missing rows with grey.

:func:`decode_planned` makes one planned row on the CPU with the op's own pixel work (the
device side's fallback for an image its decoder refuses): exactly the CPU path's pixels.

Determinism: the op's draws. State: none. Memory: the op's, plus the encoded bytes handed on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from shardfeed.sampling.crop_draws import RowKeys
from shardfeed.transforms.base import NO_RANDOMNESS, ArraySpec, Sample, Specs, TransformBase
from shardfeed.transforms.boxes import Box
from shardfeed.transforms.decode.crop import CropDecoderBase
from shardfeed.transforms.decode.crop_rows import batch_key, draw_rows
from shardfeed.transforms.decode.image import (
    CMYK_SPACES,
    Where,
    check_pixels,
    jpeg_header,
    sniff_format,
)
from shardfeed.transforms.decode.orientation import orientation_of
from shardfeed.transforms.decode.region import backend

_EOI = b"\xff\xd9"  # a device decoder may fill a JPEG cut short with grey without a word
PLAN_KEYS = ("plan/encoded", "plan/box", "plan/image_hw", "plan/flip", "plan/on_cpu",
             "plan/stream")
StreamMode = Literal["region", "whole"]

__all__ = ["PLAN_KEYS", "DevicePlan", "PlanTail", "StreamMode", "decode_planned", "parse_stream"]


class PlanTail:
    """What the device side applies to every row after the crop: ``normalize`` (None,
    ``"imagenet"`` or ``"symmetric"``), ``dtype`` (``"uint8"``/``"float32"``), ``layout``
    (``"HWC"``/``"CHW"``); the presets' ``_tail`` options, checked there."""

    __slots__ = ("dtype", "layout", "normalize")

    def __init__(self, normalize: str | None, dtype: str, layout: str) -> None:
        self.normalize, self.dtype, self.layout = normalize, dtype, layout

    def as_dict(self) -> dict[str, str | None]:
        return {"normalize": self.normalize, "dtype": self.dtype, "layout": self.layout}


class DevicePlan(TransformBase):
    """Draw each sample's crop and hand its JPEG on to the device (see the module doc).

    ``op``: the crop-aware decode op (RGB uint8 output, no mask; ValueError otherwise);
    ``tail``: what the device applies after it; ``streams``: parse each JPEG for the device
    decoder here (``"region"``: cut to the box; ``"whole"``; None: not here), set by the device
    stage that takes the batches. Determinism: the op's. State: none. Memory: the op's.
    """

    __slots__ = ("op", "streams", "tail")
    accepts_out = False

    def __init__(self, op: CropDecoderBase, *, tail: PlanTail,
                 streams: StreamMode | None = None) -> None:
        if not isinstance(op, CropDecoderBase):
            raise TypeError(f"a device plan needs a crop-aware decode op, got {op!r}")
        if op.channels != "rgb" or op.mask:
            raise ValueError(
                "decoding on the device takes RGB images without masks: pass channels='rgb' "
                "and no mask, or decode on the CPU (decode_on='cpu')"
            )
        if op.image_dtype != "uint8":
            raise ValueError(
                f"decoding on the device gives uint8 images, and the op asks for "
                f"image_dtype={op.image_dtype!r}: decode 16-bit images on the CPU "
                "(decode_on='cpu'), or pass image_dtype='uint8' (16-bit samples cut to 8 "
                "bits)"
            )
        self.op, self.tail, self.streams = op, tail, streams

    @property
    def draws_random(self) -> bool:
        return self.op.draws_random

    @property
    def decode_bytes(self) -> int | None:
        return self.op.decode_bytes

    @property
    def size(self) -> tuple[int, int]:
        return self.op.size

    def bind(self, schema: Any, *, root: str | None) -> DevicePlan:
        return DevicePlan(self.op.bind(schema, root=root), tail=self.tail,
                          streams=self.streams)

    def output_spec(self, specs: Specs) -> Specs:
        result = dict(specs)
        result["image"] = ArraySpec((*self.op.size, 3), np.dtype(np.uint8))
        result["plan/box"] = ArraySpec((4,), np.dtype(np.int32))
        result["plan/image_hw"] = ArraySpec((2,), np.dtype(np.int32))
        result["plan/flip"] = ArraySpec((), np.dtype(np.uint8))
        result["plan/on_cpu"] = ArraySpec((), np.dtype(np.uint8))
        return result

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        op = self.op
        key, encoding = op.image_field.require(sample)
        if encoding in ("auto", "path") and not isinstance(sample[key], list):
            data = bytes(op.image_field.encoded_bytes(sample, key, encoding))
            hw = _plain_jpeg_size(data, op, op.image_field.where_lazy(sample, key))
            if hw is not None:
                drawn = op.draw(*hw, rng)
                result = {k: v for k, v in sample.items() if k != key}
                result["image"] = np.zeros((*op.size, 3), np.uint8)
                result = _with_plan(result, data, (*drawn.box,), hw, drawn.flip, on_cpu=False)
                result["plan/stream"] = parse_stream(data, drawn.box, self.streams)
                return result
        made = _with_plan(dict(op(sample, rng)), b"", (0, 0, 0, 0), (0, 0), False, on_cpu=True)
        made["plan/stream"] = None
        return made

    def apply_batch(
        self, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
        out: Mapping[str, np.ndarray],
    ) -> dict[str, Any] | None:
        """Every row's draws at once where the op has a batch form of them; the rows that are
        not plain JPEGs made by the op into their batch rows (see the module doc)."""
        op, image_out = self.op, out.get("image")
        key = batch_key(op, columns, rngs, image_out)
        if key is None or image_out is None or not isinstance(rngs, RowKeys):
            return None
        values, where = columns[key], f"feature '{key}'"
        drawn = draw_rows(op, values, rngs, where)
        if drawn is None:
            return None
        n = len(values)
        box, hw = np.zeros((n, 4), np.int32), np.zeros((n, 2), np.int32)
        flip, on_cpu = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        encoded: list[bytes] = [b""] * n
        streams: list[Any] = [None] * n
        image_out[:n] = 0  # the device rows' (one fill, no GIL); rows made here overwrite it
        policy = op.image_field.exif_orientation
        for row, known in enumerate(drawn):
            if known is None or values[row][-2:] != _EOI:
                op._crop_encoded(values[row], rngs[row] if rngs else NO_RANDOMNESS, where,
                                 image_out[row])
                on_cpu[row] = 1
                continue
            if policy != "ignore" and orientation_of(values[row], policy) != 1:
                height, width, y, x, h, w, flipped = known  # drawn in the turned image
                op._jpeg_crop(values[row], Box(y, x, h, w), height, width, where,
                              flipped != 0, image_out[row])
                on_cpu[row] = 1
                continue
            hw[row], box[row], flip[row] = known[:2], known[2:6], known[6]
            encoded[row] = values[row]
            streams[row] = parse_stream(values[row], known[2:6], self.streams)
        result = {k: v for k, v in columns.items() if k != key}
        result.update({"image": image_out, "plan/encoded": encoded, "plan/box": box,
                       "plan/image_hw": hw, "plan/flip": flip, "plan/on_cpu": on_cpu,
                       "plan/stream": streams})
        return result

    def __repr__(self) -> str:
        return f"DevicePlan({self.op!r}, tail={self.tail.as_dict()!r})"


def _plain_jpeg_size(data: bytes, op: CropDecoderBase, where: Where) -> tuple[int, int] | None:
    """(height, width) of a JPEG the device decodes (not CMYK, not turned by the op's
    ``exif_orientation``), checked against the op's ``max_pixels``; None for any other
    image (made on the CPU)."""
    if sniff_format(data) != "jpeg" or data[-2:] != _EOI:
        return None  # a JPEG cut short is the CPU path's, which names it
    if orientation_of(data, op.image_field.exif_orientation) != 1:
        return None  # turned on the CPU path
    height, width, space = jpeg_header(data, where=where)
    check_pixels(height, width, max_pixels=op.image_field.max_pixels, where=where,
                 nbytes=len(data))
    return None if space in CMYK_SPACES else (height, width)


def _with_plan(sample: Sample, encoded: bytes, box: tuple[int, ...], hw: tuple[int, int],
               flip: bool, *, on_cpu: bool) -> Sample:
    sample["plan/encoded"] = encoded
    sample["plan/box"] = np.asarray(box, np.int32)
    sample["plan/image_hw"] = np.asarray(hw, np.int32)
    sample["plan/flip"] = np.uint8(flip)
    sample["plan/on_cpu"] = np.uint8(on_cpu)
    return sample


def parse_stream(data: bytes | memoryview, box: Sequence[int],
                 mode: StreamMode | None) -> Any:
    """JPEG ``data`` parsed for the device decoder: nvImageCodec's ``CodeStream``, cut to
    ``box`` (y, x, h, w) for ``mode="region"``; None for ``mode=None``, without nvImageCodec,
    or where its parser refuses the bytes (the device side then tries, then the CPU names it)."""
    module = backend() if mode is not None else None
    if module is None:
        return None
    try:
        code = module.CodeStream(bytes(data))
        if mode == "whole":
            return code
        y, x, h, w = (int(v) for v in box)
        return code.get_sub_code_stream(region=module.Region(start=(y, x), end=(y + h, x + w)))
    except Exception:  # noqa: BLE001 - any parser failure: the row is parsed, or made, later
        return None


def decode_planned(plan: DevicePlan, encoded: bytes, box: Sequence[int],
                   image_hw: Sequence[int], flip: bool, out: np.ndarray, *,
                   where: Where = "") -> np.ndarray:
    """One planned row made on the CPU into ``out`` (size×size×3 uint8): the op's own decode,
    crop, resize and flip for these draws, so exactly the CPU path's pixels. Raises the op's
    DecodeError (naming ``where``) for bytes that do not decode."""
    y, x, h, w = (int(v) for v in box)
    height, width = (int(v) for v in image_hw)
    image = plan.op._jpeg_crop(encoded, Box(y, x, h, w), height, width, where, bool(flip), out)
    if image is not out:
        out[...] = image
    return out
