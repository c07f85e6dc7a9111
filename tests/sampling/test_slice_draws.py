"""A batch slice's crop draws made at once give the numbers a NumPy generator a row gives:
the same crop boxes and flips, and the same stream after them for whatever draws next (colour
jitter). A user sees the same batches whether the compiled draws are built or not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardfeed.sampling import crop_draws
from shardfeed.sampling.crop_draws import CropParams, RowKeys, compiled_resized_crops
from shardfeed.sampling.keys import sample_rng
from shardfeed.transforms.boxes import (
    compiled_draws_agree,
    crop_params,
    random_resized_box,
    resized_boxes,
)

needs_compiled = pytest.mark.skipif(not crop_draws.compiled(),
                                    reason="the compiled draws are not built here")

CASES = [((0.08, 1.0), (3 / 4, 4 / 3), 0.5),  # the train preset's
         ((0.9, 1.0), (0.1, 0.2), 0.3),  # ratios far from any image's: fallback boxes too
         ((0.25, 0.5), (5.0, 9.0), 0.0),  # no flip: nothing drawn after the box
         ((1.0, 1.0), (1.0, 1.0), 1.0)]


def _sizes(n: int) -> np.ndarray:
    sizes = np.random.default_rng(3).integers(1, 4000, (n, 2))
    sizes[:40, 0] = 1  # one-pixel rows and columns: integers(1) draws nothing
    sizes[40:80, 1] = 1
    sizes[80:120] = np.random.default_rng(4).integers(1, 4, (40, 2))
    return sizes


def _numpy_draws(seed: int, epoch: int, position: int, height: int, width: int,
                 scale: tuple[float, float], ratio: tuple[float, float],
                 hflip: float) -> tuple[tuple[int, ...], np.random.Generator]:
    rng = sample_rng(seed, epoch, position)
    box = random_resized_box(height, width, rng, scale=scale, ratio=ratio)
    flip = hflip > 0 and bool(rng.random() < hflip)
    return (*box, int(flip)), rng


@needs_compiled
@pytest.mark.parametrize(("scale", "ratio", "hflip"), CASES)
def test_compiled_draws_equal_numpys_row_by_row(scale: tuple[float, float],
                                                ratio: tuple[float, float],
                                                hflip: float) -> None:
    n = 3000
    seed, epoch = 2**64 - 5, 2**33 + 1  # words of every size: keys are 64-bit
    positions = np.random.default_rng(5).integers(0, 2**62, n)
    sizes = _sizes(n)
    keys = RowKeys(seed, epoch, positions)
    rows = np.arange(n)
    boxes = compiled_resized_crops(keys, rows, sizes[:, 0], sizes[:, 1],
                                   crop_params(scale, ratio, hflip))
    assert boxes is not None
    for row in range(n):
        expected, rng = _numpy_draws(seed, epoch, int(positions[row]), *sizes[row].tolist(),
                                     scale, ratio, hflip)
        assert tuple(boxes[row].tolist()) == expected, (row, sizes[row])
        after = keys[row]  # the stream goes on where NumPy's does: 32-bit halves included
        assert [after.integers(7), after.random(), after.integers(2**31)] == \
            [rng.integers(7), rng.random(), rng.integers(2**31)]


@needs_compiled
def test_this_build_is_checked_and_used() -> None:
    # The build made by `make` must agree with NumPy; where it did not, it would be unused.
    assert compiled_draws_agree()


@needs_compiled
def test_only_rows_not_drawn_from_are_drawn_at_once() -> None:
    keys = RowKeys(1, 0, np.arange(4))
    first = keys[2]
    params = crop_params((0.08, 1.0), (0.75, 4 / 3), 0.5)
    sizes = np.full(4, 50)
    assert resized_boxes(keys, np.arange(4), sizes, sizes, scale=(0.08, 1.0),
                         ratio=(0.75, 4 / 3), hflip=0.5) is None  # row 2 is in use
    assert keys[2] is first
    boxes = compiled_resized_crops(keys, np.array([0, 1]), sizes[:2], sizes[:2], params)
    assert boxes is not None
    with pytest.raises(ValueError, match="drawn from already"):
        keys.record_states(np.array([1]), np.zeros((1, crop_draws.STATE_WORDS), np.uint64))


@needs_compiled
def test_bad_sizes_are_refused() -> None:
    keys = RowKeys(1, 0, np.arange(2))
    params = CropParams(0.08, 0.92, math.log(0.75), math.log(16 / 9), 0.75, 4 / 3, 0.5, 10)
    with pytest.raises(ValueError, match="heights and widths"):
        compiled_resized_crops(keys, np.arange(2), np.array([0, 5]), np.array([5, 5]), params)


def test_row_keys_are_the_keyed_generators_made_once() -> None:
    positions = np.array([7, 3, 2**40])
    keys = RowKeys(11, 2, positions)
    assert len(keys) == 3
    assert keys[-1] is keys[2]
    assert keys[0].random() == sample_rng(11, 2, 7).random()
    assert [g.integers(10**9) for g in keys[1:]] == \
        [sample_rng(11, 2, int(p)).integers(10**9) for p in positions[1:]]
    with pytest.raises(IndexError):
        keys[3]
