"""How big an encoded image says it is, read from its header before a single pixel is decoded.

A few hundred bytes can claim a 60000×60000 image: a decoder handed them allocates the
pixels first (10 GiB) and fails, or succeeds, afterwards. Every decode in shardfeed therefore
reads the claimed size from the header and refuses an image of more than ``max_pixels``
pixels (:data:`DEFAULT_MAX_PIXELS` unless raised) with a :class:`DecodeError`, whatever scale
it would be decoded at (a progressive JPEG holds its full-size coefficients even for a
1/8-scale decode).

=========  ===============================================================================
format     where the size is read
=========  ===============================================================================
JPEG       the frame header (SOF), through libjpeg-turbo (``simplejpeg``)
PNG        the IHDR chunk
BMP        the DIB header (OS/2 and Windows forms)
GIF        the logical screen and the first image descriptor (the larger of the two)
TIFF       the first IFD (classic and BigTIFF): width, length, tile size; samples of more
           than 16 bits, or more than 4 a pixel, are refused (no loader output has them)
WebP       the VP8, VP8L or VP8X chunk
PNM        the text header of PBM, PGM, PPM (P1–P6) and PAM (P7)
=========  ===============================================================================

Other formats OpenCV might decode (JPEG 2000, OpenEXR, Radiance HDR, AVIF, ...) cannot be
sized here and are refused: convert them to PNG. OpenCV's own limit
(``CV_IO_MAX_IMAGE_PIXELS``, 2^30 by default) still applies above that.

Determinism: a pure function of the bytes. State: none. Memory: none beyond the header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: The default limit on the pixels of one decoded image: 2^27 = 134,217,728 (16384×8192).
#: Above a 100-megapixel medium-format photo (11648×8736) and a 16K×8K panorama; an RGB
#: image of this size is 403 MB decoded, and at most 1.5 GB while it decodes (see
#: :func:`decode_peak_bytes`). Raise it with ``max_pixels=`` where needed.
DEFAULT_MAX_PIXELS = 1 << 27

#: The most memory one decode op holds at once, per pixel of its image, measured as the peak
#: RSS of decoding images of 16, 36 and 134 (the default limit) megapixels: a baseline JPEG
#: takes 3 bytes a pixel (its RGB output), a progressive 4:4:4 JPEG 9 (libjpeg keeps 16-bit
#: coefficients of the whole image), PNG, BMP, TIFF and PPM through OpenCV 6 (it decodes,
#: then copies), WebP 7, GIF 8, a palette TIFF 9, a progressive CMYK JPEG (OpenCV) 11; an
#: image held (3) while its mask decodes: with an 8-bit colour mask 10, a 16-bit grey one 7.
#: (16-bit colour masks, 15 and more, are refused before decoding: see
#: :mod:`shardfeed.transforms.decode.masks`.)
DECODE_PEAK_BYTES_PER_PIXEL = 11

#: What a decode holds beyond that per row and column of its image: libjpeg works in bands
#: of 8 or 16 rows (an image one row high costs as much as a band) and keeps row buffers.
#: Measured: 110 bytes a column for a 1×65000 progressive CMYK JPEG, 72 a row for a 65000×1
#: one, 80 a column at 16384×8192. JPEG sides are at most 65,535 pixels; the other formats
#: stay under 9 bytes a pixel on thin images too (a 1×1,000,000 PNG: 8.8), within the 11.
DECODE_EDGE_BYTES = 128
_MAX_SIDE = 65535  # of a JPEG


def check_max_pixels(value: object) -> int:
    """``value`` as an int >= 1; ValueError/TypeError naming the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_pixels must be an int (pixels of one image), got {value!r}; "
                        f"e.g. max_pixels={DEFAULT_MAX_PIXELS}")
    if value < 1:
        raise ValueError(f"max_pixels must be >= 1, got {value}; e.g. "
                         f"max_pixels={DEFAULT_MAX_PIXELS}")
    return value


