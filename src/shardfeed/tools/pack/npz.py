"""Rows of NumPy ``.npz`` archives, checked from the arrays' headers, read a row at a time.

An ``.npz`` is a zip archive of ``.npy`` members, one an array. Before a single value is
read, each member named (the image array, the label arrays) is checked from its header::

    member       header says                     checked
    image.npy    '|u1', (60000, 28, 28)          a plain number or text type (objects need
    label.npy    '<i8', (60000,)                 pickles: refused); as many rows as the
                                                 images; one row within MAX_ROW_BYTES; the
                                                 image array N×H×W[×C] with H×W within the
                                                 pixel limit; the member as long as its
                                                 header says

then the rows are streamed, a block of rows of each array at a time, so an archive of a
few megabytes that inflates to gigabytes takes a few megabytes of memory, never the whole
array. A file
that is not a zip archive (a single ``.npy`` or a pickle saved under an ``.npz`` name) is
refused by what it is. Nothing is unpickled; no message quotes the archive's bytes.

Determinism: the rows in array order, values as stored. Memory: a block of rows of each
array (:data:`CHUNK_BYTES`, or one row when a row is larger).
"""

from __future__ import annotations

import math
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from shardfeed.errors import FormatError, PackError
from shardfeed.format import npyfile
from shardfeed.tools.pack.rowfields import Row, RowFields

MAX_ROW_BYTES = 1 << 30
"""Largest row of any array read (1 GiB: the largest image row the default pixel limit
admits, 2^27 pixels of 4 channels of 16 bits)."""

CHUNK_BYTES = 4 << 20
"""Bytes of an array read at once (whole rows; one row when a row is larger)."""

_NPY = ".npy"
_SAVE = "save the arrays with numpy.savez(path, image=images, label=labels)"
_HEAD_BYTES = npyfile.MAX_HEADER_BYTES + 12
_TYPE_KINDS = "biufUS"  # bool, integers, floats, text, bytes


@dataclass(frozen=True, slots=True)
class _Array:
    """One array of an archive, as its header describes it."""

    key: str
    info: zipfile.ZipInfo
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    data_offset: int

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize


def npz_rows(paths: Sequence[str], fields: RowFields, *, max_pixels: int) -> Iterator[Row]:
    """The rows of the archives ``paths``: the image array's (``fields.image``) with the
    label arrays' (``fields.labels``; by default every other array, which must then be as
    long), each a :class:`Row` naming the file and row."""
    for path in paths:
        _refuse_other_files(path)
        try:
            with zipfile.ZipFile(path) as archive:
                arrays = _checked_arrays(archive, path, fields, max_pixels)
                yield from _streamed_rows(archive, path, arrays)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError,
                RuntimeError) as exc:  # damaged, truncated, encrypted, odd compression
            raise PackError(f"cannot read the .npz archive '{path}': {exc}; the archive is "
                            f"damaged or not NumPy's: {_SAVE}") from None


