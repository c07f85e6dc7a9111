"""``shardfeed.records_at`` and ``shardfeed which``: which records a step of a run held, from a
loader state the run saved, without the run's loader (see
:mod:`shardfeed.pipeline.step_records`, which computes it).

Determinism: the run's. State: none. Memory: one batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardfeed.pipeline.loader import Loader
from shardfeed.pipeline.options import OnError, Remainder
from shardfeed.pipeline.step_records import StepRecords


def records_of_run(source: Any, state: Mapping[str, Any], step: int, *, batch_size: int,
                   world_size: int = 1, rank: int | None = None, state_step: int | None = None,
                   transform: Any = None, on_error: OnError = "raise", drop_last: bool = False,
                   remainder: Remainder | None = None) -> StepRecords:
    """:meth:`Loader.records_at` from a saved loader state, without the run's loader:
    ``source`` as the run gave its Loader (a Dataset, Windows, Patches, Mixture), ``state``
    one of its saved states (``loader.state()``, its JSON), and the run's batch size, ranks,
    transform, ``on_error``, ``drop_last`` and ``remainder`` (what decides its batches and
    which samples are bad; the defaults are the Loader's: ``remainder`` None is ``"drop"``
    with ``drop_last``, else ``"pad"``). ``state_step``: the step at which the run saved (or
    restored) ``state``: steps are then counted from it (a run that changed its batch size
    or ranks at that restore); None: from the run's start. The state is checked against
    ``source`` (StateError naming what differs); its batch stages' states, which decide
    nothing of which records a step holds, are not."""
    with Loader(source, batch_size=batch_size, seed=int(state["seed"]),
                shuffle=bool(state["shuffle"]), order_method=state["order_method"],
                world_size=world_size, rank=0, transform=transform, on_error=on_error,
                drop_last=drop_last, remainder=remainder, num_threads=1) as loader:
        state = {k: v for k, v in state.items() if k != "batch_stages"}
        loader.restore(state)
        after = None if state_step is None else (state, state_step)
        return loader.records_at(step, rank=rank, after=after)


__all__ = ["records_of_run"]
