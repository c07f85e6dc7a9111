"""Which records step N trained on, computed: ``records_at`` equals what the batches held, byte
for byte, over ranks, epochs, an elastic restore onto another world size, windows, patches,
a mixture and skipped bad images; the inverse finds a record's step; and ``shardfeed which``
in a fresh process gives the same from a saved state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from pipeline_helpers import write_dataset
from test_windows import write_frames

import shardfeed
from shardfeed.dataset import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader, Mixture, Patches, Windows
from shardfeed.transforms import DecodeImage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from dist_helpers import write_records

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def records_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_records(tmp_path_factory.mktemp("steps") / "ds", 50, shards=3)


def index_of(step: shardfeed.pipeline.step_records.StepRecords, rank: int) -> list[int]:
    return [s.records[0].features["index"][0] for s in step.samples if s.rank == rank]


def run_ranks(folder: Path, world: int, epochs: int, **options: Any) -> list[list[list[int]]]:
    """Each rank's batches ("index" column) over ``epochs`` epochs: ``[rank][step]``."""
    out = []
    for rank in range(world):
        with Loader(Dataset(str(folder)), rank=rank, world_size=world, **options) as loader:
            out.append([b["index"].ravel().tolist() for _ in range(epochs) for b in loader])
    return out


def test_every_step_of_every_rank_over_epochs(records_folder: Path) -> None:
    options = {"batch_size": 4, "shuffle": True, "seed": 7, "transform": None}
    seen = run_ranks(records_folder, 3, 3, **options)
    with Loader(Dataset(str(records_folder)), rank=0, world_size=3, **options) as loader:
        steps = len(seen[0])
        assert steps == 3 * len(loader)
        for step in range(steps):
            found = loader.records_at(step)
            for rank in range(3):
                assert index_of(found, rank) == seen[rank][step], (step, rank)
            assert [s.records[0].record for s in found.samples if s.rank == 1] == seen[1][step]
            one = loader.records_at(step, rank=2)
            assert [s.rank for s in one.samples] == [2] * len(seen[2][step])
            assert index_of(one, 2) == seen[2][step]
        # the inverse: each record of epoch 1, where it is
        for record in range(50):
            for step, rank, row in loader.where_record(record, 1):
                assert seen[rank][step][row] == record
        placed = sum(len(loader.where_record(r, 1)) for r in range(50))
        per = len(loader)  # every row of the epoch's batches, once (a padded one: twice)
        assert placed == sum(len(seen[r][k]) for r in range(3) for k in range(per, 2 * per))
        shard, index, offset = (found.samples[0].records[0].shard,
                                found.samples[0].records[0].index,
                                found.samples[0].records[0].offset)
        assert shard.endswith(".tfrecord") and index >= 0 and offset >= 0
        assert "name" in found.samples[0].records[0].features  # a short text: shown


def test_an_elastic_restore_counts_steps_from_its_state(records_folder: Path) -> None:
    options = {"batch_size": 4, "shuffle": True, "seed": 3, "transform": None}
    before = []
    for rank in range(2):
        with Loader(Dataset(str(records_folder)), rank=rank, world_size=2, **options) as loader:
            batches = iter(loader)
            before.append([next(batches)["index"].ravel().tolist() for _ in range(3)])
            if rank == 0:
                state = json.loads(json.dumps(loader.state()))  # saved at step 3, as JSON
    after: list[list[list[int]]] = []
    options_3 = {**options, "batch_size": 3}
    for rank in range(3):  # restored on 3 ranks, with another batch size
        with Loader(Dataset(str(records_folder)), rank=rank, world_size=3, **options_3) as loader:
            loader.restore(state)
            after.append([b["index"].ravel().tolist() for _ in range(2) for b in loader])
    with Loader(Dataset(str(records_folder)), rank=0, world_size=2, **options) as old:
        for step in range(3):
            assert [index_of(old.records_at(step), r) for r in range(2)] == [
                before[0][step], before[1][step]]
    with Loader(Dataset(str(records_folder)), rank=0, world_size=3, **options_3) as loader:
        for k in range(len(after[0])):
            found = loader.records_at(3 + k, after=(state, 3))
            assert [index_of(found, r) for r in range(3)] == [after[r][k] for r in range(3)], k
        with pytest.raises(ValueError, match="before the state's step"):
            loader.records_at(2, after=(state, 3))
        # the same from the saved state alone, as a job that lost its loader would
        alone = shardfeed.records_at(Dataset(str(records_folder)), state, 7, batch_size=3,
                                     world_size=3, state_step=3, transform=None)
        assert alone.records() == loader.records_at(7, after=(state, 3)).records()


