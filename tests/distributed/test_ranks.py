"""Rank detection (environment, explicit override), remainder and elastic resume in-process."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardfeed import Dataset, Loader, StateError
from shardfeed.loaders.distributed import (
    RankInfo,
    agreed_state,
    detect_ranks,
    gather_states,
    resolve_ranks,
)

SEED = 3


def ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["index"].tolist()]


@pytest.fixture(scope="module")
def ds(records_folder: Path) -> Any:
    with Dataset(records_folder) as dataset:
        yield dataset


@pytest.fixture(scope="module")
def order(ds: Any) -> list[int]:
    with Loader(ds, batch_size=len(ds), seed=SEED, transform=None, rank=0,
                world_size=1) as loader:
        return ids(loader)


def test_env_ranks_are_detected() -> None:
    assert detect_ranks(environ={"RANK": "2", "WORLD_SIZE": "4"}) == RankInfo(2, 4, "env")
    assert detect_ranks(environ={"RANK": " 0 ", "WORLD_SIZE": "1"}) == RankInfo(0, 1, "env")
    assert detect_ranks(environ={}) == RankInfo(0, 1, "single")


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RANK": "1"}, "WORLD_SIZE is not"),
        ({"WORLD_SIZE": "4"}, "RANK is not"),
        ({"RANK": "one", "WORLD_SIZE": "4"}, "RANK='one' is not an integer"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 and WORLD_SIZE=4"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ],
)
def test_bad_env_ranks_fail_with_the_fix(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        detect_ranks(environ=environ)
    assert "rank= and world_size=" in str(info.value)


def test_explicit_ranks_override_the_environment() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4"}
    assert resolve_ranks(1, 2, environ=env) == RankInfo(1, 2, "explicit")
    assert resolve_ranks(None, None, environ=env) == RankInfo(3, 4, "env")
    with pytest.raises(ValueError, match="both rank and world_size"):
        resolve_ranks(1, None, environ=env)
    with pytest.raises(ValueError, match="rank must be < world_size"):
        RankInfo(2, 2)


def test_loader_uses_env_ranks_unless_given(ds: Any, order: list[int],
                                            monkeypatch: pytest.MonkeyPatch,
                                            announced: None) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.warns(UserWarning, match="RANK=1, WORLD_SIZE=3 from the environment"):
        loader = Loader(ds, batch_size=4, seed=SEED, transform=None, remainder="drop")
    with loader:
        assert loader.ranks == RankInfo(1, 3, "env")
        assert ids(loader) == order[1 : len(order) - len(order) % 3 : 3]
    with Loader(ds, batch_size=4, seed=SEED, transform=None, rank=0, world_size=1) as whole:
        assert whole.ranks.source == "explicit"
        assert ids(whole) == order
    monkeypatch.setenv("RANK", "7")
    with pytest.raises(ValueError, match="RANK=7 and WORLD_SIZE=3"):
        Loader(ds, batch_size=4, transform=None)


def test_remainder_is_checked_and_defaults_follow_drop_last(ds: Any) -> None:
    with pytest.raises(ValueError, match="remainder must be one of"):
        Loader(ds, batch_size=4, remainder="wrap", rank=0, world_size=2)
    n = len(ds)
    for drop_last, per_rank in ((True, n // 2), (False, -(-n // 2))):
        with Loader(ds, batch_size=1, drop_last=drop_last, rank=0, world_size=2,
                    transform=None) as loader:
            assert len(loader) == per_rank


def test_detection_never_imports_torch_or_jax(records_folder: Path) -> None:
    code = (
        "import sys, shardfeed\n"
        "from shardfeed.loaders.distributed import detect_ranks\n"
        f"loader = shardfeed.Loader(shardfeed.Dataset({str(records_folder)!r}), batch_size=2)\n"
        "assert loader.ranks.source == 'single', loader.ranks\n"
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=False,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def test_agreed_state_names_the_rank_that_differs() -> None:
    state = {"seed": 1, "epoch": 0, "consumed": 8, "skipped": 0, "source": {}}
    assert agreed_state([state, {**state, "skipped": 2}]) == state
    with pytest.raises(StateError, match="rank 1 saved consumed=12"):
        agreed_state([state, {**state, "consumed": 12}])
    with pytest.raises(TypeError):
        agreed_state([])
    assert gather_states(state) == state  # no process group: this rank's own


def test_state_from_4_ranks_restores_on_8(ds: Any, order: list[int]) -> None:
    n = len(order)
    before, states = [], []
    for rank in range(4):
        with Loader(ds, batch_size=2, seed=SEED, transform=None, rank=rank, world_size=4,
                    remainder="pad") as loader:
            it = iter(loader)
            before += ids([next(it)])
            states.append(loader.state())
    state = agreed_state(states)
    assert state["consumed"] == 8
    after = []
    for rank in range(8):
        with Loader(ds, batch_size=2, seed=SEED, transform=None, rank=rank, world_size=8,
                    remainder="pad") as loader:
            loader.restore(state)
            after.append(ids(loader))
    assert len({len(a) for a in after}) == 1
    counts = Counter(before + [i for a in after for i in a])
    assert set(counts) == set(range(n))
    assert sorted(i for i, c in counts.items() if c > 1) == sorted(order[: -(n - 8) % 8])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    world=st.integers(1, 5), new_world=st.integers(1, 8), batch=st.integers(1, 4),
    steps=st.integers(0, 3), remainder=st.sampled_from(["drop", "pad"]),
)
def test_elastic_resume_is_exact(ds: Any, order: list[int], world: int, new_world: int,
                                 batch: int, steps: int, remainder: str) -> None:
    """Any world sizes, batch sizes and save points: before + after is the epoch's exact set."""
    n = len(order)
    loaders = [Loader(ds, batch_size=batch, seed=SEED, transform=None, rank=r,
                      world_size=world, remainder=remainder, num_threads=1) for r in range(world)]
    steps = min(steps, len(loaders[0]) - 1) if len(loaders[0]) else 0
    before: list[int] = []
    states = []
    for loader in loaders:
        it = iter(loader)
        before += ids(next(it) for _ in range(steps))
        states.append(loader.state())
        loader.close()
    state = agreed_state(states)
    consumed = state["consumed"]
    assert sorted(before) == sorted(order[:consumed])
    after: list[list[int]] = []
    for rank in range(new_world):
        with Loader(ds, batch_size=batch, seed=SEED, transform=None, rank=rank,
                    world_size=new_world, remainder=remainder, num_threads=1) as loader:
            loader.restore(state)
            after.append(ids(loader))
            assert loader.epoch == 1  # the epoch was read to its end
    assert len({len(a) for a in after}) == 1
    left = n - consumed
    if remainder == "drop":
        both = before + [i for a in after for i in a]
        assert sorted(both) == sorted(order[: n - left % new_world])
    else:
        pad = -left % new_world
        assert sorted(i for a in after for i in a) == sorted(order[consumed:] + order[:pad])


