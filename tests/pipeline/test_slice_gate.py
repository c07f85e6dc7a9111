"""Threads that never hurt: the loader measures whether its threads build slices faster than
one thread does (small images, GIL-bound work) and keeps the faster; the bytes never change."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pipeline_helpers import keyed_transform

from shardfeed.pipeline import Loader, concurrency
from shardfeed.pipeline.concurrency import (
    BUDGET,
    LIGHT_SAMPLE_SECONDS,
    MARGIN,
    RECHECK_SECONDS,
    TRIAL_PAIRS,
    WARMUP_WINDOWS,
    SliceGate,
)

TRIAL = 1 + 2 * (2 * TRIAL_PAIRS - 1)
"""Windows of a trial: the first measured, then a settling and a measured window for each
change of limit."""
FIRST_CHOICE = WARMUP_WINDOWS + TRIAL
"""Windows before a new gate has chosen."""


def _no_cpu() -> float:
    """The threads' CPU time where the wall clock is fake: none (the real CPU time of the
    test's own calls would be compared with fake seconds)."""
    return 0.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _feed(gate: SliceGate, clock: Clock, windows: int, cost: dict[int, float],
          speed: Any = lambda window: 1.0, cpu: dict[int, float] | None = None,
          cpu_clock: Clock | None = None) -> list[int]:
    """Build ``windows`` windows of one-sample slices, each costing ``cost[limit]`` seconds
    times ``speed(window)`` (and ``cpu[limit]`` seconds of ``cpu_clock``, the threads' CPU
    time); returns the limit each window ran at."""
    seen = []
    for window in range(windows):
        seen.append(gate.limit)
        for _ in range(gate.window_samples):
            limit = gate.limit

            def build(limit: int = limit, factor: float = speed(window)) -> int:
                clock.now += cost[limit] * factor
                if cpu is not None and cpu_clock is not None:
                    cpu_clock.now += cpu[limit] * factor
                return 0

            gate.run(1, build, lambda: False)
    return seen


def test_one_thread_is_kept_only_when_clearly_faster() -> None:
    clock = Clock()
    gate = SliceGate(4, window_samples=10, clock=clock, cpu_clock=_no_cpu, min_window_seconds=0)
    # GIL-bound: one thread builds a sample in 10 µs, four fighting threads in 20 µs
    seen = _feed(gate, clock, FIRST_CHOICE + 2, {4: 20e-6, 1: 10e-6})
    # warm up, then measure all threads and one thread in turn, a settling window between
    assert seen[:FIRST_CHOICE] == [4] * WARMUP_WINDOWS + [4] + [1, 1, 4, 4] * (TRIAL_PAIRS - 1) + [1, 1]
    assert seen[FIRST_CHOICE:] == [1, 1]
    assert gate.limit == 1
    clock2 = Clock()
    gate2 = SliceGate(4, window_samples=10, clock=clock2, cpu_clock=_no_cpu, min_window_seconds=0)
    # decoding large images: four threads twice as fast; and a gain under the margin
    _feed(gate2, clock2, FIRST_CHOICE, {4: 10e-6, 1: 20e-6})
    assert gate2.limit == 4
    gate3 = SliceGate(2, window_samples=10, clock=(clock3 := Clock()), cpu_clock=_no_cpu,
                       min_window_seconds=0)
    _feed(gate3, clock3, FIRST_CHOICE, {2: 10e-6, 1: 10e-6 / (MARGIN * 0.99)})
    assert gate3.limit == 2


@pytest.mark.parametrize("faster", [1, 2])
def test_a_loader_speeding_up_as_it_warms_does_not_fool_the_trial(faster: int) -> None:
    """The first windows of a loader run several times slower (files opening, caches
    filling): measured then, whichever limit came second would look faster."""
    clock = Clock()
    gate = SliceGate(2, window_samples=10, clock=clock, cpu_clock=_no_cpu, min_window_seconds=0)
    cost = {faster: 10e-6, 3 - faster: 10e-6 * 1.4}
    _feed(gate, clock, FIRST_CHOICE, cost, speed=lambda window: 1 + 3 * 0.5**window)
    assert gate.limit == faster


