"""Where a Loader stands: its state dict (checked before a restore) and its counters.

State: ``{"seed", "epoch", "consumed", "skipped", "source"}``, JSON-serialisable; see
:mod:`shardfeed.pipeline.loader`. Determinism: pure checks. Memory: none held.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardfeed.errors import StateError

STATE_KEYS = frozenset({"seed", "epoch", "consumed", "skipped", "source"})


@dataclass(frozen=True, slots=True)
class LoaderStats:
    """Counters of a Loader: bad samples replaced this epoch and since construction."""

    epoch: int
    skipped: int
    skipped_total: int
    batches_total: int


def check_state(state: Any, *, seed: int, samples_per_epoch: int) -> Mapping[str, Any]:
    """``state`` if it is a Loader state this loader can continue; else :class:`StateError`.

    Checks the keys, that the counters are non-negative ints, the seed, that ``consumed``
    fits in an epoch of ``samples_per_epoch`` samples and that the source's part is a dict.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is a dict from Loader.state(), got {type(state)}")
    keys = set(state)
    if keys != STATE_KEYS:
        missing = sorted(STATE_KEYS - keys)
        foreign = sorted(keys - STATE_KEYS)
        raise StateError(
            f"not a Loader state: missing keys {missing}, foreign keys {foreign}; pass the "
            "dict Loader.state() returned (nested states pass their 'loader' part)"
        )
    for name in ("seed", "epoch", "consumed", "skipped"):
        value = state[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StateError(f"state[{name!r}] must be a non-negative int, got {value!r}")
    if state["seed"] != seed:
        raise StateError(
            f"the state was saved with seed={state['seed']}, this loader has "
            f"seed={seed}: construct the Loader with seed={state['seed']}"
        )
    if state["consumed"] > samples_per_epoch:
        raise StateError(
            f"state['consumed']={state['consumed']} exceeds the {samples_per_epoch} "
            "samples of an epoch here: the state belongs to another dataset"
        )
    source_state = state["source"]
    if not isinstance(source_state, Mapping):
        raise StateError(f"state['source'] must be a dict, got {source_state!r}")
    return state


def state_to_json(state: Mapping[str, Any]) -> str:
    """A loader state as JSON text (it is JSON-serialisable as is; this fixes key order)."""
    return json.dumps(state, sort_keys=True)
