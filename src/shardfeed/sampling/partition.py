"""One rank's share of an epoch, interleaved so the ranks together always consume a prefix.

::

    epoch positions   0  1  2  3  4  5  6  7  8  9  10 11 12 13      total = 14
    world_size = 4    r0 r1 r2 r3 r0 r1 r2 r3 r0 r1 r2 r3 r0 r1
                      '-- step 0 -' '-- step 1 -' '-- step 2 -'

    RankShare(14, rank=1, world_size=4)             -> 1, 5, 9       (drop: 3 each; 12, 13 dropped)
    RankShare(14, rank=1, world_size=4, remainder="pad")
                                                    -> 1, 5, 9, 13   (pad: 4 each; 14, 15
                                                                       wrap to positions 0, 1)

After every step the ranks together have consumed positions ``[start, start + steps * W)``,
a prefix of what was left of the epoch. A state saved as ``consumed = c`` therefore restores
on any number of ranks as ``RankShare(total, rank=r, world_size=W2, start=c)``: the new
ranks split exactly the positions not yet consumed, each once::

    W=4, consumed c = 8 :   0..7 done  | 8  9  10 11 12 13      resumed on W2 = 3
                                         r0 r1 r2 r0 r1 r2
"""

from __future__ import annotations

from typing import Literal, overload

import numpy as np
import numpy.typing as npt

from shardfeed.sampling._checks import as_int, as_key

__all__ = ["RankShare"]


class RankShare:
    """The global epoch positions rank ``rank`` of ``world_size`` handles: ``start + rank + k·W``.

    ``remainder="drop"``: every rank gets ``(total - start) // world_size`` positions (the last
    ``< world_size`` positions of the epoch are not visited). ``remainder="pad"``: every rank
    gets ``ceil((total - start) / world_size)`` positions; the positions past the end of the
    epoch wrap to its beginning (position ``total + j`` is position ``j mod total``), so a few
    samples of the epoch are seen twice. Every rank always has the same length, which keeps
    collective operations in step.

    ``len``, ``share[k]`` (an int), ``share[array]`` / ``share[a:b]`` (int64 arrays).
    Determinism: pure arithmetic. State: none (``start`` is the state). Memory: none.
    """

    __slots__ = ("_length", "rank", "remainder", "start", "total", "world_size")

    def __init__(
        self,
        total: int,
        *,
        rank: int,
        world_size: int,
        start: int = 0,
        remainder: Literal["drop", "pad"] = "drop",
    ) -> None:
        self.total = as_int(total, "total")
        self.world_size = as_int(world_size, "world_size")
        self.rank = as_int(rank, "rank")
        self.start = as_int(start, "start")
        if self.total < 0:
            raise ValueError(f"total must be >= 0 (the number of positions in the epoch), "
                             f"got {self.total}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size) = [0, {self.world_size}), got "
                             f"{self.rank}; check the RANK / WORLD_SIZE of this process")
        if not 0 <= self.start <= self.total:
            raise ValueError(f"start must be in [0, total] = [0, {self.total}], got "
                             f"{self.start}; a saved 'consumed' count must come from an epoch "
                             f"of the same length")
        if remainder not in ("drop", "pad"):
            raise ValueError(f"remainder must be 'drop' or 'pad', got {remainder!r}")
        self.remainder: Literal["drop", "pad"] = remainder
        left = self.total - self.start
        if remainder == "drop":
            self._length = left // self.world_size
        else:
            self._length = -(-left // self.world_size)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (f"RankShare({self.total}, rank={self.rank}, world_size={self.world_size}, "
                f"start={self.start}, remainder={self.remainder!r})")

    @overload
    def __getitem__(self, key: int) -> int: ...
    @overload
    def __getitem__(self, key: slice | npt.ArrayLike) -> npt.NDArray[np.int64]: ...

    def __getitem__(self, key: int | slice | npt.ArrayLike) -> int | npt.NDArray[np.int64]:
        k = as_key(key, self._length, "step")
        if isinstance(k, int):
            position = self.start + self.rank + k * self.world_size
            return position % self.total if position >= self.total else position
        return self._positions(k)

    def _positions(self, steps: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        positions = self.start + self.rank + steps * self.world_size
        if self.remainder == "pad" and self.total:
            positions = np.where(positions >= self.total, positions % self.total, positions)
        return positions

    def consumed(self, steps: int) -> int:
        """Global positions consumed once every rank has taken ``steps`` of its share.

        This is what a checkpoint stores: ``RankShare(total, ..., start=share.consumed(k))``
        continues exactly after step ``k`` on any world size. Capped at ``total``.
        """
        k = as_int(steps, "steps")
        if not 0 <= k <= self._length:
            raise ValueError(f"steps must be in [0, {self._length}], got {k}")
        return min(self.total, self.start + k * self.world_size)

