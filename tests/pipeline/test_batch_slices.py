"""Slices of several whole batches (the slice gate's answer where batches are small and
light, see :func:`~shardfeed.pipeline.concurrency.largest_slice`): one task builds them in
turn, so its own costs (submitting it, the gate, its hand-over) are paid once for them all.
The batches, their order and their bytes are those of one thread; an error in one of them is
raised where that batch is handed out, after the batches before it; a pass left between them
resumes at the next batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import assert_same_batches, collect, open_dataset

from shardfeed.errors import DecodeError
from shardfeed.pipeline import Loader, executor
from shardfeed.pipeline.concurrency import BATCHES_A_SLICE, SliceGate, largest_slice
from shardfeed.transforms import DecodeImage


def _whole_batches(monkeypatch: pytest.MonkeyPatch, batches: int) -> None:
    """The gate answers slices of ``batches`` whole batches."""
    monkeypatch.setattr(SliceGate, "slice_size",
                        lambda self, base, batch, ahead: batches * batch)


def _submits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the CPU pool's submits (one a slice)."""
    counted = [0]
    submit = executor.CpuPool.submit

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(executor.CpuPool, "submit", counting)
    return counted


def _loader(folder: Path, threads: int, **options: Any) -> Loader:
    options = {"batch_size": 4, "seed": 3, "prefetch_batches": 2, **options}
    return Loader(open_dataset(folder), num_threads=threads, transform=DecodeImage(),
                  **options)


def _copied(loader: Loader) -> list[dict[str, Any]]:
    """A pass's batches, copied (the loader stays open)."""
    return [{k: np.array(v) if isinstance(v, np.ndarray) else list(v)
             for k, v in batch.items()} for batch in loader]


@pytest.mark.parametrize("drop_last", [True, False])
def test_slices_of_whole_batches_are_one_threads_batches(
        monkeypatch: pytest.MonkeyPatch, clean_folder: Path, drop_last: bool) -> None:
    """103 records in batches of 4 (25 whole, one of 3): 4 threads build 16 at once in
    slices of 4 batches; the same batches as one thread, with a slice a 4 batches."""
    with _loader(clean_folder, 1, drop_last=drop_last) as one:
        want = collect(one)
    _whole_batches(monkeypatch, BATCHES_A_SLICE)
    submits = _submits(monkeypatch)
    with _loader(clean_folder, 4, drop_last=drop_last) as many:
        got = _copied(many)
        assert many._in_flight == 4 * BATCHES_A_SLICE
        again = _copied(many)  # the next epoch: its own slices too
    assert_same_batches(got, want)
    assert len(got) == (25 if drop_last else 26)
    assert len(again) == len(got)
    assert submits[0] == 2 * -(-len(got) // BATCHES_A_SLICE)  # a slice every 4 batches


def test_a_bad_record_in_a_slice_of_batches_is_raised_at_its_batch(
        monkeypatch: pytest.MonkeyPatch, bad_jpeg_folder: Path) -> None:
    """Record 41's image is damaged: batch 10 (records 40-43), the third of the slice of
    batches 8-11. Batches 0-9 are handed out first, then its error, naming the record; the
    state says 10 batches were handed out, and a new pass raises at the same batch."""
    _whole_batches(monkeypatch, BATCHES_A_SLICE)
    with _loader(bad_jpeg_folder, 4, shuffle=False) as loader:
        got = []
        with pytest.raises(DecodeError, match="record id 41") as caught:
            for batch in loader:
                got.append([int(i) for i in batch["index"]])
        assert "img0041.jpg" in str(caught.value)
        assert got == [list(range(4 * k, 4 * k + 4)) for k in range(10)]
        assert loader.state()["consumed"] == 40
        with pytest.raises(DecodeError, match="record id 41"):
            next(iter(loader))


def test_a_pass_left_between_a_slices_batches_resumes_at_the_next(
        monkeypatch: pytest.MonkeyPatch, clean_folder: Path) -> None:
    """Left after batch 5 (the second of a slice of batches 4-7), through its state in a
    new loader: batches 6 on are those of a pass never left."""
    with _loader(clean_folder, 1) as one:
        want = collect(one)
    _whole_batches(monkeypatch, BATCHES_A_SLICE)
    with _loader(clean_folder, 4) as first:
        head = []
        for batch in first:
            head.append({k: np.array(v) if isinstance(v, np.ndarray) else list(v)
                         for k, v in batch.items()})
            if len(head) == 6:
                break
        state = first.state()
    with _loader(clean_folder, 4) as second:
        second.restore(state)
        rest = collect(second)
    assert_same_batches(head + rest, want)


@pytest.mark.parametrize(("ahead", "threads", "sample_bytes", "want"), [
    (64, 16, 1024, 1024),       # 4 batches a thread: a slice of 4 batches
    (32, 16, 1024, 512),        # 2 a thread: 2 batches
    (24, 16, 1024, 256),        # 1.5 a thread: one batch (whole ones only)
    (256, 16, 1024, 1024),      # more in flight: never past BATCHES_A_SLICE
    (64, 16, 64 << 10, 128),    # a batch's records past 8 MiB: within a batch, as before
    (4, 16, 1024, 64),          # few in flight: a piece of a batch, as before
])
def test_the_largest_slice_is_whole_batches_only_where_each_thread_keeps_one(
        ahead: int, threads: int, sample_bytes: int, want: int) -> None:
    got = largest_slice(16, 256, ahead, threads, sample_bytes)
    assert got == want
    assert ahead * 256 // got >= threads  # a slice for every thread


def test_skipped_records_in_a_slice_of_batches_are_replaced_as_by_one_thread(
        monkeypatch: pytest.MonkeyPatch, bad_jpeg_folder: Path) -> None:
    """``on_error="skip"``: record 41's replacement, in the third batch of a slice of 4,
    is the one thread's, and so is every batch."""
    with _loader(bad_jpeg_folder, 1, on_error="skip") as one:
        want = _copied(one)
    _whole_batches(monkeypatch, BATCHES_A_SLICE)
    with _loader(bad_jpeg_folder, 4, on_error="skip") as many:
        got = _copied(many)
        assert many.state()["skipped"] == 0 and many.state()["epoch"] == 1
    assert_same_batches(got, want)
    assert 41 not in {int(i) for batch in got for i in batch["index"]}


def test_slices_of_several_batches_need_more_built_at_once(
        monkeypatch: pytest.MonkeyPatch, clean_folder: Path) -> None:
    """With no more batches at once than one a thread (batches over 1 MiB, or the defaults'
    prefetched ones), a slice holds one batch at most: a slice of all the batches in flight
    would leave nothing building while the caller works through them."""
    _whole_batches(monkeypatch, BATCHES_A_SLICE)
    submits = _submits(monkeypatch)
    with _loader(clean_folder, 2, prefetch_batches=4) as loader:  # 2 threads, 4 ahead
        got = _copied(loader)
        assert loader._in_flight == loader._in_flight_single == 4
    assert submits[0] == len(got)  # a slice a batch
