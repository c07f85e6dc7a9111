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
a pixel array (encoded as PNG or JPEG, or stored raw: ``RowFields.encode``), a path (read),
or ``{"bytes": ..., "path": ...}`` (Arrow's and Hugging Face's image struct). Labels map to
features as CSV columns do: integers and booleans to int64, floats to float32, text to bytes,
lists and arrays element-wise.

Determinism: a record's bytes are a function of its row and the fields only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.format.example import encode_example
from shardfeed.tools.pack.tars import TAR_SUFFIXES, is_tar, tar_rows, tars_name
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

Encode = Literal["png", "jpeg", "raw"]

DATA_SUFFIXES = (".parquet", *TAR_SUFFIXES, ".npz")
"""Files ``pack`` reads as rows (Parquet tables, WebDataset tar shards, NumPy ``.npz``
archives of arrays)."""

@dataclass(frozen=True, slots=True)
class RowFields:
    """How rows become records.

    ``image``: the image column. ``labels``: the label columns (None: every column but the
    image and the name). ``label``: the column a loader returns as the label (default: the
    first label column). ``name``: the column stored as ``image/filename`` (None: none).
    ``encode``: how pixel arrays are stored: ``png`` (lossless, 8 or 16 bits), ``jpeg``
    (``quality``), or ``raw`` uint8 pixels. ``root``: the folder relative paths are read from.
    """

    image: str = "image"
    labels: Sequence[str] | None = None
    label: str | None = None
    name: str | None = None
    encode: Encode = "png"
    quality: int = 95
    root: str | None = None

    def __post_init__(self) -> None:
        if self.encode not in ("png", "jpeg", "raw"):
            raise ValueError(f"encode must be 'png', 'jpeg' or 'raw', got {self.encode!r}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")

    def label_columns(self, row: Mapping[str, Any]) -> list[str]:
        if self.labels is not None:  # a row's mask (a tar's x.seg.png) is kept too
            masks = (spec.MASK_ENCODED, spec.MASK_FORMAT)
            return [*self.labels, *(k for k in masks if k in row and k not in self.labels)]
        return [k for k in row if k not in (self.image, self.name) and not k.startswith("__")]


def row_payload(row: Mapping[str, Any], fields: RowFields, *, where: str,
                max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """The serialized Example of one row; PackError naming ``where`` for a bad value."""
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
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return np.asarray([int(value)], dtype=np.int64)
    if isinstance(value, (float, np.floating)):
        return np.asarray([float(value)], dtype=np.float32)
    if isinstance(value, (str, bytes)):
        return value
    array = np.asarray(value)
    if array.dtype.kind in "biu":
        return array.astype(np.int64).ravel()
    if array.dtype.kind == "f":
        return array.astype(np.float32).ravel()
    if array.dtype.kind in "US" and array.ndim == 1:
        return [str(v) for v in array.tolist()]
    raise PackError(f"{where}: column '{column}' holds {type(value).__name__} "
                    f"({array.dtype}); a label is a number, text, or a list of either")


def _image_features(value: Any, fields: RowFields, where: str,
                    max_pixels: int) -> dict[str, Any]:
    from shardfeed.tools.pack.record import image_format, image_shape

    if isinstance(value, Mapping):  # Arrow's and Hugging Face's {"bytes", "path"}
        data, path = value.get("bytes"), value.get("path")
        value = data if data is not None else path
    if isinstance(value, (str, os.PathLike)):
        value = _read_path(os.fspath(value), fields.root, where)
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        kind = image_format(data)
        if kind == "other":
            raise PackError(f"{where}: the image bytes are not an image format shardfeed "
                            f"reads (first bytes {data[:8]!r})")
        height, width, channels = image_shape(data, where=where, max_pixels=max_pixels)
        return {spec.IMAGE_ENCODED: data, spec.IMAGE_FORMAT: kind, spec.IMAGE_HEIGHT: height,
                spec.IMAGE_WIDTH: width, spec.IMAGE_CHANNELS: channels}
    if hasattr(value, "__array_interface__") or isinstance(value, np.ndarray):
        return _pixels_features(np.asarray(value), fields, where, max_pixels)
    raise PackError(f"{where}: the image is a {type(value).__name__}; give encoded bytes, a "
                    "pixel array, a path, or {'bytes': ..., 'path': ...}")


def _read_path(path: str, root: str | None, where: str) -> bytes:
    full = path if os.path.isabs(path) or root is None else os.path.join(root, path)
    try:
        with open(full, "rb") as f:
            return f.read()
    except OSError as exc:
        raise PackError(f"{where}: cannot read the image file '{full}': "
                        f"{exc.strerror or exc}") from None


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


def rows_of(source: Any, fields: RowFields) -> tuple[Iterator[dict[str, Any]], str]:
    """The rows of ``source`` (see the module table) and a name for it in messages."""
    if isinstance(source, tuple) and source and isinstance(source[0], np.ndarray):
        return _array_rows(source, fields), "the arrays"
    kind = type(source).__module__.split(".")[0]
    if kind == "datasets" and hasattr(source, "features"):
        return _hf_rows(source, fields), "the Hugging Face dataset"
    if kind == "pyarrow":
        return _arrow_rows([source]), "the Arrow table"
    paths = paths_of(source)
    if paths is not None:
        if all(p.endswith(".parquet") for p in paths):
            return _parquet_rows(paths), paths[0] if len(paths) == 1 else f"{len(paths)} files"
        if all(is_tar(p) for p in paths):
            return tar_rows(paths, fields), tars_name(paths)
        if all(p.endswith(".npz") for p in paths):
            return _npz_rows(paths, fields), paths[0] if len(paths) == 1 else f"{len(paths)} files"
        raise ValueError(f"cannot pack {paths[0]!r} as rows: give .parquet, "
                         f"{', '.join(TAR_SUFFIXES)} or .npz files")
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes, Mapping)):
        return (dict(row) for row in source), "the rows"
    raise TypeError(f"cannot pack a {type(source).__name__}: give a folder, a CSV, arrays, "
                    "rows (dicts), an Arrow table, Parquet or WebDataset tar files, or a "
                    "Hugging Face dataset")


