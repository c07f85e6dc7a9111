"""The keyed generators of a batch slice's rows, and their crop draws made all at once.

:class:`RowKeys` is what a batch-form transform receives as ``rngs``: row ``i``'s generator is
``sample_rng(seed, epoch, positions[i], purpose)``, built only when a transform asks for it
and then kept, so every transform of a pipeline draws on from where the previous one stopped
(as a sample's single generator does on the sample path).

:func:`compiled_resized_crops` makes the random-resized-crop draws of many rows in one
compiled call (``_draws.c`` beside this file: NumPy's Philox stream and its ``random()`` /
``integers(n)``, reproduced): about 0.2 µs a row instead of ~12 µs for a generator and its
draws in Python. The stream state each row is left in is recorded in the :class:`RowKeys`, so
a later transform asking for that row's generator gets it exactly there. The caller checks
the compiled draws against NumPy's once before relying on them
(:func:`shardfeed.transforms.boxes.resized_boxes`).

Memory: 88 bytes a row of drawn state; generators only for the rows asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np
import numpy.typing as npt

from shardfeed.format.native import compiled_module
from shardfeed.sampling.keys import AUGMENT, sample_rng

_draws = compiled_module("shardfeed.sampling._draws")

#: Words a row's stream state takes: counter (4), buffer (4), buffer position, whether a
#: 32-bit half is kept, that half.
STATE_WORDS = 11


class CropParams(NamedTuple):
    """The random-resized-crop's ranges as the compiled draws take them (see
    :func:`shardfeed.transforms.boxes.random_resized_box`, which computes the same terms)."""

    scale_lo: float
    scale_range: float
    log_lo: float
    log_range: float
    ratio_lo: float
    ratio_hi: float
    hflip: float
    attempts: int


class RowKeys(Sequence[np.random.Generator]):
    """The generators of a slice's rows (``positions`` of ``epoch`` under ``seed``), built
    lazily and kept: ``keys[i]`` is the same object every time it is asked for."""

    __slots__ = ("_made", "_states", "epoch", "positions", "purpose", "seed")

    def __init__(self, seed: int, epoch: int, positions: npt.NDArray[np.int64],
                 purpose: int = AUGMENT) -> None:
        self.seed = seed
        self.epoch = epoch
        self.positions = positions
        self.purpose = purpose
        self._made: dict[int, np.random.Generator] = {}
        self._states: dict[int, npt.NDArray[np.uint64]] = {}

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, row: int) -> np.random.Generator: ...

    @overload
    def __getitem__(self, row: slice) -> list[np.random.Generator]: ...

    def __getitem__(self, row: int | slice) -> np.random.Generator | list[np.random.Generator]:
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        row = range(len(self))[row]  # IndexError past the end, negative rows counted back
        made = self._made.get(row)
        if made is None:
            made = self._build(row)
            self._made[row] = made
        return made

    def __iter__(self) -> Iterator[np.random.Generator]:
        return (self[i] for i in range(len(self)))

    def drawn(self, row: int) -> bool:
        """Whether row ``row`` has been drawn from (a generator handed out or state recorded)."""
        return row in self._made or row in self._states

    def any_drawn(self, rows: npt.NDArray[np.intp]) -> bool:
        """Whether any of ``rows`` has been drawn from (nothing to look up while none has)."""
        if not self._made and not self._states:
            return False
        return any(self.drawn(r) for r in rows.tolist())

    def _build(self, row: int) -> np.random.Generator:
        position = int(self.positions[row])
        rng = sample_rng(self.seed, self.epoch, position, self.purpose)
        state = self._states.pop(row, None)
        if state is not None:
            rng.bit_generator.state = {
                "bit_generator": "Philox",
                "state": {"counter": state[:4].copy(),
                          "key": np.array([self.seed, self.purpose], dtype=np.uint64)},
                "buffer": state[4:8].copy(),
                "buffer_pos": int(state[8]),
                "has_uint32": int(state[9]),
                "uinteger": int(state[10]),
            }
        return rng

    def record_states(self, rows: npt.NDArray[np.intp], states: npt.NDArray[np.uint64]) -> None:
        """Rows ``rows`` were drawn from outside a generator and left in ``states`` (one row
        of :data:`STATE_WORDS` each): their generators start there when asked for."""
        for row, state in zip(rows.tolist(), states):
            if row in self._made or row in self._states:
                raise ValueError(f"row {row} was drawn from already")
            self._states[row] = state


def compiled_resized_crops(
    keys: RowKeys, rows: npt.NDArray[np.intp], heights: npt.NDArray[np.int64],
    widths: npt.NDArray[np.int64], params: CropParams,
) -> npt.NDArray[np.int64] | None:
    """The random-resized-crop boxes and flips of ``rows`` (images ``heights``×``widths``,
    each in ``[1, 2^31)``), drawn by the compiled module from each row's fresh stream:
    an ``n×5`` array of ``(y, x, h, w, flip)``. The rows' streams are recorded in ``keys``.
    None where the module was not compiled, or a row was drawn from already."""
    if _draws is None or keys.any_drawn(rows):
        return None
    n = len(rows)
    boxes = np.empty((n, 5), dtype=np.int64)
    states = np.empty((n, STATE_WORDS), dtype=np.uint64)
    positions = np.ascontiguousarray(keys.positions[rows], dtype=np.uint64)
    _draws.resized_crops(keys.seed, keys.purpose, keys.epoch, positions,
                         np.ascontiguousarray(heights, dtype=np.int64),
                         np.ascontiguousarray(widths, dtype=np.int64), tuple(params), boxes,
                         states)
    keys.record_states(rows, states)
    return boxes


class PatchParams(NamedTuple):
    """A patch crop's terms as the compiled draws take them (see
    :func:`shardfeed.pipeline.patch_crops.draw_patch_box`)."""

    patch_h: int
    patch_w: int
    denominator: int
    scale_lo: float
    scale_range: float
    has_scale: bool


def compiled_patch_boxes(
    seed: int, purpose: int, epoch: int, positions: npt.NDArray[np.int64],
    heights: npt.NDArray[np.int64], widths: npt.NDArray[np.int64], params: PatchParams,
) -> npt.NDArray[np.int64] | None:
    """The patch crops ``(y, x, h, w)`` of outputs ``positions`` (images as decoded
    ``heights``×``widths``, each in ``[1, 2^31)``), each drawn from the output's fresh stream
    keyed ``(seed, purpose)``, by the compiled module in one call: an ``n×4`` array. None
    where the module was not compiled."""
    if _draws is None:
        return None
    n = len(positions)
    boxes = np.empty((n, 4), dtype=np.int64)
    _draws.patch_boxes(seed, purpose, epoch, np.ascontiguousarray(positions, dtype=np.uint64),
                       np.ascontiguousarray(heights, dtype=np.int64),
                       np.ascontiguousarray(widths, dtype=np.int64), tuple(params), boxes)
    return boxes


def compiled_slot_orders(keys: tuple[int, int], n: int, refresh_every: int, end: int,
                         positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | int | None:
    """The order positions of outputs ``positions`` (each in ``[0, end)``) under the
    stratified pick of a patch schedule of ``n`` cache slots refreshed every
    ``refresh_every`` outputs (see
    :meth:`~shardfeed.sampling.patches.PatchSchedule.order_positions`), ``keys`` the slot
    draws' :func:`~shardfeed.sampling.keys.position_keys`, in one compiled call without the
    GIL, for positions in order (never decreasing). The index of the first position outside
    ``[0, end)`` where there is one; -1 where a position is below the one before; None where
    the module was not compiled."""
    if _draws is None:
        return None
    positions = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
    out = np.empty(len(positions), dtype=np.int64)
    bad = _draws.slot_orders(keys[0], keys[1], n, refresh_every, end, positions, out)
    return out if bad is None else int(bad)


def compiled() -> bool:
    """Whether the compiled draws are present in this build."""
    return _draws is not None


__all__ = ["STATE_WORDS", "CropParams", "PatchParams", "RowKeys", "compiled",
           "compiled_patch_boxes", "compiled_resized_crops", "compiled_slot_orders"]
