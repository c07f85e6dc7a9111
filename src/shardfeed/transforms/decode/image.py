"""Decode encoded images (JPEG, PNG, and whatever else OpenCV reads) into NumPy arrays.

JPEG goes through simplejpeg (libjpeg-turbo; releases the GIL, decodes at reduced DCT scale,
writes into a caller's buffer); PNG and the other formats of
:mod:`shardfeed.transforms.decode.sizes` through ``cv2.imdecode`` (also releases the GIL). The
format is sniffed from the magic bytes, never trusted from a feature.

Size limit: before any pixel is decoded, the size the header claims is read and an image of
more than ``max_pixels`` pixels (default :data:`DEFAULT_MAX_PIXELS`) is refused with a
DecodeError naming it, as is a format whose size cannot be read. A decode that runs out of
memory all the same raises DecodeError too (never a bare MemoryError).

Bit depth: ``dtype=None`` (the default) gives what the decoder gives: uint8 for ``mode="rgb"``
and ``"gray"``, the stored depth for ``"unchanged"``. OpenCV cuts a 16-bit image to 8 bits
by format: a PNG (or PNM) keeps the high byte of each sample, ``v >> 8`` (as TensorFlow's
``decode_png(dtype=tf.uint8)``), a TIFF gives ``round(v / 257)``. ``dtype="uint16"`` gives
every image as uint16: a 16-bit image keeps its samples exactly, an 8-bit one is widened by
:func:`widen_to_uint16` (``v × 257``: 255 becomes 65535, the top of a 16-bit file's scale).
``dtype="uint8"`` gives every image as uint8 (with ``"unchanged"``, the high byte of 16-bit
samples, whatever the format).

Determinism: decoding is a pure function of the bytes (for one libjpeg-turbo build). State:
none, except a per-thread scratch buffer used by :func:`decode_jpeg_scratch`. Memory: the
decoded image, at most :func:`~shardfeed.transforms.decode.sizes.decode_peak_bytes` while it decodes;
the scratch buffer a thread keeps is at most :data:`SCRATCH_KEEP_BYTES` (a larger decode
gets a buffer of its own, freed with the image).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Literal, TypeAlias

import cv2
import numpy as np
import simplejpeg

from shardfeed.errors import DecodeError
from shardfeed.transforms.decode.orientation import (
    ExifOrientation,
    check_exif_orientation,
    orient,
    orientation_of,
)
from shardfeed.transforms.decode.sizes import (
    DEFAULT_MAX_PIXELS,
    ClaimedSize,
    Unsized,
    claimed_size,
    too_large,
)

Mode = Literal["rgb", "gray", "unchanged"]
MODES: tuple[str, ...] = ("rgb", "gray", "unchanged")

ImageDtype = Literal["uint8", "uint16"]
IMAGE_DTYPES: tuple[str, ...] = ("uint8", "uint16")

#: What an 8-bit sample is multiplied by to become a 16-bit one of the same brightness: the
#: byte repeated (``v << 8 | v``), so 0 stays 0 and 255 becomes 65535.
WIDEN_FACTOR = 257

Where: TypeAlias = "str | Callable[[], str]"
"""The place of an image for error messages: text, or a function that builds it (called only
when an error is raised: building the text costs more than decoding a small image)."""

_JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
"""The first 8 bytes of every PNG."""

# libjpeg colour spaces that libjpeg-turbo cannot convert to RGB; OpenCV handles them.
CMYK_SPACES = ("CMYK", "YCCK")


def sniff_format(data: bytes | memoryview) -> str:
    """Name the image format from its first bytes: ``"jpeg"``, ``"png"`` or ``"other"``."""
    head = bytes(data[:8])
    if head.startswith(_JPEG_MAGIC):
        return "jpeg"
    if head == PNG_MAGIC:
        return "png"
    return "other"


def check_mode(mode: str) -> None:
    """Raise ValueError unless ``mode`` is one of ``rgb``, ``gray``, ``unchanged``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def check_image_dtype(dtype: str) -> None:
    """Raise ValueError unless ``dtype`` is ``"uint8"`` or ``"uint16"``."""
    if dtype not in IMAGE_DTYPES:
        raise ValueError(
            f"image_dtype must be one of {IMAGE_DTYPES}, got {dtype!r}: 'uint8' (16-bit images "
            "cut to 8 bits) or 'uint16' (16-bit images kept, 8-bit ones widened ×257)"
        )


