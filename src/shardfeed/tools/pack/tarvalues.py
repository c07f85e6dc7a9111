"""The values of WebDataset tar members as columns of a row (see
:mod:`shardfeed.tools.pack.tars`): whole numbers (``cls``), text (``txt``), JSON objects
and bytes. A bad value is refused naming the member (``where``), never quoting it.

A JSON member (``x.json``, ``x.meta.json``) gives its member's bytes under its type
(``json``: nothing of it is lost) and a column a key, ``<type>/<key>``, as LAION-style
metadata needs::

    {"w": 512, "opt": null, "meta": {"h": 3}, "box": [[1, 2], [3, 4]], "tags": ["a"]}

    json/w          512                  a number, text or boolean: itself
    json/opt        (absent)             null: the record has no such feature, as a
                                         tf.train.Example without it
    json/meta/h     3                    a nested object: one column a key, its path kept
    json/box        1, 2, 3, 4           an array of arrays of numbers (or of text), equal
    json/box/shape  2, 2                 in length: its values, and their shape
    json/tags       "a"                  an array of numbers or of text: its values
    json            the member's bytes

A value no feature holds (an array of objects, of mixed kinds or of unequal rows, an
integer beyond 64 bits) has no column of its own; it stays in the member's bytes. Only a
column named as a label (``RowFields(labels=[...])``, ``--label-columns``) is refused for
holding one of these, or a null, or an object (its keys are the columns to name).

Determinism: a function of the member's type and bytes only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardfeed.errors import PackError
from shardfeed.tools.pack.limits import IngestLimits

INT_TYPES = {"cls": "label", "cls2": "cls2", "index": "index"}
"""Member types that hold one whole number as text, and the column each becomes."""

TEXT_TYPES = ("txt", "text")
"""Member types that hold UTF-8 text."""

INT_MEMBER_BYTES = 4096
"""The most bytes of a whole-number member (``cls``): one number as text."""

MAX_JSON_COLUMNS = 4096
"""The most columns one JSON member gives (nested keys counted) when no labels are named."""

MAX_INT_DIGITS = 4300
"""The most digits of a JSON integer read (Python's own default limit, held to whatever
``sys.set_int_max_str_digits`` says: reading n digits takes time n², so 16 MiB of one
integer would take hours)."""

_MAX_DEPTH = 32  # of an array of arrays with a shape (NumPy allows 64 dimensions)
_NO_FEATURE = object()  # a JSON value no feature holds


def is_json(kind: str) -> bool:
    """Whether a member of type ``kind`` is JSON (``json``, ``meta.json``)."""
    return kind == "json" or kind.endswith(".json")


def value_limit(kind: str, limits: IngestLimits) -> tuple[int, str]:
    """The most bytes a member of type ``kind`` may hold, and what it is in words: a JSON
    member parses into objects of up to ~25 times its size, text into a str of up to 4."""
    if kind in INT_TYPES:
        return INT_MEMBER_BYTES, f"a .{kind} member (one whole number as text)"
    if is_json(kind):
        return limits.json_bytes, "a JSON member (it takes up to ~25 times its size parsed)"
    if kind in TEXT_TYPES:
        return limits.value_bytes // 8, "a text member (its str takes up to 4 bytes a byte)"
    return limits.value_bytes, "one member"


def member_columns(kind: str, data: bytes, *, where: str,
                   labels: Sequence[str] | None) -> Iterator[tuple[str, Any]]:
    """The columns a member of type ``kind`` gives; ``labels``: the label columns named
    (None: none named; see the module docstring for what only a named one refuses)."""
    if kind in INT_TYPES:
        yield INT_TYPES[kind], _whole_number(kind, data, where)
    elif kind in TEXT_TYPES:
        yield kind, _text(data, where)
    elif is_json(kind):
        yield from _json(kind, data, where, labels)
        yield kind, data
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


class _TooManyDigits(ValueError):
    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooManyDigits(len(text.lstrip("-")))
    return int(text)


def _parse(kind: str, data: bytes, where: str) -> dict[str, Any]:
    text = _text(data, where)
    try:
        value = json.loads(text, parse_int=_int)
    except json.JSONDecodeError as exc:
        raise PackError(f"{where}: is not valid JSON ({exc.msg} at line {exc.lineno}, column "
                        f"{exc.colno}); fix the member") from None
    except RecursionError:
        raise PackError(f"{where}: its JSON is nested too deep") from None
    except ValueError as exc:  # an integer of more digits than are read
        digits = exc.digits if isinstance(exc, _TooManyDigits) else "thousands of"
        raise PackError(
            f"{where}: its JSON holds an integer of {digits} digits; integers of more than "
            f"{MAX_INT_DIGITS} digits are not read (no feature holds one, and reading them "
            "takes time): write it as a JSON string, or remove it") from None
    if not isinstance(value, dict):
        raise PackError(
            f"{where}: holds a JSON {_json_kind(value)}, not an object; its keys become the "
            f'columns {kind}/<key>: save it as an object (e.g. {{"values": [...]}})')
    return value


def _json(kind: str, data: bytes, where: str,
          labels: Sequence[str] | None) -> Iterator[tuple[str, Any]]:
    named = frozenset(labels) if labels is not None else None
    seen: set[str] = set()
    for column, item in _flat(_parse(kind, data, where), kind, where, named):
        for name, value in _features(column, item, where, named):
            if name in seen:
                raise PackError(
                    f"{where}: two of its values give the column '{name}' (a key holding "
                    "'/', or a key named like the shape of an array beside it); rename one "
                    "of the keys")
            seen.add(name)
            if named is None and len(seen) > MAX_JSON_COLUMNS:
                raise PackError(
                    f"{where}: its JSON gives more than {MAX_JSON_COLUMNS} columns (one a "
                    "key, nested keys counted); name the ones to keep as labels "
                    f"(--label-columns {kind}/<key> ...; RowFields(labels=[...])), or store "
                    "such data in a member of its own (a .npy)")
            yield name, value


def _flat(value: Mapping[str, Any], prefix: str, where: str,
          named: frozenset[str] | None) -> Iterator[tuple[str, Any]]:
    """The leaves of nested objects as ``(prefix/a/b, value)`` (without recursion: JSON
    as deep as the parser reads is walked)."""
    stack = [_keys(prefix, value)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
            continue
        column, leaf = item
        if isinstance(leaf, dict):
            if named is not None and column in named:
                raise PackError(
                    f"{where}: the key '{column}' is named as a label and holds a JSON "
                    f"object; its keys are the columns {column}/<key>: name those "
                    "(--label-columns, RowFields(labels=[...]))")
            stack.append(_keys(column, leaf))
        else:
            yield column, leaf


def _keys(prefix: str, value: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    return ((f"{prefix}/{key}", item) for key, item in value.items())


def _features(column: str, value: Any, where: str,
              named: frozenset[str] | None) -> Iterator[tuple[str, Any]]:
    """The feature(s) of one leaf: itself, its values and shape, or none; refused only
    when ``column`` is a named label."""
    label = named is not None and column in named
    if value is None:
        if label:
            raise PackError(f"{where}: the key '{column}' holds null, and it is named as a "
                            f"label; {_LABEL_FIX}")
        return
    if isinstance(value, int) and not isinstance(value, bool) and not (
            -(1 << 63) <= value < (1 << 63)):
        if label:
            raise PackError(f"{where}: the key '{column}' holds an integer beyond 64 bits, "
                            f"and it is named as a label; {_LABEL_FIX}")
        return
    if not isinstance(value, list):
        yield column, value
        return
    array = _array(value)
    if array is _NO_FEATURE:
        if label:
            raise PackError(f"{where}: the key '{column}' holds an array of objects, of "
                            "nulls, of mixed kinds or of unequal rows, and it is named as a "
                            f"label; {_LABEL_FIX}")
        return
    values, shape = array
    yield column, values
    if len(shape) > 1:
        yield f"{column}/shape", np.asarray(shape, dtype=np.int64)


_LABEL_FIX = ("a label is a number, text or an array of either (arrays of arrays of equal "
              "length too): fix the JSON, or leave the key out of the label columns "
              "(--label-columns, RowFields(labels=[...]))")


def _array(value: list[Any]) -> Any:
    """A JSON array as ``(values, shape)``: an int64 or float array, or a list of str, and
    the shape of the nested arrays; :data:`_NO_FEATURE` when no feature holds it."""
    shape: list[int] = []
    level: list[Any] = value
    while True:  # the shape, from the first element of each level
        shape.append(len(level))
        if not level or not isinstance(level[0], list):
            break
        if len(shape) > _MAX_DEPTH:
            return _NO_FEATURE
        level = level[0]
    leaves: list[Any] = []
    if not _leaves(value, shape, 0, leaves):
        return _NO_FEATURE
    if all(isinstance(v, str) for v in leaves):
        return leaves, tuple(shape)
    if not all(isinstance(v, (int, float)) for v in leaves):
        return _NO_FEATURE  # objects, nulls, or text among numbers
    if all(isinstance(v, (int, bool)) for v in leaves):
        if not all(-(1 << 63) <= v < (1 << 63) for v in leaves):
            return _NO_FEATURE
        return np.asarray(leaves, dtype=np.int64), tuple(shape)
    return np.asarray(leaves, dtype=np.float64), tuple(shape)


def _leaves(value: list[Any], shape: list[int], depth: int, out: list[Any]) -> bool:
    """Collect the leaves of ``value`` into ``out``; False unless every array at depth d
    has ``shape[d]`` items and arrays are exactly the first ``len(shape) - 1`` levels."""
    if len(value) != shape[depth]:
        return False
    if depth + 1 == len(shape):
        if any(isinstance(v, list) for v in value):
            return False
        out.extend(value)
        return True
    return all(isinstance(v, list) and _leaves(v, shape, depth + 1, out) for v in value)


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


__all__ = ["INT_MEMBER_BYTES", "INT_TYPES", "MAX_INT_DIGITS", "MAX_JSON_COLUMNS",
           "TEXT_TYPES", "is_json", "member_columns", "value_limit"]
