"""A user's batch stage (work on each whole batch, e.g. a GPU decode or MixUp) gets the keys
its rows were made with, keeps its state across a checkpoint, is closed with the loader, and
a state saved with other stages is refused."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import keyed_transform, open_dataset, record_ids

import shardfeed
from shardfeed.errors import StateError


class RedrawNoise(shardfeed.BatchStageBase):
    """Draws, from each row's keys, what the per-sample transform drew for that row."""

    def __call__(self, batch: dict[str, Any], keys: shardfeed.BatchKeys, /) -> dict[str, Any]:
        redrawn = np.empty((len(keys), 2), np.float32)
        for row in range(len(keys)):
            rng = keys.rng(row)
            rng.random()  # the transform's flip draw
            redrawn[row] = rng.random(2)
        batch["redrawn"] = redrawn
        batch["positions"] = np.array(keys.positions)
        return batch


class Counter(shardfeed.BatchStageBase):
    """A stage with a running state: how many images it has seen (e.g. a running mean)."""

    def __init__(self, *, scale: int = 1) -> None:
        self.seen = 0
        self.scale = scale
        self.closed = 0

    def __call__(self, batch: dict[str, Any], keys: shardfeed.BatchKeys, /) -> dict[str, Any]:
        self.seen += len(keys)
        batch["seen"] = np.full(len(keys), self.seen * self.scale)
        return batch

    def options(self) -> dict[str, Any]:
        return {"scale": self.scale}

    def state(self) -> dict[str, Any]:
        return {**super().state(), "seen": self.seen}

    def restore(self, state: Mapping[str, Any]) -> None:
        super().restore(state)
        self.seen = int(state["seen"])

    def close(self) -> None:
        self.closed += 1


def _loader(ds: Any, **options: Any) -> shardfeed.Loader:
    options.setdefault("batch_size", 8)
    options.setdefault("seed", 3)
    return shardfeed.Loader(ds, transform=keyed_transform(), **options)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_a_stage_draws_what_each_row_was_made_with(clean_ds: Any, threads: int) -> None:
    batches = list(_loader(clean_ds, num_threads=threads, batch_stages=RedrawNoise()))
    assert len(record_ids(batches)) == 103
    for batch in batches:
        np.testing.assert_array_equal(batch["redrawn"], batch["noise"])
    positions = np.concatenate([b["positions"] for b in batches])
    np.testing.assert_array_equal(positions, np.arange(103))


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_replaced_row_carries_its_stand_in_key(bad_jpeg_folder: Path, workers: str) -> None:
    loader = _loader(open_dataset(bad_jpeg_folder), num_threads=2, on_error="skip",
                     workers=workers, batch_stages=[RedrawNoise()])
    with loader:
        batches = list(loader)
    assert loader.stats().skipped_total == 1
    assert 41 not in record_ids(batches)
    positions = np.concatenate([b["positions"] for b in batches])
    records = np.array(record_ids(batches))
    # the row whose record was bad holds another position's sample and says which: the
    # same record as the row of that position
    bad_rows = np.flatnonzero(positions != np.arange(60))
    assert len(bad_rows) == 1
    stand_in = int(positions[bad_rows[0]])
    assert records[bad_rows[0]] == records[stand_in]
    for batch in batches:
        np.testing.assert_array_equal(batch["redrawn"], batch["noise"])


def test_stage_state_survives_a_checkpoint(clean_ds: Any) -> None:
    whole = [b["seen"].copy() for b in _loader(clean_ds, batch_stages=Counter())]
    first = _loader(clean_ds, batch_stages=Counter())
    it = iter(first)
    kept = [next(it)["seen"].copy() for _ in range(5)]
    saved = json.loads(json.dumps(first.state()))
    assert saved["batch_stages"] == [{"stage": "Counter", "scale": 1, "seen": 40}]
    resumed = _loader(clean_ds, num_threads=2, batch_stages=Counter())
    resumed.restore(saved)
    rest = [b["seen"].copy() for b in resumed]
    np.testing.assert_array_equal(np.concatenate(kept + rest), np.concatenate(whole))


