"""TFRecord framing: frame one payload, unframe one record, scan a whole file for its offsets.

The layout is in :mod:`shardfeed.format.spec`; it is bit-exact with TensorFlow's
``TFRecordWriter``, so files written here are read by ``tf.data.TFRecordDataset`` unchanged.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import numpy as np

from shardfeed.errors import CorruptRecordError, FormatError, ShardfeedError, location
from shardfeed.format.crc import Buffer, crc32c_of_bytes, masked_crc32c
from shardfeed.format.spec import (
    CRC_BYTES,
    CRC_MASK_DELTA,
    FRAMING_BYTES,
    GZIP_MAGIC,
    HEADER_BYTES,
    LENGTH_BYTES,
    ZLIB_FIRST_BYTE,
    ZLIB_SECOND_BYTES,
)
from shardfeed.format.walk import WALK_BLOCK_BYTES, RecordStatus, WalkData, walk
from shardfeed.storage import open_source
from shardfeed.storage.base import ByteSource

_HEADER = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK32 = 0xFFFFFFFF

SCAN_BLOCK_BYTES = WALK_BLOCK_BYTES
"""Bytes read at a time by :func:`scan` (large blocks, not one read per record)."""

CONVERT_HINT = (
    "decompress first, e.g. `gunzip -c f.tfrecord.gz > f.tfrecord`, "
    "or `shardfeed pack --from-tfrecord`"
)
"""What to do with a GZIP-compressed TFRecord file."""

ZLIB_HINT = (
    "decompress first (gunzip does not read ZLIB), e.g. `python3 -c \"import sys, zlib; "
    "sys.stdout.buffer.write(zlib.decompress(sys.stdin.buffer.read()))\" < f.tfrecord > "
    "plain.tfrecord`, or re-pack it with `shardfeed pack FILE OUT --from-tfrecord`"
)
"""What to do with a ZLIB-compressed TFRecord file (TensorFlow's ``compression_type="ZLIB"``)."""


def frame(payload: Buffer) -> bytes:
    """Frame ``payload`` as one TFRecord record (16 bytes of framing around it)."""
    length = _LENGTH.pack(len(payload))
    return b"".join(
        (length, _CRC.pack(masked_crc32c(length)), payload, _CRC.pack(masked_crc32c(payload)))
    )


def framed_size(payload_bytes: int) -> int:
    """Bytes one record of ``payload_bytes`` takes on disk."""
    return payload_bytes + FRAMING_BYTES


def _check_frame(view: memoryview, raw: Buffer, path: str, record: int | None,
                 offset: int | None) -> int:
    """Check the header of one whole framed record; return the payload length."""
    if len(view) < HEADER_BYTES:
        raise CorruptRecordError(
            f"{location(path, record, offset)}: truncated, only {len(view)} bytes where a "
            f"{HEADER_BYTES}-byte record header should be; the file was cut short or changed "
            "after indexing: re-run `shardfeed index` (or `pack --resume`) on it",
            path=path, record=record, offset=offset,
        )
    length, length_crc = _HEADER.unpack_from(view, 0)
    if masked_crc32c(raw[:LENGTH_BYTES]) != length_crc:
        raise CorruptRecordError(
            f"{location(path, record, offset)}: bad length CRC; the record header is damaged, "
            "or the index does not match the file: re-run `shardfeed index` on it, or "
            "re-create the shard",
            path=path, record=record, offset=offset,
        )
    if len(view) != length + FRAMING_BYTES:
        raise CorruptRecordError(
            f"{location(path, record, offset)}: record is {length + FRAMING_BYTES} bytes by "
            f"its header but {len(view)} bytes were read; the file was cut short or changed "
            "after indexing: re-run `shardfeed index` (or `pack --resume`) on it",
            path=path, record=record, offset=offset,
        )
    return int(length)


def _check_data(view: memoryview, payload: Buffer, length: int, path: str,
                record: int | None, offset: int | None) -> None:
    (data_crc,) = _CRC.unpack_from(view, HEADER_BYTES + length)
    if masked_crc32c(payload) != data_crc:
        raise CorruptRecordError(
            f"{location(path, record, offset)}: bad data CRC; the record's bytes are "
            "damaged. Re-create the shard from its source, or read with on_error='skip' "
            "to skip it",
            path=path, record=record, offset=offset,
        )


def unframe(
    buf: Buffer, *, path: str, record: int | None, offset: int | None, verify: bool = True
) -> memoryview:
    """Return the payload of one whole framed record held in ``buf`` (no copy).

    The length CRC is always checked (it costs one 8-byte CRC); the data CRC when ``verify``.
    Raises :class:`CorruptRecordError` naming ``path``, ``record`` and ``offset``.
    """
    view = memoryview(buf)
    raw = buf if type(buf) is bytes else view  # slicing bytes feeds the CRC without a view copy
    length = _check_frame(view, raw, path, record, offset)
    payload = view[HEADER_BYTES:HEADER_BYTES + length]
    if verify:
        _check_data(view, raw[HEADER_BYTES:HEADER_BYTES + length], length, path, record, offset)
    return payload


def unframe_bytes(
    buf: Buffer, *, path: str, record: int | None, offset: int | None, verify: bool = True
) -> bytes:
    """Like :func:`unframe`, but return the payload as ``bytes``: one copy, which the data
    CRC (a C routine that takes ``bytes``) and the protobuf parser then share."""
    view = memoryview(buf)
    raw = buf if type(buf) is bytes else view
    length = _check_frame(view, raw, path, record, offset)
    payload = view[HEADER_BYTES:HEADER_BYTES + length].tobytes()
    if verify:
        _check_data(view, payload, length, path, record, offset)
    return payload


def unframe_bytes_at(
    blob: bytes, start: int, end: int, *, path: str, record: int | None, offset: int | None,
    verify: bool = True,
) -> bytes:
    """:func:`unframe_bytes` of the record held in ``blob[start:end]``, without slicing it
    out first: the checks of a sound record in as few calls as can be (a small record's
    cost is mostly calls), and :func:`unframe_bytes` to name the fault of any other."""
    if type(blob) is bytes and end - start >= HEADER_BYTES and end <= len(blob):
        length, length_crc = _HEADER.unpack_from(blob, start)
        crc = crc32c_of_bytes(blob[start:start + LENGTH_BYTES])
        # crc.mask inlined (here and below): two calls less a record
        if (end - start == length + FRAMING_BYTES and length_crc
                == ((((crc >> 15) | (crc << 17)) & _MASK32) + CRC_MASK_DELTA) & _MASK32):
            payload = blob[start + HEADER_BYTES:end - CRC_BYTES]
            if not verify:
                return payload
            crc = crc32c_of_bytes(payload)
            if (_CRC.unpack_from(blob, end - CRC_BYTES)[0]
                    == ((((crc >> 15) | (crc << 17)) & _MASK32) + CRC_MASK_DELTA) & _MASK32):
                return payload
    return unframe_bytes(memoryview(blob)[start:end], path=path, record=record, offset=offset,
                         verify=verify)


def _signature_error(path: str, head: bytes) -> FormatError | None:
    """A FormatError for a GZIP or ZLIB file, else None."""
    if head[:2] == GZIP_MAGIC:
        kind, hint = "GZIP", CONVERT_HINT
    elif len(head) >= 2 and head[0] == ZLIB_FIRST_BYTE and head[1] in ZLIB_SECOND_BYTES:
        kind, hint = "ZLIB", ZLIB_HINT
    else:
        return None
    return FormatError(
        f"file '{path}' is a {kind}-compressed TFRecord file; compressed files cannot be read "
        f"by byte offset: {hint}"
    )


def _not_tfrecord(path: str, head: bytes) -> FormatError:
    return _signature_error(path, head) or FormatError(
        f"file '{path}' is not a TFRecord file (the length CRC of its first record at byte 0 "
        "does not match); check the path, or convert the data with `shardfeed pack`"
    )


def scan(
    source: ByteSource | str | os.PathLike[str],
    *,
    verify_data: bool = False,
    progress: Callable[[int], object] | None = None,
    block_bytes: int = SCAN_BLOCK_BYTES,
) -> np.ndarray:
    """Find every record of a TFRecord file; return the n+1 offsets (uint64, last = file size).

    Reads the file in blocks of ``block_bytes``; records larger than a block are skipped by
    seeking unless ``verify_data`` asks for their data CRC. ``progress``, if given, is called
    with the number of bytes advanced (e.g. ``tqdm.update``).

    Raises :class:`FormatError` for GZIP/ZLIB files (with the conversion hint) and for files
    that are not TFRecords; :class:`CorruptRecordError` for a truncated file, a bad length CRC
    and, with ``verify_data``, a bad data CRC. An empty file is valid and has 0 records.
    """
    owned = isinstance(source, (str, os.PathLike))
    src: ByteSource = open_source(source) if isinstance(source, (str, os.PathLike)) else source
    try:
        return _scan(src, verify_data=verify_data, progress=progress, block_bytes=block_bytes)
    finally:
        if owned:
            src.close()


def _scan(
    src: ByteSource,
    *,
    verify_data: bool,
    progress: Callable[[int], object] | None,
    block_bytes: int,
) -> np.ndarray:
    size = src.size()
    offsets: list[int] = []
    append = offsets.append
    pos = reported = 0
    data: WalkData = "check" if verify_data else "skip"
    for status in walk(src, size=size, data=data, block_bytes=block_bytes):
        _, offset, state, _, end, _ = status
        if state != "ok" or end is None:
            raise status_error(src, status, size)
        append(offset)
        pos = end
        if progress is not None and pos - reported >= block_bytes:
            progress(pos - reported)
            reported = pos
    if progress is not None and pos > reported:
        progress(pos - reported)
    offsets.append(pos)
    return np.array(offsets, dtype=np.uint64)


def status_error(source: ByteSource, status: RecordStatus, size: int) -> ShardfeedError:
    """The error :func:`scan` raises for a record :func:`walk` did not find whole: a
    :class:`FormatError` for a compressed or non-TFRecord file, else a
    :class:`CorruptRecordError` naming the file, record and offset."""
    path, record, pos = source.url, status.record, status.offset
    if status.state in ("compressed", "not_tfrecord"):
        return _not_tfrecord(path, source.read(0, min(size, HEADER_BYTES)))
    if status.state == "bad_length_crc":
        return CorruptRecordError(
            f"{location(path, record, pos)}: bad length CRC; the record header is "
            f"damaged ({record} whole records precede it). Re-create the shard from its "
            "source, or truncate the file to those records",
            path=path, record=record, offset=pos,
        )
    if status.state == "bad_data_crc":
        return CorruptRecordError(
            f"{location(path, record, pos)}: bad data CRC; the record's bytes are "
            "damaged. Re-create the shard from its source, or read with "
            "on_error='skip' to skip it",
            path=path, record=record, offset=pos,
        )
    need = HEADER_BYTES if status.length is None else FRAMING_BYTES + status.length
    return _truncated(path, record, pos, size, need)


def _truncated(path: str, record: int, pos: int, size: int, need: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"{location(path, record, pos)}: truncated, the file ends at byte {size} but this "
        f"record needs {need} bytes from byte {pos}; {record} whole records precede it. The "
        "file was cut short (interrupted write or copy): re-create it, or truncate it to "
        f"{pos} bytes to keep the whole records",
        path=path, record=record, offset=pos,
    )


__all__ = [
    "CONVERT_HINT",
    "SCAN_BLOCK_BYTES",
    "ZLIB_HINT",
    "frame",
    "framed_size",
    "scan",
    "status_error",
    "unframe",
    "unframe_bytes",
]
