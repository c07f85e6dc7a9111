"""A Parquet file's rows, read within pack's limits (:mod:`shardfeed.tools.pack.limits`).

Before a row group is read, its pages are sized from their headers
(:mod:`~shardfeed.tools.pack.parquetpages`): a page larger than one record may be is
refused (a page is decompressed whole), naming the file, row group and column, and the
rows read at once, k, are as many as keep what grows with them within
:data:`~shardfeed.tools.pack.limits.BATCH_BYTES`, however the pages fall::

    per column         held while the row group is read        grows with the k rows read
    plain              the page being read                     the largest k pages
    dictionary pages   the dictionary page, the page being     the largest k pages
                       read
      read as such     (every data page uses it, or a list column: a value of it repeats)
      read as values   (some pages are plain)                  k × its largest value

so a dictionary value that a thousand rows repeat (a 17 KB file standing for gigabytes) is
read once, as Arrow's dictionary, never once a row. Each batch's rows are then converted a
bounded slice at a time, a row over the limit of one record refused by its row number
(:mod:`~shardfeed.tools.pack.arrowrows`).

A row of a list column whose values run over many pages is bounded by its column chunk, not
its pages (Parquet's headers do not say where rows begin): such a row is refused by the
record limit once read.

Determinism: rows in file order. Memory: one batch as above, one slice of converted rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from shardfeed.errors import PackError
from shardfeed.tools.pack.arrowrows import bounded_rows
from shardfeed.tools.pack.limits import BATCH_BYTES, IngestLimits
from shardfeed.tools.pack.parquetpages import DamagedPages, dictionary_value_bytes, read_chunk

MAX_BATCH_ROWS = 1024
"""The most rows read at once."""

_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}

READ_BUFFER_BYTES = 1 << 20
"""Bytes of a column chunk read from the file at once (Arrow reads a whole chunk
otherwise)."""


@dataclass(frozen=True, slots=True)
class RowGroupPlan:
    """How one row group is read: ``rows`` at a time, ``dictionary`` columns as Arrow
    dictionaries; ``bound``: the batch's bytes at most (beyond a row of a list column
    spanning pages)."""

    rows: int
    dictionary: tuple[str, ...]
    bound: int


def file_rows(f: Any, path: str, limits: IngestLimits) -> Iterator[dict[str, Any]]:
    """The rows of the open ``pyarrow.parquet.ParquetFile`` ``f`` (of the file ``path``),
    each row group planned from its page headers before it is read."""
    import pyarrow.parquet as pq

    metadata = f.metadata
    at = 0
    readers: dict[tuple[str, ...], Any] = {}  # by the columns read as dictionaries
    try:
        with open(path, "rb") as raw:
            for group in range(metadata.num_row_groups):
                plan = plan_row_group(raw, path, metadata, group, limits)
                reader = readers.get(plan.dictionary)
                if reader is None:
                    reader = readers[plan.dictionary] = pq.ParquetFile(
                        path, metadata=metadata, buffer_size=READ_BUFFER_BYTES,
                        read_dictionary=list(plan.dictionary) or None)
                for batch in reader.iter_batches(batch_size=plan.rows, row_groups=[group]):
                    yield from bounded_rows(batch, limits=limits,
                                            where=f"'{path}', row {{}}".format, first=at)
                    at += batch.num_rows
    finally:
        for reader in readers.values():
            reader.close()


def plan_row_group(raw: IO[bytes], path: str, metadata: Any, group: int,
                   limits: IngestLimits) -> RowGroupPlan:
    """The :class:`RowGroupPlan` of row group ``group``, from its page headers; PackError
    for a page over the limit of one record, dictionary-encoded list values that could make
    one row larger than a record, or pages that do not read as the footer says."""
    row_group = metadata.row_group(group)
    parts = [_column(raw, f"'{path}': row group {group}", row_group.column(c),
                     metadata.schema.column(c), limits) for c in range(row_group.num_columns)]
    repeats = sum(p.repeats for p in parts)
    if repeats > limits.record_bytes:
        names = ", ".join(f"'{p.name}'" for p in parts if p.repeats)
        raise PackError(
            f"'{path}': row group {group}: its list column(s) {names} hold values stored "
            f"by dictionary that one row may repeat, {repeats} bytes once read (their page "
            f"headers say so), over the limit of {limits.record_bytes} of one record; "
            f"nothing of it was read. Write the file with smaller row groups (pyarrow: "
            f"write_table(..., row_group_size=...)); {limits.raise_it}")
    held = repeats + sum(p.held + int(p.pages[min(1, len(p.pages) - 1)]) for p in parts)

    def grown(k: int) -> int:  # k rows of a column lie within its k largest pages
        return sum(int(p.pages[min(k, len(p.pages) - 1)]) + k * p.value for p in parts)

    lo, hi = 1, MAX_BATCH_ROWS  # the most rows within BATCH_BYTES, at least one
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if grown(mid) <= BATCH_BYTES else (lo, mid - 1)
    return RowGroupPlan(rows=lo, dictionary=tuple(p.name for p in parts if p.dictionary),
                        bound=held + grown(lo))


@dataclass(frozen=True, slots=True)
class _Part:
    """What reading one column chunk holds: ``held`` bytes whatever the rows read,
    ``repeats`` for one row of repeated dictionary values, ``value`` bytes a row read
    grows by, and its ``pages`` (largest first, summed: ``pages[k]`` is the k largest)."""

    name: str
    dictionary: bool
    held: int
    repeats: int
    value: int
    pages: np.ndarray


def _column(raw: IO[bytes], where: str, meta: Any, column: Any,
            limits: IngestLimits) -> _Part:
    where = f"{where}, column '{column.path}'"
    try:
        chunk = read_chunk(raw, meta)
    except DamagedPages as exc:
        raise PackError(f"{where}: {exc}; the file is damaged: re-write it (e.g. with "
                        "pyarrow.parquet.write_table)") from None
    if chunk.largest_page > limits.record_bytes:
        raise PackError(
            f"{where}: a page of {chunk.largest_page} bytes uncompressed (its header says "
            f"so; a page is read whole), over the limit of {limits.record_bytes} of one "
            f"record; nothing of it was read. Write the file with smaller pages (pyarrow: "
            f"write_table(..., write_batch_size=64); a page holds up to that many values), "
            f"or leave the column out; {limits.raise_it}")
    repeated = column.max_repetition_level > 0
    binary = meta.physical_type == "BYTE_ARRAY"
    width = _WIDTHS.get(meta.physical_type) or (
        column.length if meta.physical_type == "FIXED_LEN_BYTE_ARRAY" else 0)
    has_dictionary = chunk.dictionary_bytes > 0
    as_dictionary = binary and has_dictionary and (repeated or chunk.all_dictionary)
    held, repeats, value = chunk.dictionary_bytes, 0, 0
    if as_dictionary and not chunk.all_dictionary:  # plain pages join the dictionary
        held += sum(chunk.pages)
    if has_dictionary and repeated:  # each value read: its index and levels, and itself
        repeats = chunk.dictionary_values * ((0 if as_dictionary else width) + 8)
    elif has_dictionary and not as_dictionary:
        small = chunk.dictionary_bytes * MAX_BATCH_ROWS <= BATCH_BYTES
        value = width or (chunk.dictionary_bytes if small else dictionary_value_bytes(
            raw, chunk, meta.compression, meta.physical_type))
    pages = np.concatenate([[0], np.cumsum(sorted(chunk.pages, reverse=True))])
    return _Part(column.path, as_dictionary, held, repeats, value, pages.astype(np.int64))


__all__ = ["MAX_BATCH_ROWS", "RowGroupPlan", "file_rows", "plan_row_group"]
