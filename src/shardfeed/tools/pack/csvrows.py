"""CSV rows into pack items: each named column's cells parsed, checked and coded.

Everything that needs every row comes first (one-hot vocabularies, group ids, times), then
each row becomes one :class:`~shardfeed.tools.pack.items.PackItem`. Every problem is a
:class:`~shardfeed.errors.PackError` naming the CSV, the line and the column; the stored
features are listed in :mod:`shardfeed.tools.pack.csvinput`.

Determinism: a pure function of the rows and the columns. Memory: one item a row.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.tools.pack import time as packtime
from shardfeed.tools.pack.csvcolumns import CsvColumns
from shardfeed.tools.pack.items import PackInput, PackItem

FLOAT_LABELS_KEY = "labels"
ONEHOT_PREFIX = "image/label/"
INT_LABEL_PREFIX = "image/class/"


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


@dataclass(frozen=True, slots=True)
class _Table:
    """The CSV's rows and where each named column is; its cells read with the line and
    column named in any error."""

    where: str
    base: str
    rows: list[tuple[int, list[str]]]
    at: dict[str, int]

    def cell(self, line: int, cells: list[str], col: str) -> str:
        """The stripped value of ``col`` on ``line``; an empty cell is an error."""
        value = cells[self.at[col]].strip()
        if not value:
            raise PackError(
                f"CSV file '{self.where}', line {line}, column '{col}' is empty; fill it in"
            )
        return value

    def bad(self, line: int, col: str, value: str, what: str) -> PackError:
        """The error for a ``value`` on ``line`` that is not ``what`` it should be."""
        return PackError(
            f"CSV file '{self.where}', line {line}, column '{col}': {value!r} is not {what}; "
            "fix the value or choose another column"
        )


@dataclass(frozen=True, slots=True)
class _Codes:
    """What every row is coded with: one-hot vocabularies, label feature names, group ids
    and order times (nanoseconds by line)."""

    vocab: dict[str, tuple[str, ...]]
    onehot_index: dict[str, dict[str, int]]
    int_keys: dict[str, str]
    group_ids: dict[str, int] | None
    group_names: tuple[str, ...] | None
    numeric_groups: bool
    order_nanos: dict[int, int]
    order_unit: str | None


def rows_to_input(
    where: str, base: str, header: list[str], rows: list[tuple[int, list[str]]],
    columns: CsvColumns,
    given: Mapping[str, Sequence[str]],
) -> PackInput:
    """Check the columns, code the whole table, then turn each row into an item."""
    table = _Table(where=where, base=base, rows=rows,
                   at=_column_positions(where, header, rows, columns))
    codes = _codes(table, columns, given)
    items = [_row_item(table, line, cells, columns, codes) for line, cells in rows]
    vocabularies = {ONEHOT_PREFIX + c: v for c, v in codes.vocab.items()}
    if columns.floats:
        vocabularies[FLOAT_LABELS_KEY] = columns.floats
    return PackInput(
        items=tuple(items),
        root=base,
        where=where,
        label_key=_label_key(columns, codes.int_keys),
        vocabularies=vocabularies,
        group_key=columns.group,
        order_key=columns.order,
        group_names=codes.group_names,
        order_unit=codes.order_unit,
        kind="csv",
    )


def _column_positions(
    where: str, header: list[str], rows: list[tuple[int, list[str]]], columns: CsvColumns
) -> dict[str, int]:
    """Each named column's position; every one must exist, and there must be rows."""
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
    return at


def _codes(table: _Table, columns: CsvColumns, given: Mapping[str, Sequence[str]]) -> _Codes:
    """Everything that needs every row before any item: vocabularies, group ids, times."""
    vocab = _onehot_vocabularies(table, columns, given)
    group_ids: dict[str, int] | None = None
    group_names: tuple[str, ...] | None = None
    numeric_groups = False
    if columns.group:
        values = {table.cell(ln, cells, columns.group) for ln, cells in table.rows}
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
            table.where, columns.order, columns.time_unit,
            [(ln, table.cell(ln, cells, columns.order)) for ln, cells in table.rows],
        )
    return _Codes(vocab=vocab, onehot_index=onehot_index, int_keys=int_keys,
                  group_ids=group_ids, group_names=group_names, numeric_groups=numeric_groups,
                  order_nanos=order_nanos, order_unit=order_unit)


