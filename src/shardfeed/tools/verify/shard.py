"""The per-shard checker of :func:`shardfeed.tools.verify.verify`.

:func:`check_shard` walks one shard record by record, local or on object storage (read through
the byte sources of :mod:`shardfeed.storage`, as ``Dataset`` reads it): framing, length and
data CRCs, truncation, compression, the index and what the manifest says of the shard; with
``decode``/``check_paths`` also each record's Example, images, masks and referenced files.
Images decode exactly as the Loader's decode ops decode them, by the same functions
(:class:`~shardfeed.transforms.decode.fields.ImageField`): the same ``max_pixels`` limit read from
the header, the same formats (a float TIFF a loader refuses is a bad record here too), raw
pixels checked against their stored shape and dtype, 1, 3 or 4 channels. Masks decode as the
Loader decodes them (grey values, palette indices) and must have their image's size; colour
and 16-bit masks, which a loader reads only with ``mask_colors`` / ``mask_dtype="uint16"``,
are counted in one warning per shard.
After a bad length CRC the rest of the shard can only be checked where an index says where the
records start; otherwise the walk stops there.

Determinism: problems in file order. State: none. Memory: one read block (8 MiB) and one record.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from shardfeed.errors import SchemaError, ShardfeedError, StorageError, UnsafePathError, location
from shardfeed.format import spec
from shardfeed.format.schema import ImageInfo
from shardfeed.format.walk import RecordStatus, WalkData, walk
from shardfeed.storage import files, is_remote, open_source
from shardfeed.storage.base import ByteSource
from shardfeed.tools.verify.report import (
    BAD_DATA_CRC,
    BAD_LENGTH_CRC,
    CHECKSUM_MISMATCH,
    COMPRESSED,
    COUNT_MISMATCH,
    INDEX_MISMATCH,
    MASK_SIZE_MISMATCH,
    MISSING_FILE,
    MISSING_REFERENCED,
    NOT_EXAMPLE,
    NOT_TFRECORD,
    REFUSED_PATH,
    SIZE_MISMATCH,
    TRUNCATED,
    UNDECODABLE_IMAGE,
    UNDECODABLE_MASK,
    Problem,
    ShardCheck,
)
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

if TYPE_CHECKING:
    from shardfeed.transforms.decode.fields import ImageField

__all__ = ["BLOCK_BYTES", "Expected", "ShardJob", "check_shard"]

BLOCK_BYTES = 8 << 20

@dataclass(frozen=True, slots=True)
class Expected:
    """What the manifest says about a shard (None: nothing known)."""

    records: int | None = None
    size: int | None = None
    checksum: int | None = None


@dataclass(frozen=True, slots=True)
class ShardJob:
    path: str
    expected: Expected
    decode: bool
    root: str | None
    check_paths: bool
    image: ImageInfo | None
    mask: ImageInfo | None
    max_pixels: int = DEFAULT_MAX_PIXELS


def _file_crc(source: ByteSource, size: int) -> int:
    import google_crc32c

    value = 0
    for start in range(0, size, BLOCK_BYTES):
        chunk = source.read(start, min(BLOCK_BYTES, size - start))
        value = int(google_crc32c.extend(value, chunk))
    return value


def _load_index(path: str) -> tuple[np.ndarray | None, str | None]:
    """The shard's offsets from ``.idx.npy`` or ``.idx`` if one exists (found the way
    ``Dataset`` finds them, local or remote), and why it is unusable when it is damaged (a
    Dataset would refuse it, so verify reports it)."""
    from shardfeed.dataset.shards import find_index

    try:
        found = find_index(path, mmap=False)
    except ShardfeedError as exc:
        return None, str(exc)
    return (None if found is None else np.asarray(found)), None


def _size(path: str) -> int | None:
    """The shard's size in bytes, or None if there is no such file or object."""
    if not is_remote(path):
        local = path.removeprefix("file://")
        return os.path.getsize(local) if os.path.isfile(local) else None
    try:
        return files.size(path)
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None
        raise


