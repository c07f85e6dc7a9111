"""Rows of tables: Arrow tables, Parquet files and folders of them, Hugging Face datasets
(objects and ``save_to_disk`` folders), and the class names they carry.

A folder ``pack`` reads as data (:func:`data_folder`)::

    export/                       a folder of Parquet files, as Spark, Ray and pyarrow
      _SUCCESS                    write them: every *.parquet under it in path order;
      part-00000.parquet          names starting with '.' or '_' skipped; a hive folder
      day=2024-05-01/part-0.parquet  (day=2024-05-01/) adds its value as a text column
    saved/                        Dataset.save_to_disk: read by hfsaved.load_saved, only
      state.json  dataset_info.json  data-00000-of-00001.arrow    files inside the folder

Class names: the names of a Hugging Face ``ClassLabel`` column (of a dataset, or kept in a
Parquet file's ``huggingface`` metadata, as ``Dataset.to_parquet`` and the Hub write it) are
kept as that label's vocabulary in the manifest, as a folder's class names are.

Every input is read within pack's limits (:mod:`~shardfeed.tools.pack.limits`): a Parquet
row group is planned from its page headers before it is read
(:mod:`~shardfeed.tools.pack.parquet`), and what a row of any table takes as Python values is
computed from its Arrow buffers before it is converted (a row over the limit of one record
refused by its row number); a Hugging Face dataset's slices are validated first
(:mod:`~shardfeed.tools.pack.hfrows`: a damaged ``.arrow`` file refused naming it).

Determinism: rows in file order (paths sorted), then table order. Memory: a batch of at
most :data:`~shardfeed.tools.pack.limits.BATCH_BYTES` of rows (one row when a row is
larger).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from shardfeed.errors import PackError
from shardfeed.tools.pack.limits import IngestLimits
from shardfeed.tools.pack.rowfields import Row, RowFields

DataFolder = Literal["parquet", "hf", "hf-dict"]

_BATCH_ROWS = 1024
_HF_FILES = ("state.json", "dataset_info.json")
_HF_DICT_FILE = "dataset_dict.json"
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                   ".pgm", ".jpe", ".jfif")


@dataclass(frozen=True, slots=True)
class TableRows:
    """The rows of a table input and what it says about its columns: ``vocabularies`` maps a
    ClassLabel column to its class names (for Parquet files, complete once ``rows`` is
    exhausted: each file's metadata is read as the file is opened)."""

    rows: Iterator[Row]
    where: str
    vocabularies: dict[str, list[str]] = field(default_factory=dict)


def data_folder(path: str) -> DataFolder | None:
    """What kind of data folder ``path`` is (see the module docstring), or None: not a
    folder, or a folder with images anywhere under it (the first image file found ends the
    search), which pack reads as a folder of images."""
    if not os.path.isdir(path):
        return None
    entries = set(os.listdir(path))
    if all(name in entries for name in _HF_FILES):
        return "hf"
    if _HF_DICT_FILE in entries:
        return "hf-dict"
    parquet = False
    for _folder, names, files in os.walk(path):
        names[:] = sorted(n for n in names if not n.startswith((".", "_")))
        if any(f.lower().endswith(_IMAGE_SUFFIXES) for f in files):
            return None
        parquet = parquet or any(f.endswith(".parquet") and not f.startswith((".", "_"))
                                 for f in files)
    return "parquet" if parquet else None


def folder_rows(folder: str, fields: RowFields,
                limits: IngestLimits | None = None) -> TableRows:
    """The rows of a data folder (:func:`data_folder` says it is one), within ``limits``
    (default: those of the default ``max_pixels``)."""
    kind = data_folder(folder)
    if kind == "hf":
        from shardfeed.tools.pack.hfsaved import load_saved

        dataset = load_saved(folder)  # reads only files inside the folder
        return hf_rows(dataset, fields, name=f"'{folder}' (a Hugging Face dataset)",
                       limits=limits)
    if kind == "hf-dict":
        splits = sorted(e for e in os.listdir(folder) if os.path.isdir(os.path.join(folder, e)))
        raise PackError(f"'{folder}' holds the splits of a Hugging Face DatasetDict "
                        f"({', '.join(splits)}); pack one split at a time: "
                        f"'{os.path.join(folder, splits[0] if splits else 'train')}'")
    return parquet_rows(_parquet_files(folder), name=f"'{folder}'", limits=limits)


def _parquet_files(folder: str) -> list[tuple[str, dict[str, str]]]:
    """Every Parquet file under ``folder`` in path order, with its hive partition values."""
    found = []
    for path, names, files in os.walk(folder):
        names[:] = sorted(n for n in names if not n.startswith((".", "_")))
        relative = os.path.relpath(path, folder)
        parts = [] if relative == "." else relative.split(os.sep)
        columns = {k: v for k, _, v in (p.partition("=") for p in parts if "=" in p)}
        found += [(os.path.join(path, f), columns) for f in sorted(files)
                  if f.endswith(".parquet") and not f.startswith((".", "_"))]
    return sorted(found)


def arrow_rows(table: Any, limits: IngestLimits | None = None) -> TableRows:
    """The rows of an Arrow table (or record batch), within ``limits``."""
    from shardfeed.tools.pack.arrowrows import bounded_rows

    limits = limits or IngestLimits.of()

    def rows() -> Iterator[Row]:
        at = 0
        for batch in table.to_batches(max_chunksize=_BATCH_ROWS):
            for row in bounded_rows(batch, limits=limits, where="the Arrow table, row {}".format,
                                    first=at):
                yield Row(row, where=f"the Arrow table, row {at}")
                at += 1

    return TableRows(rows(), "the Arrow table")


def parquet_rows(files: Sequence[tuple[str, dict[str, str]]], *, name: str,
                 limits: IngestLimits | None = None) -> TableRows:
    """The rows of Parquet ``files`` (each with its hive partition columns) in order, each
    naming its file and its row in that file, read within ``limits``
    (:mod:`~shardfeed.tools.pack.parquet`)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("packing Parquet files needs pyarrow: pip install "
                          "'shardfeed[arrow]'") from None
    from shardfeed.tools.pack.parquet import file_rows

    given = limits or IngestLimits.of()
    vocabularies: dict[str, list[str]] = {}

    def rows() -> Iterator[Row]:
        for path, partition in files:
            try:
                with pq.ParquetFile(path) as f:
                    _note_class_names(path, f.schema_arrow.metadata, vocabularies, given)
                    clash = sorted(set(partition) & set(f.schema_arrow.names))
                    if clash:
                        raise PackError(f"'{path}': the column '{clash[0]}' is also a "
                                        "partition folder name above it; rename one")
                    for at, row in enumerate(file_rows(f, path, given)):
                        row.update(partition)
                        yield Row(row, where=f"'{path}', row {at}")
            except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: a name
                # in the footer that is not UTF-8, and other damage pyarrow reports so
                raise PackError(f"cannot read the Parquet file '{path}' "
                                f"({type(exc).__name__}: {str(exc)[:200]}); check that it is "
                                "a complete Parquet file") from None

    where = files[0][0] if len(files) == 1 else f"{name} ({len(files)} Parquet files)"
    return TableRows(rows(), f"'{where}'" if len(files) == 1 else where, vocabularies)


def _note_class_names(path: str, metadata: dict[bytes, bytes] | None,
                      vocabularies: dict[str, list[str]], limits: IngestLimits) -> None:
    """Keep the ClassLabel names a Parquet file's Hugging Face metadata holds; files of one
    input that name different classes for a column are refused (a label would mean two
    things)."""
    text = (metadata or {}).get(b"huggingface", b"{}")
    if len(text) > limits.json_bytes:
        raise PackError(f"'{path}': its Hugging Face metadata (the footer's 'huggingface' "
                        f"key) holds {len(text)} bytes of JSON, over the limit of "
                        f"{limits.json_bytes} for one JSON value; {limits.raise_it}")
    try:
        info = json.loads(text)
        features = info["info"]["features"] if isinstance(info, dict) and "info" in info else {}
    except (ValueError, KeyError, TypeError, RecursionError):
        return  # metadata that is not the datasets library's: no class names to keep
    for column, feature in (features.items() if isinstance(features, dict) else ()):
        names = feature.get("names") if isinstance(feature, dict) else None
        if feature.get("_type") != "ClassLabel" or not isinstance(names, list) or not all(
                isinstance(n, str) for n in names):
            continue
        known = vocabularies.setdefault(column, names)
        if known != names:
            raise PackError(f"'{path}': the class names of column '{column}' differ from "
                            "those of the files before it; pack files of one dataset")


def hf_rows(dataset: Any, fields: RowFields, *, name: str = "the Hugging Face dataset",
            limits: IngestLimits | None = None) -> TableRows:
    """The rows of a Hugging Face ``datasets.Dataset``, its ``Image`` column read undecoded
    (the encoded bytes, or a path), and the class names of its ClassLabel columns; each
    slice of rows validated and sized from its Arrow buffers before it is converted
    (:mod:`~shardfeed.tools.pack.hfrows`)."""
    import datasets

    from shardfeed.tools.pack.hfrows import bounded_dataset_rows

    feature = dataset.features.get(fields.image)
    if isinstance(feature, datasets.Image) and feature.decode:
        dataset = dataset.cast_column(fields.image, datasets.Image(decode=False))
    vocabularies = {k: list(f.names) for k, f in dataset.features.items()
                    if isinstance(f, datasets.ClassLabel)}

    def rows() -> Iterator[Row]:
        for i, row in enumerate(bounded_dataset_rows(dataset, name=name,
                                                     limits=limits or IngestLimits.of())):
            yield Row(row, where=f"{name}, row {i}")

    return TableRows(rows(), name, vocabularies)


def label_vocabularies(vocabularies: dict[str, list[str]],
                       fields: RowFields) -> dict[str, list[str]]:
    """The class names of the columns packed as labels."""
    return {k: v for k, v in vocabularies.items() if k not in (fields.image, fields.name)
            and (fields.labels is None or k in fields.labels)}


__all__ = ["TableRows", "arrow_rows", "data_folder", "folder_rows", "hf_rows",
           "label_vocabularies", "parquet_rows"]
