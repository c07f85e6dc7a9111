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
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.tools.pack import time as packtime
from shardfeed.tools.pack.items import PackInput, PackItem
from shardfeed.tools.pack.time import TimeUnit

FLOAT_LABELS_KEY = "labels"
ONEHOT_PREFIX = "image/label/"
INT_LABEL_PREFIX = "image/class/"

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


def _parse_int(text: str) -> int:
    value = text.strip()
    try:
        return int(value)
    except ValueError:
        number = float(value)  # raises ValueError for non-numbers
        if not number.is_integer():
            raise ValueError(f"{text!r} is not an integer") from None
        return int(number)


def _parse_float(text: str) -> float:
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not finite")
    return value


def _sorted_vocabulary(values: set[str]) -> tuple[str, ...]:
    try:
        return tuple(sorted(values, key=float))
    except ValueError:
        return tuple(sorted(values))


def _resolve(path: str, base: str) -> str:
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(base, path))


def _stored_name(path: str, root: str) -> str:
    rel = os.path.relpath(path, root)
    if rel.startswith(os.pardir):
        return path.replace(os.sep, "/")
    return rel.replace(os.sep, "/")


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
    return _items(where, base, header, rows, columns, vocabularies or {})


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


def _items(
    where: str, base: str, header: list[str], rows: list[tuple[int, list[str]]],
    columns: CsvColumns,
    given: Mapping[str, Sequence[str]],
) -> PackInput:
    missing = [c for c in columns.required() if c not in header]
    if missing:
        raise PackError(
            f"CSV file '{where}' has no column {', '.join(repr(c) for c in missing)}; its "
            f"columns are {', '.join(header)}. Name the right columns with the --csv-* "
            "options"
        )
    at = {name: header.index(name) for name in columns.required()}
    if not rows:
        raise PackError(f"CSV file '{where}' has a header but no rows")

    def cell(line: int, cells: list[str], col: str) -> str:
        value = cells[at[col]].strip()
        if not value:
            raise PackError(f"CSV file '{where}', line {line}, column '{col}' is empty; fill it in")
        return value

    def bad(line: int, col: str, value: str, what: str) -> PackError:
        return PackError(
            f"CSV file '{where}', line {line}, column '{col}': {value!r} is not {what}; fix the "
            "value or choose another column"
        )

    # Vocabularies first: one-hot columns and string group columns need every value.
    vocab: dict[str, tuple[str, ...]] = {}
    for col in columns.onehot:
        seen = {cell(ln, cells, col): ln for ln, cells in rows}
        fixed = given.get(ONEHOT_PREFIX + col)
        if fixed is None:
            vocab[col] = _sorted_vocabulary(set(seen))
            continue
        vocab[col] = tuple(fixed)
        for value, line in sorted(seen.items(), key=lambda kv: kv[1]):
            if value not in vocab[col]:
                raise PackError(
                    f"CSV file '{where}', line {line}, column '{col}': {value!r} is not in the "
                    f"vocabulary given for it ({', '.join(vocab[col])}); its one-hot position "
                    "would differ from the other split's: fix the value, or pack without "
                    "--classes-from to make a new vocabulary"
                )
    group_ids: dict[str, int] | None = None
    group_names: tuple[str, ...] | None = None
    numeric_groups = False
    if columns.group:
        values = {cell(ln, cells, columns.group) for ln, cells in rows}
        try:
            parsed = {v: int(v) for v in values}
            numeric_groups = True
            group_ids = parsed
        except ValueError:
            group_names = tuple(sorted(values))
            group_ids = {v: i for i, v in enumerate(group_names)}
    onehot_index = {col: {v: i for i, v in enumerate(vocab[col])} for col in columns.onehot}

    int_keys: dict[str, str]
    if len(columns.labels) == 1:
        int_keys = {columns.labels[0]: spec.IMAGE_LABEL}
    else:
        int_keys = {c: INT_LABEL_PREFIX + c for c in columns.labels}

    order_nanos: dict[int, int] = {}
    order_unit: str | None = None
    if columns.order:
        order_nanos, order_unit = packtime.column_nanos(
            where, columns.order, columns.time_unit,
            [(ln, cell(ln, cells, columns.order)) for ln, cells in rows],
        )

    items: list[PackItem] = []
    for line, cells in rows:
        path = _resolve(cell(line, cells, columns.path), base)
        ints: dict[str, tuple[int, ...]] = {}
        for col in columns.labels:
            value = cell(line, cells, col)
            try:
                ints[int_keys[col]] = (_parse_int(value),)
            except ValueError:
                raise bad(line, col, value, "an integer label") from None
        for col in columns.onehot:
            hot = [0] * len(vocab[col])
            hot[onehot_index[col][cell(line, cells, col)]] = 1
            ints[ONEHOT_PREFIX + col] = tuple(hot)
        floats: dict[str, tuple[float, ...]] = {}
        if columns.floats:
            vals: list[float] = []
            for col in columns.floats:
                value = cell(line, cells, col)
                try:
                    vals.append(_parse_float(value))
                except ValueError:
                    raise bad(line, col, value, "a number") from None
            floats[FLOAT_LABELS_KEY] = tuple(vals)
        mask_source = mask_name = None
        if columns.mask:
            mask_source = _resolve(cell(line, cells, columns.mask), base)
            mask_name = _stored_name(mask_source, base)
        group = group_value = None
        if columns.group and group_ids is not None:
            raw = cell(line, cells, columns.group)
            group = group_ids[raw]
            group_value = group if numeric_groups else raw
        items.append(
            PackItem(
                source=path,
                name=_stored_name(path, base),
                row=line,
                int_labels=ints,
                float_labels=floats,
                mask_source=mask_source,
                mask_name=mask_name,
                group=group,
                group_value=group_value,
                order_ns=order_nanos.get(line),
            )
        )
    label_key: str | None = None
    if columns.labels:
        label_key = int_keys[columns.labels[0]]
    elif columns.floats:
        label_key = FLOAT_LABELS_KEY
    elif columns.onehot:
        label_key = ONEHOT_PREFIX + columns.onehot[-1]
    vocabularies = {ONEHOT_PREFIX + c: v for c, v in vocab.items()}
    if columns.floats:
        vocabularies[FLOAT_LABELS_KEY] = columns.floats
    return PackInput(
        items=tuple(items),
        root=base,
        where=where,
        label_key=label_key,
        vocabularies=vocabularies,
        group_key=columns.group,
        order_key=columns.order,
        group_names=group_names,
        order_unit=order_unit,
        kind="csv",
    )
