"""Where a Loader stands: its state dict (checked before a restore) and its counters.

State: ``{"seed", "epoch", "consumed", "skipped", "shuffle", "order_method", "source"}``,
JSON-serialisable; see :mod:`shardfeed.pipeline.loader`. ``shuffle`` and ``order_method``
decide the epoch order, so a state only restores into a loader with the same ones (the
method only matters when shuffling); ``source`` is the sampler's own fingerprint, checked by
the sampler. What does not change the stream may differ: threads, processes, prefetch depth,
batch size, ranks. Determinism: pure checks. Memory: none held.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardfeed.errors import StateError
from shardfeed.pipeline.produce import MAX_REPLACEMENT_TRIES
from shardfeed.pipeline.sampler_state import DATA_KEYS

STATE_KEYS = frozenset(
    {"seed", "epoch", "consumed", "skipped", "shuffle", "order_method", "source"}
)
_EARLIER_KEYS = frozenset({"seed", "epoch", "consumed", "skipped", "source"})
"""The keys of a state saved before the order options were recorded."""
RUN_KEYS = ("batch_size", "world_size", "drop_last", "remainder")
"""``state["run"]``: the options of the run that saved the state which decide its steps'
batches beyond the stream (``shardfeed which`` reads them). A state restores on other ones
(it is checked, not compared), and one saved before they were recorded has no ``"run"``."""
_MAX_WORD = (1 << 64) - 1  # seeds and epochs key the generators as 64-bit words


def check_state(
    state: Any, *, seed: int, samples_per_epoch: int, shuffle: bool, order_method: str
) -> Mapping[str, Any]:
    """``state`` if it is a Loader state this loader can continue; else :class:`StateError`.

    Checks the keys; that the counters are ints in range (``epoch`` a 64-bit word,
    ``consumed`` within an epoch of ``samples_per_epoch`` samples, ``skipped`` at most what
    one epoch can replace); that seed, shuffle and (when shuffling) order method are this
    loader's; and that the sampler's part is a dict. The sampler checks its own part.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is a dict from Loader.state(), got {type(state)}")
    _check_keys(set(state) - {"run"})
    if "run" in state:
        check_run(state["run"])
    _check_counters(state, samples_per_epoch=samples_per_epoch)
    if state["seed"] != seed:
        raise StateError(
            f"the state was saved with seed={state['seed']}, this loader has "
            f"seed={seed}: construct the Loader with seed={state['seed']}"
        )
    _check_order(state, shuffle=shuffle, order_method=order_method)
    source_state = state["source"]
    if not isinstance(source_state, Mapping):
        raise StateError(f"state['source'] must be a dict, got {source_state!r}")
    return state


def run_of(options: Any) -> dict[str, Any]:
    """``state["run"]`` of a Loader with ``options`` (see ``RUN_KEYS``)."""
    return {"batch_size": options.batch_size, "world_size": options.world_size,
            "drop_last": options.drop_last, "remainder": options.remainder}


def check_run(run: Any) -> None:
    """StateError unless ``run`` is a state's ``"run"`` part (see ``RUN_KEYS``)."""
    ok = (isinstance(run, Mapping) and set(run) == set(RUN_KEYS)
          and all(type(run[k]) is int and run[k] >= 1 for k in ("batch_size", "world_size"))
          and type(run["drop_last"]) is bool and run["remainder"] in ("pad", "drop"))
    if not ok:
        raise StateError(
            f"state['run'] must be {{'batch_size': int >= 1, 'world_size': int >= 1, "
            f"'drop_last': bool, 'remainder': 'pad' or 'drop'}} (the options of the run that "
            f"saved it), got {run!r}: pass the state Loader.state() returned, unchanged"
        )