def decode_peak_bytes(max_pixels: int, *, sample_bytes: int = 1) -> int:
    """The most memory one decode op holds at once for images (and masks) of up to
    ``max_pixels`` pixels, in bytes: :data:`DECODE_PEAK_BYTES_PER_PIXEL` a pixel, and
    :data:`DECODE_EDGE_BYTES` a row and column: an image of at most ``max_pixels`` pixels
    has at most ``max_pixels + 1`` rows and columns together (one row), and a JPEG, whose
    sides are at most 65,535, at most ``65535 + max_pixels // 65535``.

    ``sample_bytes``: the bytes of one decoded sample, 2 for an op that gives uint16 images
    (``image_dtype="uint16"``): every figure above counts 8-bit samples, and each at most
    doubles when the samples are 16 bits wide. Measured (peak RSS, 16-megapixel images,
    through ``DecodeImage(image_dtype="uint16")``): a 16-bit RGB or grey PNG 12 bytes a
    pixel (8-bit: 6), an 8-bit PNG widened 9, a baseline JPEG widened 9 (3), a progressive
    4:4:4 JPEG 9 (9: its coefficients are freed before the widening)."""
    if sample_bytes < 1:
        raise ValueError(f"sample_bytes must be >= 1, got {sample_bytes}")
    edges = min(max_pixels + 1, _MAX_SIDE + max_pixels // _MAX_SIDE)
    return (max_pixels * DECODE_PEAK_BYTES_PER_PIXEL + edges * DECODE_EDGE_BYTES) * sample_bytes


@dataclass(frozen=True, slots=True)
class ClaimedSize:
    """What a header claims: ``height``, ``width``, and ``pixels`` the decoder allocates
    (more than ``height × width`` when a TIFF's tiles are larger than the image); for PNG,
    TIFF and PNM also ``channels`` and ``bits`` a sample (None where not read)."""

    format: str
    height: int
    width: int
    pixels: int
    channels: int | None = None
    bits: int | None = None

    @property
    def wide_colour(self) -> bool:
        """More than one channel of more than 8 bits (a 16-bit colour image)."""
        return (self.channels or 1) > 1 and (self.bits or 8) > 8


class _Short(Exception):
    """Internal: the header runs past the bytes given."""


class Unsized(Exception):
    """The header does not say the size (damaged or unknown format); the text says why."""


def _unpack(fmt: str, data: bytes | memoryview, offset: int) -> tuple[int, ...]:
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise _Short
    return struct.unpack_from(fmt, data, offset)


def _jpeg(data: bytes | memoryview) -> tuple[int, int]:
    import simplejpeg

    try:
        height, width, _space, _sub = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise Unsized(f"unreadable JPEG header: {exc}") from None
    return int(height), int(width)


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # by colour type


def _png(data: bytes | memoryview) -> ClaimedSize:
    if bytes(data[12:16]) != b"IHDR":
        raise Unsized("damaged PNG: it does not start with its IHDR header chunk")
    width, height, depth, colour_type = _unpack(">IIBB", data, 16)
    return ClaimedSize("png", height, width, height * width,
                       _PNG_CHANNELS.get(colour_type), depth)


def _bmp(data: bytes | memoryview) -> tuple[int, int]:
    (header,) = _unpack("<I", data, 14)
    if header == 12:  # OS/2 BITMAPCOREHEADER: 16-bit dimensions
        width, height = _unpack("<HH", data, 18)
        return height, width
    width, height = _unpack("<ii", data, 18)
    return abs(height), abs(width)  # a negative height is a top-down bitmap


def _gif(data: bytes | memoryview) -> tuple[int, int]:
    screen_w, screen_h, flags = _unpack("<HHB", data, 6)
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    while True:
        (block,) = _unpack("B", data, pos)
        if block == 0x2C:  # image descriptor: left, top, width, height
            left, top, w, h = _unpack("<HHHH", data, pos + 1)
            return max(screen_h, top + h), max(screen_w, left + w)
        if block != 0x21:  # only extensions may come before the first image
            raise Unsized("damaged GIF: no image descriptor after its header")
        pos += 2
        while True:  # the extension's sub-blocks, up to a zero length
            (length,) = _unpack("B", data, pos)
            pos += 1 + length
            if length == 0:
                break


_TIFF_WIDTH, _TIFF_LENGTH, _TIFF_BITS, _TIFF_SAMPLES = 256, 257, 258, 277
_TIFF_TILE_WIDTH, _TIFF_TILE_LENGTH = 322, 323
_TIFF_TYPES = {3: "H", 4: "I", 16: "Q"}  # SHORT, LONG, LONG8: the types these tags use


def _tiff(data: bytes | memoryview) -> ClaimedSize:
    order = "<" if bytes(data[:2]) == b"II" else ">"
    (version,) = _unpack(order + "H", data, 2)
    if version == 43:  # BigTIFF: 8-byte offsets and counts
        (first,) = _unpack(order + "Q", data, 8)
        (count,) = _unpack(order + "Q", data, first)
        entry, start, value_at, count_fmt = 20, first + 8, 12, "Q"
    else:
        (first,) = _unpack(order + "I", data, 4)
        (count,) = _unpack(order + "H", data, first)
        entry, start, value_at, count_fmt = 12, first + 2, 8, "I"
    if count > 4096:
        raise Unsized(f"damaged TIFF: its first directory claims {count} entries")
    tags: dict[int, int] = {}
    bits = 8
    for i in range(count):
        pos = start + i * entry
        tag, kind = _unpack(order + "HH", data, pos)
        (values,) = _unpack(order + count_fmt, data, pos + 4)
        code = _TIFF_TYPES.get(kind)
        if code is None or tag not in (_TIFF_WIDTH, _TIFF_LENGTH, _TIFF_BITS, _TIFF_SAMPLES,
                                       _TIFF_TILE_WIDTH, _TIFF_TILE_LENGTH):
            continue
        inline = struct.calcsize(code) * values <= entry - value_at
        if tag == _TIFF_BITS:  # one value a sample: the widest counts
            where = pos + value_at
            if not inline:
                (where,) = _unpack(order + count_fmt, data, pos + value_at)
            widths = _unpack(f"{order}{min(values, 16)}{code}", data, where)
            bits = max(widths, default=8)
        elif inline:
            (tags[tag],) = _unpack(order + code, data, pos + value_at)
    if _TIFF_WIDTH not in tags or _TIFF_LENGTH not in tags:
        raise Unsized("damaged TIFF: its first directory has no image width or length")
    samples = tags.get(_TIFF_SAMPLES, 1)
    if bits > 16 or samples > 4:
        raise Unsized(f"a TIFF of {samples} samples of {bits} bits a pixel: shardfeed decodes "
                      "images of 8 or 16 bits with 1 to 4 channels (store it as 8- or 16-bit "
                      "PNG)")
    height, width = tags[_TIFF_LENGTH], tags[_TIFF_WIDTH]
    tile = tags.get(_TIFF_TILE_WIDTH, 0) * tags.get(_TIFF_TILE_LENGTH, 0)
    return ClaimedSize("tiff", height, width, max(height * width, tile), samples, bits)


def _webp(data: bytes | memoryview) -> tuple[int, int]:
    chunk = bytes(data[12:16])
    if chunk == b"VP8 ":
        if bytes(data[23:26]) != b"\x9d\x01\x2a":
            raise Unsized("damaged WebP: its VP8 frame has no start code")
        w, h = _unpack("<HH", data, 26)
        return h & 0x3FFF, w & 0x3FFF
    if chunk == b"VP8L":
        signature, bits = _unpack("<BI", data, 20)
        if signature != 0x2F:
            raise Unsized("damaged WebP: its VP8L chunk has no signature")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":
        if len(data) < 30:
            raise _Short
        w = int.from_bytes(bytes(data[24:27]), "little") + 1
        h = int.from_bytes(bytes(data[27:30]), "little") + 1
        return h, w
    raise Unsized(f"damaged WebP: unknown first chunk {chunk!r}")


def _pnm(data: bytes | memoryview) -> ClaimedSize:
    head = bytes(data[:4096])
    kind = head[1:2]
    if kind == b"7":  # PAM: "WIDTH n" / "HEIGHT n" / "DEPTH n" / "MAXVAL n" lines to ENDHDR
        fields: dict[bytes, int] = {}
        for line in head.split(b"\n")[1:]:
            words = line.split()
            if words[:1] == [b"ENDHDR"]:
                break
            if len(words) == 2 and words[1].isdigit():
                fields[words[0]] = int(words[1])
        else:
            raise _Short if len(data) <= len(head) else Unsized("damaged PAM header")
        if b"WIDTH" not in fields or b"HEIGHT" not in fields:
            raise Unsized("damaged PAM: no WIDTH and HEIGHT in its header")
        height, width = fields[b"HEIGHT"], fields[b"WIDTH"]
        return ClaimedSize("pnm", height, width, height * width, fields.get(b"DEPTH"),
                           _bits(fields.get(b"MAXVAL", 255)))
    # P1/P4: width height; the others: width height maxval
    wanted = 2 if kind in b"14" else 3
    tokens: list[int] = []
    for line in head[2:].split(b"\n"):
        for word in line.split(b"#", 1)[0].split():
            if not word.isdigit():
                raise Unsized("damaged PNM: its header is not numbers")
            tokens.append(int(word))
        if len(tokens) >= wanted:
            width, height = tokens[0], tokens[1]
            channels = 3 if kind in b"36" else 1
            bits = 1 if wanted == 2 else _bits(tokens[2])
            return ClaimedSize("pnm", height, width, height * width, channels, bits)
    raise _Short if len(data) <= len(head) else Unsized("damaged PNM header")


def _bits(maxval: int) -> int:
    return max(1, maxval.bit_length())


_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"BM", "bmp"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"II+\x00", "tiff"),
    (b"MM\x00+", "tiff"),
)