def test_windows_give_every_frame(tmp_path: Path) -> None:
    ds = Dataset(str(write_frames(tmp_path / "frames")))
    windows = Windows(ds, length=3, stride=2, label_keys=["labels"])
    with Loader(windows, batch_size=4, shuffle=True, seed=1, transform=None) as loader:
        batches = [b["index"].tolist() for _ in range(2) for b in loader]
        for step, rows in enumerate(batches):
            found = loader.records_at(step)
            assert [[r.features["index"][0] for r in s.records] for s in found.samples] == [
                [int(v) for v in np.ravel(row)] for row in rows]
            assert found.samples[0].records[0].features["image/filename"].endswith(".jpg")
        # the inverse: every window that holds a frame, where it is in epoch 1
        per = len(loader)
        held = [[int(v) for v in np.ravel(row)] for rows in batches[per:] for row in rows]
        for frame in range(len(ds)):
            places = loader.where_record(frame, 1)
            assert len(places) == sum(frame in window for window in held), frame
            for step, rank, row in places:
                window = loader.records_at(step, rank=rank).samples[row].records
                assert frame in [r.record for r in window]


def _big(folder: Path, n: int, *, bad: tuple[int, ...] = ()) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    with ShardWriter(str(folder / "big.tfrecord")) as writer:
        for i in range(n):
            data = simplejpeg.encode_jpeg(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8))
            writer.write_example({"image/encoded": data[:40] if i in bad else data,
                                  "index": [i]})
    return folder


def test_patches_give_the_image_and_its_box(tmp_path: Path) -> None:
    patches = Patches(Dataset(str(_big(tmp_path / "big", 12))), size=16, cache_images=3,
                      refresh_every=5)
    with Loader(patches, batch_size=6, shuffle=True, seed=4, num_threads=2) as loader:
        batches = [(b["patch/record"].tolist(), b["patch/box"].tolist()) for b in loader]
        for step, (records, boxes) in enumerate(batches):
            found = loader.records_at(step)
            assert [s.records[0].record for s in found.samples] == records
            assert [list(s.box) for s in found.samples] == boxes  # type: ignore[arg-type]
        # the inverse: every patch cut from an image, where it is in the epoch
        for image in range(12):
            places = loader.where_record(image, 0)
            assert len(places) == sum(records.count(image) for records, _ in batches)
            assert all(batches[step][0][row] == image for step, _, row in places)


def test_a_mixture_names_the_dataset(tmp_path: Path, records_folder: Path) -> None:
    other = write_records(tmp_path / "other", 20, shards=1)
    mixture = Mixture([Dataset(str(records_folder)), Dataset(str(other))], weights=[0.5, 0.5],
                      source_key="source")
    with Loader(mixture, batch_size=5, shuffle=True, seed=9, transform=None) as loader:
        batches = [(b["source"].tolist(), b["index"].ravel().tolist()) for b in loader]
        for step, (sources, indexes) in enumerate(batches):
            found = loader.records_at(step)
            assert [s.dataset for s in found.samples] == sources
            assert [s.records[0].features["index"][0] for s in found.samples] == indexes


def test_skipped_images_show_their_replacement(tmp_path: Path) -> None:
    folder = write_dataset(tmp_path / "bad", 40, bad_jpeg=(3, 11, 12, 30))
    options = {"batch_size": 8, "shuffle": True, "seed": 5, "on_error": "skip", "max_skipped": 10,
               "transform": DecodeImage()}
    with Loader(Dataset(str(folder)), **options) as loader:
        held = [b["index"].ravel().tolist() for _ in range(2) for b in loader]
        replaced = 0
        for step, indexes in enumerate(held):
            found = loader.records_at(step)
            assert [s.records[0].features["index"][0] for s in found.samples] == indexes
            for s in found.samples:
                if s.held != s.position:
                    replaced += 1
                    assert s.error and "JPEG" in s.error
        assert replaced >= 4
    with Loader(Dataset(str(folder)), **{**options, "on_error": "raise"}) as strict:
        bad = [s for step in range(len(strict)) for s in strict.records_at(step).samples
               if s.held is None]
        assert sorted(s.position for s in bad) and all(s.error for s in bad)
        assert len(bad) == 4  # each bad record once an epoch: the batch that stops the run