def across_versions(state: dict[str, Any], source: Mapping[str, Any], *, saved: int,
                    own: int, to_latest: bool) -> dict[str, Any]:
    """``state``, saved on version ``saved`` of the dataset whose version ``own`` this loader
    reads (``source``: its sampler state): with ``to_latest``, at an epoch's end, the state
    of the next epoch's start on version ``own``; else StateError saying how to continue it.
    StateError too for a state in the middle of an epoch, of a newer version, or of other
    sampler options."""
    if saved > own:
        raise StateError(f"the state was saved on version {saved} of its dataset, newer than "
                         f"the version {own} this loader reads: open Dataset(folder, "
                         f"version={saved})")
    if not to_latest:
        raise StateError(
            f"the state was saved on version {saved} of this loader's dataset, which reads "
            f"version {own}: open Dataset(folder, version={saved}) to continue the state "
            "exactly (each version's epoch is its own permutation), or at an epoch's end "
            "restore(state, to_latest=True) on this loader: its next epoch is one of version "
            f"{own}")
    if saved > own:
        raise StateError(f"the state was saved on version {saved} of its dataset, newer than "
                         f"the version {own} this loader reads: open Dataset(folder, "
                         f"version={saved})")
    kept = state["source"]
    for key in source:
        if key not in DATA_KEYS and kept.get(key) != source[key]:
            raise StateError(f"state['source'][{key!r}] is {kept.get(key)!r}, this loader's "
                             f"is {source[key]!r}: build the loader as the state's was")
    epoch, consumed = state.get("epoch"), state.get("consumed")
    size = kept.get("windows", kept.get("records"))
    if type(epoch) is not int or type(consumed) is not int:
        return state  # check_state names what is wrong
    if consumed != 0 and consumed != size:
        raise StateError(
            f"the state is in the middle of epoch {epoch} of version {saved} of its dataset "
            f"({consumed} of {size} positions taken), and a version's epoch is a permutation "
            f"of its own records: finish that epoch on a loader over Dataset(folder, "
            f"version={saved}) restored with it, then restore its state at the epoch's end "
            "with to_latest=True")
    return {**state, "epoch": epoch + (1 if consumed else 0), "consumed": 0, "skipped": 0,
            "source": dict(source)}


def _check_keys(keys: set[Any]) -> None:
    """StateError unless ``keys`` are exactly a Loader state's (an older state is named so)."""
    if keys == _EARLIER_KEYS:
        raise StateError(
            "this state predates the 'shuffle' and 'order_method' fields (and the dataset "
            "fingerprint), so it cannot be checked against this loader: restoring it into a "
            "loader with another order would repeat some samples and skip others. If you are "
            "sure it was saved by a loader built exactly like this one, carry its position "
            "over: state = {**loader.state(), 'epoch': old['epoch'], 'consumed': "
            "old['consumed'], 'skipped': old['skipped']}; else start the epoch again "
            "(loader.set_epoch(old['epoch']))"
        )
    if keys != STATE_KEYS:
        missing = sorted(STATE_KEYS - keys)
        foreign = sorted(keys - STATE_KEYS)
        raise StateError(
            f"not a Loader state: missing keys {missing}, foreign keys {foreign}; pass the "
            "dict Loader.state() returned (nested states pass their 'loader' part)"
        )


def _check_counters(state: Mapping[str, Any], *, samples_per_epoch: int) -> None:
    """StateError unless seed, epoch, consumed and skipped are non-negative ints in range."""
    limits = {
        "seed": (_MAX_WORD, "a 64-bit word"),
        "epoch": (_MAX_WORD, "a 64-bit word"),
        "consumed": (samples_per_epoch, f"the {samples_per_epoch} samples of an epoch here"),
        "skipped": (
            samples_per_epoch * MAX_REPLACEMENT_TRIES,
            f"what an epoch of {samples_per_epoch} samples can replace",
        ),
    }
    for name, (most, what) in limits.items():
        value = state[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StateError(
                f"state[{name!r}] must be a non-negative int, got {value!r}: the state is "
                "damaged; pass the dict Loader.state() returned (a JSON round trip keeps it)"
            )
        if value > most:
            hint = ("the state belongs to another dataset or options" if name == "consumed"
                    else "the state is damaged")
            raise StateError(
                f"state[{name!r}]={value} exceeds {what}: {hint}; restore the state this "
                "loader's own kind saved"
            )


def _check_order(state: Mapping[str, Any], *, shuffle: bool, order_method: str) -> None:
    """StateError unless the saved epoch order is this loader's (see the module docstring)."""
    saved_shuffle, saved_method = state["shuffle"], state["order_method"]
    if not isinstance(saved_shuffle, bool):
        raise StateError(f"state['shuffle'] must be true or false, got {saved_shuffle!r}")
    if saved_method not in ("exact", "bijection"):
        raise StateError(
            f"state['order_method'] must be 'exact' or 'bijection', got {saved_method!r}"
        )
    consequence = ("restoring it here would repeat some samples of the epoch and never give "
                   "others")
    if saved_shuffle != shuffle:
        raise StateError(
            f"state['shuffle'] is {saved_shuffle}, but this loader has shuffle={shuffle}: "
            f"{consequence}; construct the Loader with shuffle={saved_shuffle}"
        )
    if shuffle and saved_method != order_method:
        raise StateError(
            f"state['order_method'] is {saved_method!r}, but this loader has "
            f"order_method={order_method!r}: {consequence}; construct the Loader with "
            f"order_method={saved_method!r}"
        )


def state_to_json(state: Mapping[str, Any]) -> str:
    """A loader state as JSON text (it is JSON-serialisable as is; this fixes key order)."""
    return json.dumps(state, sort_keys=True)
