"""Sampling: the pure index math that decides what each output position of an epoch holds.

Which record, window, image and crop output ``p`` of epoch ``e`` holds is a function of
``(seed, epoch, p)`` alone; nothing here does I/O or keeps state.

- :mod:`~shardfeed.sampling.keys`: keyed random generators and hashes per position and purpose.
- :mod:`~shardfeed.sampling.permutation`: :class:`EpochOrder`, the shuffled order of an epoch.
- :mod:`~shardfeed.sampling.partition`: :class:`RankShare`, one rank's interleaved share.
- :mod:`~shardfeed.sampling.windows`: :class:`WindowIndex`, multi-frame samples within groups.
- :mod:`~shardfeed.sampling.patches`: :class:`PatchSchedule`, the closed-form patch cache.
"""

from shardfeed.sampling.keys import (
    AUGMENT,
    PATCH_CROP,
    PATCH_SLOT,
    SHUFFLE,
    SKIP_REPLACEMENT,
    WINDOW,
    Purpose,
    integers_many,
    sample_rng,
    uniform_many,
    uniform_one,
)
from shardfeed.sampling.partition import RankShare
from shardfeed.sampling.patches import PatchSchedule
from shardfeed.sampling.permutation import EpochOrder, FeistelPermutation
from shardfeed.sampling.windows import ExcludedWindows, WindowIndex

__all__ = [
    "AUGMENT",
    "PATCH_CROP",
    "PATCH_SLOT",
    "SHUFFLE",
    "SKIP_REPLACEMENT",
    "WINDOW",
    "EpochOrder",
    "ExcludedWindows",
    "FeistelPermutation",
    "PatchSchedule",
    "Purpose",
    "RankShare",
    "WindowIndex",
    "integers_many",
    "sample_rng",
    "uniform_many",
    "uniform_one",
]
