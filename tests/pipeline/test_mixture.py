"""Mixtures of datasets and class balance, as a user meets them: the stated proportions in
every epoch, no record twice in a pass, batches that mix, resume at any batch, and states
refused by a differently mixed loader."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import write_dataset

import shardfeed
from shardfeed.errors import DecodeError, SchemaError, StateError
from shardfeed.transforms import DecodeImage


class Labels(shardfeed.DataSourceBase):
    """Records that are only their label (and a tiny image), ``first``, ``first + 1``, ..."""

    def __init__(self, n: int, first: int = 0, feature: str = "label") -> None:
        self.n, self.first, self.feature = n, first, feature

    def __len__(self) -> int:
        return self.n

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [{self.feature: np.int64(self.first + i),
                 "image": np.full((2, 2), i % 251, dtype=np.uint8)} for i in indices]

    @property
    def fingerprint(self) -> str:
        return f"labels:{self.n}:{self.first}"


def labels(batches: list[dict[str, Any]], key: str = "label") -> np.ndarray:
    return np.concatenate([np.asarray(b[key]) for b in batches])


def epoch(loader: shardfeed.Loader) -> list[dict[str, Any]]:
    return [{k: np.array(v) for k, v in b.items()} for b in loader]


def test_70_30_is_exact_every_epoch_and_each_record_comes_once() -> None:
    a, b = Labels(7000), Labels(3000, first=100_000)
    mixture = shardfeed.Mixture([a, b], [0.7, 0.3])
    assert mixture.epoch_size == 10_000  # both sources read once, whole
    loader = shardfeed.Loader(mixture, batch_size=100, seed=5, num_threads=2)
    seen = []
    for _ in range(2):
        got = labels(epoch(loader))
        from_a = got[got < 100_000]
        assert len(from_a) == 7000 and len(got) == 10_000
        assert len(np.unique(got)) == len(got)  # no record twice in the epoch
        seen.append(got)
    assert not np.array_equal(seen[0], seen[1])  # a new order each epoch


def test_a_subsampled_source_gives_other_records_each_epoch() -> None:
    mixture = shardfeed.Mixture([Labels(7000), Labels(3000, first=100_000)], [0.5, 0.5])
    assert mixture.epoch_size == 6000  # 3000 of the large source's 7000 an epoch
    loader = shardfeed.Loader(mixture, batch_size=100, seed=1, num_threads=2)
    picked = [set(got[got < 100_000].tolist()) for got in (labels(epoch(loader))
                                                          for _ in range(3))]
    assert all(len(p) == 3000 for p in picked)
    # a uniform draw of 3000 of 7000 each epoch: two epochs share about 3000 * 3/7
    assert abs(len(picked[0] & picked[1]) - 3000 * 3 / 7) < 150
    assert len(picked[0] | picked[1] | picked[2]) > 5000


def test_every_batch_mixes_within_sampling_error() -> None:
    mixture = shardfeed.Mixture([Labels(7000), Labels(3000, first=100_000)], [0.7, 0.3])
    batches = epoch(shardfeed.Loader(mixture, batch_size=100, seed=1, num_threads=2))
    shares = np.array([np.mean(np.asarray(b["label"]) < 100_000) for b in batches])
    # hypergeometric share of a batch of 100 from 7000/3000: sd about 0.046
    sd = np.sqrt(0.7 * 0.3 / 100 * (10_000 - 100) / (10_000 - 1))
    assert np.all(np.abs(shares - 0.7) < 5 * sd)
    assert 0.5 * sd < shares.std() < 1.5 * sd  # spread like a uniform draw, not fixed slots
    assert shares.mean() == pytest.approx(0.7, abs=1e-12)


def test_a_small_source_repeats_in_passes_of_its_own_order() -> None:
    small, large = Labels(100), Labels(1000, first=100_000)
    mixture = shardfeed.Mixture([small, large], [0.7, 0.3], epoch_size=1000)
    got = labels(epoch(shardfeed.Loader(mixture, batch_size=50, seed=2, num_threads=2)))
    counts = Counter(got[got < 100_000].tolist())
    assert sorted(counts) == list(range(100)) and set(counts.values()) == {7}  # 7 whole passes
    assert len(np.unique(got[got >= 100_000])) == 300
    # at most once a pass: the small source's 700 outputs, in slot order, are 7 permutations
    ctx = shardfeed.Loader(mixture, batch_size=50, seed=2)._context(0)
    sources, local = mixture.sources_of(ctx, np.arange(1000))
    slots = np.asarray(ctx.order[np.arange(1000)])
    of_small = local[sources == 0][np.argsort(slots[sources == 0])]
    passes = of_small.reshape(7, 100)
    assert all(sorted(p) == list(range(100)) for p in passes.tolist())
    assert len({tuple(p) for p in passes.tolist()}) == 7  # each pass in a new order


@pytest.mark.parametrize("at", [0, 3, 7, 19])
def test_resume_at_any_batch_continues_the_same_stream(at: int) -> None:
    def loader(threads: int) -> shardfeed.Loader:
        mixture = shardfeed.Mixture([Labels(70), Labels(500, first=1000)], [0.7, 0.3],
                                    epoch_size=200, source_key="source")
        return shardfeed.Loader(mixture, batch_size=8, seed=9, num_threads=threads)

    whole = loader(2)
    first = epoch(whole) + epoch(whole)  # two epochs of 25 batches
    stopped = loader(2)
    stream = iter(stopped)
    for _ in range(at):
        next(stream)
    state = json.loads(json.dumps(stopped.state()))
    resumed = loader(1)
    resumed.restore(state)
    rest = epoch(resumed) + epoch(resumed)
    assert len(rest) == len(first) - at
    for x, y in zip(first[at:], rest):
        np.testing.assert_array_equal(x["label"], y["label"])
        np.testing.assert_array_equal(x["source"], (y["label"] >= 1000).astype(np.int64))


def test_a_state_of_another_mixture_is_refused_by_name() -> None:
    def loader(weights: list[float], second: int = 500) -> shardfeed.Loader:
        mixture = shardfeed.Mixture([Labels(70), Labels(second, first=1000)], weights,
                                    epoch_size=200)
        return shardfeed.Loader(mixture, batch_size=8, seed=9)

    saved = loader([0.7, 0.3])
    next(iter(saved))
    state = saved.state()
    with pytest.raises(StateError, match="weights"):
        loader([0.5, 0.5]).restore(state)
    with pytest.raises(StateError, match="records"):
        loader([0.7, 0.3], second=501).restore(state)
    plain = shardfeed.Loader(Labels(200), batch_size=8, seed=9)
    with pytest.raises(StateError, match="mixture"):
        plain.restore(state)


def test_class_balance_draws_every_class_alike() -> None:
    classes = np.repeat([0, 1, 2], [900, 100, 10])

    class Sorted(Labels):
        def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
            return [{"label": np.int64(classes[i]), "index": np.int64(i)} for i in indices]

    data = Sorted(len(classes))
    balanced = shardfeed.Mixture.balanced(data, classes)
    assert balanced.classes == [0, 1, 2] and balanced.epoch_size == 1010  # the dataset's length
    got = epoch(shardfeed.Loader(balanced, batch_size=10, seed=4))
    assert Counter(labels(got).tolist()) == {0: 337, 1: 337, 2: 336}
    rare = Counter(labels(got, "index")[labels(got) == 2].tolist())
    assert sorted(rare.values()) == [33] * 4 + [34] * 6  # 33 whole passes and 6 of a 34th
    assert np.array_equal(classes[labels(got, "index")], labels(got))  # records are theirs

    weighted = shardfeed.Mixture.balanced(data, classes, weights={0: 2, 1: 1, 2: 1},
                                          epoch_size=400)
    got = epoch(shardfeed.Loader(weighted, batch_size=40, seed=4))
    assert Counter(labels(got).tolist()) == {0: 200, 1: 100, 2: 100}
    rare = Counter(labels(got, "index")[labels(got) == 2].tolist())
    assert set(rare.values()) == {10}  # ten passes over the 10 rare records


def test_thread_count_and_shuffle_false() -> None:
    def run(threads: int, shuffle: bool = True) -> np.ndarray:
        mixture = shardfeed.Mixture([Labels(300), Labels(200, first=1000)], [0.5, 0.5])
        return labels(epoch(shardfeed.Loader(mixture, batch_size=16, seed=3, shuffle=shuffle,
                                             num_threads=threads)))

    assert np.array_equal(run(1), run(2))
    stored = run(2, shuffle=False)
    assert stored.tolist() == list(range(200)) + list(range(1000, 1200))


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="one each"):
        shardfeed.Mixture([Labels(3), Labels(3)], [1.0])
    with pytest.raises(ValueError, match="positive"):
        shardfeed.Mixture([Labels(3), Labels(3)], [1.0, 0.0])
    with pytest.raises(TypeError, match="Mixture source"):
        shardfeed.Mixture([Labels(3), object()])
    with pytest.raises(ValueError, match="one class a record"):
        shardfeed.Mixture.balanced(Labels(3), [0, 1])
    with pytest.raises(ValueError, match="repeat"):
        shardfeed.Mixture([shardfeed.Subset(Labels(5), [1, 1])])


def test_real_datasets_mix_decode_and_name_a_bad_record(tmp_path: Path) -> None:
    a = shardfeed.Dataset(str(write_dataset(tmp_path / "a", 30, shards=2)))
    b_folder = write_dataset(tmp_path / "b", 20, shards=2, bad_jpeg=[13])
    b = shardfeed.Dataset(str(b_folder))
    mixture = shardfeed.Mixture([a, b], [0.6, 0.4], epoch_size=50)
    loader = shardfeed.Loader(mixture, batch_size=10, seed=0, transform=DecodeImage())
    with pytest.raises(DecodeError, match=r"part-001\.tfrecord.*record 3") as info:
        epoch(loader)
    assert str(b_folder) in str(info.value)

    c = shardfeed.Dataset(str(write_dataset(tmp_path / "c", 20, shards=1)))
    images = epoch(shardfeed.Loader(shardfeed.Mixture([a, c], [0.6, 0.4], epoch_size=50),
                                    batch_size=10, seed=0, transform=DecodeImage()))
    assert sum(len(x["image"]) for x in images) == 50


def test_sources_must_hold_the_same_features(tmp_path: Path) -> None:
    a = shardfeed.Dataset(str(write_dataset(tmp_path / "a", 6, shards=1)))
    with pytest.raises(SchemaError, match="different features"):
        other = Labels(5)
        other.schema = a.schema.__class__(features={"label": a.schema.features["index"]})
        shardfeed.Mixture([a, other])


def test_two_ranks_share_the_epoch_without_overlap() -> None:
    def rank(r: int) -> np.ndarray:
        mixture = shardfeed.Mixture([Labels(70), Labels(30, first=1000)], [0.7, 0.3])
        return labels(epoch(shardfeed.Loader(mixture, batch_size=10, seed=6, rank=r,
                                             world_size=2)))

    both = np.concatenate([rank(0), rank(1)])
    assert sorted(both.tolist()) == list(range(70)) + list(range(1000, 1030))


def test_the_shuffle_report_shows_the_realised_proportions() -> None:
    from shardfeed.tools.shuffle_report import shuffle_report

    mixture = shardfeed.Mixture([Labels(100), Labels(3000, first=100_000)], [0.7, 0.3],
                                epoch_size=2000)
    report = shuffle_report(mixture, seed=3, batch_size=100)
    small, large = report["sources"]
    assert (small["outputs"], large["outputs"]) == (1400, 600)
    assert (small["passes"], small["most_in_a_pass"]) == (14, 1)
    assert (large["passes"], large["most_in_a_pass"]) == (1, 1)
    assert small["batch_share_mean"] == pytest.approx(0.7)
    assert small["batch_share_sd"] == pytest.approx(small["expected_batch_sd"], rel=0.35)
    # the figures are the Loader's own: count its first epoch
    got = labels(epoch(shardfeed.Loader(mixture, batch_size=100, seed=3)))
    shares = [np.mean(got[i:i + 100] < 100_000) for i in range(0, 2000, 100)]
    assert min(shares) == pytest.approx(small["batch_share_min"])
    assert max(shares) == pytest.approx(small["batch_share_max"])


def test_shuffle_report_command_mixes_datasets_and_balances_classes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardfeed.cli.main import main

    a = write_dataset(tmp_path / "a", 30, shards=2)
    b = write_dataset(tmp_path / "b", 50, shards=1)
    assert main(["shuffle-report", str(a), str(b), "--weights", "3", "1", "--batch", "8",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["epoch_size"] == 40 and report["names"] == [str(a), str(b)]
    assert [r["outputs"] for r in report["sources"]] == [30, 10]
    assert main(["shuffle-report", str(a), "--balanced", "--batch", "5"]) == 0
    text = capsys.readouterr().out
    assert "30 outputs an epoch" in text and text.count("class ") == 5  # labels i % 5
    with pytest.raises(SystemExit):
        main(["shuffle-report", str(a), "--weights", "1", "--balanced"])
    assert main(["shuffle-report", str(a), str(b), "--weights", "1"]) == 2
    assert "one weight a dataset" in capsys.readouterr().err


def test_process_workers_give_the_threads_bytes(tmp_path: Path) -> None:
    a = shardfeed.Dataset(str(write_dataset(tmp_path / "a", 30, shards=2)))
    c = shardfeed.Dataset(str(write_dataset(tmp_path / "c", 20, shards=1)))

    def run(**options: Any) -> list[dict[str, Any]]:
        mixture = shardfeed.Mixture([a, c], [0.6, 0.4], epoch_size=40, source_key="source")
        with shardfeed.Loader(mixture, batch_size=8, seed=2, transform=DecodeImage(),
                              **options) as loader:
            return epoch(loader)

    threads, processes = run(num_threads=2), run(workers="processes", num_threads=2)
    for x, y in zip(threads, processes, strict=True):
        for key in ("image", "index", "source"):
            np.testing.assert_array_equal(x[key], y[key])
    assert sum(int((b["source"] == 1).sum()) for b in threads) == 16


def _largest_remainder(n: int, weights: Sequence[float]) -> list[int]:
    """The counts by hand, in exact fractions: floors, then one more to the largest
    remainders (ties to the first source)."""
    from fractions import Fraction

    shares = [Fraction(w).limit_denominator(10**6) * n for w in weights]
    counts = [int(s) for s in shares]
    by_remainder = sorted(range(len(shares)), key=lambda k: (-(shares[k] - counts[k]), k))
    for k in by_remainder[:n - sum(counts)]:
        counts[k] += 1
    return counts


@pytest.mark.parametrize(("weights", "size", "expected"), [
    ([0.5, 0.3, 0.2], 7, [4, 2, 1]),     # 3.5 2.1 1.4: the spare output to a (.5), not b (.1)
    ([0.5, 0.3, 0.2], 9, [4, 3, 2]),     # 4.5 2.7 1.8: two spares, to c (.8) and b (.7)
    ([0.6, 0.25, 0.15], 11, [6, 3, 2]),  # 6.6 2.75 1.65: spares to b (.75) and c (.65)
])
def test_fractional_shares_give_each_spare_output_to_the_largest_remainder(
        weights: list[float], size: int, expected: list[int]) -> None:
    assert _largest_remainder(size, weights) == expected
    mixture = shardfeed.Mixture([Labels(20), Labels(20, first=1000), Labels(20, first=2000)],
                                weights, epoch_size=size, source_key="source")
    loader = shardfeed.Loader(mixture, batch_size=3, seed=11)
    for _ in range(2):  # every epoch, as counted from what the loader hands out
        got = Counter(labels(epoch(loader), "source").tolist())
        assert [got[k] for k in range(3)] == expected


def test_every_epoch_size_splits_as_the_largest_remainders_do() -> None:
    weights = [0.45, 0.35, 0.2]
    for size in range(1, 41):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mixture = shardfeed.Mixture(
                [Labels(5), Labels(5, first=1000), Labels(5, first=2000)], weights,
                epoch_size=size)
        assert mixture.counts.tolist() == _largest_remainder(size, weights), size
        assert len(caught) == (0 in mixture.counts.tolist()), size  # sizes 1 to 4 leave one out
