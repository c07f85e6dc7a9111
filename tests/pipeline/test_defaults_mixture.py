"""Mixture defaults a user relies on without reading the construction: a source whose share
rounds to nothing is named in a warning (never left out in silence), and a class-balanced
mixture's epoch is as long as the dataset, as a WeightedRandomSampler's usually is."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import shardfeed


class Numbers(shardfeed.DataSourceBase):
    """Records that are their number, ``first``, ``first + 1``, ..."""

    def __init__(self, n: int, first: int = 0) -> None:
        self.n, self.first = n, first

    def __len__(self) -> int:
        return self.n

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [{"number": np.int64(self.first + i)} for i in indices]

    @property
    def fingerprint(self) -> str:
        return f"numbers:{self.n}:{self.first}"


def numbers(loader: shardfeed.Loader) -> np.ndarray:
    return np.concatenate([np.asarray(batch["number"]) for batch in loader])


def test_a_source_with_a_tiny_weight_is_named_with_its_expected_count() -> None:
    a, b = Numbers(150), Numbers(60, first=1000)
    with pytest.warns(UserWarning) as caught:
        mixture = shardfeed.Mixture([a, b], weights=[0.999, 0.001])
    assert len(caught) == 1  # once, at construction: not once a batch or an epoch
    message = str(caught[0].message)
    assert "source 1 (60 records, weight 0.001): 0.15 expected an epoch, 0 given" in message
    assert "epoch_size=1000 or more" in message
    assert caught[0].filename == __file__  # points at the user's line
    loader = shardfeed.Loader(mixture, batch_size=10, seed=0)
    for _ in range(3):  # what the warning says: b never comes
        assert (numbers(loader) < 1000).all()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the size the warning names: no warning, b comes
        fixed = shardfeed.Mixture([a, b], weights=[0.999, 0.001], epoch_size=1000)
    got = numbers(shardfeed.Loader(fixed, batch_size=100, seed=0))
    assert int((got >= 1000).sum()) == 1


def test_shares_of_at_least_one_output_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shardfeed.Mixture([Numbers(150), Numbers(60, first=1000)], weights=[0.99, 0.01])


def test_a_balanced_epoch_is_the_dataset_length_and_shows_every_class_alike() -> None:
    sizes = [36, 30, 20, 12, 8, 5, 3, 2, 36, 36]
    classes = np.repeat(np.arange(len(sizes)), sizes)
    data = Numbers(len(classes))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        balanced = shardfeed.Mixture.balanced(data, classes)
    assert balanced.epoch_size == 188 == len(data)
    loader = shardfeed.Loader(balanced, batch_size=8, seed=3)
    got = numbers(loader)
    assert len(got) == 188  # it was 20: 8 x the rarest class of 2 records, 168 records unseen
    per_class = Counter(classes[got].tolist())
    assert sorted(per_class.values()) == [18] * 2 + [19] * 8  # 188 / 10, alike
    # the rare classes repeat in passes (each record of the class of 2 comes 9 or 10 times);
    # the large ones give 18 or 19 of their 36 records, other ones each epoch
    rarest = Counter(got[classes[got] == 7].tolist())
    assert sorted(rarest.values()) in ([9, 9], [9, 10], [10, 10])
    assert sum(rarest.values()) == per_class[7]
    seen = set(got.tolist())
    # at most once a pass: a class shows all its records, or as many as its outputs
    assert len(seen) == sum(min(per_class[c], size) for c, size in enumerate(sizes))
    again = set(numbers(loader).tolist())
    assert again != seen  # the next epoch shows other records of the large classes

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stated = shardfeed.Mixture.balanced(data, classes, epoch_size=40)
    assert stated.epoch_size == 40  # a stated size stays


def test_a_balanced_mixture_with_a_starved_class_warns_at_the_callers_line() -> None:
    classes = np.repeat([0, 1], [50, 50])
    with pytest.warns(UserWarning, match=r"source 1 \(50 records, weight 0.004\)") as caught:
        shardfeed.Mixture.balanced(Numbers(100), classes, weights={0: 0.996, 1: 0.004})
    assert caught[0].filename == __file__
