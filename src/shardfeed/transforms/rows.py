"""The batch form of an op that reads and writes only the decoded ``"image"``: its own
``__call__`` on each row of the image column, given as a one-entry sample.

The colour, value and layout ops (:mod:`shardfeed.transforms.color`) use it, so a pipeline
of a crop-aware decode followed by them (the presets) runs as a batch: the decode's batch
form fills the image column, these ops follow row by row, the last writing into the batch.

Determinism: row ``i`` is what ``__call__`` gives with row ``i``'s generator. State: none.
Memory: what the op allocates for one row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardfeed.transforms.base import (
    NO_RANDOMNESS,
    ArraySpec,
    Transform,
    call_into,
    output_spec_of,
)


def apply_rows(
    transform: Transform, key: str, columns: dict[str, Any],
    rngs: Sequence[np.random.Generator] | None, out: Mapping[str, np.ndarray],
) -> dict[str, Any] | None:
    """``transform`` on each row of ``columns[key]`` (an N×… decoded image column), written
    into ``out[key]`` (see :meth:`~shardfeed.transforms.base.TransformBase.apply_batch`).

    None unless ``key`` is ``"image"``, the column is a decoded N×H×W×C (or deeper) array,
    and the op declares an output of the batch rows' shape and dtype for it (the sample path
    then writes into the rows as well).
    """
    images = columns.get(key)
    target = out.get(key)
    if (key != "image" or target is None or type(images) is not np.ndarray
            or images.ndim < 4 or len(images) != len(target)
            or (rngs is not None and len(rngs) != len(images))):
        return None
    specs = output_spec_of(transform, {key: ArraySpec(images.shape[1:], images.dtype)})
    spec = specs.get(key) if specs else None
    if spec is None or spec.shape != target.shape[1:] or spec.dtype != target.dtype:
        return None
    for row in range(len(images)):
        rng = NO_RANDOMNESS if rngs is None else rngs[row]
        call_into(transform, {key: images[row]}, rng, target[row])
    result = dict(columns)
    result[key] = target
    return result


__all__ = ["apply_rows"]
