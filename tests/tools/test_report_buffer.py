"""The shuffle-buffer simulation: against a plain list-based buffer, and its known bias."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.tools.shuffle_report.buffer import (
    buffer_draws,
    buffer_shuffle_order,
    file_shuffle_buffer_order,
    simulate_buffer,
)
from shardfeed.tools.shuffle_report.stats import label_first_positions, spearman_rho


def reference_buffer(n: int, buffer_size: int, draws: list[int]) -> list[int]:
    """The algorithm as written in prose: a list, one pick per output, the next input in its slot."""
    stream = iter(range(n))
    buffer = [next(stream) for _ in range(min(buffer_size, n))]
    out = []
    for pick in draws:
        out.append(buffer[pick])
        following = next(stream, None)
        if following is not None:
            buffer[pick] = following
        else:  # input exhausted: drain, moving the last element into the emptied slot
            buffer[pick] = buffer[-1]
            buffer.pop()
    assert not buffer
    return out


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=400),
    buffer_size=st.integers(min_value=1, max_value=500),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_vectorised_buffer_equals_the_list_reference(n: int, buffer_size: int, seed: int) -> None:
    draws = buffer_draws(n, buffer_size, seed)
    expected = reference_buffer(n, buffer_size, draws.tolist())
    assert simulate_buffer(draws, buffer_size).tolist() == expected
    assert buffer_shuffle_order(n, buffer_size, seed).tolist() == expected


def test_vectorised_buffer_equals_the_reference_on_a_large_input() -> None:
    # past 2^16 slots the radix-sort shortcut is off: cover both paths
    for n, buffer_size in ((200_000, 10_000), (150_000, 70_000)):
        draws = buffer_draws(n, buffer_size, 5)
        expected = reference_buffer(n, buffer_size, draws.tolist())
        assert np.array_equal(simulate_buffer(draws, buffer_size), expected)


def test_draws_are_uniform_slots_of_the_filled_buffer() -> None:
    draws = buffer_draws(50_000, 100, 1)
    assert draws[:49_900].min() == 0 and draws[:49_900].max() == 99
    counts = np.bincount(draws[:49_900], minlength=100)
    assert counts.min() > 350 and counts.max() < 650  # ~499 each
    assert all(int(d) < 50_000 - t for t, d in enumerate(draws[49_900:], start=49_900))


def test_a_buffer_never_emits_a_record_before_reading_it() -> None:
    order = buffer_shuffle_order(20_000, 500, 3)
    assert sorted(order.tolist()) == list(range(20_000))
    assert np.all(order < np.arange(20_000) + 500)
    assert buffer_shuffle_order(1_000, 1, 3).tolist() == list(range(1_000))


def test_buffer_is_deterministic_in_seed_and_epoch() -> None:
    first = buffer_shuffle_order(5_000, 100, 11)
    assert np.array_equal(first, buffer_shuffle_order(5_000, 100, 11))
    assert not np.array_equal(first, buffer_shuffle_order(5_000, 100, 12))
    assert not np.array_equal(first, buffer_shuffle_order(5_000, 100, 11, epoch=1))


def test_golden_buffer_order() -> None:
    # Pins the simulated order for a fixed seed: changing it changes every report's figures.
    assert buffer_shuffle_order(12, 4, 0).tolist() == GOLDEN_12_4_0


GOLDEN_12_4_0 = [3, 4, 5, 0, 2, 7, 1, 8, 9, 11, 6, 10]


def test_buffer_over_label_sorted_data_is_biased_like_tf_data() -> None:
    """70,000 records in 10 sorted classes, shuffle(10000): the figures users cannot see."""
    n = 70_000
    labels = np.repeat(np.arange(10), 7_000)
    order = buffer_shuffle_order(n, 10_000, 0)
    assert 0.85 < spearman_rho(order) < 0.95
    firsts = label_first_positions(order, labels)
    assert firsts[9] > 40_000
    exact = np.random.Generator(np.random.Philox(0)).permutation(n)
    assert abs(spearman_rho(exact)) < 0.02
    assert max(label_first_positions(exact, labels).values()) < 200


def test_the_exact_shuffle_is_unbiased_where_the_buffer_is_not() -> None:
    from shardfeed.sampling.permutation import EpochOrder

    n = 70_000
    exact = EpochOrder(n, seed=0, epoch=0, shuffle=True)[0:n]
    assert abs(spearman_rho(exact)) < 0.02


def test_file_shuffle_then_buffer() -> None:
    sizes = [30, 0, 50, 20]
    starts = [0, 30, 30, 80]
    order = file_shuffle_buffer_order(sizes, 1, 4)  # buffer 1: shards whole, in shuffled order
    assert sorted(order.tolist()) == list(range(100))
    pieces = []
    position = 0
    while position < 100:
        shard = next(k for k in range(4) if sizes[k] and starts[k] == order[position])
        assert order[position : position + sizes[shard]].tolist() == list(
            range(starts[shard], starts[shard] + sizes[shard])
        )
        pieces.append(shard)
        position += sizes[shard]
    assert sorted(pieces) == [0, 2, 3]
    shard_orders = {
        tuple(file_shuffle_buffer_order(sizes, 1, seed)[[0]].tolist()) for seed in range(30)
    }
    assert len(shard_orders) == 3  # every non-empty shard gets to go first for some seed
    buffered = file_shuffle_buffer_order([1_000] * 20, 200, 4)
    assert sorted(buffered.tolist()) == list(range(20_000))


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="buffer_size must be >= 1, got 0"):
        buffer_shuffle_order(10, 0, 0)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        buffer_shuffle_order(10, 2, -1)
    with pytest.raises(TypeError, match="n must be an int"):
        buffer_shuffle_order(10.0, 2, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"draws\[1\] = 5 is outside \[0, 2\)"):
        simulate_buffer(np.array([0, 5, 0]), 2)
    with pytest.raises(ValueError, match="shard_sizes must be >= 0"):
        file_shuffle_buffer_order([3, -1], 2, 0)
