"""Many serialized ``tf.train.Example`` records at once, decoded into columns.

:func:`decode_columns` gives, for records that all hold the same features of the same kinds
and lengths, one column a feature: the values :func:`~shardfeed.format.example.decode_example`
gives record by record, gathered (numeric features stacked into one 2-D array of
``(records, length)``, bytes features a list). It is the batch form of the per-record decode,
for the loader's batch path: one parsed message reused, no per-record dict or array.

Records that differ from the first (another feature set, kind or length, a payload that does
not parse) give ``None``: the caller decodes them one at a time, which names the record that
differs. So nothing here raises for data; the per-record path owns the messages.

The compiled part (:mod:`~shardfeed.format.native`), where built, gathers the columns of
plainly encoded records (what every writer produces) in one call; anything else, and every
batch without it, goes through the message parser record by record, with the same result.

A bytes feature can also be read straight into the rows of a caller's array (see
:class:`FilledColumn`): no bytes object a record.

Determinism: pure. Memory: the columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

import numpy as np
from google.protobuf.message import DecodeError as _ProtoDecodeError

from shardfeed.format import native
from shardfeed.format.example import Example

_NUMERIC: dict[str, np.dtype[Any]] = {
    "int64_list": np.dtype(np.int64), "float_list": np.dtype(np.float32),
}


def decode_columns(
    payloads: Sequence[bytes | bytearray | memoryview], *, names: Sequence[str] | None = None,
) -> dict[str, Any] | None:
    """``{name: column}`` for ``payloads``, or None when they are not all alike (see module).

    ``names``: only these features (each must be in every record), in this order; default
    every feature, in the first record's order. Numeric columns are ``(n, length)`` arrays
    (int64 or float32); bytes columns are lists holding ``bytes`` for single values, else
    ``list[bytes]``, as the per-record decode gives them.
    """
    if not payloads:
        return None
    if native.wire is not None:
        columns = _compiled_columns(payloads, names)
        if columns is not None:
            return columns
    return _parsed_columns(payloads, names)


def _compiled_columns(
    payloads: Sequence[bytes | bytearray | memoryview], names: Sequence[str] | None, *,
    exact: bool = False,
) -> dict[str, Any] | None:
    """:func:`decode_columns` by the compiled part (``exact``: the records hold ``names``
    and no other feature); None where it does not accept the records (the parser then
    decides)."""
    wire = native.wire
    assert wire is not None
    count = len(names) if exact and names is not None else -1
    if names is None:  # the first record's features, in the order the parser lists them
        names = feature_names(payloads[0])
        if names is None:
            return None
        count = len(names)
    keys = _keys_of(names)
    if keys is None:
        return None
    gathered = wire.example_columns(list(payloads), keys, count)
    if gathered is None:
        return None
    return compiled_columns(names, gathered, len(payloads))


def feature_names(payload: bytes | bytearray | memoryview) -> list[str] | None:
    """The features of one serialized Example, in the order the parser lists them; None when
    it does not parse."""
    message = Example()
    try:
        message.ParseFromString(payload)
    except _ProtoDecodeError:
        return None
    return list(message.features.feature)


def compiled_columns(names: Sequence[str], gathered: Sequence[Any], rows: int,
                     filled: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """``{name: column}`` from the compiled part's gathered columns (one a name, in order):
    numeric ones viewed as ``(rows, length)`` arrays; a None column is a feature copied into
    the rows of ``filled[name]`` (a :class:`FilledColumn`)."""
    out: dict[str, Any] = {}
    for name, column in zip(names, gathered):
        if column is None:
            assert filled is not None
            out[name] = FilledColumn(filled[name])
        elif column[0] == _BYTES:
            out[name] = column[1]
        else:
            kind, length, data = column
            out[name] = np.frombuffer(data, _COMPILED_DTYPES[kind]).reshape(rows, length)
    return out


def decode_record(payload: bytes, names: Sequence[str], *, exact: bool) -> dict[str, Any] | None:
    """``{name: value}`` of ``payload``'s features ``names`` by the compiled part: the values
    :func:`~shardfeed.format.example.decode_example` gives (numeric ones as writable 1-D
    arrays), in the order of ``names``, the large values' copies run without the GIL.
    ``exact``: the record holds these features and no other. None where the compiled part
    is not built or does not accept the record (another feature set, a feature without
    values, anything but plain encoding): the parser then decides, and names a fault."""
    wire = native.wire
    if wire is None or type(payload) is not bytes:
        return None
    keys = _keys_of(names)
    if keys is None:
        return None
    # _compiled_columns of one record, without its (1, length) views: a record read alone
    # (on 2 cores, read_many([i]) of a 28² PNG record: 18.9 -> 14.5 µs with the names'
    # encoding kept and the shard's search a method call; 13.1 with the gather's look at
    # loaded offsets skipped too)
    gathered = wire.example_columns([payload], keys, len(names) if exact else -1)
    return None if gathered is None else record_of_columns(names, gathered)


def record_of_columns(names: Sequence[str], gathered: Sequence[Any]) -> dict[str, Any]:
    """``{name: value}`` of one record from the compiled part's gathered columns (one a
    name, in order): the values :func:`decode_record` gives."""
    out: dict[str, Any] = {}
    for name, column in zip(names, gathered):
        out[name] = (column[1][0] if column[0] == _BYTES
                     else np.frombuffer(column[2], _COMPILED_DTYPES[column[0]]))
    return out


_KEYS: dict[tuple[str, ...], tuple[bytes, ...] | None] = {}
_KEYS_KEPT = 64  # feature sets: a dataset has one or a few


def _keys_of(names: Sequence[str]) -> tuple[bytes, ...] | None:
    """``names`` encoded as the compiled part takes them (kept for the feature sets met
    lately); None where one does not encode."""
    key = tuple(names)
    try:
        return _KEYS[key]
    except KeyError:
        pass
    try:
        keys: tuple[bytes, ...] | None = tuple(name.encode() for name in names)
    except UnicodeEncodeError:
        keys = None
    if len(_KEYS) >= _KEYS_KEPT:
        _KEYS.clear()  # no lock: a race only encodes a set again
    _KEYS[key] = keys
    return keys


class FilledColumn(Sequence[bytes]):
    """A bytes column of one value a record, held as the rows of a 2-D uint8 array (row
    ``i``: record ``i``'s value, every value of the row's size) instead of bytes objects.

    What a reader gives for a feature it was asked to copy straight into a caller's buffer
    (``Dataset.read_columns(into=...)``). Indexing gives bytes, as the list column does;
    :meth:`is_in` tells a consumer whose buffer it is that the values are there already.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [row.tobytes() for row in self.rows[index]]
        value: bytes = self.rows[index].tobytes()
        return value

    @property
    def value_size(self) -> int:
        """The bytes of every value."""
        return int(self.rows.shape[1])

    def is_in(self, array: np.ndarray) -> bool:
        """Whether the values are exactly the bytes of ``array`` (same memory, same size):
        row ``i`` of the column is ``array[i]``'s bytes."""
        if not array.flags.c_contiguous or array.nbytes != self.rows.nbytes:
            return False
        here = self.rows.__array_interface__["data"][0]
        return bool(here == array.__array_interface__["data"][0] and len(array) == len(self))