def test_the_choice_is_measured_again() -> None:
    """The next trial comes after ``RECHECK_SECONDS`` at the chosen limit, and never before
    twice the last trial's cost at the other limit over ``BUDGET``."""
    clock = Clock()
    gate = SliceGate(2, window_samples=5, clock=clock, min_window_seconds=0)
    cost = {2: 20e-3, 1: 10e-3}  # windows of 5 samples: 100 ms at two threads, 50 ms at one
    seen = _feed(gate, clock, FIRST_CHOICE, cost)
    assert gate.limit == 1
    chosen_at, off = clock.now, gate.stats().off_choice_seconds
    assert off == pytest.approx(2 * TRIAL_PAIRS * 0.05)  # its one-thread windows
    wait = max(RECHECK_SECONDS, 2 * off / BUDGET)
    starts = []
    for _ in range(int(2 * wait / 0.05)):
        starts.append(clock.now)
        seen = _feed(gate, clock, 1, cost)
        if seen == [2]:
            break
    assert seen == [2]  # back to all threads for a new trial
    assert starts[-1] - chosen_at == pytest.approx(wait, abs=0.06)
    assert gate.stats().trials == 2
    # the work changed (now the threads help): the new trial keeps them
    _feed(gate, clock, TRIAL + 2, {2: 5e-3, 1: 10e-3})
    assert gate.limit == 2


def test_process_workers_keep_every_process() -> None:
    clock = Clock()
    gate = SliceGate(4, window_samples=5, adaptive=False, clock=clock)
    _feed(gate, clock, 6, {4: 20e-6, 1: 1e-6})
    assert gate.limit == 4


