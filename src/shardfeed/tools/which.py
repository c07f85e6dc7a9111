"""``shardfeed.records_at`` and ``shardfeed which``: which records a step of a run held, from a
loader state the run saved, without the run's loader (see
:mod:`shardfeed.pipeline.step_records`, which computes it).

Determinism: the run's. State: none. Memory: one batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from shardfeed.pipeline.loader import Loader
from shardfeed.pipeline.options import OnError, Remainder
from shardfeed.pipeline.step_records import StepRecords, check_run_state, loader_state_of


def records_of_run(source: Any, state: Any, step: int, *, batch_size: int,
                   world_size: int = 1, rank: int | None = None, state_step: int | None = None,
                   transform: Any = None, on_error: OnError = "raise", drop_last: bool = False,
                   remainder: Remainder | None = None) -> StepRecords:
    """:meth:`Loader.records_at` from a saved loader state, without the run's loader:
    ``source`` as the run gave its Loader (a Dataset, or the Windows, Patches or Mixture
    over it), ``state`` one of its saved states (``loader.state()``, its JSON text or file,
    a LoaderCheckpoint's ``loader_state.json`` or folder), and the run's batch size, ranks,
    transform, ``on_error``, ``drop_last`` and ``remainder`` (what decides its batches and
    which samples are bad; the defaults are the Loader's: ``remainder`` None is ``"drop"``
    with ``drop_last``, else ``"pad"``). ``state_step``: the step at which the run saved (or
    restored) ``state``: steps are then counted from it (a run that changed its batch size
    or ranks at that restore); None: from the run's start. The state is checked against
    ``source`` (StateError naming what differs); its batch stages' states, which decide
    nothing of which records a step holds, are not."""
    state = loader_state_of(state)
    with _run_loader(source, state, batch_size=batch_size, world_size=world_size,
                     transform=transform, on_error=on_error, drop_last=drop_last,
                     remainder=remainder, on_step=state_step is None) as loader:
        after = None if state_step is None else (state, state_step)
        return loader.records_at(step, rank=rank, after=after)


def record_steps(source: Any, state: Any, record: int, epoch: int | None = None,
                 *, batch_size: int, world_size: int = 1, drop_last: bool = False,
                 remainder: Remainder | None = None) -> list[tuple[int, int, int]]:
    """:meth:`Loader.where_record` from a saved state: the ``(step, rank, row)`` at which
    ``record`` is in epoch ``epoch``'s batches (None: the state's epoch), steps from the
    run's start; the run's options as for :func:`records_of_run`."""
    state = loader_state_of(state)
    with _run_loader(source, state, batch_size=batch_size, world_size=world_size,
                     transform=None, on_error="raise", drop_last=drop_last,
                     remainder=remainder, on_step=True) as loader:
        return loader.where_record(record, int(state["epoch"]) if epoch is None else epoch)


@contextlib.contextmanager
def _run_loader(source: Any, state: Mapping[str, Any], *, on_step: bool,
                **options: Any) -> Iterator[Loader]:
    """A one-thread Loader over ``source`` with the state's seed and order and ``options``,
    the state checked against it (see :func:`check_run_state`) and restored."""
    try:
        seed, shuffle = int(state["seed"]), bool(state["shuffle"])
    except (TypeError, ValueError):
        raise ValueError(f"the state's seed {state['seed']!r} is not a seed (an int): pass "
                         "the state the run saved, unchanged") from None
    with Loader(source, seed=seed, shuffle=shuffle, order_method=state["order_method"],
                rank=0, num_threads=1, **options) as loader:
        check_run_state(loader, state, on_step=on_step)
        loader.restore(state)
        yield loader


__all__ = ["record_steps", "records_of_run"]