@pytest.fixture()
def announced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh process as far as the once-a-process announcement goes."""
    from shardfeed.pipeline import ranks

    monkeypatch.setattr(ranks, "_announced", set())
    for name in ranks.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_left_over_rank_variables_are_named_once_with_the_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, announced: None,
) -> None:
    from dist_helpers import write_records

    with Dataset(write_records(tmp_path / "d", 300)) as three_hundred:
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "4")
        with pytest.warns(UserWarning) as caught:
            loader = Loader(three_hundred, batch_size=25, transform=None, shuffle=False)
        assert len(caught) == 1
        message = str(caught[0].message)
        assert message.startswith("RANK=1, WORLD_SIZE=4 from the environment: this loader "
                                  "reads 75 of 300 samples")
        assert "rank=0, world_size=1" in message
        assert caught[0].filename == __file__  # points at the user's line
        assert len(ids(loader)) == 75
        loader.close()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Loader(three_hundred, batch_size=25, transform=None).close()  # once only
            Loader(three_hundred, batch_size=25, transform=None, rank=0,
                   world_size=1).close()


def test_rank_variables_of_a_launcher_are_logged_not_warned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    announced: None,
) -> None:
    import logging
    import warnings

    from dist_helpers import write_records

    with Dataset(write_records(tmp_path / "d", 300)) as three_hundred:
        for name, value in (("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "3"),
                            ("MASTER_ADDR", "127.0.0.1")):
            monkeypatch.setenv(name, value)
        caplog.set_level(logging.INFO, logger="shardfeed.pipeline.ranks")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Loader(three_hundred, batch_size=25, transform=None).close()
            Loader(three_hundred, batch_size=25, transform=None).close()
    said = [r.getMessage() for r in caplog.records if r.name == "shardfeed.pipeline.ranks"]
    assert said == [("RANK=3, WORLD_SIZE=4 from the environment: this loader reads 75 of "
                     "300 samples an epoch (the launcher's rank share)")]
