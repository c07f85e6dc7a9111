"""Option groups of the Loader, validated at construction (never deep in a thread)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

OnError = Literal["raise", "skip"]
Workers = Literal["threads", "processes"]
OrderMethod = Literal["exact", "bijection"]
Remainder = Literal["drop", "pad"]

ON_ERROR: tuple[OnError, ...] = get_args(OnError)
WORKERS: tuple[Workers, ...] = get_args(Workers)
ORDER_METHODS: tuple[OrderMethod, ...] = get_args(OrderMethod)
REMAINDERS: tuple[Remainder, ...] = get_args(Remainder)


def _check_int(name: str, value: object, *, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}; {fix}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}; {fix}")


@dataclass(kw_only=True, frozen=True, slots=True)
class ErrorPolicy:
    """What a corrupt record or undecodable image does.

    ``on_error="raise"``: stop with the error (it names shard, record and byte offset).
    ``on_error="skip"``: replace the sample (see :mod:`shardfeed.pipeline.produce`) and count
    it; more than ``max_skipped`` bad samples in one epoch (default: ``max_skipped_fraction``
    of the epoch's samples on this rank, at least 1) raises.
    """

    on_error: OnError = "raise"
    max_skipped: int | None = None
    max_skipped_fraction: float = 0.01

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(
                f"on_error must be one of {ON_ERROR}, got {self.on_error!r}: 'raise' stops at the "
                "first bad record, 'skip' replaces bad samples and counts them"
            )
        if self.max_skipped is not None:
            _check_int("max_skipped", self.max_skipped, minimum=0, fix="pass a count such as 100")
        fraction = self.max_skipped_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (
            0.0 <= fraction <= 1.0
        ):
            raise ValueError(
                f"max_skipped_fraction must be a number in [0, 1], got {fraction!r}; "
                "e.g. 0.01 allows one bad sample in a hundred"
            )

    def budget(self, samples: int) -> int:
        """The most bad samples one epoch of ``samples`` outputs may skip."""
        if self.max_skipped is not None:
            return self.max_skipped
        return max(1, math.ceil(self.max_skipped_fraction * samples))


@dataclass(kw_only=True, frozen=True, slots=True)
class LoaderOptions:
    """Everything about a Loader except the source and the transform."""

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    num_threads: int = 4
    prefetch_batches: int = 2
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1
    remainder: Remainder = "pad"
    workers: Workers = "threads"
    copy: bool = False
    order_method: OrderMethod = "exact"
    read_ahead: int | None = None
    adaptive_threads: bool = True

    def __post_init__(self) -> None:
        _check_int("batch_size", self.batch_size, minimum=1, fix="pass e.g. batch_size=256")
        _check_int("num_threads", self.num_threads, minimum=1, fix="pass e.g. num_threads=8")
        _check_int(
            "prefetch_batches", self.prefetch_batches, minimum=1,
            fix="pass e.g. prefetch_batches=2 (batches prepared ahead of the training loop)",
        )
        if self.read_ahead is not None:
            _check_int("read_ahead", self.read_ahead, minimum=0,
                       fix="pass batches to fetch ahead (0: off), or None to size it by bytes")
        _check_int("seed", self.seed, minimum=0, fix="pass a non-negative int such as seed=0")
        _check_int("world_size", self.world_size, minimum=1, fix="pass the number of ranks")
        _check_int("rank", self.rank, minimum=0, fix="pass this process's rank")
        if self.rank >= self.world_size:
            raise ValueError(
                f"rank must be < world_size, got rank={self.rank}, world_size={self.world_size}"
            )
        if self.remainder not in REMAINDERS:
            raise ValueError(
                f"remainder must be one of {REMAINDERS}, got {self.remainder!r}: 'drop' leaves "
                "out the last (samples mod world_size) positions of an epoch, 'pad' repeats the "
                "first ones so every rank gets as many samples"
            )
        for name in ("shuffle", "drop_last", "copy", "adaptive_threads"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        if self.workers not in WORKERS:
            raise ValueError(
                f"workers must be one of {WORKERS}, got {self.workers!r}: 'threads' (default) for "
                "decoders that release the GIL, 'processes' for Python transforms that hold it"
            )
        if self.order_method not in ORDER_METHODS:
            raise ValueError(
                f"order_method must be one of {ORDER_METHODS}, got {self.order_method!r}"
            )

    def slice_size(self) -> int:
        """Samples one task works on: about a batch divided among the threads."""
        return max(1, -(-self.batch_size // self.num_threads))


COPY_DEPRECATED = (
    "copy=True is no longer needed and has no effect: batches you keep are never overwritten; "
    "drop the argument"
)


def empty_share_message(options: LoaderOptions, per_rank: int) -> str:
    """The warning for a rank whose share of an epoch is less than one batch, with drop_last."""
    return (
        f"each of {options.world_size} rank(s) gets {per_rank} samples an epoch, fewer than "
        f"batch_size={options.batch_size}: with drop_last=True it yields no batch; lower "
        "batch_size or pass drop_last=False"
    )