SIZED_FORMATS = "JPEG, PNG, BMP, GIF, TIFF, WebP and PNM (PBM, PGM, PPM, PAM)"


def image_format(data: bytes | memoryview) -> str | None:
    """The format whose size :func:`claimed_size` reads (``"jpeg"``, ``"png"``, ...), from
    the magic bytes; None for any other format."""
    head = bytes(data[:16])
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if len(head) >= 3 and head[0:1] == b"P" and head[1:2] in b"1234567" and head[2:3].isspace():
        return "pnm"
    return None


def claimed_size(data: bytes | memoryview) -> ClaimedSize:
    """The size the header of ``data`` claims, without decoding.

    Raises :class:`Unsized` (with the reason) when the format is not one of the module
    table's or its header is damaged or cut short.
    """
    kind = image_format(data)
    if kind is None:
        # the file's own bytes are never quoted: a downloaded record may point anywhere
        raise Unsized(f"not an image format whose size shardfeed can read before decoding "
                      f"(sized formats: {SIZED_FORMATS})")
    try:
        if kind in ("png", "tiff", "pnm"):
            return {"png": _png, "tiff": _tiff, "pnm": _pnm}[kind](data)
        reader = {"jpeg": _jpeg, "bmp": _bmp, "gif": _gif, "webp": _webp}[kind]
        height, width = reader(data)
    except _Short:
        raise Unsized(f"a {kind.upper()} header cut short ({len(data)} bytes)") from None
    return ClaimedSize(kind, height, width, height * width)