def test_which_in_a_fresh_process_matches(tmp_path: Path, records_folder: Path) -> None:
    options = {"batch_size": 4, "shuffle": True, "seed": 11, "transform": None}
    with Loader(Dataset(str(records_folder)), rank=0, world_size=2, **options) as loader:
        batches = iter(loader)
        for _ in range(5):
            next(batches)
        state = loader.state()
        expected = loader.records_at(17)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-m", "shardfeed", "which", str(records_folder), "--state", str(path),
         "--step", "17", "--json"],  # the state holds the run's batch size and ranks
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0 and state["run"]["world_size"] == 2, done.stderr
    assert "note" not in done.stderr
    got = json.loads(done.stdout)
    assert got["step"] == 17 and got["epoch"] == expected.epoch
    assert [[r["record"] for r in s["records"]] for s in got["samples"]] == expected.records()
    table = subprocess.run(
        [sys.executable, "-m", "shardfeed", "which", str(records_folder), "--state", str(path),
         "--step", "17", "--batch-size", "4", "--world-size", "2", "--rank", "1"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert table.returncode == 0 and "rank 1 row   0" in table.stdout, table.stderr
    with Loader(Dataset(str(records_folder)), rank=0, world_size=2, **options) as loader:
        expected_places = loader.where_record(31, 2)
    where = subprocess.run(
        [sys.executable, "-m", "shardfeed", "which", str(records_folder), "--state", str(path),
         "--record", "31", "--epoch", "2", "--json"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert where.returncode == 0, where.stderr
    assert [(p["step"], p["rank"], p["row"]) for p in json.loads(where.stdout)["places"]] == (
        expected_places) and expected_places
    # another world size asked for is answered as such, and said
    other = subprocess.run(
        [sys.executable, "-m", "shardfeed", "which", str(records_folder), "--state", str(path),
         "--step", "20", "--world-size", "1", "--json"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert other.returncode == 0 and "world_size=2; answering for world_size=1" in other.stderr
    assert {s["rank"] for s in json.loads(other.stdout)["samples"]} == {0}
    # a state saved before states held the run's options asks for the batch size
    older = tmp_path / "older.json"
    older.write_text(json.dumps({k: v for k, v in state.items() if k != "run"}))
    asked = subprocess.run(
        [sys.executable, "-m", "shardfeed", "which", str(records_folder), "--state", str(older),
         "--step", "17"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert asked.returncode != 0 and "pass --batch-size" in asked.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "shardfeed", "which", str(records_folder), "--state",
         str(tmp_path / "none.json"), "--step", "1", "--batch-size", "4"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert wrong.returncode != 0 and "cannot read the state" in wrong.stderr


FRESH = """\
import json, sys
import shardfeed
folder, state_file, steps_file = sys.argv[1:4]
state = json.loads(open(state_file).read())
steps = json.loads(open(steps_file).read())
ds = shardfeed.Dataset(folder)
out = {}
for step in steps:
    found = shardfeed.records_at(ds, state, step, batch_size=4, world_size=2,
                                 transform=shardfeed.transforms.DecodeImage(),
                                 on_error="skip")
    out[str(step)] = [[s.rank, s.records[0].features["index"][0]] for s in found.samples]
print(json.dumps(out))
"""


def test_a_hundred_random_steps_from_a_saved_state_in_a_fresh_process(tmp_path: Path) -> None:
    """Two ranks over 6 epochs with bad images skipped: the state saved mid-run, then a fresh
    process (no loader of the run) finds what 100 random steps, past and future, held."""
    folder = write_dataset(tmp_path / "bad", 30, bad_jpeg=(4, 17))
    options = {"batch_size": 4, "shuffle": True, "seed": 21, "on_error": "skip",
               "max_skipped": 10, "transform": DecodeImage(), "world_size": 2}
    held: list[list[list[int]]] = []
    for rank in range(2):
        with Loader(Dataset(str(folder)), rank=rank, **options) as loader:
            batches = [b["index"].ravel().tolist() for _ in range(6) for b in loader]
            held.append(batches)
            if rank == 0:
                state = loader.state()  # after 6 epochs: steps before it are past
    steps = sorted(np.random.default_rng(0).choice(len(held[0]), 100, replace=True).tolist())
    (tmp_path / "state.json").write_text(json.dumps(state))
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    (tmp_path / "fresh.py").write_text(FRESH)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, str(tmp_path / "fresh.py"), str(folder),
                           str(tmp_path / "state.json"), str(tmp_path / "steps.json")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for step in steps:
        rows = found[str(step)]
        for rank in range(2):
            assert [i for r, i in rows if r == rank] == held[rank][step], (step, rank)


class Same(shardfeed.BatchStageBase):
    def __call__(self, batch: Any, keys: Any, /) -> Any:
        return batch


@pytest.mark.parametrize(("drop_last", "remainder"), [(True, None), (False, "drop"),
                                                       (True, "pad")])
def test_a_saved_state_with_the_runs_options_gives_its_steps(
    records_folder: Path, drop_last: bool, remainder: Any
) -> None:
    """drop_last and remainder change an epoch's batches on several ranks: the tools take the
    Loader's defaults for them; a state with batch stages is read without them."""
    options: dict[str, Any] = {"batch_size": 3, "shuffle": True, "seed": 2, "transform": None,
                               "drop_last": drop_last, "remainder": remainder,
                               "batch_stages": [Same()]}
    held = run_ranks(records_folder, 4, 2, **options)
    with Loader(Dataset(str(records_folder)), rank=0, world_size=4, **options) as loader:
        state = json.loads(json.dumps(loader.state()))
        assert "batch_stages" in state
    for step in range(len(held[0])):
        alone = shardfeed.records_at(Dataset(str(records_folder)), state, step, batch_size=3,
                                     world_size=4, transform=None, drop_last=drop_last,
                                     remainder=remainder)
        assert [index_of(alone, r) for r in range(4)] == [held[r][step] for r in range(4)]


def test_where_record_with_fewer_samples_than_ranks(tmp_path: Path) -> None:
    folder = write_records(tmp_path / "two", 2, shards=1)
    with Loader(Dataset(str(folder)), batch_size=1, shuffle=True, seed=0, transform=None,
                rank=0, world_size=5) as loader:  # remainder="pad": positions wrap twice
        found = loader.records_at(0)
        for record in range(2):
            placed = loader.where_record(record, 0)
            assert sorted((rank, row) for _, rank, row in placed) == sorted(
                (s.rank, s.row) for s in found.samples if s.records[0].record == record)


def test_what_a_run_saved_is_read_and_checked(tmp_path: Path, records_folder: Path) -> None:
    """A state as the run saved it (its JSON text, a file, a LoaderCheckpoint's wrapper or
    folder) is read; one of another source, or whose position is not on a step of the batch
    size and ranks given, is refused with what differs; a step that is not a count is too."""
    options = {"batch_size": 4, "shuffle": True, "seed": 6, "transform": None}
    with Loader(Dataset(str(records_folder)), rank=0, world_size=2, **options) as loader:
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        state = loader.state()  # at epoch position 24 = 3 steps of 4 x 2
        expected = loader.records_at(9).records()
        checkpoint = tmp_path / "ckpt"
        checkpoint.mkdir()
        (checkpoint / "loader_state.json").write_text(
            json.dumps({"loader": state, "step": 3, "epoch": 0, "serial": 1}))
        for given in (json.dumps(state), tmp_path / "none", checkpoint,
                      checkpoint / "loader_state.json"):
            if given == tmp_path / "none":
                (tmp_path / "none").write_text(json.dumps(state))
            found = shardfeed.records_at(Dataset(str(records_folder)), given, 9, batch_size=4,
                                         world_size=2, transform=None)
            assert found.records() == expected
        with pytest.raises(ValueError, match="not at a step of batch_size=5 x world_size=2"):
            shardfeed.records_at(Dataset(str(records_folder)), state, 9, batch_size=5,
                                 world_size=2, transform=None)
        with pytest.raises(ValueError, match="step must be an int"):
            loader.records_at(1.5)  # type: ignore[arg-type]
        other = write_records(tmp_path / "other", 50, shards=2)
        with (Loader(Dataset(str(other)), rank=0, world_size=2, **options) as stranger,
              pytest.raises(shardfeed.StateError, match="another source")):
            stranger.records_at(5, after=(state, 3))
        with pytest.raises(ValueError, match="a loader state is what loader.state"):
            loader.records_at(5, after=({"epoch": 0}, 3))


def test_which_prints_the_same_whatever_the_hash_seed(tmp_path: Path,
                                                      records_folder: Path) -> None:
    with Loader(Dataset(str(records_folder)), batch_size=4, shuffle=True, seed=3,
                transform=None) as loader:
        (tmp_path / "s.json").write_text(json.dumps(loader.state()))
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-m", "shardfeed", "which", str(records_folder), "--state",
             str(tmp_path / "s.json"), "--step", "3", "--batch-size", "4", "--json"],
            capture_output=True, text=True, env=env, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        outs.append(done.stdout)
    assert outs[0] == outs[1]
    mixed = subprocess.run(
        [sys.executable, "-m", "shardfeed", "which", str(records_folder), "--state",
         str(tmp_path / "s.json"), "--step", "3", "--epoch", "1", "--batch-size", "4"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=120, check=False)
    assert mixed.returncode != 0 and "--epoch goes with --record" in mixed.stderr


@pytest.mark.parametrize("how", [{"stride": 2}, {"stride_seconds": 16.0}])
def test_the_windows_that_hold_a_frame(tmp_path: Path, how: dict[str, Any]) -> None:
    ds = Dataset(str(write_frames(tmp_path / "frames")))
    index = Windows(ds, length=3, **how).index
    every = index.frames_many(np.arange(len(index)))
    for frame in range(len(ds)):
        assert index.windows_with(frame).tolist() == np.flatnonzero(
            (every == frame).any(axis=1)).tolist()
