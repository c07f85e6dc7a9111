"""What the slice gate's measuring costs, at 2, 16 and 64 cores (a fake clock, a fake core
count): the time spent at a limit other than the chosen one stays within ``BUDGET`` of a
run, so a run keeps at least ``1 - BUDGET`` of the better limit's rate, whatever the work
and the number of cores; the choice still follows a change in the work."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shardfeed.pipeline import concurrency
from shardfeed.pipeline.concurrency import (
    BATCHES_A_SLICE,
    BUDGET,
    MAX_RECHECK_SECONDS,
    MAX_WINDOW_SECONDS,
    TRIAL_PAIRS,
    SliceGate,
)

CORES = [2, 16, 64]
Rate = Callable[[int, float], float]
"""Samples a second at a limit, at a time."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scaling(per_thread: float) -> Rate:
    """Work that scales perfectly with threads (``per_thread`` samples a second each)."""
    return lambda limit, now: per_thread * limit


def gil_bound(one: float, share: float = 0.6) -> Rate:
    """Work where one thread is fastest: ``one`` samples a second at one thread, ``share`` of
    that at any more."""
    return lambda limit, now: one if limit == 1 else one * share


class Run:
    """A gate of ``cores`` threads on ``cores`` cores, fed batches of ``batch`` samples (one
    slice each: the gate sees the same windows, in fewer calls)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cores: int, *, batch: int = 256,
                 cpu: Rate | None = None, loader_slices: bool = False) -> None:
        monkeypatch.setattr(concurrency, "usable_cores", lambda: cores)
        self.clock = Clock()
        self.cpu_clock = Clock()
        self.cores = cores
        self.batch = batch
        # ``cpu``: the threads' CPU seconds a sample at a limit; None, a CPU clock that sees
        # nothing (threads waiting on reads): every trial tries one thread, at once
        self.cpu = cpu
        self.loader_slices = loader_slices  # a batch in ``limit`` slices, as the Loader cuts
        self.gate = SliceGate(cores, window_samples=max(4 * batch, 512), clock=self.clock,
                              cpu_clock=self.cpu_clock)
        self.log: list[tuple[float, int, int]] = []  # (start, limit, samples) a slice
        self.choices: list[tuple[float, int]] = []  # (when, limit) each change of choice

    def until(self, seconds: float, rate: Rate) -> None:
        while self.clock.now < seconds:
            limit, start = self.gate.limit, self.clock.now
            samples = -(-self.batch // limit) if self.loader_slices else self.batch

            def build(limit: int = limit, samples: int = samples) -> int:
                if self.cpu is not None:
                    self.cpu_clock.now += samples * self.cpu(limit, self.clock.now)
                self.clock.now += samples / rate(limit, self.clock.now)
                return 0

            self.gate.run(samples, build, lambda: False)
            self.log.append((start, limit, samples))
            if self.gate._chosen and (not self.choices
                                      or self.choices[-1][1] != self.gate._choice):
                self.choices.append((self.clock.now, self.gate._choice))

    def rate(self, since: float = 0.0) -> float:
        """Samples a second from ``since`` to now."""
        samples = sum(n for start, _, n in self.log if start >= since)
        begun = min(start for start, _, _ in self.log if start >= since)
        return samples / (self.clock.now - begun)

    def chose_after(self, moment: float, limit: int) -> float:
        """Seconds from ``moment`` until the gate chose ``limit``."""
        for when, chosen in self.choices:
            if when >= moment and chosen == limit:
                return when - moment
        raise AssertionError(f"{limit} not chosen after {moment}: {self.choices}")


def trial_cost(seconds_a_slice_at_other_limit: float) -> float:
    """The most a trial costs: its windows at the other limit (the module's bound)."""
    return 2 * TRIAL_PAIRS * (MAX_WINDOW_SECONDS + seconds_a_slice_at_other_limit)


@pytest.mark.parametrize("cores", CORES)
def test_work_that_scales_keeps_its_all_thread_rate(monkeypatch: pytest.MonkeyPatch,
                                                    cores: int) -> None:
    """Large JPEGs at 1 ms a sample a thread: a one-thread window builds 1/cores of an
    all-thread one; trials still cost at most ``BUDGET`` of the run."""
    run = Run(monkeypatch, cores)
    rate = scaling(1000.0)
    longest = 2 * trial_cost(run.batch / rate(1, 0)) / BUDGET
    run.until(longest + 30, rate)
    assert run.gate.limit == cores
    stats = run.gate.stats()
    assert stats.trials >= 2  # one thread really was tried, more than once
    assert stats.seconds[1] > 0
    assert stats.off_choice_share <= BUDGET
    assert run.rate() >= (1 - BUDGET) * rate(cores, 0)


@pytest.mark.parametrize("cores", [16, 64])
def test_threads_seen_side_by_side_pay_no_trial_in_a_short_run(
        monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    """Work that scales, whose threads' CPU time shows them side by side (half of each
    sample's time visible to the CPU clock: too little for the heavy-work shortcut): the
    first trial waits until every thread has run twice its estimated cost over ``BUDGET``,
    so a short run (a node's epoch of 8,000 images takes 1.4 s) never runs at one thread."""
    run = Run(monkeypatch, cores, batch=16 * cores, cpu=lambda limit, now: 0.5e-3,
              loader_slices=True)
    rate = scaling(1000.0)
    run.until(20.0, rate)
    stats = run.gate.stats()
    assert set(stats.seconds) == {cores} and run.gate.limit == cores
    assert run.rate() >= (1 - BUDGET) * rate(cores, 0)
    # a trial is due all the same, once the estimated cost is amortised (a one-thread slice
    # is a batch: the estimate sees half its time)
    estimate = 2 * TRIAL_PAIRS * (MAX_WINDOW_SECONDS + run.batch * 0.5e-3)
    assert run.gate._wait_left is not None
    assert 0 < run.gate._wait_left <= 2 * estimate / BUDGET


@pytest.mark.parametrize("cores", CORES)
@pytest.mark.parametrize("one", [40_000.0, 400_000.0], ids=["small", "tiny"])
def test_gil_bound_work_ends_at_one_thread_and_keeps_its_rate(
        monkeypatch: pytest.MonkeyPatch, cores: int, one: float) -> None:
    """Small images whose threads fight over the GIL: one thread is chosen within the first
    second, and from then on the run keeps ``1 - BUDGET`` of the one-thread rate (the later
    trials at every thread included)."""
    rate = gil_bound(one)
    # the threads' CPU time is about one core's, a little more when they fight
    run = Run(monkeypatch, cores, batch=256 if one < 100_000 else 1024,
              cpu=lambda limit, now: 1.2 / rate(limit, now) if limit > 1 else 1 / one)
    run.until(1.0, rate)
    assert run.gate.limit == 1 and run.gate._chosen
    chosen_at = run.clock.now
    run.until(chosen_at + 120, rate)
    assert run.gate.limit == 1
    stats = run.gate.stats()
    assert stats.trials >= 3  # every thread was tried again
    assert stats.off_choice_share <= BUDGET
    assert run.rate(since=chosen_at) >= (1 - BUDGET) * one


@pytest.mark.parametrize("cores", CORES)
def test_the_choice_follows_a_change_in_the_work(monkeypatch: pytest.MonkeyPatch,
                                                 cores: int) -> None:
    """GIL-bound work, then work that scales, then GIL-bound again: each change is followed
    within the longest wait between trials (``MAX_RECHECK_SECONDS``, or what a trial's cost
    asks for) and one trial."""
    run = Run(monkeypatch, cores)
    small, large = gil_bound(40_000.0), scaling(1000.0)
    worst = trial_cost(run.batch / large(1, 0))
    follows = max(MAX_RECHECK_SECONDS, 2 * worst / BUDGET) + worst
    run.until(150, small)
    assert run.gate.limit == 1
    run.until(150 + follows + 10, large)
    assert run.gate.limit == cores
    assert run.chose_after(150, cores) <= follows
    changed = run.clock.now
    run.until(changed + follows + 10, small)
    assert run.gate.limit == 1
    assert run.chose_after(changed, 1) <= follows


def test_a_held_gate_of_processes_keeps_every_process() -> None:
    """``keep_all_threads`` on a gate that does not measure (process workers) lets every
    worker build at once."""
    gate = SliceGate(4, window_samples=8, adaptive=False)
    gate.keep_all_threads()
    assert gate.limit == 4


@pytest.mark.parametrize(("cores", "sample_us", "want"), [
    (2, 15.0, 128),    # 28x28 PNG: a batch over 2 threads is already past 1 ms a slice
    (16, 15.0, 64),    # 16-sample slices would be 0.24 ms: 64, as many as 4 batches ahead
                       # over 16 threads keep in flight (each thread still has one)
    (64, 15.0, 16),    # 64 threads: 4 batches ahead hold 16-sample slices for each
    (16, 2.0, 64),     # raw 28x28 records: the same bound by the threads
    (16, 300.0, 16),   # a small JPEG crop: 16 samples are 4.8 ms, as they are
    (16, 1300.0, 16),  # the train preset: unchanged
])
def test_light_work_builds_slices_of_at_least_a_millisecond_while_every_thread_has_one(
        monkeypatch: pytest.MonkeyPatch, cores: int, sample_us: float, want: int) -> None:
    run = Run(monkeypatch, cores, cpu=lambda limit, now: sample_us * 1e-6)
    base = -(-run.batch // cores)
    assert run.gate.slice_size(base, run.batch, 4) == base  # nothing measured yet
    rate = scaling(1e6 / sample_us)
    run.gate.hold(cores)  # every thread, as a held loader: sizes follow the work alone
    run.until(2.0, rate)
    got = run.gate.slice_size(base, run.batch, 4)
    assert got == want
    assert run.batch % got == 0  # even slices
    in_flight = 4 * run.batch // got
    assert in_flight >= cores  # a slice for every thread that may build


def test_fewer_threads_at_once_still_take_a_batch_among_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch, 16, cpu=lambda limit, now: 1e-3)
    run.gate.hold(2)
    run.until(1.0, scaling(1000.0))
    assert run.gate.slice_size(16, 256, 4) == 128


@pytest.mark.parametrize(("cores", "sample_us", "sample_kb", "shares_gil", "want"), [
    (16, 1300.0, 81, True, 43),    # the train preset: 43-image slices pay a slice's own
                                   # Python 2.7 times less often an image than 16 (60 ms)
    (16, 1300.0, 81, False, 16),   # worker processes: each its own GIL, slices as before
    (16, 1300.0, None, True, 16),  # record bytes not known: as before
    (16, 100.0, 0, True, 64),      # patches (no record held): a slice for each thread
    (16, 10_000.0, 945, True, 16),  # 1566² frames: 16 of 10 ms are 160 ms already
    (16, 700.0, 945, True, 16),    # big records, cheap work: 8 MiB is 8 of them, < 16
    (64, 1300.0, 81, True, 16),    # 64 threads: 4 batches ahead leave 16 for each
    (8, 1300.0, 81, True, 32),     # 8 threads: 32 of 1.3 ms are past 28 ms
    (2, 1300.0, 81, True, 128),    # 2 threads: a batch over the threads, as before
    (2, 15.0, 1, True, 256),       # 28x28 PNG on 2 threads: 4 ms a slice, a batch each
])
def test_many_threads_that_share_the_gil_build_slices_of_at_least_4_ms_a_thread(
        monkeypatch: pytest.MonkeyPatch, cores: int, sample_us: float, sample_kb: int | None,
        shares_gil: bool, want: int) -> None:
    """At ``limit`` threads of one process every slice's own Python queues for one GIL: a
    slice is given at least ``SLICE_SECONDS_A_THREAD × (limit - 1)`` of work (each thread
    still with a slice in flight, and at most ``SLICE_RECORD_BYTES`` of records)."""
    run = Run(monkeypatch, cores, cpu=lambda limit, now: sample_us * 1e-6)
    run.gate.shares_gil = shares_gil
    run.gate.sample_bytes = None if sample_kb is None else sample_kb * 1024
    base = -(-run.batch // cores)
    run.gate.hold(cores)
    run.until(2.0 if sample_us < 5000 else 20.0, scaling(1e6 / sample_us))
    assert run.gate.slice_size(base, run.batch, 4) == want


@pytest.mark.parametrize("ahead", [4, 16])
def test_light_work_on_large_records_holds_at_most_8_mib_a_slice(
        monkeypatch: pytest.MonkeyPatch, ahead: int) -> None:
    """Little work a record but large records (a 1 MiB raw array cropped small: 2 µs): the
    light-work rule enlarges slices only within ``SLICE_RECORD_BYTES`` of records, as the
    memory budget counts them: 16 of 1 MiB are past it already, so a batch over the threads
    it stays (enlarged to a batch, with 16 batches in flight, a slice would hold 256 MiB a
    thread; to 64 among 4)."""
    run = Run(monkeypatch, 16, cpu=lambda limit, now: 2e-6)
    run.gate.sample_bytes = 1 << 20
    run.gate.hold(16)
    run.until(0.2, scaling(5e5))
    assert run.gate.slice_size(16, run.batch, ahead) == 16
    run.gate.sample_bytes = 256 << 10  # 32 of them in 8 MiB
    assert run.gate.slice_size(16, run.batch, ahead) == 32


def test_slices_of_fewer_threads_at_once_hold_at_most_8_mib_of_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At a limit of one thread a slice is a batch over it (a whole batch), but within
    ``SLICE_RECORD_BYTES`` of records where they are known, cut evenly: slices cut then may
    build side by side once a trial raises the limit (16 threads each holding a batch of 1
    MiB records: 4 GiB, where the memory budget counts 8 MiB a thread). A held limit never
    rises: its slices stay a batch over it."""
    run = Run(monkeypatch, 16, cpu=lambda limit, now: 1e-3)
    run.gate.hold(16)
    run.until(1.0, scaling(1000.0))
    run.gate.fixed = False  # measuring again, and a trial's window at one thread now
    run.gate.limit = 1
    assert run.gate.slice_size(16, run.batch, 4) == run.batch  # records not known: as before
    run.gate.sample_bytes = 1 << 20
    assert run.gate.slice_size(16, run.batch, 4) == 16  # 8 of them fit: the base stands
    run.gate.sample_bytes = 64 << 10
    assert run.gate.slice_size(16, run.batch, 4) == 128
    run.gate.sample_bytes = 100_000  # 83 fit: four even slices of 64, not 83, 83, 83, 7
    assert run.gate.slice_size(16, run.batch, 4) == 64
    run.gate.sample_bytes = 1024
    assert run.gate.slice_size(16, run.batch, 4) == run.batch
    run.gate.hold(2)  # the GPU path's planning threads: held, as before
    run.gate.sample_bytes = 100_000
    assert run.gate.slice_size(16, run.batch, 4) == 128


@pytest.mark.parametrize(("cores", "want_in_flight", "want_slice"), [
    (2, 4, 128),      # 2 threads: prefetch; a batch over the threads (3.6 ms), as before
    (16, 64, 1024),   # the node: 4 batches a thread, a slice 4 batches (64s among 4)
    (64, 256, 1024),  # 64 threads: 256 batches of 203 KB (52 MB), a slice a thread
])
def test_small_batches_in_flight_give_each_thread_a_slice_of_whole_batches(
        monkeypatch: pytest.MonkeyPatch, cores: int, want_in_flight: int,
        want_slice: int) -> None:
    """28² PNGs (28 µs a sample on the node's cores, a 1 KB record): with up to
    ``BATCHES_A_SLICE`` batches in flight a thread
    (:func:`~shardfeed.pipeline.pool.batches_in_flight`), the gate cuts slices of whole
    batches, and every thread still has one; a slice's own Python (submitting it, the
    gate, its hand-over) is paid once for four batches, not four times a batch. Only at
    the gate's choice: a trial's windows (and a held gate's) keep slices within a batch."""
    from shardfeed.pipeline.options import LoaderOptions
    from shardfeed.pipeline.pool import batches_in_flight

    run = Run(monkeypatch, cores, cpu=lambda limit, now: 28e-6)
    run.gate.sample_bytes = 1024
    base = -(-run.batch // cores)
    run.until(2.0, scaling(1e6 / 28))
    assert run.gate._at_choice() and run.gate.limit == cores  # every thread, chosen
    options = LoaderOptions(batch_size=run.batch, num_threads=cores, prefetch_batches=4)
    in_flight = batches_in_flight(options, run.batch * (28 * 28 + 8))
    assert in_flight == want_in_flight
    got = run.gate.slice_size(base, run.batch, in_flight)
    assert got == want_slice
    assert in_flight * run.batch // got >= cores  # a slice for every thread
    if cores > 4:  # among 4 batches, as before: four slices a batch
        assert run.gate.slice_size(base, run.batch, 4) == 4 * run.batch // cores
    run.gate._start_trial()  # a trial: within a batch
    assert run.gate.slice_size(base, run.batch, in_flight) == min(want_slice, run.batch)
    held = Run(monkeypatch, cores, cpu=lambda limit, now: 28e-6)
    held.gate.sample_bytes = 1024
    held.until(2.0, scaling(1e6 / 28))
    held.gate.hold(cores)  # held from the choice (a stage that asks): within a batch
    assert held.gate.slice_size(base, run.batch, in_flight) == min(want_slice, run.batch)


@pytest.mark.parametrize("cores", [10, 16, 20])
@pytest.mark.parametrize("ahead", [2, 3, 4, 6])
@pytest.mark.parametrize(("sample_us", "sample_kb"), [(200.0, 83), (744.0, 83), (100.0, 129)])
def test_larger_slices_leave_each_thread_a_slice_and_hold_at_most_8_mib(
        monkeypatch: pytest.MonkeyPatch, cores: int, ahead: int, sample_us: float,
        sample_kb: int) -> None:
    """Cut evenly, a slice is never past the bounds it was cut for: as many slices in flight
    as threads (or as the threads' own slices made), within ``SLICE_RECORD_BYTES`` of
    records (or a batch over the threads). A rounding up to even slices once left threads
    idle (16 threads, 3 batches ahead: 52-image slices, 15 in flight) and held 2× the
    bytes."""
    run = Run(monkeypatch, cores, cpu=lambda limit, now: sample_us * 1e-6)
    run.gate.sample_bytes = sample_kb * 1024
    base = -(-run.batch // cores)
    run.gate.hold(cores)
    run.until(2.0, scaling(1e6 / sample_us))
    got = run.gate.slice_size(base, run.batch, ahead)
    assert base <= got <= run.batch
    assert ahead * -(-run.batch // got) >= min(cores, ahead * -(-run.batch // base))
    assert got == base or got * sample_kb * 1024 <= concurrency.SLICE_RECORD_BYTES


def test_a_loader_tells_its_gate_what_a_sample_holds_and_whether_threads_share_the_gil(
        tmp_path: Path) -> None:
    """The Loader's gate learns the first sample's record bytes (its threads' slices are
    enlarged within ``SLICE_RECORD_BYTES`` of them) and that threads share one GIL
    (processes do not); ``memory_budget()`` counts the largest slice the gate may cut."""
    from shardfeed import Dataset, Loader
    from shardfeed.format.writer import ShardWriter
    from shardfeed.pipeline.memory import work_bytes

    with ShardWriter(str(tmp_path / "small.tfrecord")) as writer:
        for i in range(64):
            writer.write_example({"data": bytes(range(256)) * 4, "label": [i]})
    with Dataset(str(tmp_path)) as ds:
        with Loader(ds, batch_size=16, num_threads=8, prefetch_batches=4) as loader:
            assert loader._gate.shares_gil and loader._gate.sample_bytes is None
            next(iter(loader))
            assert loader._gate.sample_bytes == 1024 + 8  # the bytes and the int64 label
            records = loader._probe[1]
            a_record = work_bytes(records, slice_size=1, row_bytes=0)
            # batches of 16 KB: 4 a thread at once (32), and slices of up to 4 batches,
            # each built in turn: a batch's records (16) held at once, not a batch over the
            # threads' (2)
            assert loader._in_flight == 8 * BATCHES_A_SLICE
            row = loader.memory_budget().work_bytes_per_thread - 16 * a_record
            assert 0 < row < a_record  # a batch row (~1 KB) beside them
        with Loader(ds, batch_size=16, num_threads=2, workers="processes") as loader:
            assert not loader._gate.shares_gil
