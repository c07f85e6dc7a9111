"""Everything that turns stored bytes into pixels, in one package.

=================  ==========================================================================
module             what it does
=================  ==========================================================================
``sizes``          the size an encoded image claims (read from its header), ``max_pixels``
``orientation``    the EXIF orientation policy of every path (ignored unless applied)
``image``          bytes → pixels: :func:`decode_image`, reduced-scale JPEG decode, scratch
``masks``          mask bytes → class ids (grey values, palette indices, colours)
``mask_labels``    how a decoded mask's pixels become class ids (:class:`MaskLabels`)
``fields``         where a sample's image (or mask) is: embedded, raw or referenced
``ops``            the decode op :class:`DecodeImage` and the base of every decode op
``crop``           decode + crop + resize fused: :class:`DecodeRandomResizedCrop`,
                   :class:`DecodeCenterCrop`
``patches``        a record decoded once for :class:`~shardfeed.pipeline.patches.Patches`
=================  ==========================================================================

A new decode backend (another codec, a GPU decoder) belongs here, beside ``image``; a new
decode op derives from :class:`~shardfeed.transforms.decode.ops.DecoderBase`.
"""

from shardfeed.transforms.decode.crop import DecodeCenterCrop, DecodeRandomResizedCrop
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.image import (
    DEFAULT_MAX_PIXELS,
    MODES,
    SCRATCH_KEEP_BYTES,
    Mode,
    Where,
    check_size,
    decode_image,
    decode_jpeg_reduced,
    decode_jpeg_scratch,
    jpeg_header,
    sniff_format,
)
from shardfeed.transforms.decode.masks import MaskLabels, decode_mask, read_mask
from shardfeed.transforms.decode.ops import DecodeImage, DecoderBase
from shardfeed.transforms.decode.orientation import EXIF_ORIENTATIONS, ExifOrientation
from shardfeed.transforms.decode.patches import DecodedImage, decode_for_patches

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "EXIF_ORIENTATIONS",
    "MODES",
    "SCRATCH_KEEP_BYTES",
    "DecodeCenterCrop",
    "DecodeImage",
    "DecodeRandomResizedCrop",
    "DecodedImage",
    "DecoderBase",
    "ExifOrientation",
    "ImageField",
    "MaskLabels",
    "Mode",
    "Where",
    "check_size",
    "decode_for_patches",
    "decode_image",
    "decode_jpeg_reduced",
    "decode_jpeg_scratch",
    "decode_mask",
    "jpeg_header",
    "read_mask",
    "sniff_format",
]
