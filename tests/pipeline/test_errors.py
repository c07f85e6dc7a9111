"""Corrupt records, undecodable images and failing transforms, in both error modes."""

from __future__ import annotations

import threading
import time
import traceback
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import open_dataset, record_ids, train_transform

from shardfeed.errors import CorruptRecordError, DecodeError
from shardfeed.pipeline import Loader, TooManyErrorsError
from shardfeed.pipeline.concurrency import SliceGate


def ids_of_epoch(loader: Loader) -> list[int]:
    return record_ids([{"index": b["index"].copy()} for b in loader])


def test_bad_jpeg_raises_with_shard_record_offset(bad_jpeg_folder: Path) -> None:
    ds = open_dataset(bad_jpeg_folder)
    path, in_shard, offset = ds.locate(41)
    loader = Loader(ds, batch_size=6, shuffle=False, transform=train_transform(), num_threads=2)
    seen = []
    with pytest.raises(DecodeError) as info:
        for batch in loader:
            seen.extend(batch["index"].tolist())
    assert seen == list(range(36))  # the batches before the bad one arrive
    error = info.value
    assert error.path == path and error.record == in_shard and error.offset == offset
    text = str(error)
    assert "part-002.tfrecord" in text and f"record {in_shard}" in text
    assert f"byte {offset}" in text and "epoch position 41" in text


def test_bad_crc_raises_with_record_and_offset(bad_crc_folder: Path) -> None:
    ds = open_dataset(bad_crc_folder)
    path, in_shard, offset = ds.locate(25)
    loader = Loader(ds, batch_size=8, shuffle=False, transform=train_transform(), num_threads=2)
    with pytest.raises(CorruptRecordError) as info:
        list(loader)
    assert (info.value.path, info.value.record, info.value.offset) == (path, in_shard, offset)
    assert "part-001.tfrecord" in str(info.value)


