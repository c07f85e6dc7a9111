"""Batch stages: work done on each whole batch, with the keys of its samples.

A batch stage is the place for work that is cheaper, or only possible, a batch at a time: a
decode on the GPU, a per-batch conversion, a mix of samples (MixUp, CutMix). The Loader calls
its stages in order on every batch it hands out, in the thread that iterates::

    loader = Loader(ds, batch_size=256, transform=..., batch_stages=[stage])
    for batch in loader:        # = stage(batch_from_workers, keys)

Contract (:class:`BatchStage`; :class:`BatchStageBase` gives the defaults):

- ``stage(batch, keys)`` returns the batch to hand out (the same dict changed, or a new one).
  ``keys`` (:class:`BatchKeys`) are the keys the rows were made with: row ``i`` is the sample
  of epoch position ``keys.positions[i]``, and ``keys.rng(i, purpose)`` is the very generator
  a per-sample transform got for that row (a row whose sample was replaced, with
  ``on_error="skip"``, carries its stand-in's position). A stage that draws from these keys
  draws what a per-sample path would, so moving work between a transform and a stage keeps
  the same random choices.
- Called once per handed-out batch, in order, after the workers built it; never ahead of the
  caller, unless the stage runs ahead (:class:`RunAheadStage`, below). A stage that raises ends the pass without the batch counted as handed out: the
  Loader's state still has it to come, and iterating again builds it again. So ``state()``
  describes exactly the batches handed out; it is saved in the
  Loader's state (``"batch_stages"``) and given back to ``restore()``, which raises
  :class:`~shardfeed.errors.StateError` for a state this stage cannot continue.
- ``close()`` frees what the stage holds (device memory, threads); the Loader calls it once
  from its own ``close()``.

A stage that runs ahead (:class:`RunAheadStage`: ``ahead_batches`` > 0 and ``hand_over``) is
called on a thread of the Loader's own, up to ``ahead_batches`` batches before the caller asks
(:mod:`shardfeed.pipeline.run_ahead`), still once per batch and in order; ``hand_over(batch)``
is then called on the caller's thread as each batch is handed out (where a device stage makes
the caller's stream wait for the batch). The Loader's ``state()`` still describes exactly the
batches handed out: the ones made ahead are made again after a restore or a new pass.

Determinism: a stage whose output is a function of the batch and its keys keeps the Loader's
rule (same seed, same bytes, whatever the thread count). Memory: what the stage allocates;
it is not in :meth:`Loader.memory_budget` unless the stage says (``memory_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from shardfeed.errors import StateError
from shardfeed.pipeline.samplers import SampleKey
from shardfeed.sampling.keys import AUGMENT, sample_rng

__all__ = ["BatchKeys", "BatchStage", "BatchStageBase", "RunAheadStage", "SliceBoundStage",
           "as_stages", "slice_threads_of"]

Batch = dict[str, Any]


@dataclass(frozen=True, slots=True)
class BatchKeys:
    """The keys of a batch's rows: row ``i`` was made from ``(seed, epoch, positions[i])``.

    ``positions`` is a read-only int64 array, one entry a row of the batch.
    """

    seed: int
    epoch: int
    positions: np.ndarray

    def __len__(self) -> int:
        return len(self.positions)

    def key(self, row: int) -> SampleKey:
        """The :class:`SampleKey` row ``row`` was made with."""
        return SampleKey(self.seed, self.epoch, int(self.positions[row]))

    def rng(self, row: int, purpose: int = int(AUGMENT)) -> np.random.Generator:
        """The keyed generator of row ``row``: the draws its transform got for ``purpose``."""
        return sample_rng(self.seed, self.epoch, int(self.positions[row]), purpose)


@runtime_checkable
class BatchStage(Protocol):
    """What the Loader needs from a batch stage (see the module docstring)."""

    def __call__(self, batch: Batch, keys: BatchKeys, /) -> Batch:
        """The batch to hand out, made from ``batch`` and the keys of its rows."""
        ...

    def state(self) -> dict[str, Any]:
        """JSON-serialisable: what :meth:`restore` needs to continue after the batches so far."""
        ...

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; StateError (changing nothing) if it is not one of ours."""
        ...

    def close(self) -> None:
        """Free what the stage holds; idempotent."""
        ...


@runtime_checkable
class RunAheadStage(BatchStage, Protocol):
    """A batch stage the Loader calls ahead of the caller, on a thread of its own (see the
    module docstring)."""

    @property
    def ahead_batches(self) -> int:
        """Batches made ahead of the caller (at least 1 for the stage to run ahead)."""
        ...

    def hand_over(self, batch: Batch, /) -> Batch:
        """``batch`` (made by this stage ahead of time) as the caller gets it, called on the
        caller's thread when it is handed out."""
        ...