def widen_to_uint16(image: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """8-bit samples as 16-bit ones of the same brightness: ``v × 257`` (0 → 0, 255 → 65535),
    as TensorFlow's ``decode_png(dtype=tf.uint16)`` widens an 8-bit PNG. Into ``out`` (a
    uint16 array of ``image``'s shape) when given, else into a new array."""
    target = np.empty(image.shape, np.uint16) if out is None else out
    np.multiply(image, np.uint16(WIDEN_FACTOR), out=target)
    return target


def where_text(where: Where) -> str:
    """``where`` as text (calling it when it is a function)."""
    return where if isinstance(where, str) else where()


def _describe(where: Where) -> str:
    text = where_text(where)
    return f" ({text})" if text else ""


_KINDS = {"jpeg": "JPEG", "png": "PNG", "other": "neither JPEG nor PNG"}


def decode_error(data: bytes | memoryview, where: Where, reason: str) -> DecodeError:
    """Build the DecodeError every decode path raises: place, reason, size, the fix.

    The message says what the bytes look like (JPEG, PNG, neither) but never quotes them: a
    referenced image may be any file a dataset points at, and its content is not for logs.
    """
    kind = _KINDS[sniff_format(data)] if len(data) else "empty"
    return DecodeError(
        f"cannot decode image{_describe(where)}: {reason} "
        f"[{len(data)} bytes, {kind}]. "
        "The record holds a damaged or unsupported image: re-encode it as JPEG or PNG, or drop "
        "the record; `shardfeed verify --decode` lists every bad record, and "
        "on_error='skip' lets a loader replace such samples."
    )


def too_large_error(where: Where, reason: str, nbytes: int) -> DecodeError:
    """The DecodeError of an image larger than ``max_pixels`` (``reason`` from
    :func:`~shardfeed.transforms.decode.sizes.too_large`): place, claimed size, the fix."""
    return DecodeError(
        f"refusing to decode image{_describe(where)} [{nbytes} bytes]: {reason}. Otherwise "
        "drop the record: `shardfeed verify --decode` lists every such record, and "
        "on_error='skip' lets a loader replace such samples."
    )


def out_of_memory(data: bytes | memoryview, where: Where, what: str) -> DecodeError:
    """The DecodeError of a decode that ran out of memory (``what``: the size it needed)."""
    return decode_error(data, where, f"out of memory while decoding {what}; lower num_threads "
                        "or max_pixels, or free memory")


def check_size(
    data: bytes | memoryview, *, max_pixels: int, where: Where, what: str = "image"
) -> ClaimedSize:
    """The size the header of ``data`` claims, after checking it against ``max_pixels``.

    Raises DecodeError (naming ``where``) for an image of more pixels than ``max_pixels``,
    a damaged header, or a format whose size cannot be read (see
    :mod:`shardfeed.transforms.decode.sizes`).
    """
    try:
        claim = claimed_size(data)
    except Unsized as exc:
        raise decode_error(data, where, str(exc)) from None
    reason = too_large(claim, max_pixels, what=what)
    if reason is not None:
        raise too_large_error(where, reason, len(data))
    return claim


def _as_uint8(data: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


# OpenCV turns an image as its EXIF tag says unless told not to (IMREAD_UNCHANGED never
# turns): the tag is applied, or not, in one place for every decoder (see orientation).
NO_TURN = cv2.IMREAD_IGNORE_ORIENTATION
_CV2_FLAGS = {
    "rgb": cv2.IMREAD_COLOR | NO_TURN,
    "gray": cv2.IMREAD_GRAYSCALE | NO_TURN,
    "unchanged": cv2.IMREAD_UNCHANGED,
}
# OpenCV >= 4.10 decodes PNG straight to RGB: the same pixels as BGR + a channel swap, one
# array and one call less (on small images the call costs as much as the decode).
_RGB_FLAG: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)
PNG_RGB_FLAG: int | None = None if _RGB_FLAG is None else _RGB_FLAG | NO_TURN


def _decode_cv2(data: bytes | memoryview, mode: str, where: Where, *,
                deep: bool = False) -> np.ndarray:
    """OpenCV's decode in RGB order; ``deep``: 16-bit samples kept (``IMREAD_ANYDEPTH``)."""
    buf = _as_uint8(data)
    if buf.size == 0:
        raise decode_error(data, where, "the image is empty (0 bytes)")
    flags = _CV2_FLAGS[mode]
    rgb_direct = mode == "rgb" and PNG_RGB_FLAG is not None and bytes(data[:8]) == PNG_MAGIC
    if rgb_direct and PNG_RGB_FLAG is not None:
        flags = PNG_RGB_FLAG
    if deep and mode != "unchanged":
        flags |= cv2.IMREAD_ANYDEPTH
    try:
        image = cv2.imdecode(buf, flags)
    except cv2.error as exc:  # OpenCV raises for some malformed inputs instead of returning None
        raise decode_error(data, where, f"OpenCV failed: {exc}") from None
    except MemoryError:
        raise out_of_memory(data, where, "the image") from None
    if image is None:
        kind = sniff_format(data)
        reason = "not a format OpenCV can read" if kind == "other" else f"damaged {kind.upper()}"
        raise decode_error(data, where, reason)
    try:
        if image.ndim == 3:
            if image.shape[2] == 3:
                if not rgb_direct:
                    image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
            elif image.shape[2] == 4:
                image = cv2.cvtColor(image, cv2.COLOR_BGRA2RGBA)
    except (cv2.error, MemoryError):  # the only way a channel swap fails: no memory for it
        raise out_of_memory(data, where, f"the {image.shape} image") from None
    if image.flags.c_contiguous:
        return image
    return np.ascontiguousarray(image)


def _jpeg_colorspace(mode: str, header_space: str) -> str:
    if mode == "gray" or (mode == "unchanged" and header_space == "Gray"):
        return "GRAY"
    return "RGB"


def check_pixels(
    height: int, width: int, *, max_pixels: int, where: Where, nbytes: int, fmt: str = "jpeg",
    what: str = "image",
) -> None:
    """DecodeError when a ``height``×``width`` image (from its header) exceeds ``max_pixels``."""
    if height * width > max_pixels:
        claim = ClaimedSize(fmt, height, width, height * width)
        raise too_large_error(where, too_large(claim, max_pixels, what=what) or "", nbytes)


def jpeg_header(data: bytes | memoryview, *, where: Where = "") -> tuple[int, int, str]:
    """Read a JPEG's ``(height, width, colorspace)`` without decoding pixels.

    Raises DecodeError (with ``where``) when the header is unreadable.
    """
    try:
        height, width, space, _sub = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise decode_error(data, where, f"unreadable JPEG header: {exc}") from None
    return int(height), int(width), str(space)


def decode_image(
    data: bytes | memoryview,
    *,
    mode: Mode = "rgb",
    where: Where = "",
    fast_dct: bool = True,
    fast_upsample: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    dtype: ImageDtype | None = None,
    exif_orientation: ExifOrientation = "ignore",
) -> np.ndarray:
    """Decode one encoded image into a new array (uint8 unless ``dtype`` says otherwise).

    ``mode="rgb"`` gives H×W×3, ``"gray"`` gives H×W, ``"unchanged"`` keeps the stored
    channels (H×W for single-channel images, H×W×3 RGB, H×W×4 RGBA; 16-bit PNGs stay
    uint16). The format comes from the magic bytes: JPEG via simplejpeg, anything else via
    OpenCV (converted from BGR to RGB). ``where`` names the record in error messages, e.g.
    ``"file 'x.tfrecord', record 5 at byte 1234"`` (or a function returning that text, called
    only when an error is raised).

    ``dtype``: the bit depth of the result (see the module docstring). None: uint8 for
    ``"rgb"``/``"gray"`` (a 16-bit PNG's samples cut to their high byte, ``v >> 8``; a TIFF's
    rounded, ``round(v / 257)``), the stored depth for ``"unchanged"``. ``"uint16"``: 16-bit
    samples kept exactly, 8-bit ones (every JPEG) widened ``v × 257``. ``"uint8"``: as None
    for ``"rgb"``/``"gray"``; for ``"unchanged"``, the high byte of 16-bit samples. A uint16
    result takes twice the memory of a uint8 one.

    ``exif_orientation``: ``"ignore"`` (default) gives the stored pixels whatever a JPEG's
    EXIF Orientation tag says, as ``tf.io.decode_jpeg`` and torchvision's ``decode_jpeg``
    do; ``"apply"`` turns a tagged JPEG as the tag says (orientations 5-8 swap height and
    width), as Pillow's ``ImageOps.exif_transpose`` shows it. Other formats are decoded as
    stored either way. See :mod:`shardfeed.transforms.decode.orientation`.

    ``fast_dct=True`` uses libjpeg's fast integer IDCT: a few percent faster and the same
    method ``tf.io.decode_jpeg`` uses by default, so JPEG pixels match tf.data's; ``False``
    uses the accurate integer IDCT. The two differ by about one level on average (at most
    2.5). The largest differences (measured on scikit-image's bundled images, encoded at
    quality 75 to 100): at most 8 levels on photos saved at quality 90 or less, up to 36 on
    photos saved at 95-100 (up to 10 % of pixels 4 or more apart), and on synthetic
    black-and-white edges at quality 95 or more the fast IDCT overflows: pixels up to 255
    levels off. Pass ``False`` for such images, or where pixels must not depend on it.

    ``fast_upsample=True`` upsamples subsampled chroma (4:2:0, 4:2:2) by pixel replication
    merged with the colour conversion instead of libjpeg's smooth ("fancy") filter: about 5 %
    faster, with slightly blockier colour edges; luma is unchanged. Default False, as
    ``tf.io.decode_jpeg`` (``fancy_upscaling=True``).

    ``max_pixels``: an image whose header claims more pixels is refused before decoding
    (see the module docstring), as is a format whose size cannot be read from its header.

    Raises DecodeError for bytes that do not decode (including truncated JPEGs); ValueError
    for a ``mode``, ``dtype`` or ``exif_orientation`` that is not one of those above.
    """
    check_mode(mode)
    if dtype is not None:
        check_image_dtype(dtype)
    check_exif_orientation(exif_orientation)
    image = _decode_natural(data, mode=mode, where=where, fast_dct=fast_dct,
                            fast_upsample=fast_upsample, max_pixels=max_pixels,
                            deep=dtype == "uint16")
    turn = orientation_of(data, exif_orientation)
    if turn != 1:
        try:
            image = orient(image, turn)
        except (cv2.error, MemoryError):
            raise out_of_memory(data, where, f"the {image.shape} image turned") from None
    return to_image_dtype(image, dtype, data=data, where=where)


def to_image_dtype(image: np.ndarray, dtype: ImageDtype | None, *,
                   data: bytes | memoryview = b"", where: Where = "") -> np.ndarray:
    """A decoded ``image`` at bit depth ``dtype`` (see :func:`decode_image`): 8-bit samples
    widened ×257 for ``"uint16"``, 16-bit ones cut to their high byte for ``"uint8"``; the
    image itself when it has that depth already, or ``dtype`` is None. DecodeError for any
    other depth (``data`` and ``where`` name the image) or no memory for the new array."""
    if dtype is None or image.dtype == np.dtype(dtype):
        return image
    try:
        if dtype == "uint16" and image.dtype == np.uint8:
            return widen_to_uint16(image)
        if dtype == "uint8" and image.dtype == np.uint16:
            high: np.ndarray = np.right_shift(image, 8).astype(np.uint8)
            return high
    except MemoryError:
        raise out_of_memory(data, where, f"the {image.shape} {dtype} image") from None
    raise decode_error(data, where, f"{image.dtype} samples cannot be given as {dtype}; "
                       "store 8- or 16-bit images")


def _decode_natural(
    data: bytes | memoryview, *, mode: str, where: Where, fast_dct: bool,
    fast_upsample: bool, max_pixels: int, deep: bool,
) -> np.ndarray:
    """:func:`decode_image` at the decoder's own depth (``deep``: 16 bits kept by OpenCV)."""
    if sniff_format(data) != "jpeg":
        check_size(data, max_pixels=max_pixels, where=where)
        return _decode_cv2(data, mode, where, deep=deep)
    height, width, space = jpeg_header(data, where=where)
    check_pixels(height, width, max_pixels=max_pixels, where=where, nbytes=len(data))
    if space in CMYK_SPACES:
        return _decode_cv2(data, mode, where, deep=deep)
    colorspace = _jpeg_colorspace(mode, space)
    try:
        image: np.ndarray = simplejpeg.decode_jpeg(
            data, colorspace=colorspace, fastdct=fast_dct, fastupsample=fast_upsample
        )
    except ValueError as exc:
        raise decode_error(data, where, f"damaged JPEG: {exc}") from None
    except MemoryError:
        raise out_of_memory(data, where, f"a {height}×{width} JPEG") from None
    if colorspace == "GRAY":
        image = image.reshape(image.shape[0], image.shape[1])
    return image


def decode_jpeg_reduced(
    data: bytes | memoryview, *, height: int, width: int, denominator: int, where: Where
) -> np.ndarray:
    """Decode an RGB JPEG (``height``×``width`` from its header, already checked against
    ``max_pixels``) at scale ``1/denominator`` (libjpeg-turbo DCT scaling) into a new array.

    The caller handles :data:`CMYK_SPACES` (libjpeg-turbo cannot convert them to RGB).
    Raises DecodeError for bytes that do not decode or a decode that runs out of memory.
    """
    try:
        if denominator == 1:
            image: np.ndarray = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True)
        else:
            image = simplejpeg.decode_jpeg(
                data, colorspace="RGB", fastdct=True,
                min_height=math.ceil(height / denominator),
                min_width=math.ceil(width / denominator),
            )
    except ValueError as exc:
        raise decode_error(data, where, f"damaged JPEG: {exc}") from None
    except MemoryError:
        raise out_of_memory(data, where, "the JPEG") from None
    return image


