"""The rows of a Hugging Face ``datasets.Dataset``, a checked and bounded slice at a time.

A saved dataset's ``.arrow`` files are memory-mapped: what they say is read only when a row
is converted to Python values, and a damaged one (an offset past its data, a negative
length, text that is not UTF-8) makes that conversion crash the process or raise whatever
the bytes lead to. So each slice of rows is first validated in full from its Arrow buffers
(``Table.validate(full=True)``: offsets, lengths, UTF-8), then sized
(:func:`~shardfeed.tools.pack.arrowrows.row_costs`, a row over the limit of one record
refused by its number), and only then converted, by ``datasets`` (its features' formatting:
an ``Image`` read undecoded, ``ClassLabel`` ids), at most
:data:`~shardfeed.tools.pack.limits.BATCH_BYTES` at a time.

Determinism: the dataset's order. Memory: one slice of converted rows; the Arrow data stays
memory-mapped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from shardfeed.errors import PackError
from shardfeed.tools.pack.limits import BATCH_BYTES, IngestLimits

SLICE_ROWS = 1024
"""Rows validated and sized at once."""

_RESAVE = ("the file is damaged: download the dataset again, or save it again with "
           "save_to_disk")


def bounded_dataset_rows(dataset: Any, *, name: str,
                         limits: IngestLimits) -> Iterator[dict[str, Any]]:
    """The rows of ``dataset`` as ``datasets`` formats them, each slice validated and sized
    first; PackError naming the ``.arrow`` file (where one is known) and the rows of a
    damaged slice, or the row over the limit of one record."""
    import pyarrow as pa

    from shardfeed.tools.pack.arrowrows import row_costs

    arrow = dataset.with_format("arrow")
    files = _files(dataset)
    for start in range(0, len(dataset), SLICE_ROWS):
        stop = min(start + SLICE_ROWS, len(dataset))
        try:
            table = arrow[start:stop]
            table.validate(full=True)
            costs, largest = row_costs(table)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise PackError(
                f"{_where(name, files, start, stop)}: its data does not read as Arrow "
                f"({type(exc).__name__}: {str(exc)[:200]}); {_RESAVE}") from None
        over = np.flatnonzero(costs > limits.record_bytes)
        if over.size:
            i = start + int(over[0])
            raise PackError(
                f"{name}, row {i}{_file(files, i)}: its values take {int(costs[i - start])} "
                f"bytes as Python objects (most in column "
                f"'{table.schema.names[int(largest[i - start])]}'), over the limit of "
                f"{limits.record_bytes} for one record; nothing of it was converted. Leave "
                f"the column out (dataset.remove_columns), or {limits.raise_it}")
        ends = np.cumsum(costs)
        at = 0
        while at < len(costs):
            before = int(ends[at - 1]) if at else 0
            end = max(at + 1, int(np.searchsorted(ends, before + BATCH_BYTES, side="right")))
            part = dataset[start + at:start + end]
            columns = list(part)
            for j in range(end - at):
                yield {c: part[c][j] for c in columns}
            at = end


def _files(dataset: Any) -> list[tuple[str, int, int]]:
    """The memory-mapped files of ``dataset`` with the rows each holds (``[start, stop)``),
    where its table says so (none for a dataset with an indices mapping)."""
    if getattr(dataset, "_indices", None) is not None:
        return []
    table = getattr(dataset, "data", None)
    blocks = getattr(table, "blocks", None)
    rows = [row[0] for row in blocks] if isinstance(blocks, list) and all(
        isinstance(r, list) and len(r) == 1 for r in blocks) else [table]
    found, at = [], 0
    for block in rows:
        path, count = getattr(block, "path", None), getattr(block, "num_rows", None)
        if not isinstance(path, str) or not isinstance(count, int):
            return []
        found.append((path, at, at + count))
        at += count
    return found


def _file(files: list[tuple[str, int, int]], row: int) -> str:
    for path, start, stop in files:
        if start <= row < stop:
            return f" (the file '{path}', row {row - start})"
    return ""


def _where(name: str, files: list[tuple[str, int, int]], start: int, stop: int) -> str:
    named = [f"'{p}'" for p, a, b in files if a < stop and start < b]
    where = f"the file {' or '.join(named)} of {name}" if named else name
    return f"{where}, rows {start} to {stop - 1}"


__all__ = ["SLICE_ROWS", "bounded_dataset_rows"]
