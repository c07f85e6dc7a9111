"""The values of WebDataset tar members as columns of a row (see
:mod:`shardfeed.tools.pack.tars`): whole numbers (``cls``), text (``txt``), JSON objects
(one column a key, ``<type>/<key>``) and bytes. A bad value is refused naming the member
(``where``), never quoting it.

Determinism: a function of the member's type and bytes only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardfeed.errors import PackError

INT_TYPES = {"cls": "label", "cls2": "cls2", "index": "index"}
"""Member types that hold one whole number as text, and the column each becomes."""

TEXT_TYPES = ("txt", "text")
"""Member types that hold UTF-8 text."""


def member_columns(kind: str, data: bytes, *, where: str,
                   labels: Sequence[str] | None) -> Iterator[tuple[str, Any]]:
    """The columns a member of type ``kind`` gives; ``labels``: the label columns named
    (None: every column), whose JSON values are checked to be labels."""
    if kind in INT_TYPES:
        yield INT_TYPES[kind], _whole_number(kind, data, where)
    elif kind in TEXT_TYPES:
        yield kind, _text(data, where)
    elif kind == "json" or kind.endswith(".json"):
        yield from _json(kind, data, where, labels)
    else:
        yield kind, data


def _text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackError(f"{where}: is not UTF-8 text (byte {exc.start} of it); save it as "
                        "UTF-8") from None


def _whole_number(kind: str, data: bytes, where: str) -> int:
    text = _text(data, where).strip()
    try:
        value: int | None = int(text, 10)
    except ValueError:
        value = None
    if value is None or not -(1 << 63) <= value < (1 << 63):
        raise PackError(
            f"{where}: a .{kind} member holds one whole number as text (e.g. 3), and this "
            "one does not; fix it, or give the member another type (x.txt keeps it as text)")
    return value


def _json(kind: str, data: bytes, where: str,
          labels: Sequence[str] | None) -> Iterator[tuple[str, Any]]:
    text = _text(data, where)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PackError(f"{where}: is not valid JSON ({exc.msg} at line {exc.lineno}, column "
                        f"{exc.colno}); fix the member") from None
    except RecursionError:
        raise PackError(f"{where}: its JSON is nested too deep") from None
    if not isinstance(value, dict):
        raise PackError(
            f"{where}: holds a JSON {_json_kind(value)}, not an object; its keys become the "
            f'columns {kind}/<key>: save it as an object (e.g. {{"values": [...]}})')
    for column, item in _flat(value, kind):
        problem = _json_problem(item) if labels is None or column in labels else None
        if problem is not None:
            raise PackError(
                f"{where}: the key '{column}' holds {problem}; a label is a number, text or "
                "a list of either: choose the label columns (--label-columns, "
                "RowFields(labels=[...])) or fix the JSON")
        yield column, item


def _flat(value: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, item in value.items():
        column = f"{prefix}/{key}"
        if isinstance(item, dict):
            yield from _flat(item, column)
        else:
            yield column, item



def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")



def _json_problem(value: Any) -> str | None:
    """What makes a JSON value no label (None: it is one): null, an integer beyond int64,
    an array of arrays of other lengths, of objects, or of mixed kinds."""
    if isinstance(value, (str, bool, float)):
        return None
    if isinstance(value, int):
        return None if -(1 << 63) <= value < (1 << 63) else "an integer beyond 64 bits"
    if value is None:
        return "null"
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return None
        problems = [p for p in map(_json_problem, value) if p is not None]
        if problems:
            return f"an array with {problems[0]}"
        try:
            kind = np.asarray(value).dtype.kind
        except ValueError:
            kind = "O"
        return None if kind in "biuf" else "an array of mixed kinds or ragged rows"
    return f"a JSON {_json_kind(value)}"


__all__ = ["INT_TYPES", "TEXT_TYPES", "member_columns"]
