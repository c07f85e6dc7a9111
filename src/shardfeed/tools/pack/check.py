"""Checking every input file of ``pack`` before a single shard is written.

``pack`` first checks all images (and masks) in parallel, then either stops with every bad
file listed (:class:`BadInputsError`, nothing written) or, with ``skip_bad``, packs the rest.
Two levels:

=============  ==========================================================================
header         (default, cheap) the file exists, is not empty, is an image (magic bytes),
               its header gives a size; a JPEG ends with its end-of-image marker (FF D9:
               found from the tail, or by walking the segments when data follows it) and a
               PNG has its IEND chunk, so a truncated file is caught without decoding it.
               Formats other than JPEG and PNG (BMP, GIF, TIFF, WebP, PPM) are decoded: that
               is their header check. A mask must have its image's height and width, as
               stored or as shown (a JPEG's EXIF orientation 5-8 swaps them; a loader
               with ``exif_orientation="apply"`` decodes it so).
decode         (``check_decode``) every JPEG and PNG is fully decoded as well: catches
               damaged image data inside a complete file, at the cost of a decode a file.
=============  ==========================================================================

Determinism: the problems are listed in input order whatever the number of workers.
Memory: the head (256 KiB) and tail of a file at a time per worker; a whole file only
for a full decode, a non-JPEG/PNG format, or a JPEG with data after its end marker.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from shardfeed.errors import DecodeError, PackError
from shardfeed.tools.pack.items import PackItem
from shardfeed.tools.pack.record import image_format
from shardfeed.transforms.decode.sizes import (
    DEFAULT_MAX_PIXELS,
    ClaimedSize,
    Unsized,
    claimed_size,
    too_large,
)

CheckLevel = Literal["header", "decode"]

HEAD_BYTES = 256 << 10
_TAIL_BYTES = 64
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_PNG_CHUNK = struct.Struct(">I4s")
# In entropy-coded JPEG data a 0xFF byte is followed by 0x00 (stuffing), 0xD0-0xD7 (restart
# markers) or more 0xFF (fill): anything else after a run of 0xFF is the next marker.
_JPEG_MARKER = re.compile(rb"\xff+[^\x00\xd0-\xd7\xff]")


@dataclass(frozen=True, slots=True)
class BadInput:
    """One input file that cannot be packed: ``path``, the ``problem``, and the CSV ``line``
    that names it (None for folder input)."""

    path: str
    problem: str
    line: int | None = None

    def text(self) -> str:
        place = f"line {self.line}: " if self.line is not None else ""
        return f"{place}'{self.path}' {self.problem}"


class BadInputsError(PackError):
    """Some input files cannot be packed; ``problems`` lists every one (in input order).

    Raised before anything is written."""

    def __init__(self, problems: Sequence[BadInput], *, where: str, hint: str = "") -> None:
        self.problems = tuple(problems)
        count = len(self.problems)
        shown = "; ".join(p.text() for p in self.problems[:3])
        more = f"; and {count - 3} more" if count > 3 else ""
        noun = "file" if count == 1 else "files"
        super().__init__(
            f"{count} input {noun} of '{where}' cannot be packed ({shown}{more}); nothing was "
            f"written. Fix or remove {'it' if count == 1 else 'them'}{hint}, or pass "
            "--skip-bad (skip_bad=True) to pack the rest and list what was skipped"
        )


class _Problem(Exception):
    """Internal: what is wrong with one file, as the text of a :class:`BadInput`."""


class _Probe:
    """The head and tail of a file, and the whole file when a check needs it."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            if self.size <= 2 * HEAD_BYTES:
                self.head = f.read()
                self._whole: bytes | None = self.head
            else:
                self.head = f.read(HEAD_BYTES)
                self._whole = None
            f.seek(max(0, self.size - _TAIL_BYTES))
            self.tail = f.read()

    def whole(self) -> bytes:
        if self._whole is None:
            with open(self.path, "rb") as f:
                self._whole = f.read()
        return self._whole


def _reason(exc: DecodeError) -> str:
    """The reason part of a decode error (``cannot decode image: REASON [n bytes ...]``)."""
    text = str(exc)
    text = text.split(": ", 1)[1] if ": " in text else text
    return text.split(" [", 1)[0]


