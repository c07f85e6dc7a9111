"""Which rank this process is, and checkpoints that agree across ranks.

Rank detection lives in :mod:`shardfeed.pipeline.ranks` (the Loader uses it) and is re-exported
here. First match wins (explicit ``rank=`` / ``world_size=`` arguments of the
Loader override all of them)::

    1. torch.distributed    an initialised default process group   (only if torch is imported)
    2. RANK / WORLD_SIZE     environment variables (torchrun, torch.distributed.launch, ...)
    3. JAX                   jax.process_index() / jax.process_count() > 1 (only if jax is imported)
    4. (0, 1)                a single process

The core never imports torch or jax: they are consulted only when the program has imported
them already (``"torch" in sys.modules``).

Checkpoints: the Loader's state counts the samples the whole job has consumed
(``consumed``, global), so every rank that saves after the same number of batches holds the
same state and rank 0's is enough::

    state = loader.state()                         # identical on every rank at a given step
    if rank == 0:
        save(state)
    ...
    loader = Loader(ds, batch_size=B, seed=S)      # any number of ranks
    loader.restore(load())                         # the ranks split what is left of the epoch

:func:`agreed_state` checks states gathered from all ranks and returns the one to save.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from shardfeed.errors import StateError
from shardfeed.pipeline.ranks import SOURCES, RankInfo, _from_torch, detect_ranks, resolve_ranks

__all__ = ["SOURCES", "RankInfo", "agreed_state", "detect_ranks", "gather_states", "resolve_ranks"]

# Keys every rank's state must share; "skipped" counts this rank's replaced samples only.
_SHARED_KEYS = ("seed", "epoch", "consumed", "source")


def agreed_state(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The state to checkpoint, from the states of all ranks taken at the same step.

    Ranks of a data-parallel job hold identical ``seed``, ``epoch``, ``consumed`` and source
    state after the same number of batches; this checks that and returns rank 0's state (its
    ``skipped`` counts rank 0's replaced samples only). Raises :class:`StateError` naming
    the first rank that differs: that rank saved at another step.
    """
    if isinstance(states, Mapping) or not isinstance(states, Sequence) or not states:
        raise TypeError("states must be a non-empty list of Loader.state() dicts, one per rank")
    first = states[0]
    for rank, state in enumerate(states):
        if not isinstance(state, Mapping):
            raise TypeError(f"states[{rank}] must be a Loader.state() dict, got {state!r}")
        for key in _SHARED_KEYS:
            if key not in state:
                raise StateError(f"states[{rank}] has no {key!r}: pass Loader.state() dicts")
            if state[key] != first[key]:
                raise StateError(
                    f"rank {rank} saved {key}={state[key]!r} but rank 0 saved "
                    f"{first[key]!r}: the ranks saved at different steps; save every rank's "
                    "state after the same number of batches"
                )
    return dict(first)


def gather_states(state: Mapping[str, Any]) -> dict[str, Any]:
    """Under torch.distributed: gather every rank's ``state`` and return :func:`agreed_state`.

    A collective call: every rank must call it at the same step. Without an initialised
    process group it returns ``state`` unchanged. Only imports torch if it is imported already.
    """
    info = _from_torch()
    if info is None or info.world_size == 1:
        return dict(state)
    dist = sys.modules["torch"].distributed
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, dict(state))
    return agreed_state(gathered)
