"""The check every sampler makes before a restore: its saved state against its own.

A sampler's state (the Loader state's ``"source"``) names the data it reads (``kind``,
``records``, ``windows``, ``index``, ``dataset``: the data source's fingerprint) and the
options that decide its stream; a restore continues the saved stream only when all of them
are this sampler's own. Determinism, state,
memory: none (a pure check).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardfeed.errors import StateError


def check_sampler_state(
    state: Mapping[str, Any], expected: Mapping[str, Any], *, sampler: str
) -> None:
    """StateError unless a sampler's saved ``state`` equals its own ``expected`` state.

    ``sampler`` names this loader's sampler in the message (``"Windows"``). The error names
    the first key that differs, both values and what to do: the keys ``kind``, ``records``,
    ``windows``, ``index`` and ``dataset`` describe the data, every other key an option.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"state['source'] must be a dict, got {state!r}")
    kind = state.get("kind")
    if kind != expected["kind"]:
        raise StateError(
            f"state['source']['kind'] is {kind!r}, but this loader reads {expected['kind']}: "
            f"the state was saved by a Loader over {kind}; restore it on one like that"
        )
    for key, want in expected.items():
        got = state.get(key, want)  # a missing key is reported below
        if _same(got, want):
            continue
        if key == "dataset":
            fix = "restore it on a Loader over the dataset the state was saved on"
            if isinstance(got, str) and got.split(":")[0] != str(want).split(":")[0]:
                how = ("bare TFRecord files" if got.startswith("files:")
                       else "its manifest")
                fix += f" (opened then from {how}: open it the same way)"
        elif key == "records":
            fix = "restore it on a Loader over the dataset it was saved on"
        elif key in ("windows", "index"):
            fix = ("the dataset's group ids or order keys (its groups.npy / order.npy) are not "
                   "those the state was saved with; restore it on a Loader over that dataset")
        else:
            fix = f"construct {sampler} with {key}={_as_argument(got)}"
        raise StateError(
            f"state['source'][{key!r}] is {got!r}, but this loader's {sampler} has "
            f"{key}={want!r}: restoring it would not continue the saved stream; {fix}"
        )
    missing = [k for k in expected if k not in state]
    foreign = sorted(str(k) for k in state if k not in expected)
    if missing == ["dataset"] and not foreign:
        raise StateError(
            "state['source'] predates the 'dataset' fingerprint, so it cannot be checked "
            "against this loader's dataset: if you are sure it is the same dataset, take "
            "state['source'] from this loader's state(); else start the epoch again"
        )
    if missing or foreign:
        raise StateError(
            f"state['source'] is not a state of {sampler}: missing keys {missing}, foreign "
            f"keys {foreign}; pass the dict Loader.state() returned"
        )


DATA_KEYS = frozenset({"dataset", "records", "windows", "index"})
"""The keys of a sampler state that describe its data (every other key is an option)."""


def _same(got: Any, want: Any) -> bool:
    """Whether a saved value is this sampler's (True is not 1; 16 and 16.0 are one value)."""
    if isinstance(got, bool) != isinstance(want, bool):
        return False
    try:
        return bool(got == want)
    except (TypeError, ValueError):  # an array or other odd value is no saved option
        return False


def _as_argument(value: Any) -> str:
    """A saved option as the argument that gives it (JSON lists were tuples)."""
    return repr(tuple(value)) if isinstance(value, list) else repr(value)
