"""Which rank this process is, and checkpoints that agree across ranks.

Rank detection, first match wins (explicit ``rank=`` / ``world_size=`` arguments of the
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

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardfeed.errors import StateError

__all__ = ["SOURCES", "RankInfo", "agreed_state", "detect_ranks", "gather_states", "resolve_ranks"]

SOURCES = ("explicit", "torch", "env", "jax", "single")
"""Where a :class:`RankInfo` came from."""

# Keys every rank's state must share; "skipped" counts this rank's replaced samples only.
_SHARED_KEYS = ("seed", "epoch", "consumed", "source")


@dataclass(frozen=True, slots=True)
class RankInfo:
    """This process's ``rank`` among ``world_size`` processes, and where that came from."""

    rank: int
    world_size: int
    source: str = "explicit"

    def __post_init__(self) -> None:
        for name in ("rank", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}; pass the "
                             "number of processes of the job")
        if self.rank < 0:
            raise ValueError(f"rank must be >= 0, got {self.rank}; pass this process's rank")
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be < world_size, got rank={self.rank}, world_size="
                             f"{self.world_size}; pass this process's rank in "
                             f"[0, {self.world_size})")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")


def _from_torch() -> RankInfo | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return RankInfo(int(dist.get_rank()), int(dist.get_world_size()), "torch")


def _env_int(environ: Mapping[str, str], name: str) -> int:
    text = environ[name]
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(
            f"environment variable {name}={text!r} is not an integer; fix it, or pass rank= "
            "and world_size= to the Loader"
        ) from None


def _from_env(environ: Mapping[str, str]) -> RankInfo | None:
    has_rank, has_size = "RANK" in environ, "WORLD_SIZE" in environ
    if not has_rank and not has_size:
        return None
    if has_rank != has_size:
        present, absent = ("RANK", "WORLD_SIZE") if has_rank else ("WORLD_SIZE", "RANK")
        raise ValueError(
            f"environment variable {present} is set but {absent} is not; set both (torchrun "
            f"does), unset {present}, or pass rank= and world_size= to the Loader"
        )
    rank, size = _env_int(environ, "RANK"), _env_int(environ, "WORLD_SIZE")
    if size < 1 or not 0 <= rank < size:
        raise ValueError(
            f"environment variables RANK={rank} and WORLD_SIZE={size} do not describe a rank "
            "(need 0 <= RANK < WORLD_SIZE); fix them, or pass rank= and world_size= to the "
            "Loader"
        )
    return RankInfo(rank, size, "env")


def _from_jax() -> RankInfo | None:
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    count = int(jax.process_count())
    if count <= 1:
        return None
    return RankInfo(int(jax.process_index()), count, "jax")


def detect_ranks(*, environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank and the number of ranks (see the module docstring for the order).

    ``environ`` defaults to ``os.environ``. Raises ValueError when RANK / WORLD_SIZE are set
    but unusable (one without the other, not integers, rank out of range): a silent fallback
    to a single rank would make every process read the whole dataset.
    """
    found = _from_torch()
    if found is None:
        found = _from_env(os.environ if environ is None else environ)
    if found is None:
        found = _from_jax()
    return found if found is not None else RankInfo(0, 1, "single")


def resolve_ranks(
    rank: int | None, world_size: int | None, *, environ: Mapping[str, str] | None = None
) -> RankInfo:
    """``RankInfo(rank, world_size)`` when both are given, else :func:`detect_ranks`."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"pass both rank and world_size or neither (neither detects them), got "
            f"rank={rank!r}, world_size={world_size!r}"
        )
    if rank is not None and world_size is not None:
        return RankInfo(rank, world_size, "explicit")
    return detect_ranks(environ=environ)


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
