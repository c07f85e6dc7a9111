"""Which rank this process is: detection from the environment the program runs in.

First match wins (explicit ``rank=`` / ``world_size=`` arguments of the Loader override all)::

    1. torch.distributed    an initialised default process group   (only if torch is imported)
    2. RANK / WORLD_SIZE     environment variables (torchrun, torch.distributed.launch, ...)
    3. JAX                   jax.process_index() / jax.process_count() > 1 (only if jax is imported)
    4. (0, 1)                a single process

The core never imports torch or jax: they are consulted only when the program has imported
them already (``"torch" in sys.modules``). Checkpoints that agree across ranks are in
:mod:`shardfeed.loaders.distributed`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SOURCES", "RankInfo", "detect_ranks", "resolve_ranks"]

SOURCES = ("explicit", "torch", "env", "jax", "single")
"""Where a :class:`RankInfo` came from."""


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
