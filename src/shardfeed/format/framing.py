"""TFRecord framing: frame one payload, unframe one record, scan a whole file for its offsets.

The layout is in :mod:`shardfeed.format.spec`; it is bit-exact with TensorFlow's
``TFRecordWriter``, so files written here are read by ``tf.data.TFRecordDataset`` unchanged.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import google_crc32c
import numpy as np

from shardfeed.errors import CorruptRecordError, FormatError, location
from shardfeed.format.crc import Buffer, mask, masked_crc32c
from shardfeed.format.spec import (
    FRAMING_BYTES,
    GZIP_MAGIC,
    HEADER_BYTES,
    LENGTH_BYTES,
    MAX_RECORD_BYTES,
    ZLIB_FIRST_BYTE,
    ZLIB_SECOND_BYTES,
)
from shardfeed.storage import open_source
from shardfeed.storage.base import ByteSource

_HEADER = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")

SCAN_BLOCK_BYTES = 8 << 20
"""Bytes read at a time by :func:`scan` (large blocks, not one read per record)."""

CONVERT_HINT = (
    "decompress first, e.g. `gunzip -c f.tfrecord.gz > f.tfrecord`, "
    "or `shardfeed pack --from-tfrecord`"
)


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


def _signature_error(path: str, head: bytes) -> FormatError | None:
    """A FormatError for a GZIP or ZLIB file, else None."""
    if head[:2] == GZIP_MAGIC:
        kind = "GZIP"
    elif len(head) >= 2 and head[0] == ZLIB_FIRST_BYTE and head[1] in ZLIB_SECOND_BYTES:
        kind = "ZLIB"
    else:
        return None
    return FormatError(
        f"file '{path}' is a {kind}-compressed TFRecord file; compressed files cannot be read "
        f"by byte offset: {CONVERT_HINT}"
    )


def _not_tfrecord(path: str, head: bytes) -> FormatError:
    return _signature_error(path, head) or FormatError(
        f"file '{path}' is not a TFRecord file (the length CRC of its first record at byte 0 "
        "does not match); check the path, or convert the data with `shardfeed pack`"
    )


class _Window:
    """A sliding window of file bytes read in large blocks."""

    def __init__(self, source: ByteSource, size: int, block_bytes: int) -> None:
        self.source = source
        self.size = size
        self.block_bytes = block_bytes
        self.start = 0
        self.data = b""
        self.bytes_read = 0

    def ensure(self, start: int, end: int) -> bool:
        """Make ``[start, end)`` available; False if the file ends before ``end``."""
        if end > self.size:
            return False
        if start >= self.start and end <= self.start + len(self.data):
            return True
        want = max(self.block_bytes, end - start)
        data = self.source.read(start, min(want, self.size - start))
        self.start = start
        self.data = data
        self.bytes_read += len(data)
        return end <= start + len(data)


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
    path = src.url
    size = src.size()
    offsets: list[int] = []
    if size == 0:
        return np.zeros(1, dtype=np.uint64)
    win = _Window(src, size, max(block_bytes, HEADER_BYTES))
    pos = 0
    reported = 0
    append = offsets.append
    unpack_header = _HEADER.unpack_from
    crc_value = google_crc32c.value  # the hot loop: one 8-byte CRC a record
    while pos < size:
        record = len(offsets)
        if not win.ensure(pos, pos + HEADER_BYTES):
            if record == 0:
                head = src.read(0, min(size, HEADER_BYTES))
                sig = _signature_error(path, head)
                if sig is not None:
                    raise sig
            raise _truncated(path, record, pos, size, HEADER_BYTES)
        rel = pos - win.start
        data = win.data
        length, length_crc = unpack_header(data, rel)
        if mask(crc_value(data[rel:rel + LENGTH_BYTES])) != length_crc:
            if record == 0:
                raise _not_tfrecord(path, data[:HEADER_BYTES])
            raise CorruptRecordError(
                f"{location(path, record, pos)}: bad length CRC; the record header is "
                f"damaged ({record} whole records precede it). Re-create the shard from its "
                "source, or truncate the file to those records",
                path=path, record=record, offset=pos,
            )
        end = pos + FRAMING_BYTES + length
        if length > MAX_RECORD_BYTES or end > size:
            raise _truncated(path, record, pos, size, FRAMING_BYTES + length)
        if verify_data:
            data_start = pos + HEADER_BYTES
            if not win.ensure(data_start, end):
                raise _truncated(path, record, pos, size, FRAMING_BYTES + length)
            drel = data_start - win.start
            ddata = win.data
            (data_crc,) = _CRC.unpack_from(ddata, drel + length)
            if masked_crc32c(ddata[drel:drel + length]) != data_crc:
                raise CorruptRecordError(
                    f"{location(path, record, pos)}: bad data CRC; the record's bytes are "
                    "damaged. Re-create the shard from its source, or read with "
                    "on_error='skip' to skip it",
                    path=path, record=record, offset=pos,
                )
        append(pos)
        pos = end
        if progress is not None and pos - reported >= block_bytes:
            progress(pos - reported)
            reported = pos
    if progress is not None and pos > reported:
        progress(pos - reported)
    offsets.append(pos)
    return np.array(offsets, dtype=np.uint64)


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
    "frame",
    "framed_size",
    "scan",
    "unframe",
    "unframe_bytes",
]
