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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardfeed.errors import PackError
from shardfeed.tools.pack import time as packtime
from shardfeed.tools.pack.csvrows import rows_to_input
from shardfeed.tools.pack.items import PackInput
from shardfeed.tools.pack.time import TimeUnit

_RANGE = re.compile(r"^(?P<p1>.*?)(?P<a>\d+)\.\.(?P<p2>.*?)(?P<b>\d+)$")


def expand_columns(text: str | Sequence[str]) -> tuple[str, ...]:
    """Expand a column list: ``'VF,IRR0..IRR10'`` -> ``('VF', 'IRR0', ..., 'IRR10')``.

    A range ``X<a>..X<b>`` (or ``X<a>..<b>``) counts from a to b inclusive, keeping the
    zero padding of ``<a>`` (``F00..F10`` gives ``F00, F01, ..., F10``).
    """
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    out: list[str] = []
    for part in parts:
        if not part:
            continue
        m = _RANGE.match(part) if ".." in part else None
        if m is None:
            if ".." in part:
                raise ValueError(
                    f"column range {part!r} is not of the form PREFIX<a>..PREFIX<b> "
                    "(e.g. 'IRR0..IRR10')"
                )
            out.append(part)
            continue
        prefix, second = m.group("p1"), m.group("p2")
        if second not in ("", prefix):
            raise ValueError(
                f"column range {part!r} mixes prefixes {prefix!r} and {second!r}; write it as "
                f"'{prefix}<a>..{prefix}<b>'"
            )
        a, b = int(m.group("a")), int(m.group("b"))
        if b < a:
            raise ValueError(f"column range {part!r} counts down; write the smaller number first")
        width = len(m.group("a")) if m.group("a").startswith("0") and len(m.group("a")) > 1 else 0
        out.extend(f"{prefix}{i:0{width}d}" for i in range(a, b + 1))
    if len(set(out)) != len(out):
        raise ValueError(f"column list {text!r} names a column twice")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CsvColumns:
    """Which CSV columns hold what. Every name must be a column of the CSV header.

    ``path``: the image path column; ``labels``: int label columns; ``floats``: float label
    columns (ranges allowed, see :func:`expand_columns`), stored together as ``labels``;
    ``onehot``: categorical columns stored as one-hot lists; ``mask``: a mask path column;
    ``group`` / ``order``: the group and order-key columns; ``time_unit``: what the order
    column's numbers are (``s``, ``ms``, ``us``, ``ns``), ``iso`` for ISO 8601 timestamps, or
    ``auto`` (default) to detect it, refusing a column whose unit cannot be told.
    """

    path: str = "path"
    labels: tuple[str, ...] = ()
    floats: tuple[str, ...] = ()
    onehot: tuple[str, ...] = ()
    mask: str | None = None
    group: str | None = None
    order: str | None = None
    time_unit: TimeUnit = "auto"

    def __post_init__(self) -> None:
        packtime.check_time_unit(self.time_unit)
        if self.time_unit != "auto" and not self.order:
            raise ValueError(
                f"time_unit={self.time_unit!r} was given without an order column; name the "
                "column with order= (--csv-order)"
            )
        for name in ("labels", "floats", "onehot"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, expand_columns(value))
            elif not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if not self.path:
            raise ValueError("CsvColumns.path must name the image path column, e.g. 'path'")
        named = [self.path, *self.labels, *self.floats, *self.onehot]
        named += [c for c in (self.mask, self.group, self.order) if c]
        seen: set[str] = set()
        for col in named:
            if col in seen:
                raise ValueError(
                    f"CSV column {col!r} is given two roles; each column may be used once"
                )
            seen.add(col)

    def required(self) -> tuple[str, ...]:
        """Every column this spec reads, in a stable order."""
        cols = [self.path, *self.labels, *self.floats, *self.onehot]
        return tuple(cols + [c for c in (self.mask, self.group, self.order) if c])


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