def jpeg_end(data: bytes) -> int | None:
    """The offset just past the JPEG's end-of-image marker, or None when it has none.

    Walks the marker segments by their lengths (so an EXIF thumbnail's own end marker inside
    APP1 does not count) and jumps over entropy-coded data to the next real marker."""
    pos, n = 2, len(data)
    while pos + 2 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker == 0xD9:
            return pos + 2
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 2
            continue
        if pos + 4 > n:
            return None
        end = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == 0xDA:  # start of scan: entropy-coded data up to the next marker
            found = _JPEG_MARKER.search(data, end)
            if found is None:
                return None
            pos = found.end() - 2
            continue
        pos = end
    return None


def png_complete(data: bytes) -> bool:
    """True when the PNG's chunks run, whole, up to an IEND chunk."""
    pos, n = 8, len(data)
    while pos + 12 <= n:
        length, kind = _PNG_CHUNK.unpack_from(data, pos)
        pos += 12 + int(length)
        if kind == b"IEND":
            return bool(pos <= n)
    return False


def _jpeg_size(probe: _Probe) -> tuple[int, int]:
    from shardfeed.transforms.decode import jpeg_header

    try:
        height, width, _space = jpeg_header(probe.head)
    except DecodeError:
        if len(probe.head) == probe.size:
            raise
        height, width, _space = jpeg_header(probe.whole())  # a header past HEAD_BYTES
    return height, width


def _png_size(probe: _Probe) -> tuple[int, int]:
    head = probe.head
    if len(head) < 24 or head[12:16] != b"IHDR":
        raise _Problem("is a PNG without its IHDR header chunk (damaged)")
    width, height = struct.unpack(">II", head[16:24])
    return int(height), int(width)


def _claimed(probe: _Probe) -> ClaimedSize:
    """The size the file's header claims (reading the whole file when the header lies
    beyond the head, as a TIFF's directory may)."""
    try:
        return claimed_size(probe.head)
    except Unsized as exc:
        if len(probe.head) == probe.size:
            raise _Problem(f"does not decode ({exc})") from None
    try:
        return claimed_size(probe.whole())
    except Unsized as exc:
        raise _Problem(f"does not decode ({exc})") from None


def _check_pixels(claim: ClaimedSize, max_pixels: int) -> None:
    reason = too_large(claim, max_pixels)
    if reason is not None:
        size = f"{claim.height}x{claim.width} (height x width) = {claim.pixels:,} pixels"
        raise _Problem(
            f"is a {claim.format.upper()} that claims {size}, more than max_pixels="
            f"{max_pixels:,}: no loader decodes it with that limit; if such images are "
            "intended, pass --max-pixels (max_pixels=) to pack, and the same limit to the "
            "loader's decode"
        )


def _not_an_image(head: bytes) -> str:
    sample = head[:16]
    if sample and all(32 <= b < 127 or b in (9, 10, 13) for b in sample):
        text = sample.decode("ascii").splitlines()[0] if sample.strip() else ""
        return f"is not an image (it holds text: {text!r}...)"
    return f"is not an image (it starts with bytes {sample[:8].hex(' ')})"


