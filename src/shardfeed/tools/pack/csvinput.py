"""Reading a CSV of ``path,label...`` rows into pack items.

Columns are named by a :class:`CsvColumns`; float label lists may use ranges
(``'VF,IRR0..IRR10'`` is ``VF, IRR0, IRR1, ..., IRR10``). Every problem is reported as a
:class:`~shardfeed.errors.PackError` naming the CSV, the line and the column.

Stored features:

- ``--csv-labels c``: one int column is ``image/class/label``; several are
  ``image/class/<c>`` each (the first is the label key);
- ``--csv-floats``: all named columns together, in the order given, as one float feature
  ``labels``;
- ``--csv-onehot root,leaf``: ``image/label/<col>`` one-hot int64 lists; the vocabulary is
  the column's distinct values, sorted (numerically when all are numbers);
- ``--csv-group day``: int64 ``day`` (or bytes when not all values are integers);
  ``--csv-order timestamp``: int64 ``timestamp`` in nanoseconds, read from numbers in the
  declared or detected ``--time-unit`` or from ISO 8601 timestamps (naive ones taken as UTC);
  see :mod:`shardfeed.tools.pack.time`.

Files named in the CSV are not opened here: ``tools.pack.check`` checks every one of them
(and reports all the missing or bad ones together) before ``pack`` writes anything.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence

from shardfeed.errors import PackError
from shardfeed.tools.pack import time as packtime
from shardfeed.tools.pack.csvcolumns import CsvColumns, expand_columns
from shardfeed.tools.pack.csvrows import rows_to_input
from shardfeed.tools.pack.items import PackInput

__all__ = ["CsvColumns", "expand_columns", "parse_order_key", "read_csv"]

def parse_order_key(text: str, *, unit: str = "s") -> int:
    """One order key in integer nanoseconds: a number in ``unit``, or (``unit="iso"``) an
    ISO 8601 timestamp (naive = UTC). Raises ValueError for anything else."""
    return packtime.to_nanos(packtime.parse_cell(text), unit)


def read_csv(
    csv_path: str | os.PathLike[str],
    *,
    columns: CsvColumns,
    root: str | None = None,
    vocabularies: Mapping[str, Sequence[str]] | None = None,
) -> PackInput:
    """Read ``csv_path`` into pack items.

    ``vocabularies`` (feature name → values, e.g. the training split's manifest) fixes the
    one-hot vocabulary of a ``--csv-onehot`` column, so a split that lacks a value keeps every
    other value's position; a value outside it is an error naming its line.

    Relative image paths are resolved against ``root`` (default: the CSV's folder) and stored
    relative to it. Checks: the file is UTF-8 CSV text, every named column exists, every
    label and time parses; the first problem found is reported with its line. The image
    files are checked later, all together (:mod:`shardfeed.tools.pack.check`).
    """
    where = os.fspath(csv_path)
    if not os.path.isfile(where):
        raise PackError(f"CSV file '{where}' does not exist; check the path")
    base = os.path.abspath(root if root is not None else os.path.dirname(os.path.abspath(where)))
    try:
        header, rows = _read_rows(where)
    except UnicodeDecodeError:
        raise PackError(
            f"'{where}' is not a CSV file (it is not UTF-8 text); pack takes a folder of "
            "images or a CSV of image paths (see shardfeed pack --help)"
        ) from None
    except csv.Error as exc:
        raise PackError(
            f"'{where}' is not a readable CSV file ({exc}); fix or re-export it"
        ) from None
    return rows_to_input(where, base, header, rows, columns, vocabularies or {})


def _read_rows(where: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    with open(where, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise PackError(f"CSV file '{where}' is empty; it needs a header row") from None
        rows: list[tuple[int, list[str]]] = []
        for cells in reader:
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) < len(header):
                raise PackError(
                    f"CSV file '{where}', line {reader.line_num} has {len(cells)} values for "
                    f"{len(header)} columns; fix that line"
                )
            rows.append((reader.line_num, cells))
    return header, rows
