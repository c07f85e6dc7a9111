"""Decode and augmentation: ``transform(sample, rng) -> sample`` ops and presets.

- decode: :func:`decode_image`, :class:`DecodeImage`, and the crop-aware
  :class:`DecodeRandomResizedCrop` / :class:`DecodeCenterCrop` (reduced-scale JPEG decode);
- geometry (image, mask and second images together): :class:`RandomResizedCrop`,
  :class:`Resize`, :class:`CenterCrop`, :class:`CropOrPad`, :class:`RandomHorizontalFlip`,
  and for segmentation and detection :class:`RandomCrop`, :class:`RandomVerticalFlip`,
  :class:`RandomRotate90`, :class:`RandomAffine`, :class:`RandomScale` (boxes move with the
  pixels: :class:`BoxFields`);
- boxes stored in records: :class:`ReadBoxes` (TF Object Detection's ``bbox`` lists to
  pixels) and :class:`PadBoxes` (fixed-size rows and a count, for batches);
- colour and values: :class:`ColorJitter`, :class:`Normalize`, :class:`ToFloat`,
  :class:`ToCHW`;
- features: :class:`Gather` (many numeric features into one array, e.g. one label vector);
- the contract: :class:`TransformBase` (every member declared, with its default);
- composition: :class:`Compose`, :func:`as_transform`; ``presets.train`` / ``presets.eval``.
"""

from shardfeed.transforms import presets
from shardfeed.transforms.base import (
    ArraySpec,
    Compose,
    Sample,
    Transform,
    TransformBase,
    bind_transform,
    call_into,
)
from shardfeed.transforms.color import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ColorJitter,
    Normalize,
    ToCHW,
    ToFloat,
)
from shardfeed.transforms.decode.crop import DecodeCenterCrop, DecodeRandomResizedCrop
from shardfeed.transforms.decode.image import decode_image, sniff_format
from shardfeed.transforms.decode.ops import DecodeImage
from shardfeed.transforms.detection import PadBoxes, ReadBoxes
from shardfeed.transforms.gather import Gather
from shardfeed.transforms.geometry import (
    CenterCrop,
    CropOrPad,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from shardfeed.transforms.placement import BoxFields
from shardfeed.transforms.spatial import (
    RandomAffine,
    RandomCrop,
    RandomRotate90,
    RandomScale,
    RandomVerticalFlip,
)
from shardfeed.transforms.wrap import as_transform

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ArraySpec",
    "BoxFields",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CropOrPad",
    "DecodeCenterCrop",
    "DecodeImage",
    "DecodeRandomResizedCrop",
    "Gather",
    "Normalize",
    "PadBoxes",
    "RandomAffine",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomRotate90",
    "RandomScale",
    "RandomVerticalFlip",
    "ReadBoxes",
    "Resize",
    "Sample",
    "ToCHW",
    "ToFloat",
    "Transform",
    "TransformBase",
    "as_transform",
    "bind_transform",
    "call_into",
    "decode_image",
    "presets",
    "sniff_format",
]