_BYTES = 0
_COMPILED_DTYPES: dict[int, np.dtype[Any]] = {1: np.dtype(np.float32), 2: np.dtype(np.int64)}


def _parsed_columns(
    payloads: Sequence[bytes | bytearray | memoryview], names: Sequence[str] | None,
) -> dict[str, Any] | None:
    """:func:`decode_columns` by the message parser, record by record."""
    message = Example()
    try:
        message.ParseFromString(payloads[0])
    except _ProtoDecodeError:
        return None
    fmap = message.features.feature
    wanted = list(fmap) if names is None else list(names)
    if any(name not in fmap for name in wanted):
        return None
    kinds = [fmap[name].WhichOneof("kind") for name in wanted]
    if any(kind is None for kind in kinds):
        return None
    count = len(fmap)
    gathered: list[list[Any]] = [[] for _ in wanted]
    pairs = list(zip(wanted, kinds, gathered))
    for payload in payloads:
        try:
            message.ParseFromString(payload)
        except _ProtoDecodeError:
            return None
        fmap = message.features.feature
        if names is None and len(fmap) != count:
            return None
        for name, kind, values in pairs:
            if name not in fmap:
                return None
            feature = fmap[name]
            if feature.WhichOneof("kind") != kind:
                return None
            if kind == "bytes_list":
                listed = feature.bytes_list.value
                values.append(listed[0] if len(listed) == 1 else list(listed))
            elif kind == "int64_list":
                values.append(feature.int64_list.value[:])
            else:
                values.append(feature.float_list.value[:])
    return _as_columns(wanted, kinds, gathered)


def _as_columns(names: list[str], kinds: list[Any], gathered: list[list[Any]]) -> dict[str, Any] | None:
    """Stack numeric columns (None when a column's lengths differ); bytes columns stay lists."""
    out: dict[str, Any] = {}
    for name, kind, values in zip(names, kinds, gathered):
        dtype = _NUMERIC.get(kind)
        if dtype is None:
            out[name] = values
            continue
        lengths = set(map(len, values))
        if len(lengths) != 1:
            return None
        length = lengths.pop()
        array = np.array(values, dtype=dtype)
        out[name] = array.reshape(len(values), length)
    return out
