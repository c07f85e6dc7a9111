"""restore() refuses a state it cannot continue, and accepts what does not change the stream.

Each refusal follows a user's steps: save from loader A, restore into a loader B built
differently; the StateError names the field and both values. Before these checks, B took
the state and handed out some samples twice and others never.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from pipeline_helpers import record_image, write_dataset

from shardfeed import Dataset, Loader
from shardfeed.errors import StateError
from shardfeed.format.writer import ShardWriter
from shardfeed.tools.index import index_files


def saved_after(loader: Loader, batches: int) -> dict[str, Any]:
    """The state after ``batches`` batches, through JSON as a checkpoint file keeps it."""
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return json.loads(json.dumps(loader.state()))


def indices(loader: Loader) -> list[int]:
    return [int(i) for batch in loader for i in batch["index"].tolist()]


def write_names(folder: Path, n: int, *, prefix: str, shards: int = 2) -> Path:
    """``n`` records ``{index, name}`` whose sizes do not depend on ``prefix`` (one letter)."""
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, n, shards + 1).astype(int)
    for s in range(shards):
        with ShardWriter(str(folder / f"part-{s:03d}.tfrecord")) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                writer.write_example({"index": [i], "name": f"{prefix}{i:04d}".encode()})
    return folder


def write_jpegs(folder: Path, n: int, *, first_image: int, shards: int = 2) -> Path:
    """``n`` JPEG records showing pictures ``first_image...``, in shards named like
    :func:`write_dataset`'s."""
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, n, shards + 1).astype(int)
    for s in range(shards):
        with ShardWriter(str(folder / f"part-{s:03d}.tfrecord")) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                picture = simplejpeg.encode_jpeg(record_image(first_image + i), quality=95)
                writer.write_example({"image/encoded": picture, "index": [i]})
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("restore-checks")
    train = write_names(root / "train", 40, prefix="t")
    val = write_names(root / "val", 40, prefix="v")  # as many records, of the same sizes
    bare = write_dataset(root / "bare", 30, shards=2)  # bare TFRecord files, JPEG records
    other = write_jpegs(root / "other", 30, first_image=100)  # same names, other pictures
    index_files(str(train))
    index_files(str(val))
    return {"train": train, "val": val, "bare": bare, "other": other}


# -- the epoch order ---------------------------------------------------------------------------


@pytest.mark.parametrize(("saved", "restored", "field"), [
    ({"shuffle": True}, {"shuffle": False}, "shuffle"),
    ({"shuffle": False}, {"shuffle": True}, "shuffle"),
    ({"order_method": "exact"}, {"order_method": "bijection"}, "order_method"),
    ({"order_method": "bijection"}, {"order_method": "exact"}, "order_method"),
])
def test_another_order_is_refused(folders: dict[str, Path], saved: dict[str, Any],
                                  restored: dict[str, Any], field: str) -> None:
    ds = Dataset(str(folders["train"]))
    state = saved_after(Loader(ds, batch_size=4, seed=1, **saved), 2)
    other = Loader(ds, batch_size=4, seed=1, **restored)
    with pytest.raises(StateError) as info:
        other.restore(state)
    message = str(info.value)
    assert f"state[{field!r}]" in message
    assert repr(saved[field]) in message or str(saved[field]) in message
    assert f"{field}={restored[field]!r}" in message
    assert f"construct the Loader with {field}={saved[field]!r}" in message
    assert other.state()["consumed"] == 0  # nothing changed


def test_the_order_method_of_an_unshuffled_loader_may_differ(folders: dict[str, Path]) -> None:
    """Without shuffling both methods give the stored order: the state continues it."""
    ds = Dataset(str(folders["train"]))
    state = saved_after(Loader.for_eval(ds, batch_size=4, order_method="exact"), 3)
    resumed = Loader.for_eval(ds, batch_size=4, order_method="bijection")
    resumed.restore(state)
    assert indices(resumed) == list(range(12, 40))


def test_a_bijection_order_resumes_exactly(folders: dict[str, Path]) -> None:
    ds = Dataset(str(folders["train"]))
    whole = indices(Loader(ds, batch_size=4, seed=3, order_method="bijection"))
    state = saved_after(Loader(ds, batch_size=4, seed=3, order_method="bijection"), 3)
    resumed = Loader(ds, batch_size=5, seed=3, order_method="bijection", num_threads=1,
                     prefetch_batches=1)
    resumed.restore(state)
    assert indices(resumed) == whole[12:]