def check_shard(job: ShardJob, advance: Callable[[int], object]) -> ShardCheck:
    """Check one shard (a local path or a URL); ``advance(n)`` reports bytes walked."""
    size = _size(job.path)
    if size is None:
        missing = Problem(job.path, None, None, MISSING_FILE,
                          "the shard does not exist; restore it, or rebuild the dataset")
        return ShardCheck(job.path, 0, 0, 0, (missing,))
    source = open_source(job.path)
    try:
        return _walk(job, source, size, advance)
    finally:
        source.close()


def _walk(job: ShardJob, source: ByteSource, size: int,
          advance: Callable[[int], object]) -> ShardCheck:
    """Check the shard ``job.path`` of ``size`` bytes, read through ``source``."""
    path = job.path
    problems: list[Problem] = []
    warnings: list[str] = []

    def problem(kind: str, detail: str, record: int | None = None, offset: int | None = None) -> None:
        problems.append(Problem(path, record, offset, kind, detail))

    exp = job.expected
    if exp.size is not None and exp.size != size:
        problem(SIZE_MISMATCH, f"the file has {size} bytes, the manifest says {exp.size}; the "
                "shard changed after it was written: restore it, or re-run `shardfeed index`")
    elif exp.checksum is not None and _file_crc(source, size) != exp.checksum:
        problem(CHECKSUM_MISMATCH, "the file's CRC32C differs from the manifest; the shard "
                "changed after it was written: restore it, or re-run `shardfeed index`")
    if size == 0:
        if exp.records:
            problem(COUNT_MISMATCH, f"the file is empty, the manifest says {exp.records} records")
        else:
            warnings.append(f"file '{path}' is empty (no records); remove it if unintended")
        return ShardCheck(path, 0, 0, 0, tuple(problems), tuple(warnings))
    index, damaged = _load_index(path)
    if damaged is not None:
        problem(INDEX_MISMATCH, damaged)
    notes: list[tuple[str, int, int]] = []  # masks a loader reads only with an option
    offsets, decoded, masks = _walk_records(job, source, size, index, problem, notes, advance)
    if index is not None and not problems:
        walked = np.asarray(offsets + [size], dtype=np.uint64)
        if walked.shape != index.shape or bool(np.any(walked != index)):
            problem(INDEX_MISMATCH, f"the index lists {index.size - 1} records, the file holds "
                    f"{len(offsets)}; the shard changed after indexing: re-run `shardfeed index`")
    if exp.records is not None and len(offsets) != exp.records and not problems:
        problem(COUNT_MISMATCH, f"the file holds {len(offsets)} records, the manifest says "
                f"{exp.records}; re-run `shardfeed index`")
    warnings.extend(_mask_warnings(path, notes))
    return ShardCheck(path, len(offsets), size, decoded, tuple(problems), tuple(warnings),
                      masks_decoded=masks)


_Report = Callable[[str, str, "int | None", "int | None"], None]


def _walk_records(
    job: ShardJob, source: ByteSource, size: int, index: np.ndarray | None,
    problem: _Report, notes: list[tuple[str, int, int]], advance: Callable[[int], object],
) -> tuple[list[int], int, int]:
    """Walk the records with :func:`shardfeed.format.walk.walk`, reporting each problem;
    return the offsets of the records walked, the number of images and masks decoded, and
    how many of those were masks."""
    resume = None if index is None else partial(_next_indexed, index)
    data: WalkData = "payload" if job.decode or job.check_paths else "check"
    offsets: list[int] = []
    decoded = masks = reported = 0
    for status in walk(source, size=size, data=data, resume=resume, block_bytes=BLOCK_BYTES):
        record, pos, state = status.record, status.offset, status.state
        if state == "ok" and status.payload is not None:
            images_here, masks_here = _check_payload(job, status.payload, record, pos,
                                                     problem, notes)
            decoded += images_here + masks_here
            masks += masks_here
        elif state != "ok":
            _report_status(status, size, problem)
        if status.end is None:
            break
        offsets.append(pos)
        if status.end - reported >= BLOCK_BYTES:
            advance(status.end - reported)
            reported = status.end
    advance(size - reported)
    return offsets, decoded, masks