def _refuse_other_files(path: str) -> None:
    """A file that is not a zip archive, named by what it is (NumPy's own test: the zip
    signature at byte 0)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise PackError(f"cannot read '{path}': {exc.strerror or exc}; check the path") from None
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return
    if head.startswith(npyfile.MAGIC):
        what = ("a single NumPy array saved as .npy (numpy.save), not an .npz archive of named "
                "arrays")
    elif head[:1] == b"\x80":  # the PROTO opcode that starts every pickle since protocol 2
        what = "a Python pickle, not an .npz archive; pickles are never loaded (they can run code)"
    else:
        what = "not an .npz archive (no zip signature at byte 0)"
    raise PackError(f"'{path}' is {what}; {_SAVE}")


def _checked_arrays(archive: zipfile.ZipFile, path: str, fields: RowFields,
                    max_pixels: int) -> list[_Array]:
    """The image array, then the label arrays, each checked from its header."""
    members = {info.filename[:-len(_NPY)]: info for info in archive.infolist()
               if info.filename.endswith(_NPY)}
    keys = list(members)
    if fields.image not in members:
        raise PackError(f"{path} has no array '{fields.image}' (it holds "
                        f"{', '.join(keys) or 'no arrays'}); name the image array with "
                        "--image-column (RowFields(image=...))")
    wanted = [k for k in (fields.labels if fields.labels is not None else keys)
              if k != fields.image]
    missing = [k for k in wanted if k not in members]
    if missing:
        raise PackError(f"{path} has no array {missing[0]!r} (it holds {', '.join(keys)})")
    arrays = [_header(archive, path, k, members[k]) for k in (fields.image, *wanted)]
    images = arrays[0]
    _check_images(path, images, max_pixels)
    for array in arrays:
        _check_sizes(path, array)
    for array in arrays[1:]:
        if array.shape[0] != images.shape[0]:
            hint = ("" if fields.labels is not None else "; name the label arrays with "
                    "--label-columns (RowFields(labels=[...]))")
            raise PackError(f"{path}: '{images.key}' has {images.shape[0]} rows, "
                            f"'{array.key}' {array.shape[0]}{hint}")
    return arrays


def _header(archive: zipfile.ZipFile, path: str, key: str, info: zipfile.ZipInfo) -> _Array:
    """The array ``key`` as its header describes it; refused unless its type is plain and it
    has rows in C order."""
    where = f"{path}: the array '{key}'"
    with archive.open(info) as stream:
        head = stream.read(_HEAD_BYTES)
    try:
        header = npyfile.parse_header(head, path=path, what=f"an .npz archive whose '{key}' "
                                      "is a NumPy array", fix=_SAVE)
    except FormatError as exc:
        raise PackError(str(exc)) from None
    if header.descr.lstrip("|<>=").startswith("O"):
        raise PackError(f"{where} holds Python objects, which are not read (no pickles); save "
                        "it as numbers or bytes")
    try:
        dtype = np.dtype(header.descr)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in _TYPE_KINDS or dtype.itemsize == 0:
        raise PackError(f"{where} holds values of type {header.descr!r}; pack reads numbers, "
                        "booleans, text and bytes: save it as one of those")
    shape = header.shape
    if not shape:
        raise PackError(f"{where} is a single value, not an array of rows")
    if header.fortran_order and len(shape) > 1:
        raise PackError(f"{where} is stored in Fortran (column) order, which cannot be read a "
                        "row at a time; save numpy.ascontiguousarray(array) instead")
    return _Array(key, info, dtype, shape, header.data_offset)


def _check_sizes(path: str, array: _Array) -> None:
    """A row within MAX_ROW_BYTES; the member as long as the header says."""
    where = f"{path}: the array '{array.key}'"
    shape, dtype = array.shape, array.dtype
    if array.row_bytes > MAX_ROW_BYTES:
        raise PackError(f"{where} has rows of {_shape(shape[1:])} {dtype} values "
                        f"({array.row_bytes} bytes), over the {MAX_ROW_BYTES}-byte limit of "
                        "one row; it is not an array of images or labels pack can read")
    nbytes = math.prod(shape) * dtype.itemsize
    if array.info.file_size != array.data_offset + nbytes:
        raise PackError(f"{where} claims {_shape(shape)} {dtype} values ({nbytes} bytes) but "
                        f"its member holds {array.info.file_size - array.data_offset}; the "
                        f"archive is damaged: {_SAVE}")


def _check_images(path: str, images: _Array, max_pixels: int) -> None:
    """The image array has images small enough, before any is read."""
    shape = images.shape
    if len(shape) >= 3 and shape[1] * shape[2] > max_pixels:
        raise PackError(
            f"{path}: the image array '{images.key}' holds {shape[0]} images of "
            f"{shape[1]}×{shape[2]} pixels ({_shape(shape)} {images.dtype}, "
            f"{math.prod(shape) * images.dtype.itemsize} bytes), over max_pixels={max_pixels}"
            "; raise max_pixels (--max-pixels) if the images are meant to be that large")


def _streamed_rows(archive: zipfile.ZipFile, path: str, arrays: list[_Array]) -> Iterator[Row]:
    """The rows, read a block of rows of each array at a time (at most CHUNK_BYTES, or one
    row); the members' ends (and CRCs) checked last."""
    streams: list[IO[bytes]] = []
    try:
        for array in arrays:
            stream = archive.open(array.info)
            streams.append(stream)
            stream.read(array.data_offset)  # past the header, checked already
        total = arrays[0].shape[0]
        step = max(1, min(CHUNK_BYTES // max(1, a.row_bytes) for a in arrays))
        for start in range(0, total, step):
            count = min(step, total - start)
            blocks = [_rows(s, a, start, count, path) for a, s in zip(arrays, streams)]
            for j in range(count):
                values = {a.key: b[j] for a, b in zip(arrays, blocks)}  # as np.load's
                yield Row(values, where=f"'{path}' (array '{arrays[0].key}'), row {start + j}")
        for array, stream in zip(arrays, streams):
            if stream.read(1):  # pragma: no cover - the header and member size agree
                raise PackError(f"{path}: the array '{array.key}' holds more than its "
                                f"header says; {_SAVE}")
    finally:
        for stream in streams:
            stream.close()


def _rows(stream: IO[bytes], array: _Array, start: int, count: int, path: str) -> np.ndarray:
    """Rows ``start`` to ``start + count`` of ``array``, read from ``stream``."""
    nbytes = count * array.row_bytes
    data = stream.read(nbytes)
    if len(data) != nbytes:
        raise PackError(f"{path}: the array '{array.key}' ends before row "
                        f"{start + len(data) // max(1, array.row_bytes)} of {array.shape[0]}; "
                        f"the archive is truncated or damaged: {_SAVE}")
    block = np.frombuffer(data, dtype=array.dtype).reshape(count, *array.shape[1:])
    return block if block.dtype.isnative else block.astype(block.dtype.newbyteorder("="))


def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(str(n) for n in shape) or "single"


__all__ = ["MAX_ROW_BYTES", "npz_rows"]
