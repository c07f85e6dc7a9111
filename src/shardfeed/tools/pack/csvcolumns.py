"""Which CSV columns hold what (:class:`CsvColumns`) and column lists with ranges
(:func:`expand_columns`): what :mod:`~shardfeed.tools.pack.csvinput` reads a CSV by and
:mod:`~shardfeed.tools.pack.csvrows` turns its rows into pack items by."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shardfeed.tools.pack import time as packtime
from shardfeed.tools.pack.time import TimeUnit

__all__ = ["CsvColumns", "expand_columns"]

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