def _report_status(status: RecordStatus, size: int, problem: _Report) -> None:
    """Report a record the walk did not find whole."""
    record, pos, state = status.record, status.offset, status.state
    if state == "compressed":
        problem(COMPRESSED, "the file is GZIP/ZLIB-compressed and cannot be read by "
                "offset; convert it with `shardfeed pack FILE OUT --from-tfrecord`", 0, 0)
    elif state == "truncated" and status.length is None:
        problem(TRUNCATED, f"the file ends at byte {size} inside this record's header; "
                f"{record} whole records precede it: re-create the shard", record, pos)
    elif state == "not_tfrecord":
        problem(NOT_TFRECORD, "the first record's length CRC does not match: this "
                "is not a TFRecord file (or its first header is damaged)", 0, 0)
    elif state == "bad_length_crc":
        tail = ("the rest of the shard is checked at the offsets of its index"
                if status.end is not None else
                "records after it cannot be located without an index and were not "
                "checked")
        problem(BAD_LENGTH_CRC, f"the record header is damaged; {tail}. Re-create the "
                "shard from its source", record, pos)
    elif state == "truncated":
        need = spec.FRAMING_BYTES + (status.length or 0)
        problem(TRUNCATED, f"the record needs {need} bytes but "
                f"the file ends at byte {size}; {record} whole records precede it: "
                f"re-create the shard, or truncate it to {pos} bytes", record, pos)
    else:
        problem(BAD_DATA_CRC, "the record's bytes are damaged; re-create the shard from "
                "its source, or read with on_error='skip'", record, pos)


def _next_indexed(index: np.ndarray, record: int, pos: int) -> int | None:
    if record + 1 >= index.size or int(index[record]) != pos:
        return None
    return int(index[record + 1])


# Where images and masks may be when the schema does not say: the standard feature names.
_DEFAULT_SLOTS = (
    ("image", (ImageInfo(spec.IMAGE_ENCODED, "mixed"),
               ImageInfo(spec.IMAGE_RAW, "raw", spec.IMAGE_HEIGHT, spec.IMAGE_WIDTH,
                         spec.IMAGE_CHANNELS),
               ImageInfo(spec.IMAGE_PATH, "path"))),
    ("mask", (ImageInfo(spec.MASK_ENCODED, "mixed"),
              ImageInfo(spec.MASK_RAW, "raw", spec.MASK_HEIGHT, spec.MASK_WIDTH),
              ImageInfo(spec.MASK_PATH, "path"))),
)


def _check_payload(
    job: ShardJob, payload: bytes, record: int, offset: int,
    problem: Callable[[str, str, int | None, int | None], None],
    notes: list[tuple[str, int, int]],
) -> tuple[int, int]:
    """Parse the record, check referenced files, and (``job.decode``) decode images and
    masks, checking that a mask has its image's size. Returns the images and the masks
    decoded."""
    from shardfeed.format.example import decode_example

    where = location(job.path, record, offset)
    try:
        features = decode_example(payload, where=where)
    except SchemaError as exc:
        problem(NOT_EXAMPLE, str(exc), record, offset)
        return 0, 0
    count = {"image": 0, "mask": 0}
    sizes: dict[str, tuple[int, int]] = {}
    for role, defaults in _DEFAULT_SLOTS:
        given = job.image if role == "image" else job.mask
        slots = (given,) if given is not None else defaults
        for slot in slots:
            value = features.get(slot.key)
            if not isinstance(value, bytes):
                continue
            size: tuple[int, int] | None = None
            if slot.encoding == "path":
                try:
                    full = _referenced(job.root, value, "the record")
                except UnsafePathError as exc:
                    problem(REFUSED_PATH, str(exc), record, offset)
                    continue
                data = files.read_if_exists(full) if job.decode else None  # one read, no stat
                if not (data is not None if job.decode else files.exists(full)):
                    problem(MISSING_REFERENCED, f"{role} '{full}' does not exist; restore it, or "
                            "pass the right --root", record, offset)
                elif data is not None:
                    size = _try_decode(job, slot, data, where, role, record, offset, problem,
                                       notes)
            elif not job.decode:
                continue
            elif slot.encoding == "raw":
                size = _try_raw(job, slot, features, where, role, record, offset, problem)
            else:
                size = _try_decode(job, slot, value, where, role, record, offset, problem,
                                   notes)
            if size is not None:
                count[role] += 1
                sizes.setdefault(role, size)
    image_hw, mask_hw = sizes.get("image"), sizes.get("mask")
    if image_hw is not None and mask_hw is not None and image_hw != mask_hw:
        problem(MASK_SIZE_MISMATCH, f"the mask is {mask_hw[0]}×{mask_hw[1]} (height×width) but "
                f"its image is {image_hw[0]}×{image_hw[1]}; a loader would misalign or reject "
                "it: re-create the mask at the image's size and pack again, or skip the record "
                "with on_error='skip'", record, offset)
    return count["image"], count["mask"]


