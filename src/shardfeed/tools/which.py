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


def records_of_run(source: Any, state: Any, step: int, *, batch_size: int | None = None,
                   world_size: int | None = None, rank: int | None = None,
                   state_step: int | None = None, transform: Any = None,
                   on_error: OnError = "raise", drop_last: bool | None = None,
                   remainder: Remainder | None = None) -> StepRecords:
    """:meth:`Loader.records_at` from a saved loader state, without the run's loader:
    ``source`` as the run gave its Loader (a Dataset, or the Windows, Patches or Mixture
    over it), ``state`` one of its saved states (``loader.state()``, its JSON text or file,
    a LoaderCheckpoint's ``loader_state.json`` or folder), and the run's batch size, ranks,
    transform, ``on_error``, ``drop_last`` and ``remainder`` (what decides its batches and
    which samples are bad). Batch size, ranks, ``drop_last`` and ``remainder`` left None are
    the state's (``state["run"]``, recorded by the loader that saved it); a state saved
    before it held them needs ``batch_size``, and the others are then the Loader's defaults
    (``remainder`` None: ``"drop"`` with ``drop_last``, else ``"pad"``). ``state_step``: the step at which the run saved (or
    restored) ``state``: steps are then counted from it (a run that changed its batch size
    or ranks at that restore); None: from the run's start. The state is checked against
    ``source`` (StateError naming what differs); its batch stages' states, which decide
    nothing of which records a step holds, are not."""
    state = loader_state_of(state)
    options = run_options(state, batch_size=batch_size, world_size=world_size,
                          drop_last=drop_last, remainder=remainder)
    with _run_loader(source, state, transform=transform, on_error=on_error,
                     on_step=state_step is None, **options) as loader:
        after = None if state_step is None else (state, state_step)
        return loader.records_at(step, rank=rank, after=after)


def record_steps(source: Any, state: Any, record: int, epoch: int | None = None,
                 *, batch_size: int | None = None, world_size: int | None = None,
                 drop_last: bool | None = None, remainder: Remainder | None = None
                 ) -> list[tuple[int, int, int]]:
    """:meth:`Loader.where_record` from a saved state: the ``(step, rank, row)`` at which
    ``record`` is in epoch ``epoch``'s batches (None: the state's epoch), steps from the
    run's start; the run's options as for :func:`records_of_run`."""
    state = loader_state_of(state)
    options = run_options(state, batch_size=batch_size, world_size=world_size,
                          drop_last=drop_last, remainder=remainder)
    with _run_loader(source, state, transform=None, on_error="raise", on_step=True,
                     **options) as loader:
        return loader.where_record(record, int(state["epoch"]) if epoch is None else epoch)


def run_options(state: Mapping[str, Any], *, batch_size: int | None = None,
                world_size: int | None = None, drop_last: bool | None = None,
                remainder: Remainder | None = None) -> dict[str, Any]:
    """The run's batch size, ranks, ``drop_last`` and ``remainder``: each as given, else as
    the state records it (``state["run"]``), else the Loader's default; ValueError when no
    batch size is known (a state saved before states held the run's options)."""
    run = state.get("run")
    run = run if isinstance(run, Mapping) else {}
    if batch_size is None:
        if "batch_size" not in run:
            raise ValueError("this state does not hold the run's batch size (it was saved "
                             "before states recorded it): pass the run's batch size")
        batch_size = int(run["batch_size"])
    if world_size is None:
        world_size = int(run.get("world_size", 1))
    if drop_last is None:
        drop_last = bool(run.get("drop_last", False))
    if remainder is None and "remainder" in run and run.get("drop_last") == drop_last:
        remainder = run["remainder"]  # the run's, unless drop_last was changed from it
    return {"batch_size": batch_size, "world_size": world_size, "drop_last": drop_last,
            "remainder": remainder}


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


__all__ = ["record_steps", "records_of_run", "run_options"]
