"""Which rank this process is: detection from the environment the program runs in.

First match wins (explicit ``rank=`` / ``world_size=`` arguments of the Loader override all)::

    1. torch.distributed    an initialised default process group   (only if torch is imported)
    2. RANK / WORLD_SIZE     environment variables (torchrun, torch.distributed.launch, ...)
    3. JAX                   jax.process_index() / jax.process_count() > 1 (only if jax is imported)
    4. (0, 1)                a single process

The core never imports torch or jax: they are consulted only when the program has imported
them already (``"torch" in sys.modules``). Checkpoints that agree across ranks are in
:mod:`shardfeed.loaders.distributed`.

Ranks taken from RANK / WORLD_SIZE are announced once a process (:func:`announce_share`):
a launcher (torchrun and the like also set MASTER_ADDR, LOCAL_RANK, ...) gets an INFO log
line; variables with no launcher beside them, perhaps left over from another job, get a
warning, since they silently shrink what the loader reads.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SOURCES", "RankInfo", "announce_share", "detect_ranks", "resolve_ranks"]

log = logging.getLogger(__name__)

LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                      "TORCHELASTIC_RUN_ID", "GROUP_RANK")
"""Variables a launcher (torchrun, torch.distributed.launch, accelerate) sets with RANK."""

_announced: set[tuple[int, int]] = set()

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


def announce_share(
    ranks: RankInfo, *, share: int, total: int, environ: Mapping[str, str] | None = None
) -> None:
    """Say which share of an epoch ranks from RANK / WORLD_SIZE give, once a process.

    Nothing for other sources, or for a world of one. With a launcher's variables beside
    them (:data:`LAUNCHER_VARIABLES`) it is an INFO log line; without, a ``UserWarning``
    (pointing at the code that built the loader), since left-over variables would
    otherwise quietly read a fraction of the data.
    """
    if ranks.source != "env" or ranks.world_size == 1:
        return
    key = (ranks.rank, ranks.world_size)
    if key in _announced:
        return
    _announced.add(key)
    env = os.environ if environ is None else environ
    text = (f"RANK={ranks.rank}, WORLD_SIZE={ranks.world_size} from the environment: this "
            f"loader reads {share} of {total} samples an epoch")
    if any(name in env for name in LAUNCHER_VARIABLES):
        log.info("%s (the launcher's rank share)", text)
        return
    warnings.warn(
        f"{text}; if these variables are left over from another job, unset them or pass "
        "rank=0, world_size=1 to read all",
        stacklevel=3,
    )
