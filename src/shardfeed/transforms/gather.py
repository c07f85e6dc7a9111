"""Gather numeric features into one array: many per-record scalars become one target.

Records written by other tools often keep each label as a feature of its own (a time-lapse
frame's ``VF`` and ``IRR0`` ... ``IRR21``, one float each); a model wants them as one vector
(Keras: one ``(B, 23)`` float32 target). :class:`Gather` puts the values of its keys side by
side, in the order given, in one array::

    sample                              Gather(["VF", "IRR0", ..., "IRR21"], into="labels")
    "VF"     float32 (1,)   0.71    ->  "labels"  float32 (23,)  [0.71, 0.02, ..., 0.40]
    "IRR0"   float32 (1,)   0.02        batch     float32 (B, 23)
    ...
    "IRR21"  float32 (1,)   0.40

It is the batch form of ``tf.stack([features[k] for k in keys], axis=-1)`` after
``tf.io.parse_example``. Features a record may lack are given a value first, with a
:class:`~shardfeed.format.example.FeatureSpec` default in ``Dataset(features=...)``.

Determinism: a pure function of the sample. State: none. Memory: the gathered array (one
row a sample; a slice's rows in the batch form).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import numpy as np

from shardfeed.errors import SchemaError
from shardfeed.transforms.base import Sample, Specs, TransformBase

GatherDtype = Literal["float32", "float64", "int32", "int64"]
GATHER_DTYPES: tuple[str, ...] = get_args(GatherDtype)


class Gather(TransformBase):
    """Put the values of the numeric features ``keys`` side by side in one array ``into``.

    Each feature's values are flattened and joined in the order of ``keys``, so features of
    one value each give one entry each: 23 scalar features give a ``(23,)`` array, and a
    batch a dense ``(B, 23)`` column. The values are cast to ``dtype`` (float32 by default,
    what Keras takes as a target); integers fit any float type, floats never go into an
    integer type. ``keep``: keep the gathered features in the sample too (default: they
    are dropped, the array replaces them).

    With :class:`~shardfeed.Windows` the transform runs on each frame before the frames are
    stacked, so ``into`` is a label like any numeric feature: with ``labels="last"`` a
    window's array is its last frame's (when ``label_keys`` is given, list ``into`` there).

    It has a batch form (:meth:`apply_batch`): as the last op of a ``Compose`` after a decode
    op, or alone, the loader keeps reading and decoding whole slices.

    Args:
        keys: the features to gather, in order (at least one; no repeats).
        into: the name of the gathered array in the sample.
        dtype: ``"float32"``, ``"float64"``, ``"int32"`` or ``"int64"``.
        keep: keep the gathered features as well.

    Raises:
        ValueError: at construction, for empty or repeated keys, an empty ``into``, an
            unknown ``dtype``, or ``keep=True`` with ``into`` among ``keys``.
        SchemaError: when called, for a sample that lacks a key (give its feature a
            default), a key that holds bytes, floats for an integer ``dtype``, or integers
            that ``dtype`` cannot hold.
    """

    __slots__ = ("dtype", "into", "keep", "keys")
    draws_random = False

    def __init__(self, keys: Sequence[str], /, *, into: str,
                 dtype: GatherDtype = "float32", keep: bool = False) -> None:
        if isinstance(keys, str) or not isinstance(keys, Sequence):
            raise TypeError(
                f"Gather takes a list of feature names, got {keys!r}; for one feature, pass "
                f"[{keys!r}]")
        names = list(keys)
        if not names or not all(isinstance(k, str) and k for k in names):
            raise ValueError(f"Gather keys must be one or more feature names, got {keys!r}")
        repeated = sorted({k for k in names if names.count(k) > 1})
        if repeated:
            raise ValueError(f"Gather keys must not repeat, got {repeated} more than once")
        if not isinstance(into, str) or not into:
            raise ValueError(f"Gather into must be a feature name, got {into!r}")
        if dtype not in GATHER_DTYPES:
            raise ValueError(f"Gather dtype must be one of {GATHER_DTYPES}, got {dtype!r}")
        if not isinstance(keep, bool):
            raise TypeError(f"Gather keep must be True or False, got {keep!r}")
        if keep and into in names:
            raise ValueError(
                f"Gather(keep=True) cannot write into {into!r}, one of the gathered keys: "
                "name the array otherwise, or leave keep=False")
        self.keys: tuple[str, ...] = tuple(names)
        self.into = into
        self.dtype = np.dtype(dtype)
        self.keep = keep

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        parts = []
        for key in self.keys:
            if key not in sample:
                raise SchemaError(
                    f"Gather: the sample has no feature {key!r} (it has {sorted(sample)}); "
                    "fix the name, or give the feature a default for the records that lack "
                    f"it: Dataset(features={{{key!r}: FeatureSpec('float', shape=(), "
                    "default=0.0), ...}})")
            parts.append(self._numbers(key, np.asarray(sample[key])).reshape(-1))
        out = self._without_keys(sample)
        out[self.into] = self._cast(np.concatenate(parts))
        return out

    def apply_batch(
        self, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
        out: Mapping[str, np.ndarray],
    ) -> dict[str, Any] | None:
        """The rows :meth:`__call__` gives, from numeric columns of ``(rows, length)``;
        None (the loader goes sample by sample) where a key is missing or not numeric."""
        parts = []
        for key in self.keys:
            column = columns.get(key)
            if not isinstance(column, np.ndarray) or column.dtype.kind not in "biuf":
                return None
            parts.append(column.reshape(len(column), -1))
        result = self._without_keys(columns)
        result[self.into] = self._cast(np.concatenate(parts, axis=1))
        return result

    def output_spec(self, specs: Specs) -> Specs | None:
        """``"image"`` and ``"mask"`` pass through unchanged."""
        gone = {self.into, *(() if self.keep else self.keys)}
        return {name: spec for name, spec in specs.items() if name not in gone}

    def _without_keys(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        if self.keep:
            return dict(sample)
        return {name: value for name, value in sample.items() if name not in self.keys}

    def _numbers(self, key: str, values: np.ndarray) -> np.ndarray:
        if values.dtype.kind not in "biuf":
            raise SchemaError(
                f"Gather: feature {key!r} holds {values.dtype} {values.shape}, not numbers; "
                "gather int64 or float features only")
        if values.dtype.kind == "f" and self.dtype.kind != "f":
            raise SchemaError(
                f"Gather: feature {key!r} holds floats, which {self.dtype} would cut; gather "
                "into dtype='float32' (or 'float64')")
        return values

    def _cast(self, values: np.ndarray) -> np.ndarray:
        if values.dtype.kind == "f" and self.dtype.kind != "f":
            raise SchemaError(
                f"Gather into {self.into!r}: the features hold floats, which {self.dtype} "
                "would cut; gather into dtype='float32' (or 'float64')")
        if self.dtype.kind in "iu" and values.size and not np.can_cast(values.dtype, self.dtype):
            info = np.iinfo(self.dtype)
            low, high = int(values.min()), int(values.max())
            if low < info.min or high > info.max:
                raise SchemaError(
                    f"Gather into {self.into!r}: values {low}..{high} do not fit "
                    f"{self.dtype}; gather into dtype='int64'")
        return values.astype(self.dtype)

    def __repr__(self) -> str:
        return (f"Gather({list(self.keys)!r}, into={self.into!r}, dtype={str(self.dtype)!r}"
                f"{', keep=True' if self.keep else ''})")


__all__ = ["GATHER_DTYPES", "Gather", "GatherDtype"]