def _onehot_vocabularies(
    table: _Table, columns: CsvColumns, given: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """Each one-hot column's vocabulary: its values sorted, or the one ``given`` (which must
    hold every value)."""
    vocab: dict[str, tuple[str, ...]] = {}
    for col in columns.onehot:
        seen = {table.cell(ln, cells, col): ln for ln, cells in table.rows}
        fixed = given.get(ONEHOT_PREFIX + col)
        if fixed is None:
            vocab[col] = _sorted_vocabulary(set(seen))
            continue
        vocab[col] = tuple(fixed)
        for value, line in sorted(seen.items(), key=lambda kv: kv[1]):
            if value not in vocab[col]:
                raise PackError(
                    f"CSV file '{table.where}', line {line}, column '{col}': {value!r} is not "
                    f"in the vocabulary given for it ({', '.join(vocab[col])}); its one-hot "
                    "position would differ from the other split's: fix the value, or pack "
                    "without --classes-from to make a new vocabulary"
                )
    return vocab


def _row_item(
    table: _Table, line: int, cells: list[str], columns: CsvColumns, codes: _Codes
) -> PackItem:
    """One row as a pack item: its image, labels, mask, group and time."""
    base = table.base
    path = _resolve(table.cell(line, cells, columns.path), base)
    ints = _int_labels(table, line, cells, columns, codes)
    floats = _float_labels(table, line, cells, columns)
    mask_source = mask_name = None
    if columns.mask:
        mask_source = _resolve(table.cell(line, cells, columns.mask), base)
        mask_name = _stored_name(mask_source, base)
    group = group_value = None
    if columns.group and codes.group_ids is not None:
        raw = table.cell(line, cells, columns.group)
        group = codes.group_ids[raw]
        group_value = group if codes.numeric_groups else raw
    return PackItem(
        source=path,
        name=_stored_name(path, base),
        row=line,
        int_labels=ints,
        float_labels=floats,
        mask_source=mask_source,
        mask_name=mask_name,
        group=group,
        group_value=group_value,
        order_ns=codes.order_nanos.get(line),
    )


def _int_labels(
    table: _Table, line: int, cells: list[str], columns: CsvColumns, codes: _Codes
) -> dict[str, tuple[int, ...]]:
    """A row's integer labels and one-hot vectors, by feature name."""
    ints: dict[str, tuple[int, ...]] = {}
    for col in columns.labels:
        value = table.cell(line, cells, col)
        try:
            ints[codes.int_keys[col]] = (_parse_int(value),)
        except ValueError:
            raise table.bad(line, col, value, "an integer label") from None
    for col in columns.onehot:
        hot = [0] * len(codes.vocab[col])
        hot[codes.onehot_index[col][table.cell(line, cells, col)]] = 1
        ints[ONEHOT_PREFIX + col] = tuple(hot)
    return ints


def _float_labels(
    table: _Table, line: int, cells: list[str], columns: CsvColumns
) -> dict[str, tuple[float, ...]]:
    """A row's float columns, together as one feature (none without float columns)."""
    floats: dict[str, tuple[float, ...]] = {}
    if columns.floats:
        vals: list[float] = []
        for col in columns.floats:
            value = table.cell(line, cells, col)
            try:
                vals.append(_parse_float(value))
            except ValueError:
                raise table.bad(line, col, value, "a number") from None
        floats[FLOAT_LABELS_KEY] = tuple(vals)
    return floats


def _label_key(columns: CsvColumns, int_keys: dict[str, str]) -> str | None:
    """The feature that is the label: the first int label, else the floats, else the last
    one-hot column."""
    if columns.labels:
        return int_keys[columns.labels[0]]
    if columns.floats:
        return FLOAT_LABELS_KEY
    if columns.onehot:
        return ONEHOT_PREFIX + columns.onehot[-1]
    return None
