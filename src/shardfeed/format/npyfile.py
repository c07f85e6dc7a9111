"""The small ``.npy`` files of a dataset, read as untrusted input: ``.idx.npy`` offsets and the
``groups.npy`` / ``order.npy`` sidecars.

::

    \\x93NUMPY | major minor | header length | {'descr': '<u8', 'fortran_order': False,
    6 bytes    | 2 bytes     | 2 (v1) or 4   |  'shape': (n,), }  + spaces + newline | n values

NumPy's own loader evaluates the header as a Python literal, so damaged bytes surface as
tokenizer, syntax or recursion errors, and a shape it believes is allocated before the data
is looked at. Here the header is matched against the one shape these files have (a 1-D
array of a plain little-endian number type named in ``dtypes``), the data length is checked
against it (so the count is bounded by the file's size before anything is allocated), and
the values are then memory-mapped or viewed in place. Every failure is a
:class:`~shardfeed.errors.FormatError` naming the file. Nothing is ever unpickled.

:func:`parse_header` reads the header of any ``.npy`` the same way (any shape, any type
string), for callers that check what it claims before reading a value: ``pack`` of the
arrays of an ``.npz`` archive, whose members may claim gigabytes.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from shardfeed.errors import FormatError

MAGIC = b"\x93NUMPY"
MAX_HEADER_BYTES = 1 << 16
"""Largest header accepted (NumPy writes 64 to 128 bytes for a 1-D array)."""
_PREFIX_BYTES = len(MAGIC) + 2
_ITEM = re.compile(
    r"'(descr|fortran_order|shape)'\s*:\s*('[^']{0,16}'|True|False|\([0-9 ,]{0,64}\))"
)
_SEPARATORS = re.compile(r"[\s,]*")


@dataclass(frozen=True, slots=True)
class NpyLayout:
    """Where the values of a checked ``.npy`` file are: ``count`` values of ``dtype`` from
    byte ``data_offset``."""

    dtype: np.dtype[np.generic]
    count: int
    data_offset: int


def _fail(path: str, what: str, reason: str, fix: str) -> FormatError:
    return FormatError(f"file '{path}' is not {what} ({reason}); {fix}")


def parse_layout(
    head: bytes, *, file_bytes: int, path: str, dtypes: Collection[str], what: str, fix: str
) -> NpyLayout:
    """Check the header at the start of a ``.npy`` file of ``file_bytes`` bytes (``head``
    holds at least its first ``MAX_HEADER_BYTES + 12`` bytes, or the whole file).

    ``dtypes``: the accepted type strings (``'<u8'``, ``'<i8'``, ...). ``what`` names the
    file's role in messages (``a binary index``), ``fix`` says what to do.
    """
    fields, data_offset = _header(head, file_bytes=file_bytes, path=path, what=what, fix=fix)
    descr, shape = fields["descr"].strip("'"), fields["shape"]
    if descr not in dtypes:
        raise _fail(path, what, f"values of type {descr!r}, expected "
                                f"{' or '.join(repr(d) for d in sorted(dtypes))}", fix)
    dims = [d.strip() for d in shape.strip("()").split(",") if d.strip()]
    if len(dims) != 1 or not dims[0].isdigit():
        raise _fail(path, what, f"shape {shape}, expected one dimension", fix)
    dtype = np.dtype(descr)
    count = int(dims[0])
    if data_offset + count * dtype.itemsize != file_bytes:
        raise _fail(
            path, what, f"its header says {count} values ({count * dtype.itemsize} bytes) "
            f"but {file_bytes - data_offset} bytes follow it", fix,
        )
    return NpyLayout(dtype=dtype, count=count, data_offset=data_offset)


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """What the header of a ``.npy`` file claims, unchecked against the data: the type
    string ``descr`` (``'|u1'``, ``'<f4'``, ``'|O'``...), the ``shape``, whether the values
    are in Fortran order, and where they start."""

    descr: str
    shape: tuple[int, ...]
    fortran_order: bool
    data_offset: int


def parse_header(head: bytes, *, path: str, what: str, fix: str) -> NpyHeader:
    """The header at the start of ``head`` (at least ``MAX_HEADER_BYTES + 12`` bytes of a
    ``.npy`` file, or all of it), of any shape and type, matched as text (never evaluated).
    The caller checks the type, the shape and the data length before reading any value.
    A structured type (a list of fields) is refused as not a plain array header."""
    fields, data_offset = _header(head, file_bytes=len(head), path=path, what=what, fix=fix)
    dims = [d.strip() for d in fields["shape"].strip("()").split(",") if d.strip()]
    if not all(d.isdigit() for d in dims):
        raise _fail(path, what, f"shape {fields['shape']} is not a tuple of sizes", fix)
    return NpyHeader(descr=fields["descr"].strip("'"), shape=tuple(int(d) for d in dims),
                     fortran_order=fields["fortran_order"] == "True", data_offset=data_offset)


def _header(
    head: bytes, *, file_bytes: int, path: str, what: str, fix: str
) -> tuple[dict[str, str], int]:
    """The three header entries as text, and where the data starts."""
    if head[:len(MAGIC)] != MAGIC or len(head) < _PREFIX_BYTES:
        raise _fail(path, what, "no NumPy .npy signature at byte 0", fix)
    major, minor = head[len(MAGIC)], head[len(MAGIC) + 1]
    if major == 1 and minor == 0:
        size_format, start = "<H", _PREFIX_BYTES + 2
    elif major in (2, 3) and minor == 0:
        size_format, start = "<I", _PREFIX_BYTES + 4
    else:
        raise _fail(path, what, f".npy format version {major}.{minor} is not 1.0, 2.0 or 3.0",
                    fix)
    if len(head) < start:
        raise _fail(path, what, f"the file ends inside its header at byte {len(head)}", fix)
    (header_bytes,) = struct.unpack_from(size_format, head, _PREFIX_BYTES)
    data_offset = start + header_bytes
    if header_bytes > MAX_HEADER_BYTES or data_offset > len(head):
        raise _fail(path, what, f"header of {header_bytes} bytes, the file has "
                                f"{file_bytes}", fix)
    fields = _header_fields(head[start:data_offset].decode("latin-1"))
    if fields is None:
        raise _fail(path, what, "its header is not a NumPy array header", fix)
    return fields, data_offset


def _header_fields(text: str) -> dict[str, str] | None:
    """The three entries of a header dict, or None if it holds anything else."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    inner = body[1:-1]
    fields: dict[str, str] = {}
    pos = 0
    for item in _ITEM.finditer(inner):
        if not _SEPARATORS.fullmatch(inner, pos, item.start()) or item.group(1) in fields:
            return None
        fields[item.group(1)] = item.group(2)
        pos = item.end()
    if not _SEPARATORS.fullmatch(inner, pos) or len(fields) != 3:
        return None
    return fields


