"""The Loader over real shards of real JPEGs: coverage, order, batches, state, arguments."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import HEIGHT, WIDTH, keyed_transform, record_ids, train_transform

from shardfeed.errors import StateError
from shardfeed.pipeline import Loader
from shardfeed.sampling.keys import sample_rng


def run_epoch(loader: Loader) -> list[dict[str, Any]]:
    return [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in b.items()}
            for b in loader]


def digest(batches: list[dict[str, Any]]) -> list[bytes]:
    return [b"".join(v.tobytes() if isinstance(v, np.ndarray) else repr(v).encode()
                     for v in b.values()) for b in batches]


@pytest.mark.parametrize("shuffle", [True, False])
def test_every_record_once_per_epoch(clean_ds: Any, shuffle: bool) -> None:
    with Loader(clean_ds, batch_size=10, shuffle=shuffle, seed=1, num_threads=2) as loader:
        ids = record_ids(run_epoch(loader))
    assert sorted(ids) == list(range(103))
    assert (ids == list(range(103))) is (not shuffle)


def test_permutation_differs_by_epoch_and_is_reproducible(clean_ds: Any) -> None:
    loader = Loader(clean_ds, batch_size=16, seed=5, num_threads=2)
    epochs = [record_ids(run_epoch(loader)) for _ in range(3)]
    assert loader.epoch == 3
    assert epochs[0] != epochs[1] != epochs[2]
    again = Loader(clean_ds, batch_size=16, seed=5, num_threads=1)
    again.set_epoch(1)
    assert record_ids(run_epoch(again)) == epochs[1]
    other_seed = Loader(clean_ds, batch_size=16, seed=6, num_threads=2)
    assert record_ids(run_epoch(other_seed)) != epochs[0]


def test_golden_first_indices(clean_ds: Any) -> None:
    # Changing these numbers changes every user's stream: a breaking change for CHANGELOG.md.
    loader = Loader(clean_ds, batch_size=8, seed=0, num_threads=1, transform=keyed_transform())
    batch = next(iter(loader))
    assert record_ids([batch]) == GOLDEN_SEED0_EPOCH0
    # the transform of position 0 draws from sample_rng(seed, epoch, 0): flip, then noise
    rng = sample_rng(0, 0, 0)
    rng.random()
    np.testing.assert_allclose(batch["noise"][0], rng.random(2).astype(np.float32))


GOLDEN_SEED0_EPOCH0: list[int] = [89, 37, 9, 58, 35, 40, 18, 59]


@pytest.mark.parametrize("threads", [2, 4])
def test_same_bytes_for_any_thread_count(clean_ds: Any, threads: int) -> None:
    def stream(num_threads: int) -> list[bytes]:
        with Loader(clean_ds, batch_size=12, seed=3, transform=train_transform(),
                    num_threads=num_threads, prefetch_batches=3) as loader:
            return digest(run_epoch(loader))

    assert stream(threads) == stream(1)


def test_batch_contents(clean_ds: Any) -> None:
    loader = Loader(clean_ds, batch_size=10, seed=0, transform=keyed_transform(), num_threads=2)
    batch = next(iter(loader))
    assert batch["image"].dtype == np.uint8 and batch["image"].shape == (10, 32, 48, 3)
    assert batch["image/class/label"].dtype == np.int64
    assert batch["image/class/label"].shape == (10,)
    assert batch["labels"].dtype == np.float32 and batch["labels"].shape == (10, 3)
    assert batch["noise"].shape == (10, 2)
    names = batch["image/filename"]
    assert isinstance(names, list) and len(names) == 10
    ids = batch["index"]
    assert names == [f"img{i:04d}.jpg".encode() for i in ids]
    np.testing.assert_array_equal(batch["image/class/label"], ids % 5)
    np.testing.assert_allclose(batch["labels"][:, 0], ids)
    assert "image/encoded" not in batch
    loader.close()


def test_transform_none_gives_stored_features(clean_ds: Any) -> None:
    loader = Loader(clean_ds, batch_size=4, shuffle=False, num_threads=1)
    batch = next(iter(loader))
    encoded = batch["image/encoded"]
    assert isinstance(encoded, list) and all(isinstance(e, bytes) for e in encoded)
    assert encoded[0][:3] == b"\xff\xd8\xff"
    assert batch["image/height"].tolist() == [HEIGHT] * 4
    assert batch["image/width"].tolist() == [WIDTH] * 4
    assert batch["index"].tolist() == [0, 1, 2, 3]
    loader.close()


def test_drop_last_and_len(clean_ds: Any) -> None:
    keep = Loader.for_eval(clean_ds, batch_size=25, num_threads=2)
    sizes = [len(b["index"]) for b in keep]
    assert sizes == [25, 25, 25, 25, 3] and len(keep) == 5
    drop = Loader.for_train(clean_ds, batch_size=25, num_threads=2)
    assert [len(b["index"]) for b in drop] == [25] * 4 and len(drop) == 4


def test_kept_batches_outlive_the_ring(clean_ds: Any) -> None:
    loader = Loader(clean_ds, batch_size=5, shuffle=False, prefetch_batches=1, num_threads=2)
    kept = list(loader)
    assert [int(b["index"][0]) for b in kept] == list(range(0, 103, 5))


def test_rank_shares_are_disjoint(clean_ds: Any) -> None:
    shares = []
    for rank in range(2):
        loader = Loader(clean_ds, batch_size=8, seed=2, rank=rank, world_size=2,
                        drop_last=True, num_threads=2)
        shares.append(record_ids(run_epoch(loader)))
    assert len(shares[0]) == len(shares[1]) == 48
    assert not set(shares[0]) & set(shares[1])
    single = record_ids(run_epoch(Loader(clean_ds, batch_size=8, seed=2, num_threads=1)))
    assert set(shares[0]) | set(shares[1]) == set(single[:96])


def test_state_is_small_json_and_restores_midway(clean_ds: Any) -> None:
    reference = digest(run_epoch(Loader(clean_ds, batch_size=10, seed=4,
                                        transform=train_transform(), num_threads=2)))
    loader = Loader(clean_ds, batch_size=10, seed=4, transform=train_transform(), num_threads=2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(loader.state()))
    assert state["consumed"] == 40 and state["epoch"] == 0
    resumed = Loader(clean_ds, batch_size=10, seed=4, transform=train_transform(),
                     num_threads=4)
    resumed.restore(state)
    resumed.set_epoch(0)  # a resumed training loop calls this; it keeps the position
    assert digest(run_epoch(resumed)) == reference[4:]
    assert resumed.state()["epoch"] == 1 and resumed.state()["consumed"] == 0


def test_restore_rejects_foreign_states(clean_ds: Any) -> None:
    loader = Loader(clean_ds, batch_size=10, seed=4)
    good = loader.state()
    with pytest.raises(StateError, match="missing keys \\['consumed'\\]"):
        loader.restore({k: v for k, v in good.items() if k != "consumed"})
    with pytest.raises(StateError, match="foreign keys \\['step'\\]"):
        loader.restore({**good, "step": 3})
    with pytest.raises(StateError, match="seed=9"):
        loader.restore({**good, "seed": 9})
    with pytest.raises(StateError, match="records"):
        loader.restore({**good, "source": {"kind": "records", "records": 5}})
    with pytest.raises(StateError):
        loader.restore({**good, "consumed": -1})


def test_set_epoch_jumps_and_close(clean_ds: Any) -> None:
    loader = Loader(clean_ds, batch_size=10, seed=4, num_threads=2)
    it = iter(loader)
    next(it)
    loader.set_epoch(3)
    assert loader.state()["epoch"] == 3 and loader.state()["consumed"] == 0
    epoch3 = record_ids(run_epoch(loader))
    fresh = Loader(clean_ds, batch_size=10, seed=4, num_threads=1)
    fresh.set_epoch(3)
    assert record_ids(run_epoch(fresh)) == epoch3
    loader.close()
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_memory_bound(clean_ds: Any) -> None:
    loader = Loader(clean_ds, batch_size=10, transform=keyed_transform(), num_threads=2,
                    prefetch_batches=2)
    budget = loader.memory_budget()
    row = 32 * 48 * 3 + 8 * 4 + 3 * 4 + 2 * 4 + 8 * 2  # image, ints, labels, noise, timestamp
    assert budget.batch_bytes >= 10 * 32 * 48 * 3
    assert budget.ring_batches == 3
    assert budget.decode_bytes_per_thread >= HEIGHT * WIDTH * 3  # its own decode: estimated
    assert budget.index_bytes >= 8 * 103
    assert loader.memory_bound_bytes == budget.total_bytes > 3 * budget.batch_bytes
    names = 33 + len("img0000.jpg") + 33 + len("jpeg")  # the two bytes list columns
    assert budget.batch_bytes <= 10 * (row + 64 + names)
    loader.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"batch_size": 4, "num_threads": 0}, "num_threads must be >= 1"),
        ({"batch_size": 4, "prefetch_batches": 0}, "prefetch_batches"),
        ({"batch_size": 4, "on_error": "ignore"}, "on_error must be one of"),
        ({"batch_size": 4, "workers": "gpu"}, "workers must be one of"),
        ({"batch_size": 4, "rank": 2, "world_size": 2}, "rank must be < world_size"),
        ({"batch_size": 4, "rank": 0}, "both rank and world_size"),
        ({"batch_size": 4, "max_skipped_fraction": 2.0}, "max_skipped_fraction"),
        ({"batch_size": 4, "seed": -1}, "seed must be >= 0"),
        ({"batch_size": 2.5}, "batch_size must be an int"),
    ],
)
def test_bad_arguments_fail_at_construction(clean_ds: Any, kwargs: dict[str, Any],
                                            message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Loader(clean_ds, **kwargs)


def test_source_must_be_a_dataset() -> None:
    with pytest.raises(TypeError, match="shardfeed.Dataset"):
        Loader([1, 2, 3], batch_size=2)


def test_presets_train_and_eval(clean_ds: Any) -> None:
    from shardfeed.transforms import presets

    with Loader.for_train(clean_ds, batch_size=16, seed=0, transform=presets.train(size=24),
                          num_threads=2) as train:
        batches = run_epoch(train)
    assert len(batches) == 6
    assert batches[0]["image"].shape == (16, 24, 24, 3) and batches[0]["image"].dtype == np.uint8
    with Loader.for_eval(clean_ds, batch_size=16, transform=presets.eval(size=24),
                         num_threads=2) as evaluation:
        first = run_epoch(evaluation)
        second = run_epoch(evaluation)
    assert [len(b["index"]) for b in first] == [16] * 6 + [7]
    assert digest(first) == digest(second)  # eval: same order, deterministic transforms
    assert record_ids(first) == list(range(103))


def test_loader_source_is_the_sampler_under_its_old_name_and_warns(clean_ds: Any) -> None:
    """A source is where bytes and records come from; the sampler is ``Loader.sampler``."""
    with Loader(clean_ds, batch_size=10, num_threads=1) as loader, \
            pytest.warns(DeprecationWarning, match="use Loader.sampler"):
        assert loader.source is loader.sampler


def test_a_pass_leaves_no_cycles_of_its_batches(clean_ds: Any) -> None:
    """With the collector off (as training loops run it), the batches a pass waited for are
    freed as they go: nothing of them is kept in a cycle for the collector to find."""
    import gc

    from shardfeed.pipeline import epoch

    gc.collect()
    alive = {id(o) for o in gc.get_objects() if isinstance(o, epoch._Pending)}  # others'
    gc.disable()
    try:
        with Loader(clean_ds, batch_size=4, shuffle=True, seed=1, num_threads=2) as loader:
            for e in range(2):
                loader.set_epoch(e)
                batches = sum(1 for _ in loader)
        left = sum(isinstance(o, epoch._Pending) and id(o) not in alive
                   for o in gc.get_objects())
    finally:
        gc.enable()
    assert batches > 4 and left == 0