# -- the dataset -------------------------------------------------------------------------------


def test_another_dataset_of_as_many_records_is_refused(folders: dict[str, Path]) -> None:
    """train and val: 40 records each, same shard names and sizes; only the bytes differ."""
    state = saved_after(Loader(Dataset(str(folders["train"])), batch_size=4, seed=0), 2)
    val = Loader(Dataset(str(folders["val"])), batch_size=4, seed=0)
    with pytest.raises(StateError, match=r"state\['source'\]\['dataset'\] is 'records:") as info:
        val.restore(state)
    assert "the dataset the state was saved on" in str(info.value)


def test_other_bare_files_of_as_many_records_are_refused(folders: dict[str, Path]) -> None:
    state = saved_after(Loader(Dataset(str(folders["bare"])), batch_size=4, seed=0), 2)
    other = Loader(Dataset(str(folders["other"])), batch_size=4, seed=0)
    assert len(other.sampler.dataset) == 30  # type: ignore[attr-defined, arg-type]
    with pytest.raises(StateError, match=r"\['dataset'\] is 'files:"):
        other.restore(state)


def test_the_same_files_opened_another_way_continue(folders: dict[str, Path]) -> None:
    """A folder, a glob and a list of the same TFRecord files are one dataset."""
    bare = folders["bare"]
    whole = indices(Loader(Dataset(str(bare)), batch_size=4, seed=6))
    state = saved_after(Loader(Dataset(str(bare)), batch_size=4, seed=6), 2)
    files = sorted(str(p) for p in bare.glob("*.tfrecord"))
    for opened in (str(bare / "*.tfrecord"), files):
        resumed = Loader(Dataset(opened), batch_size=4, seed=6)
        resumed.restore(state)
        assert indices(resumed) == whole[8:]


def test_a_manifest_state_on_bare_files_says_how_it_was_opened(
    folders: dict[str, Path]
) -> None:
    train = folders["train"]
    state = saved_after(Loader(Dataset(str(train)), batch_size=4, seed=0), 1)
    files = sorted(str(p) for p in train.glob("*.tfrecord"))
    with pytest.raises(StateError, match="opened then from its manifest: open it the same way"):
        Loader(Dataset(files), batch_size=4, seed=0).restore(state)


def test_the_fingerprint_is_computed_once(folders: dict[str, Path]) -> None:
    ds = Dataset(str(folders["bare"]))
    first = ds.fingerprint
    assert ds.fingerprint is first  # cached, not hashed again per state()
    loader = Loader(ds, batch_size=4)
    assert loader.state()["source"]["dataset"] == first


# -- counters out of range ---------------------------------------------------------------------


@pytest.mark.parametrize(("change", "words"), [
    ({"epoch": 2**64 + 1}, "state['epoch']=18446744073709551617 exceeds a 64-bit word"),
    ({"seed": 2**64}, "state['seed']=18446744073709551616 exceeds a 64-bit word"),
    ({"skipped": 10**30}, "state['skipped']=1000000000000000000000000000000 exceeds"),
    ({"consumed": -1}, "state['consumed'] must be a non-negative int, got -1"),
    ({"consumed": 41}, "state['consumed']=41 exceeds the 40 samples of an epoch"),
    ({"consumed": "8"}, "state['consumed'] must be a non-negative int, got '8'"),
    ({"consumed": 8.0}, "state['consumed'] must be a non-negative int, got 8.0"),
    ({"epoch": True}, "state['epoch'] must be a non-negative int, got True"),
    ({"skipped": None}, "state['skipped'] must be a non-negative int, got None"),
    ({"shuffle": "yes"}, "state['shuffle'] must be true or false, got 'yes'"),
    ({"shuffle": 1}, "state['shuffle'] must be true or false, got 1"),
    ({"order_method": "random"}, "state['order_method'] must be 'exact' or 'bijection'"),
    ({"run": {"batch_size": 0, "world_size": 1, "drop_last": False, "remainder": "pad"}},
     "state['run'] must be {'batch_size': int >= 1"),
    ({"run": {"batch_size": 4}}, "state['run'] must be"),
    ({"run": None}, "state['run'] must be"),
])
def test_values_out_of_range_are_refused_at_restore(folders: dict[str, Path],
                                                    change: dict[str, Any], words: str) -> None:
    loader = Loader(Dataset(str(folders["train"])), batch_size=4, seed=0)
    state = saved_after(loader, 2)
    with pytest.raises(StateError) as info:
        loader.restore({**state, **change})
    assert words in str(info.value)
    assert loader.state() == state  # the position is kept
    assert len(indices(loader)) == 32  # and the loader still reads the rest of the epoch