def paths_of(source: Any) -> list[str] | None:
    """``source`` as a list of paths, or None when it is not one path or a list of them."""
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(s, (str, os.PathLike)) for s in source):
        return [os.fspath(s) for s in source]
    return None


def _array_rows(source: tuple[Any, ...], fields: RowFields) -> Iterator[dict[str, Any]]:
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
        yield row


def _npz_rows(paths: Sequence[str], fields: RowFields) -> Iterator[dict[str, Any]]:
    """The rows of NumPy ``.npz`` archives: the image array's rows with the label arrays'
    (``fields.labels``; by default every other array, which must then be as long). Read
    without pickles: an archive of object arrays is refused."""
    for path in paths:
        with np.load(path, allow_pickle=False) as archive:
            keys = list(archive.files)
            if fields.image not in keys:
                raise PackError(f"{path} has no array '{fields.image}' (it holds "
                                f"{', '.join(keys)}); name the image array with "
                                "--image-column (RowFields(image=...))")
            wanted = [k for k in (fields.labels if fields.labels is not None else keys)
                      if k != fields.image]
            missing = [k for k in wanted if k not in keys]
            if missing:
                raise PackError(f"{path} has no array {missing[0]!r} (it holds "
                                f"{', '.join(keys)})")
            images = _archive_array(archive, path, fields.image)
            columns = {k: _archive_array(archive, path, k) for k in wanted}
        other = {k: len(v) for k, v in columns.items() if len(v) != len(images)}
        if other:
            k, n = next(iter(other.items()))
            hint = ("" if fields.labels is not None else "; name the label arrays with "
                    "--label-columns (RowFields(labels=[...]))")
            raise PackError(f"{path}: '{fields.image}' has {len(images)} rows, '{k}' {n}{hint}")
        yield from _array_rows((images, columns), fields)


def _archive_array(archive: Any, path: str, key: str) -> np.ndarray:
    try:
        value = archive[key]
    except ValueError as exc:  # object arrays need pickles: never loaded
        raise PackError(f"{path}: the array '{key}' holds Python objects, which are not "
                        f"read (no pickles); save it as numbers or bytes: {exc}") from None
    if value.ndim == 0:
        raise PackError(f"{path}: '{key}' is a single value, not an array of rows")
    return np.asarray(value)


def _arrow_rows(tables: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for table in tables:
        for batch in table.to_batches(max_chunksize=1024):
            yield from batch.to_pylist()


def _parquet_rows(paths: Sequence[str]) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("packing Parquet files needs pyarrow: pip install "
                          "'shardfeed[arrow]'") from None
    for path in paths:
        with pq.ParquetFile(path) as f:
            for batch in f.iter_batches(batch_size=1024):
                yield from batch.to_pylist()


def _hf_rows(dataset: Any, fields: RowFields) -> Iterator[dict[str, Any]]:
    import datasets

    feature = dataset.features.get(fields.image)
    if isinstance(feature, datasets.Image) and feature.decode:
        dataset = dataset.cast_column(fields.image, datasets.Image(decode=False))
    for row in dataset:
        yield dict(row)


__all__ = ["DATA_SUFFIXES", "RowFields", "paths_of", "row_payload", "rows_of"]