@runtime_checkable
class SliceBoundStage(BatchStage, Protocol):
    """A batch stage whose loader's slices should build on at most :attr:`slice_threads`
    threads while it runs: the CPU half it asks of the slices holds the GIL for most of
    their time (planning for a device), so more threads only queue for the GIL, and past a
    few they slow each other and the stage's own thread down."""

    @property
    def slice_threads(self) -> int:
        """The most slices built at once (>= 1)."""
        ...


def slice_threads_of(stages: Sequence[BatchStage]) -> int | None:
    """The fewest slice threads any of ``stages`` asks for; None when none asks."""
    asked = [int(stage.slice_threads) for stage in stages if isinstance(stage, SliceBoundStage)]
    return max(1, min(asked)) if asked else None


_MEMBERS = ("__call__", "state", "restore", "close")


class BatchStageBase:
    """Defaults for a batch stage without state of its own.

    Its state is its :meth:`fingerprint`, ``{"stage": <class name>, **self.options()}``: a restore
    refuses the state of another stage, or of this stage with other options (which would make
    another stream). Subclasses implement ``__call__`` and, when options change the output,
    :meth:`options`; a stage with a running state overrides ``state`` and ``restore``.
    """

    def __call__(self, batch: Batch, keys: BatchKeys, /) -> Batch:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(batch, keys)")

    def options(self) -> dict[str, Any]:
        """The options that change what the stage makes (JSON values); none by default."""
        return {}

    def memory_bytes(self) -> int:
        """The most memory the stage holds beyond the batches, for the Loader's budget."""
        return 0

    def fingerprint(self) -> dict[str, Any]:
        """What makes this stage's output: its class name and :meth:`options`."""
        return {"stage": type(self).__qualname__, **self.options()}

    def state(self) -> dict[str, Any]:
        return self.fingerprint()

    def restore(self, state: Mapping[str, Any]) -> None:
        """Check that ``state`` holds this stage's fingerprint (a subclass with a running state
        calls this first, then takes its own keys)."""
        own = self.fingerprint()
        saved = {key: state.get(key) for key in own}
        if saved != own:
            raise StateError(
                f"the saved batch stage state {dict(state)!r} is not this stage's {own!r}: the "
                "state was saved with another stage or other stage options; build the Loader "
                "with the stages it was saved with"
            )

    def close(self) -> None:
        return None


def as_stages(stages: BatchStage | Sequence[BatchStage] | None) -> tuple[BatchStage, ...]:
    """``stages`` as a tuple, each checked to have every member (TypeError naming a missing one)."""
    if stages is None:
        return ()
    if not isinstance(stages, Sequence):
        stages = [stages]
    for stage in stages:
        missing = [name for name in _MEMBERS if not callable(getattr(stage, name, None))]
        if missing:
            raise TypeError(
                f"batch_stages: {type(stage).__name__} is not a batch stage, it lacks "
                f"{', '.join(missing)}; implement shardfeed.BatchStage (or subclass "
                "shardfeed.BatchStageBase, which gives state, restore and close)"
            )
    return tuple(stages)


def stage_memory_bytes(stages: Sequence[BatchStage]) -> int:
    """What the stages say they hold (``memory_bytes()``; 0 for a stage that does not say)."""
    total = 0
    for stage in stages:
        method = getattr(stage, "memory_bytes", None)
        total += int(method()) if callable(method) else 0
    return total


def save_stages(stages: Sequence[BatchStage]) -> list[dict[str, Any]]:
    """The stages' states, in order (the Loader state's ``"batch_stages"``)."""
    return [dict(stage.state()) for stage in stages]


def check_stage_states(stages: Sequence[BatchStage], saved: Any) -> list[Mapping[str, Any]]:
    """``saved`` as one state a stage, or StateError when it does not match the stages."""
    if not stages and saved is None:
        return []
    if saved is None:
        raise StateError(
            f"the state was saved by a loader without batch stages, this one has "
            f"{len(stages)}: build the Loader as it was saved (batch_stages=None)"
        )
    if not stages:
        raise StateError(
            f"the state was saved by a loader with {len(saved) if isinstance(saved, list) else '?'} "
            "batch stage(s), this one has none: build the Loader with the batch_stages it was "
            "saved with"
        )
    if not isinstance(saved, list) or not all(isinstance(s, Mapping) for s in saved):
        raise StateError(
            f"state['batch_stages'] must be a list of dicts, got {saved!r}: the state is damaged"
        )
    if len(saved) != len(stages):
        raise StateError(
            f"the state was saved with {len(saved)} batch stage(s), this loader has "
            f"{len(stages)}: build the Loader with the batch_stages it was saved with"
        )
    return list(saved)


def restore_stages(stages: Sequence[BatchStage], saved: Any, *, then: Callable[[], None]) -> None:
    """Restore every stage from ``saved``, then call ``then``; if any of it raises, the stages
    get their states from before back (a refused restore changes nothing) and it re-raises."""
    parts = check_stage_states(stages, saved)
    before = save_stages(stages)
    try:
        for stage, part in zip(stages, parts):
            stage.restore(part)
        then()
    except BaseException:
        for stage, part in zip(stages, before):
            stage.restore(part)
        raise