def test_the_run_options_are_recorded_and_restore_on_other_ones(folders: dict[str, Path]
                                                                 ) -> None:
    loader = Loader(Dataset(str(folders["train"])), batch_size=4, seed=0, rank=0,
                    world_size=2, drop_last=True)
    state = saved_after(loader, 2)
    assert state["run"] == {"batch_size": 4, "world_size": 2, "drop_last": True,
                            "remainder": "drop"}
    again = Loader(Dataset(str(folders["train"])), batch_size=2, seed=0, rank=0, world_size=1)
    again.restore(state)  # another batch size and world size: the stream continues
    assert again.state()["consumed"] == state["consumed"]
    assert again.state()["run"]["batch_size"] == 2  # the run is the loader's own
    older = Loader(Dataset(str(folders["train"])), batch_size=4, seed=0, rank=0,
                   world_size=2, drop_last=True)
    older.restore({k: v for k, v in state.items() if k != "run"})  # saved before "run"
    assert older.state() == state


def test_set_epoch_refuses_an_epoch_past_64_bits(folders: dict[str, Path]) -> None:
    loader = Loader(Dataset(str(folders["train"])), batch_size=4)
    with pytest.raises(ValueError, match=r"epoch must be an int in \[0, 2\*\*64\), got "):
        loader.set_epoch(2**64)
    loader.set_epoch(2**64 - 1)
    assert len(indices(loader)) == 40


def test_a_damaged_source_part_is_refused(folders: dict[str, Path]) -> None:
    loader = Loader(Dataset(str(folders["train"])), batch_size=4, seed=0)
    state = loader.state()
    with pytest.raises(StateError, match=r"\['records'\] is 41, but this loader's record source "
                                         r"has records=40"):
        loader.restore({**state, "source": {**state["source"], "records": 41}})
    with pytest.raises(StateError, match="foreign keys \\['extra'\\]"):
        loader.restore({**state, "source": {**state["source"], "extra": 1}})
    with pytest.raises(StateError, match="reads records: the state was saved by a Loader over "
                                         "windows"):
        loader.restore({**state, "source": {**state["source"], "kind": "windows"}})


# -- states saved before these fields -------------------------------------------------------------


def test_a_state_from_before_the_order_fields_is_refused_with_a_way_out(
    folders: dict[str, Path]
) -> None:
    ds = Dataset(str(folders["train"]))
    whole = indices(Loader(ds, batch_size=4, seed=2))
    current = saved_after(Loader(ds, batch_size=4, seed=2), 3)
    old = {k: current[k] for k in ("seed", "epoch", "consumed", "skipped")}
    old["source"] = {"kind": "records", "records": 40}  # what earlier versions saved
    resumed = Loader(ds, batch_size=4, seed=2)
    with pytest.raises(StateError, match="predates the 'shuffle' and 'order_method' fields"):
        resumed.restore(old)
    # the way out the message gives, for a loader built exactly like the saving one
    resumed.restore({**resumed.state(), "epoch": old["epoch"], "consumed": old["consumed"],
                     "skipped": old["skipped"]})
    assert indices(resumed) == whole[12:]
    with pytest.raises(StateError, match="predates the 'dataset' fingerprint"):
        resumed.restore({**current, "source": old["source"]})


# -- what does not change the stream may differ -------------------------------------------------


def test_threads_prefetch_batch_size_and_ranks_may_differ(folders: dict[str, Path]) -> None:
    ds = Dataset(str(folders["train"]))
    whole = indices(Loader(ds, batch_size=4, seed=8))
    state = saved_after(Loader(ds, batch_size=4, seed=8, num_threads=4, prefetch_batches=3), 3)
    resumed = Loader(ds, batch_size=7, seed=8, num_threads=1, prefetch_batches=1,
                     drop_last=True, on_error="skip")
    resumed.restore(state)
    assert indices(resumed) == whole[12:12 + 28]  # drop_last: 28 of the 28 left
    shares = []
    for rank in range(2):
        loader = Loader(ds, batch_size=2, seed=8, rank=rank, world_size=2)
        loader.restore(state)
        shares.append(indices(loader))
    assert sorted(shares[0] + shares[1]) == sorted(whole[12:])