def inspect_file(
    path: str, *, decode: bool, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[int, int]:
    """``(height, width)`` of the image at ``path`` after the checks of the module table;
    raises :class:`_Problem` saying what is wrong."""
    return _inspect(path, decode=decode, max_pixels=max_pixels)[0]


def _inspect(
    path: str, *, decode: bool, max_pixels: int
) -> tuple[tuple[int, int], int]:
    """:func:`inspect_file`'s size (as stored) and the file's EXIF orientation (1 for
    anything but a tagged JPEG)."""
    from shardfeed.transforms.decode import decode_image
    from shardfeed.transforms.decode.orientation import jpeg_orientation

    try:
        probe = _Probe(path)
    except FileNotFoundError:
        raise _Problem("does not exist") from None
    except IsADirectoryError:
        raise _Problem("is a folder, not an image file") from None
    except OSError as exc:
        raise _Problem(f"cannot be read ({exc.strerror or exc})") from None
    if probe.size == 0:
        raise _Problem("is empty (0 bytes)")
    kind = image_format(probe.head)
    turn = 1
    try:
        if kind == "other":
            raise _Problem(_not_an_image(probe.head))
        if kind == "jpeg":
            size = _jpeg_size(probe)
            _check_pixels(ClaimedSize("jpeg", *size, size[0] * size[1]), max_pixels)
            if not probe.tail.rstrip(b"\x00").endswith(b"\xff\xd9") and (
                jpeg_end(probe.whole()) is None
            ):
                raise _Problem("is a truncated JPEG: it has no end-of-image marker (FF D9)")
            turn = jpeg_orientation(probe.head)
        elif kind == "png":
            size = _png_size(probe)
            _check_pixels(ClaimedSize("png", *size, size[0] * size[1]), max_pixels)
            if not probe.tail.endswith(_PNG_IEND) and not png_complete(probe.whole()):
                raise _Problem("is a truncated PNG: its chunks stop before the IEND chunk")
        else:
            _check_pixels(_claimed(probe), max_pixels)
        if kind not in ("jpeg", "png") or decode:
            image = decode_image(probe.whole(), mode="unchanged", max_pixels=max_pixels)
            size = (int(image.shape[0]), int(image.shape[1]))
    except DecodeError as exc:
        raise _Problem(f"does not decode ({_reason(exc)})") from None
    return size, turn


def check_item(
    item: PackItem, *, decode: bool, line: int | None, max_pixels: int = DEFAULT_MAX_PIXELS
) -> list[BadInput]:
    """The problems of one item: its image, its mask, and whether their sizes agree."""
    problems: list[BadInput] = []
    image = mask = None
    try:
        image = _inspect(item.source, decode=decode, max_pixels=max_pixels)
    except _Problem as exc:
        problems.append(BadInput(item.source, str(exc), line))
    if item.mask_source is not None:
        try:
            mask = _inspect(item.mask_source, decode=decode, max_pixels=max_pixels)
        except _Problem as exc:
            problems.append(BadInput(item.mask_source, f"(mask) {exc}", line))
    if image is not None and mask is not None and not _sizes_agree(image, mask):
        (height, width), turn = image
        shown = ""
        if _shown(image) != (height, width):
            shown = (f", {width}x{height} as shown (its EXIF orientation is {turn}; a mask "
                     "of either size packs)")
        problems.append(BadInput(
            item.mask_source or "", f"(mask) is {mask[0][0]}x{mask[0][1]} (height x "
            f"width) but its image '{item.source}' is {height}x{width}{shown}", line,
        ))
    return problems


def _shown(found: tuple[tuple[int, int], int]) -> tuple[int, int]:
    """The ``(height, width)`` of an image as its EXIF orientation shows it."""
    (height, width), turn = found
    return (width, height) if turn >= 5 else (height, width)


def _sizes_agree(image: tuple[tuple[int, int], int], mask: tuple[tuple[int, int], int]) -> bool:
    """Whether a mask fits its image as both are stored, or as both are shown (what a loader
    with ``exif_orientation="ignore"`` / ``"apply"`` decodes)."""
    return image[0] == mask[0] or _shown(image) == _shown(mask)


def check_inputs(
    items: Sequence[PackItem],
    *,
    level: CheckLevel,
    csv_lines: bool,
    run: Callable[[Callable[[PackItem], list[BadInput]], Iterable[PackItem]],
                  Iterable[list[BadInput]]],
    advance: Callable[[int], object] = lambda n: None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> list[list[BadInput]]:
    """The problems of each of ``items`` (one list per item, empty when it is fine).

    ``run(fn, items)`` maps in parallel, in order (``workers.ordered_map``);
    ``csv_lines`` says that ``PackItem.row`` is a CSV line to name in the problems;
    ``max_pixels``: the most pixels an image may claim."""
    if level not in ("header", "decode"):
        raise ValueError(f"check must be 'header' or 'decode', got {level!r}")
    fn = partial(_check_row, decode=level == "decode", csv_lines=csv_lines,
                 max_pixels=max_pixels)
    found: list[list[BadInput]] = []
    for problems in run(fn, items):
        found.append(problems)
        advance(1)
    return found


def _check_row(
    item: PackItem, *, decode: bool, csv_lines: bool, max_pixels: int
) -> list[BadInput]:
    return check_item(item, decode=decode, line=item.row if csv_lines else None,
                      max_pixels=max_pixels)
