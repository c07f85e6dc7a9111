"""The pages of a Parquet column chunk, from their headers: how big each is once
decompressed, before ``pyarrow`` decompresses any.

A Parquet file's footer gives each column chunk's place and total size; the chunk is a run
of pages, each behind a small Thrift (compact protocol) header that states the page's size
compressed and uncompressed::

    column chunk  [header|dictionary page][header|data page][header|data page] ...
    header        type · uncompressed size · compressed size · (page kind's own header)

A page is decompressed whole, so its uncompressed size is what reading it costs: a value
of a plain page is at most its page, a value of a dictionary-encoded one at most the largest
value of the dictionary page (read here, when it matters, by decompressing that one page,
itself within the limit of one record). No other part of a page is read.

Determinism: a function of the file's bytes. Memory: one page header (at most
:data:`MAX_HEADER_BYTES`, Arrow's own limit), or one dictionary page.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import IO, Any

MAX_HEADER_BYTES = 16 << 20
"""The largest page header read (Arrow refuses larger ones too)."""

DICTIONARY_PAGE = 2
_DATA_PAGES = (0, 3)  # DATA_PAGE, DATA_PAGE_V2
_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd",
           "LZ4_RAW": "lz4_raw", "UNCOMPRESSED": None}  # no others are read here
_MAX_DEPTH = 64
_MAX_SCANNED = 1 << 20  # dictionary values scanned for the largest (~0.3 s)


class DamagedPages(Exception):
    """The chunk's pages do not read as its footer says (a header cut short or beyond the
    chunk, an impossible size)."""


@dataclass(slots=True)
class Chunk:
    """The pages of one column chunk: the dictionary page's size (0: none), where its
    stored bytes are, each data page's size, the values the dictionary-encoded data pages
    hold (each a value of the dictionary), and whether every data page is
    dictionary-encoded."""

    dictionary_bytes: int = 0
    dictionary_at: tuple[int, int] | None = None  # (offset, stored bytes)
    pages: list[int] = field(default_factory=list)
    dictionary_values: int = 0
    all_dictionary: bool = True

    @property
    def largest_page(self) -> int:
        return max([self.dictionary_bytes, *self.pages])


def read_chunk(f: IO[bytes], meta: Any) -> Chunk:
    """The pages of the column chunk ``meta`` (a ``ColumnChunkMetaData``) of the file ``f``,
    from their headers."""
    start = meta.data_page_offset
    if meta.has_dictionary_page and 0 < (meta.dictionary_page_offset or 0) < start:
        start = meta.dictionary_page_offset  # as Arrow finds the chunk's start
    end = start + meta.total_compressed_size
    chunk = Chunk()
    at = start
    while at < end:
        kind, size, stored, (encoding, count), length = _header(f, at, end)
        body = at + length
        at = body + stored
        if at > end:
            raise DamagedPages(f"a page at byte {body - length} runs past its column chunk")
        if kind == DICTIONARY_PAGE:
            chunk.dictionary_bytes, chunk.dictionary_at = size, (body, stored)
        elif kind in _DATA_PAGES:
            chunk.pages.append(size)
            if encoding in _DICTIONARY_ENCODINGS:
                chunk.dictionary_values += max(count, 0)
            else:
                chunk.all_dictionary = False
    return chunk


def dictionary_value_bytes(f: IO[bytes], chunk: Chunk, codec: str, physical: str) -> int:
    """The largest value of the chunk's dictionary page: read from the page (decompressed:
    at most its size, checked already) for byte arrays under a codec Arrow names; else the
    page's size, which no value exceeds."""
    size = chunk.dictionary_bytes
    name = _CODECS.get(codec, "")
    if chunk.dictionary_at is None or physical != "BYTE_ARRAY" or name == "":
        return size
    body, stored = chunk.dictionary_at
    import pyarrow as pa

    f.seek(body)
    data = f.read(stored)
    try:
        plain = (data if name is None else
                 pa.Codec(name).decompress(data, decompressed_size=size).to_pybytes())
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DamagedPages(f"its dictionary page does not decompress ({exc})") from None
    largest, at = 0, 0
    for _ in range(_MAX_SCANNED):  # PLAIN byte arrays: a 4-byte length, then the bytes
        if at + 4 > len(plain):
            return min(largest, size)
        (n,) = struct.unpack_from("<I", plain, at)
        largest, at = max(largest, n), at + 4 + n
    return size  # too many values to scan: the page's size bounds them


# -- the Thrift compact protocol, as much as a page header needs ------------------------------


class _Short(Exception):
    """The header goes on past the bytes read so far."""


