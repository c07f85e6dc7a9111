"""Rows into records: what ``pack`` packs when its input is data, not files on disk.

A *row* is a mapping of column names to values, one per record; every input kind becomes an
iterator of rows (:func:`rows_of`):

==================================  ======================================================
NumPy arrays                        ``(images, labels)``: images N×H×W[×C], labels N or
                                    N×K (or a dict of such columns)
NumPy ``.npz`` archive(s)           the image array's rows with the label arrays' (no
                                    pickles)
an iterable of dicts                used as it is (a generator too)
Arrow table / Parquet file(s)       one row a table row (``pyarrow``)
WebDataset tar shard(s)             one row a sample: members sharing a key, by extension
a Hugging Face ``datasets.Dataset``  its ``Image`` feature read undecoded (``datasets``)
==================================  ======================================================

:class:`RowFields` says which column is the image, which are labels and which is the name.
An image value may be encoded bytes (stored as they are, as ``pack --mode embedded`` does),
a pixel array (encoded as PNG or JPEG, or stored raw: ``RowFields.encode``), a path, or
``{"bytes": ..., "path": ...}`` (Arrow's and Hugging Face's image struct). Labels map to
features as CSV columns do: integers and booleans to int64, floats to float32, text to bytes,
lists and arrays element-wise; a null (None) is refused by name.

A path in data is read only under the root the user names (``RowFields(root=...)``,
``pack(..., root=...)``, ``--root``), never because the data says so: without a root it is
refused, and with one it must resolve inside it (no ``..`` out, no absolute path elsewhere,
no symbolic link out: :func:`shardfeed.storage.paths.contained`). A row knows where it came
from (:class:`Row`: the file and row), and every message names it.

Determinism: a record's bytes are a function of its row and the fields only.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.format.example import encode_example
from shardfeed.tools.pack.rowfields import Row, RowFields
from shardfeed.tools.pack.tars import TAR_SUFFIXES, is_tar, tar_rows, tars_name
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

if TYPE_CHECKING:
    from shardfeed.tools.pack.tables import TableRows

DATA_SUFFIXES = (".parquet", *TAR_SUFFIXES, ".npz")
"""Files ``pack`` reads as rows (Parquet tables, WebDataset tar shards, NumPy ``.npz``
archives of arrays)."""

def row_payload(row: Mapping[str, Any], fields: RowFields, *, where: str,
                max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """The serialized Example of one row; PackError naming the row (``row.where`` for a
    :class:`Row`, else ``where``) and the column for a bad value."""
    if isinstance(row, Row):
        where = row.where
    if fields.image not in row:
        raise PackError(f"{where} has no image column '{fields.image}' (columns: "
                        f"{', '.join(map(str, row))}); name it with RowFields(image=...)")
    features: dict[str, Any] = {}
    for column in fields.label_columns(row):
        if column not in row:
            raise PackError(f"{where} has no label column '{column}'")
        features[column] = _label_value(row[column], column, where)
    if fields.name is not None:
        name = row.get(fields.name)
        if name is None:
            raise PackError(f"{where} has no name column '{fields.name}'")
        features[spec.IMAGE_FILENAME] = str(name)
    features.update(_image_features(row[fields.image], fields, where, max_pixels))
    return encode_example(features)


def _label_value(value: Any, column: str, where: str) -> Any:
    if value is None:
        raise PackError(f"{where}, column '{column}': the value is null (None), and a record "
                        "has no null; fill the column's nulls, or leave the column out of the "
                        "labels (RowFields(labels=[...]); on the command line --label-columns)")
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return np.asarray([int(value)], dtype=np.int64)
    if isinstance(value, (float, np.floating)):
        return np.asarray([float(value)], dtype=np.float32)
    if isinstance(value, (str, bytes)):
        return value
    try:
        array = np.asarray(value)
    except ValueError:  # NumPy refuses lists of lists of different lengths
        raise PackError(f"{where}, column '{column}': a nested list whose inner lists differ "
                        "in length; a label is a number, text, or a list (or equal-length "
                        "lists) of either: pad the inner lists to one length, or leave the "
                        "column out of the labels (RowFields(labels=[...]); --label-columns)"
                        ) from None
    if array.dtype.kind in "biu":
        return array.astype(np.int64).ravel()
    if array.dtype.kind == "f":
        return array.astype(np.float32).ravel()
    if array.dtype.kind in "US" and array.ndim == 1:
        return [str(v) for v in array.tolist()]
    nulls = " with nulls (None)" if array.dtype == object and None in array.ravel() else ""
    raise PackError(f"{where}, column '{column}': a {type(value).__name__}{nulls} "
                    f"({array.dtype}); a label is a number, text, or a list of either: fix the "
                    "column, or leave it out of the labels (RowFields(labels=[...]); "
                    "--label-columns)")


def _image_features(value: Any, fields: RowFields, where: str,
                    max_pixels: int) -> dict[str, Any]:
    from shardfeed.tools.pack.record import image_format, image_shape

    where = f"{where}, column '{fields.image}'"
    if isinstance(value, Mapping):  # Arrow's and Hugging Face's {"bytes", "path"}
        data, path = value.get("bytes"), value.get("path")
        value = data if data is not None else path
    if value is None:
        raise PackError(f"{where}: the image is null (no bytes, no path); fill it or leave "
                        "the row out")
    if isinstance(value, (str, os.PathLike)):
        full = _image_path(os.fspath(value), fields.root, where)
        where = f"{where} (the file '{full}')"
        value = _read_image_file(full, where)
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        kind = image_format(data)
        if kind == "other":  # the bytes are not quoted: they may be a file's contents
            raise PackError(f"{where}: the {len(data)} bytes are no image format shardfeed "
                            "reads (JPEG, PNG, BMP, GIF, WebP, TIFF, PNM: none of their "
                            "signatures is at byte 0); give the encoded image")
        height, width, channels = image_shape(data, where=where, max_pixels=max_pixels)
        return {spec.IMAGE_ENCODED: data, spec.IMAGE_FORMAT: kind, spec.IMAGE_HEIGHT: height,
                spec.IMAGE_WIDTH: width, spec.IMAGE_CHANNELS: channels}
    if hasattr(value, "__array_interface__") or isinstance(value, np.ndarray):
        return _pixels_features(np.asarray(value), fields, where, max_pixels)
    raise PackError(f"{where}: the image is a {type(value).__name__}; give encoded bytes, a "
                    "pixel array, a path, or {'bytes': ..., 'path': ...}")


_ROOT_FIX = ("pass root= (RowFields(root=...) or pack(..., root=...); on the command line "
             "--root) with the folder that holds the images")


def _image_path(path: str, root: str | None, where: str) -> str:
    """The file an image path in the data names, inside ``root``; refused without a root
    (data never chooses which local file is read) or when it leads out of the root."""
    from shardfeed.storage.paths import contained
    from shardfeed.tools.pack.errors import UnsafeRowPathError

    if root is None:
        raise UnsafeRowPathError(
            f"{where}: the image is given as the path {path!r:.300}; image paths in data are "
            f"read only under a folder you name: {_ROOT_FIX}", named=path)
    return contained(root, path, where=where, what="image", error=UnsafeRowPathError,
                     opt_in=f"name a root that holds it: {_ROOT_FIX}")


def _read_image_file(full: str, where: str) -> bytes:
    """The bytes of a regular file (opened without blocking: a FIFO is refused, not
    waited on)."""
    try:
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PackError(f"{where}: cannot read the image file: {exc.strerror or exc}; check "
                        "the path and the root") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise PackError(f"{where}: not a regular file; an image path names an image "
                            "file")
        return f.read()


def _pixels_features(pixels: np.ndarray, fields: RowFields, where: str,
                     max_pixels: int) -> dict[str, Any]:
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3, 4)):
        raise PackError(f"{where}: pixels of shape {pixels.shape}; give H×W or H×W×C "
                        "(C = 1, 3 or 4)")
    if pixels.dtype not in (np.uint8, np.uint16):
        raise PackError(f"{where}: pixels of type {pixels.dtype}; give uint8 (or uint16 "
                        "with encode='png')")
    height, width = int(pixels.shape[0]), int(pixels.shape[1])
    if height * width > max_pixels:
        raise PackError(f"{where}: {height}×{width} pixels is over max_pixels={max_pixels}")
    channels = 1 if pixels.ndim == 2 else int(pixels.shape[2])
    out: dict[str, Any] = {spec.IMAGE_HEIGHT: height, spec.IMAGE_WIDTH: width,
                           spec.IMAGE_CHANNELS: channels}
    if fields.encode != "png" and pixels.dtype != np.uint8:
        raise PackError(f"{where}: {pixels.dtype} pixels are kept by encode='png' only")
    if fields.encode == "raw":
        out[spec.IMAGE_RAW] = np.ascontiguousarray(pixels).tobytes()
        return out
    out[spec.IMAGE_ENCODED] = _encode(pixels, fields)
    out[spec.IMAGE_FORMAT] = fields.encode
    return out


def _encode(pixels: np.ndarray, fields: RowFields) -> bytes:
    import cv2

    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if fields.encode == "jpeg" and pixels.ndim == 3 and pixels.shape[2] == 4:
        pixels = pixels[:, :, :3]  # JPEG has no alpha
    if pixels.ndim == 3:  # OpenCV writes BGR(A); the pixels are RGB(A)
        code = cv2.COLOR_RGB2BGR if pixels.shape[2] == 3 else cv2.COLOR_RGBA2BGRA
        pixels = cv2.cvtColor(np.ascontiguousarray(pixels), code)
    if fields.encode == "png":
        ok, buf = cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    else:
        ok, buf = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, fields.quality])
    if not ok:  # pragma: no cover - OpenCV encodes every uint8/uint16 array above
        raise PackError(f"OpenCV could not encode a {pixels.shape} image as {fields.encode}")
    return bytes(buf)


# -- input kinds -------------------------------------------------------------------------


def rows_of(source: Any, fields: RowFields, *,
            max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[Iterator[dict[str, Any]], str]:
    """The rows of ``source`` (see the module table) and a name for it in messages."""
    table = table_rows(source, fields, max_pixels=max_pixels)
    return table.rows, table.where


def table_rows(source: Any, fields: RowFields, *,
               max_pixels: int = DEFAULT_MAX_PIXELS) -> TableRows:
    """The rows of ``source`` (see the module table), each a :class:`Row` naming where it
    came from, with a name for the input and the class names it carries. ``max_pixels``
    bounds the images of an ``.npz`` archive before they are read, and sets the limits
    tables are read within (:class:`~shardfeed.tools.pack.limits.IngestLimits`)."""
    from shardfeed.tools.pack import tables
    from shardfeed.tools.pack.limits import IngestLimits
    from shardfeed.tools.pack.npz import npz_rows

    limits = IngestLimits.of(max_pixels)
    if isinstance(source, tuple) and source and isinstance(source[0], np.ndarray):
        return tables.TableRows(_array_rows(source, fields), "the arrays")
    kind = type(source).__module__.split(".")[0]
    if kind == "datasets" and hasattr(source, "features"):
        return tables.hf_rows(source, fields, limits=limits)
    if kind == "pyarrow":
        return tables.arrow_rows(source, limits)
    paths = paths_of(source)
    if paths is not None:
        many = len(paths) > 1
        if len(paths) == 1 and tables.data_folder(paths[0]) is not None:
            return tables.folder_rows(paths[0], fields, limits)
        if all(p.endswith(".parquet") for p in paths):
            return tables.parquet_rows([(p, {}) for p in paths], name="the files",
                                       limits=limits)
        if all(is_tar(p) for p in paths):
            where = tars_name(paths)
            return tables.TableRows(
                located(tar_rows(paths, fields, max_pixels=max_pixels), where), where)
        if all(p.endswith(".npz") for p in paths):
            where = f"{len(paths)} files" if many else paths[0]
            return tables.TableRows(npz_rows(paths, fields, max_pixels=max_pixels), where)
        raise ValueError(f"cannot pack {paths[0]!r} as rows: give .parquet, "
                         f"{', '.join(TAR_SUFFIXES)} or .npz files, or a folder of Parquet "
                         "files")
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes, Mapping)):
        return tables.TableRows(located(source, "the rows"), "the rows")
    raise TypeError(f"cannot pack a {type(source).__name__}: give a folder, a CSV, arrays, "
                    "rows (dicts), an Arrow table, Parquet or WebDataset tar files, or a "
                    "Hugging Face dataset")


def is_data(paths: Sequence[str]) -> bool:
    """Whether ``pack`` reads ``paths`` as rows: files ending in :data:`DATA_SUFFIXES`, or
    one folder of Parquet files or of a Hugging Face dataset (``save_to_disk``)."""
    from shardfeed.tools.pack.tables import data_folder

    if all(p.endswith(DATA_SUFFIXES) for p in paths):
        return True
    return len(paths) == 1 and data_folder(paths[0]) is not None


def located(rows: Iterable[Any], name: str) -> Iterator[Row]:
    """``rows`` as :class:`Row` objects naming ``name`` and their position (a row that is
    one already keeps its own)."""
    for i, row in enumerate(rows):
        if isinstance(row, Row):
            yield row
        elif isinstance(row, Mapping):
            yield Row(row, where=f"{name}, row {i}")
        else:
            raise TypeError(f"{name}, row {i} is a {type(row).__name__}; rows are dicts of "
                            "column names to values")


def paths_of(source: Any) -> list[str] | None:
    """``source`` as a list of paths, or None when it is not one path or a list of them."""
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(s, (str, os.PathLike)) for s in source):
        return [os.fspath(s) for s in source]
    return None


def _array_rows(source: tuple[Any, ...], fields: RowFields) -> Iterator[Row]:
    images = source[0]
    labels: Any = source[1] if len(source) > 1 else {}
    if not isinstance(labels, Mapping):
        labels = {fields.label or "label": labels}
    columns = {k: np.asarray(v) for k, v in labels.items()}
    for k, v in columns.items():
        if len(v) != len(images):
            raise PackError(f"the arrays differ in length: {len(images)} images, {len(v)} "
                            f"values of '{k}'")
    for i in range(len(images)):
        row: dict[str, Any] = {fields.image: images[i]}
        row.update((k, v[i]) for k, v in columns.items())
        yield Row(row, where=f"the arrays, row {i}")


__all__ = ["DATA_SUFFIXES", "Row", "RowFields", "is_data", "located", "paths_of",
           "row_payload", "rows_of", "table_rows"]
