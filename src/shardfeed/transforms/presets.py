"""Ready-made pipelines: ``train`` (random augmentation) and ``eval`` (deterministic).

Both return a :class:`~shardfeed.transforms.base.Compose` whose output ``"image"`` has a
fixed shape, so the loader can batch it:

============  =====================================  =========================
layout        shape                                  dtype
============  =====================================  =========================
``"HWC"``     ``size × size × 3``                    uint8, or float32 when
``"CHW"``     ``3 × size × size``                    ``normalize`` or ``dtype``
============  =====================================  =========================

With a mask in the dataset, ``"mask"`` is ``size × size`` class ids (same crop and flip,
nearest neighbour): uint8 grey values or palette indices; ``mask_colors`` maps the colours
of colour masks to ids, ``mask_dtype="uint16"`` keeps 16-bit masks (see
:mod:`shardfeed.transforms.decode.masks`). ``pipeline.bind(schema, root=...).output_spec()`` gives these as
``ArraySpec`` objects for preallocating batch arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

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
from shardfeed.transforms.decode.masks import Color, MaskDtype
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

NormalizeName = Literal["imagenet", "symmetric"]
DType = Literal["uint8", "float32"]
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


def _tail(normalize: NormalizeName | None, dtype: DType, layout: Layout) -> list[Transform]:
    if normalize not in (None, "imagenet", "symmetric"):
        raise ValueError(
            f"normalize must be None, 'imagenet' or 'symmetric', got {normalize!r}"
        )
    if dtype not in ("uint8", "float32"):
        raise ValueError(f"dtype must be 'uint8' or 'float32', got {dtype!r}")
    if layout not in ("HWC", "CHW"):
        raise ValueError(f"layout must be 'HWC' or 'CHW', got {layout!r}")
    if normalize is not None and dtype == "uint8":
        raise ValueError(
            f"normalize={normalize!r} produces floats: pass dtype='float32' (or normalize=None "
            "to keep uint8)"
        )
    ops: list[Transform] = []
    if normalize == "imagenet":
        ops.append(Normalize(IMAGENET_MEAN, IMAGENET_STD))
    elif normalize == "symmetric":
        ops.append(Normalize.symmetric())
    elif dtype == "float32":
        ops.append(ToFloat())
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
    dtype: DType = "uint8",
    layout: Layout = "HWC",
    reduced_decode: bool = True,
    fast_upsample: bool = True,
    mask_colors: Mapping[Color, int] | None = None,
    mask_unlisted: int | None = None,
    mask_dtype: MaskDtype = "uint8",
    max_pixels: int = DEFAULT_MAX_PIXELS,
    decode_on: DecodeOn = "cpu",
) -> Compose:
    """Training pipeline: crop-aware decode with random-resized-crop to ``size``, a 50 %
    left-right flip (``flip``), colour jitter at ``color`` strength (1.0 = brightness,
    contrast, saturation 0.4 and hue 0.1), then optional normalisation and layout.

    ``fast_upsample`` (default True here, False in :func:`eval` and the decode ops): JPEG
    chroma is upsampled by replication, merged with the colour conversion, instead of
    libjpeg's smooth filter. Decodes are about 5 % faster; colour edges are slightly blockier
    before the resize (luma is exact). Random crops, flips and jitter change pixels far more,
    so training is the place for it; pass False for pixels identical to a smooth decode.

    Output ``"image"``: ``size×size×3`` (HWC) or ``3×size×size`` (CHW); uint8, or float32
    with ``normalize`` (``"imagenet"`` mean/std, ``"symmetric"`` → [-1, 1]) or
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

    Determinism: every random choice comes from the per-sample generator.
    """
    if color is not None and (isinstance(color, bool) or not color >= 0):
        raise ValueError(f"color is a strength >= 0 (1.0 = standard jitter) or None, got {color!r}")
    tail = _tail(normalize, dtype, layout)
    crop = DecodeRandomResizedCrop(
        size, scale=scale, ratio=ratio, hflip=0.5 if flip else 0.0,
        reduced_decode=reduced_decode, fast_upsample=fast_upsample,
        mask_colors=mask_colors, mask_unlisted=mask_unlisted, mask_dtype=mask_dtype,
        max_pixels=max_pixels,
    )
    if _on_device(decode_on, color=color):
        return Compose([DevicePlan(crop, tail=PlanTail(normalize, dtype, layout))])
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
    dtype: DType = "uint8",
    layout: Layout = "HWC",
    reduced_decode: bool = True,
    mask_colors: Mapping[Color, int] | None = None,
    mask_unlisted: int | None = None,
    mask_dtype: MaskDtype = "uint8",
    max_pixels: int = DEFAULT_MAX_PIXELS,
    decode_on: DecodeOn = "cpu",
) -> Compose:
    """Evaluation pipeline: resize the shorter side to ``size / crop_fraction`` and take the
    center ``size×size`` (one fused, reduced-scale decode), then optional normalisation and
    layout. Same output shapes and dtypes as :func:`train`; the mask options,
    ``max_pixels`` and ``decode_on`` as in :func:`train`.

    Determinism: fully deterministic; the generator is not used.
    """
    tail = _tail(normalize, dtype, layout)
    crop = DecodeCenterCrop(
        size, crop_fraction=crop_fraction, reduced_decode=reduced_decode,
        mask_colors=mask_colors, mask_unlisted=mask_unlisted, mask_dtype=mask_dtype,
        max_pixels=max_pixels,
    )
    if _on_device(decode_on, color=None):
        return Compose([DevicePlan(crop, tail=PlanTail(normalize, dtype, layout))])
    return Compose([crop, *tail])

__all__ = ["COLOR_AT_STRENGTH_1", "eval", "train"]