# --- reduced-scale JPEG decode into a per-thread scratch buffer ---------------------------

_scratch = threading.local()

#: The largest scratch buffer a thread keeps between decodes: 16 MiB, a 2560×2160 RGB image
#: at full scale (or a 20-megapixel one at 1/2). Larger decodes get a buffer of their own,
#: freed with the image, so a thread that met one huge image does not hold it for good.
SCRATCH_KEEP_BYTES = 16 << 20


def scratch_buffer(nbytes: int) -> np.ndarray:
    """A per-thread reusable uint8 buffer of at least ``nbytes`` (grown up to
    :data:`SCRATCH_KEEP_BYTES`, never shrunk; larger requests get a new buffer, not kept).

    Arrays that view it are valid only until the same thread asks for scratch again.
    """
    buf: np.ndarray | None = getattr(_scratch, "buf", None)
    if buf is None or buf.size < nbytes:
        if nbytes > SCRATCH_KEEP_BYTES:
            return np.empty(nbytes, dtype=np.uint8)
        # Grow with headroom so a stream of slightly larger images does not reallocate often.
        buf = np.empty(min(SCRATCH_KEEP_BYTES, max(nbytes, int(nbytes * 1.25))), dtype=np.uint8)
        _scratch.buf = buf
    return buf


def decode_jpeg_scratch(
    data: bytes | memoryview,
    *,
    height: int,
    width: int,
    denominator: int = 1,
    mode: Literal["rgb", "gray"] = "rgb",
    where: Where = "",
    fast_dct: bool = True,
    fast_upsample: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Decode a JPEG at scale ``1/denominator`` into this thread's scratch buffer.

    ``height``/``width`` are the full-size dimensions from :func:`jpeg_header`. Returns an
    H'×W'×C view of the scratch buffer (C = 3 for rgb, 1 for gray) with
    ``H' = ceil(height / denominator)``; it is overwritten by the next call on this thread,
    so copy or resize out of it before decoding again. ``fast_dct`` / ``fast_upsample``: see
    :func:`decode_image`. ``max_pixels`` bounds the full-size image, whatever the scale.
    Raises DecodeError.
    """
    check_pixels(height, width, max_pixels=max_pixels, where=where, nbytes=len(data))
    out_h = math.ceil(height / denominator)
    out_w = math.ceil(width / denominator)
    channels = 1 if mode == "gray" else 3
    try:
        buf = scratch_buffer(out_h * out_w * channels)
    except MemoryError:
        raise out_of_memory(data, where, f"a {out_h}×{out_w} JPEG") from None
    kwargs: dict[str, int] = {}
    if denominator > 1:
        kwargs = {"min_height": out_h, "min_width": out_w}
    try:
        image: np.ndarray = simplejpeg.decode_jpeg(
            data,
            colorspace="GRAY" if mode == "gray" else "RGB",
            fastdct=fast_dct,
            fastupsample=fast_upsample,
            buffer=buf,
            **kwargs,
        )
    except ValueError as exc:
        raise decode_error(data, where, f"damaged JPEG: {exc}") from None
    except MemoryError:
        raise out_of_memory(data, where, f"a {height}×{width} JPEG") from None
    return image


__all__ = [
    "CMYK_SPACES",
    "DEFAULT_MAX_PIXELS",
    "IMAGE_DTYPES",
    "MODES",
    "NO_TURN",
    "SCRATCH_KEEP_BYTES",
    "WIDEN_FACTOR",
    "ImageDtype",
    "Mode",
    "Where",
    "check_image_dtype",
    "check_mode",
    "check_pixels",
    "check_size",
    "decode_error",
    "decode_image",
    "decode_jpeg_reduced",
    "decode_jpeg_scratch",
    "jpeg_header",
    "out_of_memory",
    "scratch_buffer",
    "sniff_format",
    "to_image_dtype",
    "too_large_error",
    "where_text",
    "widen_to_uint16",
]