def _header(f: IO[bytes], at: int,
            end: int) -> tuple[int, int, int, tuple[int, int], int]:
    """The page header at byte ``at``: its page type, uncompressed and compressed sizes,
    its data page's encoding and values (-1: none) and the header's own length."""
    want = 256
    while True:
        f.seek(at)
        buf = f.read(min(want, end - at))
        try:
            fields, length = _page_header(buf)
            break
        except _Short:
            if len(buf) < want or want >= MAX_HEADER_BYTES:
                raise DamagedPages(f"the page header at byte {at} is cut short or over "
                                   f"{MAX_HEADER_BYTES} bytes") from None
            want *= 4
        except (IndexError, struct.error):
            raise DamagedPages(f"the page header at byte {at} is damaged") from None
    kind, size, stored = fields.get(1), fields.get(2), fields.get(3)
    if kind is None or size is None or stored is None or size < 0 or stored < 0:
        raise DamagedPages(f"the page header at byte {at} has no sizes")
    return kind, size, stored, (fields.get(-1, -1), fields.get(-2, -1)), length


def _page_header(buf: bytes) -> tuple[dict[int, int], int]:
    """The integer fields 1-3 of a PageHeader (type, uncompressed and compressed size), the
    encoding and value count of its data page header (field 5, DataPageHeader: fields 2
    and 1; field 8, DataPageHeaderV2: fields 4 and 1; under the keys -1 and -2), and the
    header's length."""
    fields: dict[int, int] = {}
    pos, last = 0, 0
    while True:
        fid, ttype, pos, last = _field(buf, pos, last)
        if ttype == 0:
            return fields, pos
        if fid in (1, 2, 3) and ttype == 5:
            value, pos = _varint(buf, pos)
            fields[fid] = _zigzag(value)
        elif fid in (5, 8) and ttype == 12:
            inner, pos = _struct(buf, pos, 1)
            fields[-1], fields[-2] = inner.get(2 if fid == 5 else 4, -1), inner.get(1, -1)
        else:
            pos = _skip(buf, pos, ttype, 1)


def _field(buf: bytes, pos: int, last: int) -> tuple[int, int, int, int]:
    if pos >= len(buf):
        raise _Short
    byte = buf[pos]
    pos += 1
    if byte == 0:
        return 0, 0, pos, last
    ttype, delta = byte & 0x0F, byte >> 4
    if delta:
        fid = last + delta
    else:
        raw, pos = _varint(buf, pos)
        fid = _zigzag(raw)
    return fid, ttype, pos, fid


def _struct(buf: bytes, pos: int, depth: int) -> tuple[dict[int, int], int]:
    """A struct's i32 fields (the others skipped) and the position after it."""
    if depth > _MAX_DEPTH:
        raise DamagedPages("a page header nested too deep")
    values: dict[int, int] = {}
    last = 0
    while True:
        fid, ttype, pos, last = _field(buf, pos, last)
        if ttype == 0:
            return values, pos
        if ttype == 5:
            raw, pos = _varint(buf, pos)
            values[fid] = _zigzag(raw)
        else:
            pos = _skip(buf, pos, ttype, depth + 1)


def _skip(buf: bytes, pos: int, ttype: int, depth: int) -> int:
    if ttype in (1, 2):  # a boolean field: its value is its type
        return pos
    if ttype == 3:
        return _need(buf, pos + 1)
    if ttype in (4, 5, 6):
        return _varint(buf, pos)[1]
    if ttype == 7:
        return _need(buf, pos + 8)
    if ttype == 8:
        n, pos = _varint(buf, pos)
        return _need(buf, pos + n)
    if ttype in (9, 10):
        if pos >= len(buf):
            raise _Short
        head = buf[pos]
        pos += 1
        count, inner = head >> 4, head & 0x0F
        if count == 15:
            count, pos = _varint(buf, pos)
        if inner in (1, 2):  # booleans in a list: a byte each
            return _need(buf, pos + count)
        for _ in range(count):
            pos = _skip(buf, pos, inner, depth + 1)
        return pos
    if ttype == 11:
        count, pos = _varint(buf, pos)
        if count == 0:
            return pos
        if pos >= len(buf):
            raise _Short
        kinds = buf[pos]
        pos += 1
        for _ in range(count):
            pos = _skip(buf, pos, kinds >> 4, depth + 1)
            pos = _skip(buf, pos, kinds & 0x0F, depth + 1)
        return pos
    if ttype == 12:
        return _struct(buf, pos, depth)[1]
    raise DamagedPages(f"a page header holds a value of unknown type {ttype}")


def _need(buf: bytes, pos: int) -> int:
    if pos > len(buf):
        raise _Short
    return pos


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise _Short
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DamagedPages("a page header holds a number of more than 64 bits")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


__all__ = ["MAX_HEADER_BYTES", "Chunk", "DamagedPages", "dictionary_value_bytes", "read_chunk"]
