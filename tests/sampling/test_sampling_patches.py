"""PatchSchedule: the closed form of the N-slot cache refreshed every R outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.sampling import PATCH_SLOT, PatchSchedule, crop_draws, sample_rng, uniform_many
from shardfeed.sampling import patches as patches_module
from shardfeed.sampling.patches import Pick


def simulate(m: int, n: int, r: int) -> list[list[int]]:
    """The cache as a loader would run it: N slots, the oldest replaced every R outputs."""
    n = min(n, m)
    cache = list(range(n))
    resident = []
    upcoming = n
    while True:
        for _ in range(r):
            resident.append(sorted(cache))
        if upcoming == m:
            return resident
        cache.pop(0)
        cache.append(upcoming)
        upcoming += 1


@given(m=st.integers(1, 40), n=st.integers(1, 50), r=st.integers(1, 6))
def test_closed_form_matches_a_simulated_cache(m: int, n: int, r: int) -> None:
    schedule = PatchSchedule(m, cache_images=n, refresh_every=r)
    resident = simulate(m, n, r)
    assert len(schedule) == len(resident) == (m - min(n, m) + 1) * r
    for p, images in enumerate(resident):
        lo, hi = schedule.window(p)
        assert list(range(lo, hi)) == images
    los, his = schedule.windows_many(np.arange(len(schedule)))
    assert [list(range(a, b)) for a, b in zip(los.tolist(), his.tolist())] == resident
    assert schedule.max_resident == min(n, m) == max(len(x) for x in resident)


@given(m=st.integers(1, 40), n=st.integers(1, 12), r=st.integers(1, 6))
def test_residency_spans_match_the_simulation(m: int, n: int, r: int) -> None:
    schedule = PatchSchedule(m, cache_images=n, refresh_every=r)
    resident = simulate(m, n, r)
    first, last = schedule.resident_spans(np.arange(m))
    for q in range(m):
        outputs = [p for p, images in enumerate(resident) if q in images]
        assert (first[q], last[q]) == (outputs[0], outputs[-1])
        assert outputs == list(range(outputs[0], outputs[-1] + 1))  # one contiguous stay
        assert schedule.first_output(q) == outputs[0] and schedule.last_output(q) == outputs[-1]
    nn = min(n, m)
    interior = np.arange(nn - 1, m - nn + 1)
    assert (last[interior] - first[interior] + 1 == nn * r).all()


@given(m=st.integers(1, 60), n=st.integers(1, 10), r=st.integers(1, 5),
       seed=st.integers(0, 2**32))
@settings(deadline=None)
def test_pick_is_always_inside_the_window(m: int, n: int, r: int, seed: int) -> None:
    schedule = PatchSchedule(m, cache_images=n, refresh_every=r)
    outputs = np.arange(len(schedule))
    picks = schedule.pick_many(outputs, uniform_many(seed, 0, outputs, PATCH_SLOT))
    lo, hi = schedule.windows_many(outputs)
    assert ((picks >= lo) & (picks < hi)).all()
    for p in outputs[:: max(1, len(outputs) // 7)]:
        q = schedule.pick(int(p), sample_rng(seed, 0, int(p), PATCH_SLOT))
        assert lo[p] <= q < hi[p]
    # Edge uniforms map to the first and last slot.
    assert schedule.pick_many([0], [0.0])[0] == lo[0]
    assert schedule.pick_many([0], [np.nextafter(1.0, 0.0)])[0] == hi[0] - 1


def test_pick_matches_pick_many_for_the_same_draw() -> None:
    schedule = PatchSchedule(100, cache_images=16, refresh_every=4)
    u = sample_rng(3, 1, 50, PATCH_SLOT).random()
    q = schedule.pick(50, sample_rng(3, 1, 50, PATCH_SLOT))
    assert q == schedule.pick_many([50], [u])[0]


def test_each_interior_image_is_used_r_times_on_average() -> None:
    m, n, r = 2000, 32, 8
    schedule = PatchSchedule(m, cache_images=n, refresh_every=r)
    outputs = np.arange(len(schedule))
    uses = np.zeros(m)
    for epoch in range(5):
        picks = schedule.pick_many(outputs, uniform_many(9, epoch, outputs, PATCH_SLOT))
        uses += np.bincount(picks, minlength=m)
    interior = uses[n - 1 : m - n + 1] / 5
    assert abs(interior.mean() - r) < 0.05 * r
    assert schedule.expected_uses(m // 2) == r
    # Edge images get fewer uses, as the first/last (N - 1) positions are resident less long.
    assert schedule.expected_uses(0) == pytest.approx(r / n)
    assert uses[:n // 4].mean() / 5 < r / 2
    assert uses.sum() == 5 * len(schedule)


def test_a_batch_of_consecutive_outputs_mixes_many_images() -> None:
    m, n, r, batch = 5000, 64, 16, 32
    schedule = PatchSchedule(m, cache_images=n, refresh_every=r)
    outputs = np.arange(len(schedule) // batch * batch)
    picks = schedule.pick_many(outputs, uniform_many(4, 0, outputs, PATCH_SLOT))
    distinct = np.array([np.unique(b).size for b in picks.reshape(-1, batch)])
    expected = n * (1 - (1 - 1 / n) ** batch)  # about 25 of min(B, N) = 32
    assert abs(distinct.mean() - expected) < 1.0
    # With a big cache relative to the batch, nearly every sample is a different image.
    wide = PatchSchedule(m, cache_images=1024, refresh_every=1)
    outputs = np.arange(len(wide) // 8 * 8)
    picks = wide.pick_many(outputs, uniform_many(4, 0, outputs, PATCH_SLOT))
    assert np.mean([np.unique(b).size for b in picks.reshape(-1, 8)]) > 7.9


def test_cache_clipped_to_the_number_of_images_and_empty_epochs() -> None:
    schedule = PatchSchedule(5, cache_images=100, refresh_every=3)
    assert schedule.max_resident == 5 and len(schedule) == 3
    assert schedule.window(2) == (0, 5)
    empty = PatchSchedule(0, cache_images=4, refresh_every=2)
    assert len(empty) == 0 and empty.max_resident == 0
    assert empty.pick_many([], []).shape == (0,)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((10, 0, 1), ValueError, "cache_images must be >= 1"),
        ((10, 4, 0), ValueError, "refresh_every must be >= 1"),
        ((-1, 4, 1), ValueError, "num_images must be >= 0"),
        ((10, 4.0, 1), TypeError, "cache_images must be an integer"),
    ],
)
def test_bad_arguments(args: tuple[object, object, object], error: type, match: str) -> None:
    m, n, r = args
    with pytest.raises(error, match=match):
        PatchSchedule(m, cache_images=n, refresh_every=r)  # type: ignore[arg-type]


def test_out_of_range_outputs_and_uniforms() -> None:
    schedule = PatchSchedule(10, cache_images=4, refresh_every=2)
    with pytest.raises(IndexError, match="output 14 out of range"):
        schedule.window(14)
    with pytest.raises(IndexError, match="output"):
        schedule.windows_many([0, 14])
    with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\)"):
        schedule.pick_many([0], [1.0])
    with pytest.raises(ValueError, match="one value per output"):
        schedule.pick_many([0, 1], [0.5])
    with pytest.raises(IndexError, match="order position 10 out of range"):
        schedule.first_output(10)


@pytest.mark.parametrize("pick", ["stratified", "uniform"])
def test_one_outputs_order_position_is_the_arrays_and_checked_alike(pick: Pick) -> None:
    s = PatchSchedule(10, cache_images=3, refresh_every=2)  # 16 outputs
    every = s.order_positions(5, 1, np.arange(len(s)), pick=pick)
    assert [s.order_position(5, 1, p, pick=pick) for p in range(len(s))] == every.tolist()
    lo, hi = s.windows_many(np.arange(len(s)))
    assert np.all((lo <= every) & (every < hi))
    for bad in (16, -1, 10**6):
        with pytest.raises(IndexError, match="out of range"):
            s.order_position(5, 1, bad, pick=pick)
        with pytest.raises(IndexError, match="out of range"):
            s.order_positions(5, 1, [bad], pick=pick)
    with pytest.raises(ValueError, match="pick must be one of"):
        s.order_position(5, 1, 0, pick="Uniform")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pick must be one of"):
        s.order_positions(5, 1, [0], pick="Uniform")  # type: ignore[arg-type]


# -- the compiled stratified order positions ---------------------------------------------------

needs_compiled = pytest.mark.skipif(not crop_draws.compiled(),
                                    reason="built without the compiled draws")


@needs_compiled
@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 120), r=st.integers(1, 9),
       seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 2**40), data=st.data())
def test_compiled_order_positions_are_numpys(m: int, n: int, r: int, seed: int, epoch: int,
                                             data: st.DataObject) -> None:
    """The compiled call and NumPy's block permutations give every output the same order
    position: runs, strides, sorted draws with repeats, outputs in no order (NumPy's then)."""
    assert patches_module.compiled_slot_orders_agree()  # this build's call is the one tested
    s = PatchSchedule(m, cache_images=n, refresh_every=r)
    end = len(s)
    start = data.draw(st.integers(0, end - 1))
    stride = data.draw(st.integers(1, 7))
    picked = data.draw(st.lists(st.integers(0, end - 1), min_size=1, max_size=300))
    for ps in (np.arange(start, end, stride), np.sort(picked), np.array(picked),
               np.arange(end)[::-1]):
        got = s.order_positions(seed, epoch, ps)
        assert np.array_equal(got, s._stratified(seed, epoch, ps.astype(np.int64)))
        assert [s.order_position(seed, epoch, p) for p in ps[:5].tolist()] == got[:5].tolist()


@needs_compiled
def test_a_compiled_call_that_differs_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check finds a build whose permutations differ, and the order positions are then
    NumPy's: the same a schedule's outputs get with the compiled call."""
    s = PatchSchedule(50, cache_images=8, refresh_every=3)
    want = s.order_positions(4, 2, np.arange(len(s)))
    real = patches_module.compiled_slot_orders

    def off(keys: tuple[int, int], n: int, r: int, end: int,
            ps: np.ndarray) -> np.ndarray | int | None:
        q = real(keys, n, r, end, ps)
        return np.where(ps % n == 1, q + 1, q) if isinstance(q, np.ndarray) else q

    monkeypatch.setattr(patches_module, "compiled_slot_orders", off)
    assert not patches_module.compiled_slot_orders_agree.__wrapped__()
    monkeypatch.setattr(patches_module, "compiled_slot_orders_agree", lambda: False)
    assert np.array_equal(s.order_positions(4, 2, np.arange(len(s))), want)
    monkeypatch.setattr(patches_module, "compiled_slot_orders_agree", lambda: True)
    assert not np.array_equal(s.order_positions(4, 2, np.arange(len(s))), want)  # it is used


@needs_compiled
def test_one_schedule_asked_for_other_seeds_and_epochs_in_turn() -> None:
    """The slot draws' keys kept for the last seed and epoch are not those of another: each
    (seed, epoch) gets its own order positions, asked for in any order on one schedule."""
    s = PatchSchedule(40, cache_images=8, refresh_every=3)
    outputs = np.arange(len(s))
    want = {(seed, epoch): PatchSchedule(40, cache_images=8, refresh_every=3)._stratified(
        seed, epoch, outputs) for seed in (0, 1) for epoch in (0, 1)}
    assert len({tuple(q.tolist()) for q in want.values()}) == 4
    for seed, epoch in [(0, 0), (0, 1), (1, 1), (1, 0), (0, 0), (1, 0)]:
        assert np.array_equal(s.order_positions(seed, epoch, outputs), want[seed, epoch])


def test_order_positions_refuse_what_they_refused_before() -> None:
    """An empty schedule, outputs out of range (named as before: the lowest where one is
    negative, else the highest), a seed out of range on a new schedule; and the array's
    shape is kept."""
    with pytest.raises(IndexError, match=r"output 0 out of range: valid are 0..-1"):
        PatchSchedule(0, cache_images=8, refresh_every=3).order_positions(1, 2, [0])
    s = PatchSchedule(50, cache_images=8, refresh_every=3)
    end = len(s)
    with pytest.raises(IndexError, match=rf"output {end + 5} out of range"):
        s.order_positions(1, 2, np.r_[np.arange(10), end, end + 5])
    with pytest.raises(IndexError, match=r"output -3 out of range"):
        s.order_positions(1, 2, np.r_[np.arange(10), end, -3])
    with pytest.raises(ValueError, match="seed"):
        PatchSchedule(50, cache_images=8, refresh_every=3).order_positions(-1, -1,
                                                                           np.arange(10))
    grid = np.arange(24).reshape(2, 12)
    assert np.array_equal(s.order_positions(1, 2, grid),
                          s.order_positions(1, 2, grid.ravel()).reshape(2, 12))