@pytest.mark.parametrize("threads", [2, 4])
def test_changing_the_limit_mid_epoch_changes_no_byte(clean_ds: Any, threads: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(concurrency, "RECHECK_SECONDS", 0.0)  # a trial after every choice
    monkeypatch.setattr(concurrency, "MAX_RECHECK_SECONDS", 0.0)
    monkeypatch.setattr(concurrency, "BUDGET", 10.0**9)
    def run(loader: Loader) -> list[np.ndarray]:
        with loader:
            return [np.concatenate([b["image"].reshape(len(b["index"]), -1),
                                    b["noise"].view(np.uint8)], axis=1).copy()
                    for b in loader]

    reference = run(Loader(clean_ds, batch_size=8, seed=5, transform=keyed_transform(),
                           num_threads=1))
    loader = Loader(clean_ds, batch_size=8, seed=5, transform=keyed_transform(),
                    num_threads=threads)
    # tiny windows and a clock that flips the verdict often: the limit changes many times
    ticks = iter(range(10**9))
    gate = SliceGate(threads, window_samples=3, clock=lambda: next(ticks) * 1e-6,
                     cpu_clock=lambda: 0.0, min_window_seconds=0)
    limits: list[int] = []
    set_limit = gate._set_limit

    def record(limit: int) -> None:
        limits.append(limit)
        set_limit(limit)

    gate._set_limit = record  # type: ignore[method-assign]
    loader._gate = gate
    got = run(loader)
    assert limits.count(1) >= 3  # the slices really ran one at a time, again and again
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        np.testing.assert_array_equal(a, b)


def _gate_on_two_cores(monkeypatch: pytest.MonkeyPatch, clock: Clock,
                       cpu_clock: Clock) -> SliceGate:
    monkeypatch.setattr(concurrency, "usable_cores", lambda: 2)
    return SliceGate(2, window_samples=4, clock=clock, cpu_clock=cpu_clock,
                     min_window_seconds=0)


def test_heavy_samples_never_try_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, cpu_clock = Clock(), Clock()
    gate = _gate_on_two_cores(monkeypatch, clock, cpu_clock)
    # a large JPEG: 0.6 ms of wall time a sample with two threads decoding side by side
    # (1.2 ms of their CPU time); one thread alone would take 1 ms a sample
    seen = _feed(gate, clock, 64, {2: 0.6e-3, 1: 1e-3},
                 cpu={2: 1.2e-3, 1: 1e-3}, cpu_clock=cpu_clock)
    assert seen == [2] * len(seen)


def test_heavy_work_that_holds_the_gil_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python that holds the GIL for 130 µs a sample: two threads take turns (their CPU time
    is one core's) and each hand-over costs, 160 µs a sample; the trial finds one faster."""
    clock, cpu_clock = Clock(), Clock()
    gate = _gate_on_two_cores(monkeypatch, clock, cpu_clock)
    seen = _feed(gate, clock, FIRST_CHOICE + 2, {2: 160e-6, 1: 130e-6},
                 cpu={2: 176e-6, 1: 130e-6}, cpu_clock=cpu_clock)
    assert seen[FIRST_CHOICE:] == [1, 1]


def test_a_window_of_fast_samples_lasts_long_enough_to_measure() -> None:
    """Samples of 10 µs: ten make a window of 100 µs, too short to measure (a scheduler tick
    decides it); a window then takes the samples of ``min_window_seconds``."""
    clock = Clock()
    gate = SliceGate(2, window_samples=10, clock=clock, cpu_clock=_no_cpu, min_window_seconds=0.01)
    windows = []
    end_window = gate._end_window

    def record() -> None:
        windows.append(clock.now)
        end_window()

    gate._end_window = record  # type: ignore[method-assign]
    _feed(gate, clock, 250, {2: 10e-6, 1: 10e-6})  # 2,500 samples, 25 ms
    # the warm-up's windows are not measured: they end at ten samples each
    assert windows[:WARMUP_WINDOWS] == pytest.approx([1e-4 * (k + 1)
                                                      for k in range(WARMUP_WINDOWS)])
    warm = windows[WARMUP_WINDOWS - 1]
    assert windows[WARMUP_WINDOWS] - warm == pytest.approx(0.01, rel=0.01)  # measured
    # then a change of limit: a settling window of ten samples, and a measured one
    settle, measured = windows[WARMUP_WINDOWS + 1: WARMUP_WINDOWS + 3]
    assert settle - windows[WARMUP_WINDOWS] == pytest.approx(1e-4)
    assert measured - settle == pytest.approx(0.01, rel=0.01)


def test_one_slice_at_a_time_runs_on_one_thread(clean_ds: Any) -> None:
    """While the gate lets one slice build at a time, every slice goes to one thread (slices
    handed between threads that wait on the GIL cost more than they gain): the builds run on
    one thread of the CPU pool, each batch as one slice, and the batches are the one-thread
    loader's."""
    import threading

    built_on: list[tuple[str, int]] = []

    def watch(loader: Loader) -> None:
        build = loader._builder.build_slice

        def record(ctx: Any, positions: np.ndarray, *args: Any) -> Any:
            built_on.append((threading.current_thread().name, len(positions)))
            return build(ctx, positions, *args)

        loader._builder.build_slice = record  # type: ignore[method-assign,assignment]

    def images(loader: Loader) -> list[np.ndarray]:
        with loader:
            return [b["image"].copy() for b in loader]

    from shardfeed.transforms import DecodeImage

    reference = images(Loader(clean_ds, batch_size=8, seed=5, num_threads=1,
                              transform=DecodeImage()))
    loader = Loader(clean_ds, batch_size=8, seed=5, num_threads=2, transform=DecodeImage())
    loader._gate._warmup = 10**9  # never trials: stays at the limit set here
    loader._gate.limit = 1
    watch(loader)
    got = images(loader)
    assert len({name for name, _ in built_on}) == 1
    assert {name.rsplit("_", 1)[0] for name, _ in built_on} == {"shardfeed-loader"}
    assert [n for _, n in built_on] == [len(b) for b in got]
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        np.testing.assert_array_equal(a, b)


def test_tiny_work_goes_to_one_thread_without_a_trial(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Samples of 2 µs at every thread: one thread at once after the first measured window
    (a trial's windows at every thread would cost much of a short epoch); measured again
    later all the same."""
    monkeypatch.setattr(concurrency, "RECHECK_SECONDS", 1e-3)  # 50 windows of 20 µs
    clock = Clock()
    gate = SliceGate(2, window_samples=10, clock=clock, cpu_clock=_no_cpu, min_window_seconds=0)
    cost = {2: LIGHT_SAMPLE_SECONDS * 0.5, 1: LIGHT_SAMPLE_SECONDS * 0.4}
    seen = _feed(gate, clock, WARMUP_WINDOWS + 3, cost)
    assert seen == [2] * (WARMUP_WINDOWS + 1) + [1, 1]
    seen = _feed(gate, clock, 60, cost)
    assert 2 in seen  # the choice is measured again


def test_work_that_reads_light_in_wall_time_but_not_in_cpu_is_tried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of 2.5 µs a sample at 16 threads whose threads spent 20 µs of CPU a sample
    (28² PNGs on 16 cores, or a window that caught many slices finishing at once) is not
    tiny work: it is not held to one thread at once (its threads ran side by side: they
    are kept)."""
    monkeypatch.setattr(concurrency, "usable_cores", lambda: 16)
    clock, cpu_clock = Clock(), Clock()
    gate = SliceGate(16, window_samples=10, clock=clock, cpu_clock=cpu_clock,
                     min_window_seconds=0)
    seen = _feed(gate, clock, WARMUP_WINDOWS + 4, {16: 2.5e-6, 1: 20e-6},
                 cpu={16: 20e-6, 1: 20e-6}, cpu_clock=cpu_clock)
    assert seen == [16] * (WARMUP_WINDOWS + 4)
    assert gate._chosen and gate._choice == 16
    # tiny in CPU too: one thread at once, as before
    clock, cpu_clock = Clock(), Clock()
    tiny = SliceGate(16, window_samples=10, clock=clock, cpu_clock=cpu_clock,
                     min_window_seconds=0)
    seen = _feed(tiny, clock, WARMUP_WINDOWS + 3, {16: 2.5e-6, 1: 2e-6},
                 cpu={16: 3e-6, 1: 2e-6}, cpu_clock=cpu_clock)
    assert seen == [16] * (WARMUP_WINDOWS + 1) + [1, 1]


def test_tiny_work_is_held_to_one_thread_after_a_few_windows_of_samples() -> None:
    """28×28 raw records at 2 µs a sample: the warm-up and the first window are counted in
    samples, not in ``min_window_seconds`` (a 25 ms window at two threads would be a large
    part of a short epoch spent at the slower limit)."""
    clock = Clock()
    gate = SliceGate(2, window_samples=10, clock=clock, cpu_clock=lambda: 0.0,
                     min_window_seconds=0.025)
    seen = _feed(gate, clock, WARMUP_WINDOWS + 3, {2: 2e-6, 1: 1.5e-6})
    assert seen == [2] * (WARMUP_WINDOWS + 1) + [1, 1]
    assert clock.now < 0.001
    # a window that is neither tiny work nor unmeasured still lasts min_window_seconds
    slow = SliceGate(2, window_samples=10, clock=clock, cpu_clock=lambda: 0.0,
                     min_window_seconds=0.025)
    start = clock.now
    _feed(slow, clock, WARMUP_WINDOWS + 1, {2: 20e-6, 1: 20e-6})
    assert slow._trial == [] and clock.now - start < 0.025