def test_a_state_from_other_stages_is_refused_and_changes_nothing(clean_ds: Any) -> None:
    saved = _loader(clean_ds, batch_stages=Counter()).state()
    plain = _loader(clean_ds).state()
    other = _loader(clean_ds, batch_stages=Counter(scale=2))
    other_state = other.state()
    with pytest.raises(StateError, match="other stage options"):
        other.restore(saved)
    assert other.state() == other_state
    with pytest.raises(StateError, match="without batch stages"):
        _loader(clean_ds, batch_stages=Counter()).restore(plain)
    with pytest.raises(StateError, match="this one has none"):
        _loader(clean_ds).restore(saved)
    two = _loader(clean_ds, batch_stages=[Counter(), RedrawNoise()])
    with pytest.raises(StateError, match="1 batch stage"):
        two.restore(saved)
    # a refused stage restores nothing, even when an earlier stage accepted its part
    two_state = two.state()
    damaged = {**two_state, "batch_stages": [{**two_state["batch_stages"][0], "seen": 99},
                                             {"stage": "Other"}]}
    with pytest.raises(StateError):
        two.restore(damaged)
    assert two.state() == two_state


def test_close_closes_the_stage_once(clean_ds: Any) -> None:
    stage = Counter()
    with _loader(clean_ds, batch_stages=stage) as loader:
        next(iter(loader))
    loader.close()
    assert stage.closed == 1


def test_a_stage_missing_a_member_is_named_at_construction(clean_ds: Any) -> None:
    class NoState:
        def __call__(self, batch: dict[str, Any], keys: Any) -> dict[str, Any]:
            return batch

        def close(self) -> None:
            pass

    with pytest.raises(TypeError, match="lacks state, restore"):
        _loader(clean_ds, batch_stages=NoState())


def test_stages_run_before_the_torch_adapter(clean_ds: Any) -> None:
    torch = pytest.importorskip("torch")
    from shardfeed.loaders.torch import adapt

    batches = list(adapt(_loader(clean_ds, batch_stages=RedrawNoise())))
    assert isinstance(batches[0]["redrawn"], torch.Tensor)
    for batch in batches:
        assert torch.equal(batch["redrawn"], batch["noise"])


def test_memory_budget_counts_what_a_stage_holds(clean_ds: Any) -> None:
    class Holds(RedrawNoise):
        def memory_bytes(self) -> int:
            return 5 << 20

    plain = _loader(clean_ds).memory_budget()
    staged = _loader(clean_ds, batch_stages=Holds()).memory_budget()
    assert staged.stage_bytes == 5 << 20
    assert staged.total_bytes == plain.total_bytes + (5 << 20)


class FailsOnce(shardfeed.BatchStageBase):
    """Raises on the third batch it is given, the first time (a GPU out of memory, say)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch: dict[str, Any], keys: shardfeed.BatchKeys, /) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 3:
            raise MemoryError("device out of memory")
        return batch


def test_a_batch_whose_stage_raised_is_not_lost(clean_ds: Any) -> None:
    whole = [b["index"].copy() for b in _loader(clean_ds)]
    loader = _loader(clean_ds, batch_stages=FailsOnce())
    got = []
    with pytest.raises(MemoryError):
        for batch in loader:
            got.append(batch["index"].copy())
    assert loader.state()["consumed"] == 16  # two batches of 8 handed out, not three
    saved = json.loads(json.dumps(loader.state()))
    got += [b["index"].copy() for b in loader]  # iterating again: the third batch comes
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(whole))
    resumed = _loader(clean_ds)
    resumed.restore({k: v for k, v in saved.items() if k != "batch_stages"})
    np.testing.assert_array_equal(np.concatenate([b["index"] for b in resumed]),
                                  np.concatenate(whole[2:]))