_COLOUR_MASK = "colour"
_WIDE_MASK = "16-bit"


def _referenced(root: str | None, value: bytes, where: str) -> str:
    """The file a referenced path names under ``root``, found as the Loader finds it:
    refused (:class:`~shardfeed.errors.UnsafePathError`) when not UTF-8 or leading outside
    the root, unless the root is unconfined (``--allow-outside-paths``)."""
    from shardfeed.transforms.decode.fields import referenced_file

    return referenced_file(root, value, where)


def _field(job: ShardJob, slot: ImageInfo, role: str) -> ImageField:
    """The field a Loader's decode op reads ``slot`` with (its dtype, shape keys, limit)."""
    from shardfeed.transforms.decode.fields import ImageField

    return ImageField(is_mask=role == "mask", max_pixels=job.max_pixels).bound(slot,
                                                                                root=job.root)


def _try_decode(
    job: ShardJob, slot: ImageInfo, data: bytes, where: str, role: str, record: int,
    offset: int, problem: Callable[[str, str, int | None, int | None], None],
    notes: list[tuple[str, int, int]],
) -> tuple[int, int] | None:
    """Decode an image or mask as the Loader does; its (height, width), or None after
    reporting it undecodable."""
    from shardfeed.errors import DecodeError
    from shardfeed.transforms.decode.masks import read_mask
    from shardfeed.transforms.decode.ops import check_channels

    try:
        if role == "mask":
            pixels = read_mask(data, where=where, max_pixels=job.max_pixels)
            if pixels.kind == "colour" and pixels.grey_values() is None:
                notes.append((_COLOUR_MASK, record, offset))
            elif pixels.plane.dtype != np.uint8:
                notes.append((_WIDE_MASK, record, offset))
            return pixels.size
        image = _field(job, slot, role).decode_bytes(data, where, True)
        check_channels(image)
    except DecodeError as exc:
        problem(UNDECODABLE_IMAGE if role == "image" else UNDECODABLE_MASK, str(exc), record,
                offset)
        return None
    return int(image.shape[0]), int(image.shape[1])


def _try_raw(
    job: ShardJob, slot: ImageInfo, features: dict[str, Any], where: str, role: str,
    record: int, offset: int, problem: Callable[[str, str, int | None, int | None], None],
) -> tuple[int, int] | None:
    """Read raw pixels as the Loader does (stored shape and dtype, ``max_pixels``); their
    (height, width), or None after reporting them."""
    from shardfeed.transforms.decode.ops import check_channels

    try:
        image = _field(job, slot, role).decode(features)
        if role == "image":
            check_channels(image)
    except ShardfeedError as exc:  # DecodeError, or SchemaError for a missing shape feature
        problem(UNDECODABLE_IMAGE if role == "image" else UNDECODABLE_MASK, str(exc), record,
                offset)
        return None
    return int(image.shape[0]), int(image.shape[1])


def _mask_warnings(path: str, notes: list[tuple[str, int, int]]) -> list[str]:
    """One warning per kind of mask that a loader reads only with an option."""
    needs = {
        _COLOUR_MASK: ("colour (RGB) images",
                       "mask_colors={(r, g, b): id, ...} to give their colours class ids"),
        _WIDE_MASK: ("16-bit", "mask_dtype='uint16' to keep their values"),
    }
    result = []
    for kind, (what, option) in needs.items():
        hits = [(record, offset) for k, record, offset in notes if k == kind]
        if hits:
            record, offset = hits[0]
            result.append(f"{len(hits)} masks in file '{path}' are {what} (the first: record "
                          f"{record} at byte {offset}); a loader reads them only with {option}, "
                          "and raises DecodeError without it")
    return result
