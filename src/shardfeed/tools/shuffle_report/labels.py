"""The labels of a shuffle report: read from a dataset, checked to be classes, coded 0..K-1.

The report's label figures (where the last class first appears, distinct labels a batch) count
classes, so the label must be categorical: one integer, string or one-hot vector a record.
:func:`encode_labels` refuses anything else with a :class:`ValueError` naming the feature and
the fix (a float feature, several values a record, or nearly one value a record, which is an
identifier rather than a class) instead of counting every distinct float as a "class".

Memory: the labels (one Python value a record while reading, then one int64 code a record);
reading holds one chunk of decoded records at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shardfeed.errors import SchemaError
from shardfeed.tools.shuffle_report.buffer import check_count as _check_int

__all__ = [
    "LabelSource",
    "check_label_feature",
    "class_features",
    "encode_labels",
    "label_key_of",
    "read_labels",
]

DEFAULT_LABEL_KEY = "image/class/label"
CHUNK_RECORDS = 1024  # records decoded at a time: bounded memory even for large images
# A class holds records: below two records a class on average, the values name records
# (file ids, timestamps), and every class figure of the report would be meaningless.
_MIN_RECORDS_PER_CLASS = 2

Progress = Callable[[int, int], None]


class LabelSource(Protocol):
    """What the report needs of a dataset: the contract of :class:`shardfeed.dataset.Dataset`."""

    def __len__(self) -> int: ...

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]: ...


def _label_value(value: Any) -> Any:
    """One record's label as a hashable scalar: int/float, str, or a tuple for a vector."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return tuple(_label_value(v) for v in value)
    array = np.asarray(value)
    if array.ndim == 0:
        return array.item()
    if array.size == 1:
        return array.reshape(-1)[0].item()
    return tuple(array.reshape(-1).tolist())


def label_key_of(dataset: Any, label_key: str | None) -> str | None:
    """``label_key`` if given, else the schema's label key, else ``image/class/label`` when the
    schema has it, else None."""
    if label_key is not None:
        return label_key
    schema = getattr(dataset, "schema", None)
    key = getattr(schema, "label_key", None)
    if key:
        return str(key)
    features = getattr(schema, "features", None) or {}
    return DEFAULT_LABEL_KEY if DEFAULT_LABEL_KEY in features else None


def class_features(dataset: Any) -> list[str]:
    """Features that can be a class: one int64 value a record (from the schema, if known)."""
    features = getattr(getattr(dataset, "schema", None), "features", None) or {}
    return sorted(
        name for name, info in features.items()
        if getattr(info, "kind", None) == "int64" and getattr(info, "length", None) == 1
    )


def _fix(key: str | None, candidates: Sequence[str]) -> str:
    if key is None:
        return "give one integer class (or string, or one-hot vector) per record"
    fix = "pass label_key= (--label-key) naming an integer class feature"
    if candidates:
        fix += " such as " + ", ".join(repr(c) for c in candidates[:5])
    return fix


def _what(key: str | None) -> str:
    return "the label array" if key is None else f"label feature {key!r}"


def check_label_feature(dataset: Any, key: str) -> None:
    """Refuse, before reading a record, a label feature the schema already shows is not a
    class: a float feature of one value a record. ValueError naming the key and the fix."""
    features = getattr(getattr(dataset, "schema", None), "features", None) or {}
    info = features.get(key)
    if info is not None and getattr(info, "kind", None) == "float" and info.length == 1:
        raise ValueError(
            f"{_what(key)} holds float values, not classes: a shuffle report counts classes; "
            f"{_fix(key, class_features(dataset))}"
        )


def read_labels(
    dataset: LabelSource,
    label_key: str,
    *,
    chunk_records: int = CHUNK_RECORDS,
    progress: Progress | None = None,
) -> list[Any]:
    """The label of every record of ``dataset``, in stored order, read in chunks.

    Raises :class:`SchemaError` naming the record when one has no ``label_key`` feature.
    ``progress(done, total)`` is called after each chunk.
    """
    chunk_records = _check_int("chunk_records", chunk_records, minimum=1)
    total = len(dataset)
    labels: list[Any] = []
    for start in range(0, total, chunk_records):
        stop = min(start + chunk_records, total)
        for offset, record in enumerate(dataset.read_many(range(start, stop))):
            if label_key not in record:
                where = f"record {start + offset}"
                locate = getattr(dataset, "locate", None)
                if callable(locate):
                    from shardfeed.errors import location

                    path, index, byte = locate(start + offset)
                    where = location(path, index, byte)
                raise SchemaError(
                    f"{where} has no feature {label_key!r} (it has {sorted(record)}): "
                    f"pass label_key= (--label-key) naming the label feature"
                )
            labels.append(_label_value(record[label_key]))
        if progress is not None:
            progress(stop, total)
    return labels


def _examples(values: npt.NDArray[Any]) -> str:
    shown = [f"{v:g}" if isinstance(v, float) else str(v) for v in values[:3].tolist()]
    return ", ".join(shown)


def encode_labels(
    values: Sequence[Any] | npt.NDArray[Any],
    *,
    key: str | None = None,
    candidates: Sequence[str] = (),
) -> tuple[npt.NDArray[np.int64], list[str]]:
    """Labels as integer codes ``0..K-1`` (sorted by value) and the K class names.

    A class is an integer, a bool, a string, or a one-hot vector (the class is where its 1 is).
    Anything else is refused with a :class:`ValueError` naming ``key`` (None: a label array)
    and the fix, listing ``candidates`` (integer features) if given: float values, several
    values a record, or more classes than half the records (an identifier, not a class).
    """
    what = _what(key)
    try:
        array = np.asarray(values)
    except ValueError:  # label vectors of different lengths
        raise ValueError(
            f"{what} holds a varying number of values a record, not one class a record; "
            f"{_fix(key, candidates)}"
        ) from None
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim == 2:
        one_hot = (
            array.dtype.kind in "biuf"
            and array.size > 0
            and bool(np.all((array == 0) | (array == 1)))
            and bool(np.all(array.sum(axis=1) == 1))
        )
        if not one_hot:
            raise ValueError(
                f"{what} holds {array.shape[1]} values a record (not a one-hot vector), not "
                f"one class a record; {_fix(key, candidates)}"
            )
        array = np.argmax(array, axis=1)
    if array.ndim != 1:
        raise ValueError(f"{what} must hold one class a record, got shape {array.shape}")
    if array.dtype.kind not in "biuUS":
        kind = "float" if array.dtype.kind == "f" else array.dtype.name
        raise ValueError(
            f"{what} holds {kind} values (e.g. {_examples(array)}), not classes: a shuffle "
            f"report counts classes; {_fix(key, candidates)}"
        )
    classes, codes = np.unique(array, return_inverse=True)
    if classes.size * _MIN_RECORDS_PER_CLASS > array.size:
        raise ValueError(
            f"{what} has {classes.size:,} distinct values in {array.size:,} records, fewer "
            f"than {_MIN_RECORDS_PER_CLASS} records a value on average: an identifier, not a "
            f"class; "
            f"{_fix(key, candidates)}"
        )
    names = [str(c.item()) for c in classes]
    return np.asarray(codes, dtype=np.int64).reshape(-1), names