def too_large(claim: ClaimedSize, max_pixels: int, *, what: str = "image") -> str | None:
    """The reason to refuse ``claim`` (its pixels exceed ``max_pixels``), or None."""
    if claim.pixels <= max_pixels:
        return None
    size = f"{claim.height}×{claim.width} (height×width)"
    if claim.pixels != claim.height * claim.width:
        size += f" in tiles of {claim.pixels:,} pixels"
    return (f"the {claim.format.upper()} {what} claims {size} = {claim.pixels:,} pixels, more "
            f"than max_pixels={max_pixels:,}; if such images are intended, raise max_pixels "
            "(the decode op's or preset's max_pixels=, Patches(max_pixels=), "
            "`--max-pixels` of verify and pack)")


def pixels_reason(height: int, width: int, max_pixels: int, *, what: str) -> str | None:
    """:func:`too_large` for a size stored beside raw pixels (no header)."""
    claim = ClaimedSize("raw", height, width, height * width)
    return too_large(claim, max_pixels, what=what)


__all__ = [
    "DECODE_EDGE_BYTES",
    "DECODE_PEAK_BYTES_PER_PIXEL",
    "DEFAULT_MAX_PIXELS",
    "SIZED_FORMATS",
    "ClaimedSize",
    "Unsized",
    "check_max_pixels",
    "claimed_size",
    "decode_peak_bytes",
    "image_format",
    "pixels_reason",
    "too_large",
]
