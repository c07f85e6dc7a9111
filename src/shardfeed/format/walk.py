"""The one walk over a TFRecord file's framing: each record's place and status, in file order.

:func:`walk` reads a :class:`~shardfeed.storage.base.ByteSource` (a local file or an object
in a bucket alike) in large blocks and yields one :class:`RecordStatus` a record: its number,
offset and payload length, and whether it is whole (``"ok"``) or what is wrong with it
(``"bad_length_crc"``, ``"bad_data_crc"``, ``"truncated"``, ``"compressed"``,
``"not_tfrecord"``), with its payload when asked. It raises nothing for damaged data: the
callers decide. :func:`shardfeed.format.framing.scan` stops at the first problem and raises;
``shardfeed index`` reads the payloads; ``shardfeed verify`` reports every problem and goes on
past a bad length CRC where an index says where the next record starts.

Determinism: records in file order. State: none kept between walks. Memory: one read block
(``block_bytes``, or one record when a record is larger).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Literal, NamedTuple

import google_crc32c

from shardfeed.format.crc import mask
from shardfeed.format.spec import (
    FRAMING_BYTES,
    GZIP_MAGIC,
    HEADER_BYTES,
    LENGTH_BYTES,
    MAX_RECORD_BYTES,
    ZLIB_FIRST_BYTE,
    ZLIB_SECOND_BYTES,
)
from shardfeed.storage.base import ByteSource

__all__ = [
    "WALK_BLOCK_BYTES", "RecordState", "RecordStatus", "Resume", "WalkData", "compressed", "walk",
]

WALK_BLOCK_BYTES = 8 << 20
"""Bytes read at a time by :func:`walk` (one read, or one ranged GET, per block)."""

RecordState = Literal[
    "ok", "bad_length_crc", "bad_data_crc", "truncated", "compressed", "not_tfrecord"
]
"""What :func:`walk` found at one record."""

WalkData = Literal["skip", "check", "payload"]
"""What :func:`walk` does with each payload: ``"skip"`` it (records larger than a block are
not read at all), ``"check"`` its data CRC, or check it and hand it back (``"payload"``)."""

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")


class RecordStatus(NamedTuple):
    """One record as :func:`walk` found it.

    ``length``: the payload bytes its header gives (None where there is no whole header with
    a matching length CRC). ``end``: where the next record starts, or None where the walk
    stops at this record. ``payload``: the payload bytes, for ``"ok"`` records when the walk
    was asked for them. A truncated record needs ``HEADER_BYTES`` bytes (``length`` None) or
    ``FRAMING_BYTES + length`` bytes from ``offset``.
    """

    record: int
    offset: int
    state: RecordState
    length: int | None
    end: int | None
    payload: bytes | None = None


def compressed(head: bytes) -> bool:
    """True if ``head`` (a file's first bytes) starts as a GZIP or ZLIB stream."""
    if head[:2] == GZIP_MAGIC:
        return True
    return len(head) >= 2 and head[0] == ZLIB_FIRST_BYTE and head[1] in ZLIB_SECOND_BYTES


class _Window:
    """A sliding window of file bytes read in large blocks."""

    def __init__(self, source: ByteSource, size: int, block_bytes: int) -> None:
        self.source = source
        self.size = size
        self.block_bytes = block_bytes
        self.start = 0
        self.data = b""

    def ensure(self, start: int, end: int) -> bool:
        """Make ``[start, end)`` available; False if the file ends before ``end``."""
        if end > self.size:
            return False
        if start >= self.start and end <= self.start + len(self.data):
            return True
        want = max(self.block_bytes, end - start)
        self.data = self.source.read(start, min(want, self.size - start))
        self.start = start
        return end <= start + len(self.data)


Resume = Callable[[int, int], "int | None"]
"""``resume(record, offset)``: where the record after a damaged header starts, or None."""


def walk(
    source: ByteSource,
    *,
    size: int | None = None,
    data: WalkData = "skip",
    resume: Resume | None = None,
    block_bytes: int = WALK_BLOCK_BYTES,
) -> Iterator[RecordStatus]:
    """Yield the status of every record of the TFRecord file read through ``source``.

    ``size``: the file's size when the caller knows it (else ``source.size()``). ``data``:
    see :data:`WalkData`. ``resume``: where to go on after a bad length CRC (e.g. from an
    index); without it the walk stops there, and a bad first header means the file is not a
    TFRecord (``"not_tfrecord"``). A GZIP/ZLIB file gives one ``"compressed"`` status. The
    walk also stops after a truncated record. An empty file yields nothing.
    """
    total = source.size() if size is None else size
    win = _Window(source, total, max(block_bytes, HEADER_BYTES))
    check, keep = data != "skip", data == "payload"
    unpack_header, unpack_crc = _HEADER.unpack_from, _CRC.unpack_from
    crc_value = google_crc32c.value  # the hot loop: one 8-byte CRC a record
    new = tuple.__new__  # builds a RecordStatus without NamedTuple's Python-level __new__
    pos = record = 0
    buf, start, stop = b"", 0, 0  # the window's bytes and the file range they hold
    while pos < total:
        if pos < start or pos + HEADER_BYTES > stop:
            if not win.ensure(pos, pos + HEADER_BYTES):
                yield _short_header(source, record, pos, total)
                return
            buf, start = win.data, win.start
            stop = start + len(buf)
        rel = pos - start
        length, length_crc = unpack_header(buf, rel)
        if mask(crc_value(buf[rel:rel + LENGTH_BYTES])) != length_crc:
            status = _bad_header(buf[rel:rel + HEADER_BYTES], record, pos, resume)
            yield status
            if status.end is None:
                return
            pos, record = status.end, record + 1
            continue
        end = pos + FRAMING_BYTES + length
        if length > MAX_RECORD_BYTES or end > total:
            yield RecordStatus(record, pos, "truncated", length, None)
            return
        if not check:
            yield new(RecordStatus, (record, pos, "ok", length, end, None))
        else:
            if end > stop:  # the body is not all in the window: read from its start
                win.ensure(pos + HEADER_BYTES, end)  # the file holds ``end`` bytes (above)
                buf, start = win.data, win.start
                stop = start + len(buf)
            body = pos + HEADER_BYTES - start
            payload = buf[body:body + length]
            if mask(crc_value(payload)) != unpack_crc(buf, body + length)[0]:
                yield new(RecordStatus, (record, pos, "bad_data_crc", length, end, None))
            else:
                yield new(RecordStatus, (record, pos, "ok", length, end, payload if keep else None))
        pos, record = end, record + 1


def _short_header(source: ByteSource, record: int, pos: int, size: int) -> RecordStatus:
    """The status of a record whose header the file ends inside."""
    if record == 0 and compressed(source.read(0, min(size, HEADER_BYTES))):
        return RecordStatus(0, 0, "compressed", None, None)
    return RecordStatus(record, pos, "truncated", None, None)


def _bad_header(head: bytes, record: int, pos: int, resume: Resume | None) -> RecordStatus:
    """The status of a record whose length CRC does not match."""
    if record == 0 and compressed(head):
        return RecordStatus(0, 0, "compressed", None, None)
    if record == 0 and resume is None:
        return RecordStatus(0, 0, "not_tfrecord", None, None)
    end = resume(record, pos) if resume is not None else None
    if end is not None and end <= pos:
        end = None  # an index that does not move forward cannot say where to go on
    return RecordStatus(record, pos, "bad_length_crc", None, end)