@pytest.mark.parametrize("folder_name", ["bad_jpeg_folder", "bad_crc_folder"])
def test_skip_replaces_deterministically_and_counts(folder_name: str,
                                                    request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue(folder_name)
    bad = 41 if folder_name == "bad_jpeg_folder" else 25

    def run(threads: int) -> tuple[list[int], Any]:
        loader = Loader(open_dataset(folder), batch_size=7, seed=8, on_error="skip",
                        transform=train_transform(), num_threads=threads)
        ids = ids_of_epoch(loader)
        return ids, loader.stats()

    ids, stats = run(1)
    assert len(ids) == 60 and bad not in ids
    assert len(set(ids)) == 59  # the 59 good records, one of them twice (the replacement)
    assert stats.skipped_total == 1 and stats.skipped == 0  # new epoch: per-epoch count reset
    assert run(3)[0] == ids


def test_skip_budget_raises(bad_jpeg_folder: Path) -> None:
    loader = Loader(open_dataset(bad_jpeg_folder), batch_size=6, on_error="skip",
                    max_skipped=0, transform=train_transform(), num_threads=2)
    with pytest.raises(TooManyErrorsError, match="budget of 0"):
        list(loader)


def test_skip_count_survives_state(bad_jpeg_folder: Path) -> None:
    ds = open_dataset(bad_jpeg_folder)
    loader = Loader(ds, batch_size=6, shuffle=False, on_error="skip",
                    transform=train_transform(), num_threads=2)
    it = iter(loader)
    for _ in range(8):  # past record 41
        next(it)
    state = loader.state()
    assert state["skipped"] == 1


class Boom(RuntimeError):
    pass


def exploding_transform(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if int(sample["index"][0]) == 17:
        raise Boom("user code failed")
    return sample


def test_user_transform_error_keeps_traceback_and_names_record(clean_ds: Any) -> None:
    _, in_shard, offset = clean_ds.locate(17)
    loader = Loader(clean_ds, batch_size=5, shuffle=True, seed=2, on_error="skip",
                    transform=exploding_transform, num_threads=2)
    with pytest.raises(Boom, match="user code failed") as info:
        list(loader)
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "exploding_transform" in frames
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "record id 17" in notes and f"record {in_shard} at byte {offset}" in notes
    assert "stage 'transform'" in notes


def test_one_argument_transform(clean_ds: Any) -> None:
    def add_one(sample: dict[str, Any]) -> dict[str, Any]:
        sample["index"] = sample["index"] + 1
        return sample

    loader = Loader(clean_ds, batch_size=4, shuffle=False, transform=add_one, num_threads=1)
    assert next(iter(loader))["index"].tolist() == [1, 2, 3, 4]


def _wider_after_the_first(sample: dict[str, Any]) -> dict[str, Any]:
    """Class ids as uint8 for record 0, as uint16 (300) for every other record."""
    index = int(np.asarray(sample["index"]).reshape(-1)[0])
    dtype = np.uint8 if index == 0 else np.uint16
    return {"index": sample["index"], "ids": np.full((4, 4), 1 if index == 0 else 300, dtype)}


def test_values_that_do_not_fit_the_batch_dtype_are_refused_not_wrapped(clean_ds: Any) -> None:
    from shardfeed.errors import SchemaError

    loader = Loader(clean_ds, batch_size=4, shuffle=False, transform=_wider_after_the_first,
                    num_threads=1)
    with pytest.raises(SchemaError, match=r"'ids'.*uint16.*uint8"):
        next(iter(loader))  # 300 stored as uint8 would read 44


def test_of_two_failing_slices_of_a_batch_the_first_is_raised(
        clean_ds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch in four slices whose first and last fail, the last long before the first: the
    error raised is the first slice's, naming its record, as when the slices were waited for
    in order."""
    monkeypatch.setattr(SliceGate, "slice_size", lambda self, base, batch, ahead: 2)

    def failing(sample: dict[str, Any]) -> dict[str, Any]:
        index = int(np.asarray(sample["index"]).reshape(-1)[0])
        if index == 1:
            time.sleep(0.3)
            raise Boom(f"first slice, record {index}")
        if index == 7:
            raise Boom(f"last slice, record {index}")
        return sample

    loader = Loader(clean_ds, batch_size=8, shuffle=False, transform=failing, num_threads=4)
    with pytest.raises(Boom, match="first slice, record 1") as info:
        next(iter(loader))
    assert "record id 1" in "\n".join(getattr(info.value, "__notes__", []))


def test_the_consumer_waits_once_a_batch_for_slices_done_in_order(
        clean_ds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch in four slices built in order by one thread, the consumer ahead of it: it
    blocks once a batch (each time a wake-up under the GIL), on the batch's lock, and never
    on a slice's future."""
    from shardfeed.pipeline import epoch

    monkeypatch.setattr(SliceGate, "slice_size", lambda self, base, batch, ahead: 2)
    blocked = {"lock": 0, "future": 0}
    consumer = threading.get_ident()
    held = epoch._held

    class Counted:
        def __init__(self) -> None:
            self._lock = held()

        def acquire(self) -> bool:
            if not self._lock.acquire(blocking=False):
                blocked["lock"] += 1
                self._lock.acquire()
            return True

        def release(self) -> None:
            self._lock.release()

    monkeypatch.setattr(epoch, "_held", Counted)
    original = Future.result

    def result(self: Future[Any], *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == consumer and not self.done():
            blocked["future"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Future, "result", result)

    def slow(sample: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.005)
        return sample

    loader = Loader(clean_ds, batch_size=8, shuffle=False, transform=slow, num_threads=1,
                    prefetch_batches=1, drop_last=True)
    batches = sum(1 for _ in loader)
    assert batches >= 4 and 0 < blocked["lock"] <= batches and blocked["future"] == 0


def test_a_failing_slice_ends_the_wait_for_its_batch(
        clean_ds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first of a batch's four slices fails at once: the error comes out without waiting
    for the slices queued behind it on the one thread (a slice stalled on storage would hold
    it up to its deadline); the close drops them (the next may have started already)."""
    monkeypatch.setattr(SliceGate, "slice_size", lambda self, base, batch, ahead: 2)
    seen: list[int] = []

    def failing(sample: dict[str, Any]) -> dict[str, Any]:
        index = int(np.asarray(sample["index"]).reshape(-1)[0])
        seen.append(index)
        if index == 1:  # record 0 is the loader's first sample, read before any slice
            raise Boom("first slice")
        if index:
            time.sleep(0.5)
        return sample

    loader = Loader(clean_ds, batch_size=8, shuffle=False, transform=failing, num_threads=1,
                    prefetch_batches=1)
    with pytest.raises(Boom, match="first slice"):
        next(iter(loader))
    assert not {4, 5, 6, 7} & set(seen)


def test_a_batch_submitted_in_part_leaves_no_slice_running(
        clean_ds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool refuses a batch's third slice (no thread could start): the error comes out
    once the two slices submitted before it are cancelled or done, none left writing into a
    buffer the ring may hand to another batch."""
    from shardfeed.pipeline.executor import CpuPool

    monkeypatch.setattr(SliceGate, "slice_size", lambda self, base, batch, ahead: 2)
    submit = CpuPool.submit
    calls = 0

    def refusing(self: CpuPool, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("can't start new thread")
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(CpuPool, "submit", refusing)
    ended: list[float] = []

    def slow(sample: dict[str, Any]) -> dict[str, Any]:
        if int(np.asarray(sample["index"]).reshape(-1)[0]):  # record 0: the first sample,
            time.sleep(0.3)  # read before any slice
            ended.append(time.monotonic())
        return sample

    loader = Loader(clean_ds, batch_size=8, shuffle=False, transform=slow, num_threads=2,
                    prefetch_batches=1)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        next(iter(loader))
    raised = time.monotonic()
    time.sleep(1.0)  # a slice left running would end meanwhile
    assert all(t <= raised for t in ended)