def parse_vector(
    data: bytes, *, path: str, dtypes: Collection[str], what: str, fix: str
) -> np.ndarray:
    """The 1-D array held by the bytes of a ``.npy`` file (a read-only view of ``data``)."""
    layout = parse_layout(data, file_bytes=len(data), path=path, dtypes=dtypes, what=what,
                          fix=fix)
    return np.frombuffer(data, dtype=layout.dtype, count=layout.count,
                         offset=layout.data_offset)


def map_vector(
    path: str, *, dtypes: Collection[str], what: str, fix: str, mmap: bool = True
) -> np.ndarray:
    """The 1-D array of the local ``.npy`` file ``path``: memory-mapped read-only (``mmap``)
    or read into memory. Only the header is read before the data length is checked.

    ``OSError`` from opening the file (missing, unreadable) propagates unchanged.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe would block, a folder fail oddly
        raise _fail(path, what, "not a regular file", fix)
    with open(path, "rb") as f:
        file_bytes = os.fstat(f.fileno()).st_size
        head = f.read(MAX_HEADER_BYTES + _PREFIX_BYTES + 4)
        layout = parse_layout(head, file_bytes=file_bytes, path=path, dtypes=dtypes,
                              what=what, fix=fix)
        if layout.count == 0:
            return np.zeros(0, dtype=layout.dtype)
        nbytes = layout.count * layout.dtype.itemsize
        if not mmap:
            f.seek(layout.data_offset)
            data = f.read(nbytes)
            if len(data) != nbytes:  # the file shrank since its size was taken
                raise _fail(path, what, "the file changed while it was read", fix)
            return np.frombuffer(data, dtype=layout.dtype, count=layout.count)
    try:
        return np.memmap(path, dtype=layout.dtype, mode="r", offset=layout.data_offset,
                         shape=(layout.count,))
    except ValueError:  # the file shrank since its size was taken
        raise _fail(path, what, "the file changed while it was read", fix) from None
