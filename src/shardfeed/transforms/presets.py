"""Ready-made pipelines: ``train`` (random augmentation) and ``eval`` (deterministic).

Both return a :class:`~shardfeed.transforms.base.Compose` whose output ``"image"`` has a
fixed shape, so the loader can batch it:

============  =====================================  =========================
layout        shape                                  dtype
============  =====================================  =========================
``"HWC"``     ``size × size × 3``                    ``image_dtype`` (uint8 or
``"CHW"``     ``3 × size × size``                    uint16), or float32 when
                                                     ``normalize`` or ``dtype``
============  =====================================  =========================

Bit depth: ``image_dtype="uint16"`` decodes every image to uint16 (16-bit PNGs exactly,
8-bit images widened ×257; see :class:`~shardfeed.transforms.decode.ops.DecoderBase`).
``dtype`` names the output's type: left out (None), it is the decoded type,
``image_dtype``; ``"float32"`` scales that type's full range to [0, 1] (255 for uint8, 65535
for uint16; ``normalize`` likewise). An integer ``dtype`` other than ``image_dtype`` is a
ValueError: the presets never convert between integer types (cutting 16-bit samples to 8
bits is ``image_dtype="uint8"``'s job, at decode, where it is documented). Colour jitter
works on uint8 only: ``color`` with ``image_dtype="uint16"`` is a ValueError, as is
``decode_on="cuda"`` (the GPU path gives uint8).

With a mask in the dataset, ``"mask"`` is ``size × size`` class ids (same crop and flip,
nearest neighbour): uint8 grey values or palette indices; ``mask_colors`` maps the colours
of colour masks to ids, ``mask_dtype="uint16"`` keeps 16-bit masks (see
:mod:`shardfeed.transforms.decode.masks`). ``pipeline.bind(schema, root=...).output_spec()`` gives these as
``ArraySpec`` objects for preallocating batch arrays.

Where the image and mask are: found as the decode ops find them (the dataset's schema, the
standard feature names), or named with the decode ops' own options (``key``, ``encoding``,
``height_key``, ``width_key``, ``channels_key``, ``shape``, ``mask``, ``mask_key``,
``mask_encoding``, ``mask_height_key``, ``mask_width_key``, ``mask_shape``, ``root``: see
:class:`~shardfeed.transforms.decode.ops.DecoderBase`), e.g. TensorFlow's guide layout::

    presets.train(256, key="image_raw", mask_key="mask_raw", mask_encoding="raw",
                  mask_height_key="height", mask_width_key="width")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from shardfeed.transforms.base import Compose, Transform
from shardfeed.transforms.color import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ColorJitter,
    Normalize,
    ToCHW,
    ToFloat,
)
from shardfeed.transforms.decode.crop import DecodeCenterCrop, DecodeRandomResizedCrop
from shardfeed.transforms.decode.device_plan import DevicePlan, PlanTail
from shardfeed.transforms.decode.image import ImageDtype, check_image_dtype
from shardfeed.transforms.decode.masks import Color, MaskDtype
from shardfeed.transforms.decode.ops import FieldOptions
from shardfeed.transforms.decode.orientation import ExifOrientation
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

if TYPE_CHECKING:
    from typing_extensions import Unpack

NormalizeName = Literal["imagenet", "symmetric"]
DType = Literal["uint8", "uint16", "float32"]
Layout = Literal["HWC", "CHW"]
DecodeOn = Literal["cpu", "cuda"]

#: ColorJitter at strength 1: brightness, contrast, saturation, hue.
COLOR_AT_STRENGTH_1 = (0.4, 0.4, 0.4, 0.1)


def _on_device(decode_on: str, *, color: float | None) -> bool:
    """Whether the pipeline decodes on the GPU (``decode_on="cuda"``): then only its CPU half
    is built here (:class:`~shardfeed.transforms.decode.device_plan.DevicePlan`)."""
    if decode_on not in ("cpu", "cuda"):
        raise ValueError(f"decode_on must be 'cpu' or 'cuda', got {decode_on!r}")
    if decode_on == "cuda" and color:
        raise ValueError(
            "colour jitter is not applied on the GPU: pass color=None with decode_on='cuda', "
            "or decode on the CPU (decode_on='cpu')"
        )
    return decode_on == "cuda"


def _check_color(color: float | None, image_dtype: str) -> None:
    """ValueError for a ``color`` strength that is not one, or jitter asked of 16-bit
    images (ColorJitter's tables have 256 levels)."""
    if color is not None and (isinstance(color, bool) or not color >= 0):
        raise ValueError(f"color is a strength >= 0 (1.0 = standard jitter) or None, got {color!r}")
    if color and image_dtype != "uint8":
        raise ValueError(
            f"colour jitter works on uint8 images, and image_dtype={image_dtype!r}: pass "
            "color=None to keep 16-bit samples, or image_dtype='uint8' to jitter colours "
            "(16-bit samples cut to 8 bits)"
        )


def _output_dtype(dtype: DType | None, image_dtype: ImageDtype) -> DType:
    """The output type the presets' ``dtype`` names: the decoded type when None; ValueError
    for an unknown one or an integer type other than ``image_dtype`` (see the module doc)."""
    check_image_dtype(image_dtype)
    if dtype is None:
        return image_dtype
    if dtype not in ("uint8", "uint16", "float32"):
        raise ValueError(f"dtype must be None, 'uint8', 'uint16' or 'float32', got {dtype!r}")
    if dtype != "float32" and dtype != image_dtype:
        raise ValueError(
            f"dtype={dtype!r} contradicts image_dtype={image_dtype!r}: the presets never "
            f"convert between integer types; leave dtype out (it is then {image_dtype!r}), "
            f"pass dtype='float32', or decode to {dtype} with image_dtype={dtype!r}"
        )
    return dtype


def _tail(normalize: NormalizeName | None, dtype: DType, layout: Layout) -> list[Transform]:
    if normalize not in (None, "imagenet", "symmetric"):
        raise ValueError(
            f"normalize must be None, 'imagenet' or 'symmetric', got {normalize!r}"
        )
    if layout not in ("HWC", "CHW"):
        raise ValueError(f"layout must be 'HWC' or 'CHW', got {layout!r}")
    if normalize is not None and dtype != "float32":
        raise ValueError(
            f"normalize={normalize!r} produces floats: pass dtype='float32' (or normalize=None "
            f"to keep {dtype})"
        )
    ops: list[Transform] = []
    if normalize == "imagenet":
        ops.append(Normalize(IMAGENET_MEAN, IMAGENET_STD))
    elif normalize == "symmetric":
        ops.append(Normalize.symmetric())
    elif dtype == "float32":
        ops.append(ToFloat())  # 1/255 for uint8, 1/65535 for uint16: [0, 1] either way
    if layout == "CHW":
        ops.append(ToCHW())
    return ops


def train(
    size: int = 224,
    *,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    flip: bool = True,
    color: float | None = None,
    normalize: NormalizeName | None = None,
    dtype: DType | None = None,
    layout: Layout = "HWC",
    reduced_decode: bool = True,
    fast_upsample: bool = True,
    mask_colors: Mapping[Color, int] | None = None,
    mask_unlisted: int | None = None,
    mask_dtype: MaskDtype = "uint8",
    max_pixels: int = DEFAULT_MAX_PIXELS,
    decode_on: DecodeOn = "cpu",
    image_dtype: ImageDtype = "uint8",
    exif_orientation: ExifOrientation = "ignore",
    **fields: Unpack[FieldOptions],
) -> Compose:
    """Training pipeline: crop-aware decode with random-resized-crop to ``size``, a 50 %
    left-right flip (``flip``), colour jitter at ``color`` strength (1.0 = brightness,
    contrast, saturation 0.4 and hue 0.1), then optional normalisation and layout.

    ``fast_upsample`` (default True here, False in :func:`eval` and the decode ops): JPEG
    chroma is upsampled by replication, merged with the colour conversion, instead of
    libjpeg's smooth filter. Decodes are about 5 % faster; colour edges are slightly blockier
    before the resize (luma is exact). Random crops, flips and jitter change pixels far more,
    so training is the place for it; pass False for pixels identical to a smooth decode.

    Output ``"image"``: ``size×size×3`` (HWC) or ``3×size×size`` (CHW); ``image_dtype``
    (uint8, or uint16: see the module doc for it and ``dtype``), or float32 with
    ``normalize`` (``"imagenet"`` mean/std, ``"symmetric"`` → [-1, 1]) or
    ``dtype="float32"`` (→ [0, 1]). ``"mask"`` (if any): ``size×size`` class ids.

    ``mask_colors`` (``{(r, g, b): id, ...}``), ``mask_unlisted`` and ``mask_dtype``: how
    mask pixels become ids, as in :class:`~shardfeed.transforms.decode.ops.DecoderBase`.
    Without them a palette PNG mask gives its indices, a grey mask its values, and a colour
    or 16-bit mask a DecodeError.

    ``max_pixels``: the most pixels an image may have (read from its header before decoding;
    a larger one is a DecodeError): see
    :class:`~shardfeed.transforms.decode.ops.DecoderBase`.

    ``decode_on="cuda"``: the JPEGs are decoded on the GPU. The pipeline returned is then the
    CPU half (:class:`~shardfeed.transforms.decode.device_plan.DevicePlan`: the same crops
    and flips drawn, the JPEG handed on), and ``shardfeed.torch.adapt(loader,
    device="cuda")`` does the rest (decode, resize, flip, normalise, layout on the GPU;
    images the GPU decoder refuses made on the CPU). Colour jitter stays on the CPU path.

    ``fields``: where the image and mask are, in the decode ops' words (``key="image_raw"``,
    ``mask_key=...``, ``shape=(28, 28, 1)``, ...: see the module doc); left out, they are
    found as :class:`~shardfeed.transforms.decode.ops.DecodeImage` finds them.

    Determinism: every random choice comes from the per-sample generator.

    Raises:
        ValueError: an option out of range or contradicting another (see the module doc).
        TypeError: a keyword that is not an option.
    """
    out_dtype = _output_dtype(dtype, image_dtype)
    _check_color(color, image_dtype)
    tail = _tail(normalize, out_dtype, layout)
    crop = DecodeRandomResizedCrop(
        size, scale=scale, ratio=ratio, hflip=0.5 if flip else 0.0,
        reduced_decode=reduced_decode, fast_upsample=fast_upsample,
        mask_colors=mask_colors, mask_unlisted=mask_unlisted, mask_dtype=mask_dtype,
        max_pixels=max_pixels, image_dtype=image_dtype, exif_orientation=exif_orientation,
        **fields,
    )
    if _on_device(decode_on, color=color):
        return Compose([DevicePlan(crop, tail=PlanTail(normalize, out_dtype, layout))])
    ops: list[Transform] = [crop]
    if color:
        b, c, s, h = (v * color for v in COLOR_AT_STRENGTH_1)
        ops.append(ColorJitter(b, c, s, min(0.5, h)))
    ops.extend(tail)
    return Compose(ops)


def eval(  # the name the API promises (presets.train / presets.eval)
    size: int = 224,
    *,
    crop_fraction: float = 0.875,
    normalize: NormalizeName | None = None,
    dtype: DType | None = None,
    layout: Layout = "HWC",
    reduced_decode: bool = True,
    mask_colors: Mapping[Color, int] | None = None,
    mask_unlisted: int | None = None,
    mask_dtype: MaskDtype = "uint8",
    max_pixels: int = DEFAULT_MAX_PIXELS,
    decode_on: DecodeOn = "cpu",
    image_dtype: ImageDtype = "uint8",
    exif_orientation: ExifOrientation = "ignore",
    **fields: Unpack[FieldOptions],
) -> Compose:
    """Evaluation pipeline: resize the shorter side to ``size / crop_fraction`` and take the
    center ``size×size`` (one fused, reduced-scale decode), then optional normalisation and
    layout. Same output shapes and dtypes as :func:`train`; the mask options,
    ``max_pixels``, ``decode_on``, ``image_dtype``, ``dtype``, ``exif_orientation`` and
    where the image and mask are (``key``, ``mask_key``, ``shape``, ...) as in :func:`train`.

    Determinism: fully deterministic; the generator is not used.

    Raises:
        ValueError: an option out of range or contradicting another (see the module doc).
        TypeError: a keyword that is not an option.
    """
    out_dtype = _output_dtype(dtype, image_dtype)
    tail = _tail(normalize, out_dtype, layout)
    crop = DecodeCenterCrop(
        size, crop_fraction=crop_fraction, reduced_decode=reduced_decode,
        mask_colors=mask_colors, mask_unlisted=mask_unlisted, mask_dtype=mask_dtype,
        max_pixels=max_pixels, image_dtype=image_dtype, exif_orientation=exif_orientation,
        **fields,
    )
    if _on_device(decode_on, color=None):
        return Compose([DevicePlan(crop, tail=PlanTail(normalize, out_dtype, layout))])
    return Compose([crop, *tail])

__all__ = ["COLOR_AT_STRENGTH_1", "eval", "train"]
