"""Where a Loader's time goes (loader.stats()): a pipeline made slow at one stage at a time
gets that stage named by the verdict, in a fresh process as a user's script runs it; the
consumer's wait and step add up to the pass's wall time, the stages to the threads' busy
time; and loader.report() writes its JSON lines and display while batches are handed out."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg

from shardfeed.dataset import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.stage_clocks import ConsumerClock, StageClock
from shardfeed.pipeline.stage_stats import StageFigures, snapshot
from shardfeed.transforms import presets


def _photos(folder: Path, count: int = 96, side: int = 96) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(count):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            writer.write_example({"image/encoded": simplejpeg.encode_jpeg(pixels, quality=90),
                                  "image/class/label": [i % 3]})
    return folder


SCRIPT = textwrap.dedent(r'''
    import json, sys, time
    import numpy as np
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import Compose, presets
    from shardfeed.transforms.base import TransformBase

    class Slow(TransformBase):
        """An op after the decode that takes 30 ms a slice (a heavy augmentation)."""
        def __call__(self, sample, rng):
            time.sleep(0.03 / 8)
            return sample
        def apply_batch(self, columns, rngs, out):
            time.sleep(0.03)
            return columns
        def output_spec(self, specs):
            return specs

    folder, scenario = sys.argv[1:3]
    transform = presets.train(size=32)
    if scenario == "transform":
        transform = Compose([*transform.transforms, Slow()])
    with Loader(Dataset(folder), batch_size=8, transform=transform, num_threads=2,
                seed=1) as loader:
        for epoch in range(3):
            if epoch == 1:  # the window starts after the first pass's start-up
                loader.stats()
                began = time.perf_counter()
            loader.set_epoch(epoch)
            for batch in loader:
                if scenario == "consumer":
                    time.sleep(0.1)  # a training step much longer than a batch's making
        wall = time.perf_counter() - began
        stats = loader.stats()
    print(json.dumps({"wall": wall, "window": stats.window.to_dict(), "verdict": stats.verdict}))
''')


def _run(folder: Path, scenario: str, tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(folder), scenario],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_slow_consumer_is_told_input_is_not_the_bottleneck(tmp_path: Path) -> None:
    result = _run(_photos(tmp_path / "d"), "consumer", tmp_path)
    window = result["window"]
    assert window["wait_share"] < 0.05, window
    assert result["verdict"].startswith("input is not the bottleneck"), result["verdict"]
    # the consumer's wait and step are the pass's time, within 5%
    assert abs(window["wait"] + window["step"] - result["wall"]) <= 0.05 * result["wall"]
    assert window["batches"] == 24 and window["samples"] == 192


def test_a_slow_transform_is_named(tmp_path: Path) -> None:
    result = _run(_photos(tmp_path / "d"), "transform", tmp_path)
    window = result["window"]
    assert window["wait_share"] > 0.5, window
    assert "the transform takes" in result["verdict"], result["verdict"]
    assert window["shares"]["transform"] > 0.5
    # every second the threads were busy is in a stage, within 5%
    assert abs(sum(window["stages"].values()) - window["busy"]) <= 0.05 * window["busy"]
    assert window["busy"] <= window["threads"] * window["seconds"] * 1.05


def test_decoding_is_named_when_it_is_the_work(tmp_path: Path) -> None:
    result = _run(_photos(tmp_path / "d", side=320), "decode", tmp_path)
    assert "decoding takes" in result["verdict"], result["verdict"]
    assert result["window"]["shares"]["decode"] > 0.5


def test_report_writes_json_lines_and_a_display_line(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "logs" / "input.jsonl"
    with Loader(Dataset(str(_photos(tmp_path / "d"))), batch_size=8, num_threads=2,
                transform=presets.train(size=32)) as loader:
        loader.report(every=1e-6, display=True, jsonl=log)
        for _ in loader:
            time.sleep(0.002)
        loader.report(None)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) >= 10  # one a batch at this rate
    assert all("verdict" in line and line["window"]["batches"] >= 1 for line in lines)
    assert sum(line["window"]["batches"] for line in lines) == 12  # stopping writes the rest
    assert "samples/s" in capsys.readouterr().err


def test_a_report_into_a_folder_it_cannot_write_is_refused_at_once(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with Loader(Dataset(str(_photos(tmp_path / "d", count=8))), batch_size=8) as loader:
        with pytest.raises(OSError):
            loader.report(jsonl=blocker / "input.jsonl")
        with pytest.raises(ValueError, match="is a folder"):
            loader.report(jsonl=tmp_path)
        with pytest.raises(TypeError, match="stats_window"):
            loader.stats("the last minute")  # type: ignore[arg-type]
        with Loader(Dataset(str(tmp_path / "d")), batch_size=8) as other, \
                pytest.raises(TypeError, match="this loader's"):
            loader.stats(other.stats_window())


def test_the_window_is_the_time_since_the_last_call() -> None:
    clock, consumer = StageClock(), ConsumerClock()
    first = snapshot(clock, consumer, [], 0)
    clock.add(1, 0.5)
    consumer.asked()
    consumer.handed(4)
    middle = snapshot(clock, consumer, [], 0)
    clock.add(1, 0.25)
    last = snapshot(clock, consumer, [], 0)
    assert StageFigures.between(first, last, threads=2).stages["decode"] == pytest.approx(0.75)
    window = StageFigures.between(middle, last, threads=2)
    assert window.stages["decode"] == pytest.approx(0.25) and window.batches == 0
    assert window.verdict() == "no batch handed out yet"


def _figures(**changes: Any) -> StageFigures:
    base: dict[str, Any] = {
        "seconds": 10.0, "batches": 100, "samples": 6400, "wait": 5.0, "step": 5.0,
        "stages": {"read": 1.0, "decode": 15.0, "transform": 2.0, "assemble": 0.5},
        "storage": 0.0, "busy": 18.5, "threads": 2, "slices": 400, "requests": 0, "bytes_fetched": 0,
        "retries": 0, "skipped": 0, "cores": 2}
    base.update(changes)
    return StageFigures(**base)


def test_the_verdicts_advice_follows_the_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardfeed.pipeline import stage_stats

    monkeypatch.setattr(stage_stats, "_has_gpu", lambda: False)
    said = _figures().verdict()
    assert said.startswith("the training step waits 50% of its time for data; decoding takes")
    assert "every core decodes already (2 threads, 2 cores)" in said
    # cores to spare and threads all busy: more threads, numbered
    assert "use more threads (num_threads=4; this machine has 16 cores)" in _figures(
        cores=16).verdict()
    monkeypatch.setattr(stage_stats, "_has_gpu", lambda: True)
    assert "try decode_on='cuda'" in _figures().verdict()
    # threads mostly idle while the step waits: the hand-over, not a stage
    idle = _figures(busy=4.0, prefetch=2, stages={"read": 0.5, "decode": 3.0, "transform": 0.4,
                                                  "assemble": 0.1})
    assert "threads are idle 80% of the time meanwhile (decoding takes 75%" in idle.verdict()
    assert "prefetch_batches=4; 2 built at once now" in idle.verdict()
    # more threads than cores, idle a fifth of the time, the process's CPU 1.9 cores' worth:
    # the cores are busy, so the stage's advice, not processes (4.6 times slower there)
    monkeypatch.setattr(stage_stats, "_has_gpu", lambda: False)
    crowded = _figures(threads=16, cores=2, busy=125.0, prefetch=16, cpu_seconds=19.0)
    assert "idle" not in crowded.verdict() and "processes" not in crowded.verdict()
    assert "every core decodes already (16 threads, 2 cores)" in crowded.verdict()
    # as idle, with 1.2 cores' worth of CPU on 8 (threads waiting for the GIL, in their
    # slices all the same): the threads' idle time and the GIL
    held = _figures(threads=32, cores=8, busy=250.0, prefetch=16, cpu_seconds=12.0)
    assert "threads are idle 22% of the time" in held.verdict()
    assert "workers='processes'" in held.verdict()
    # as many cores as threads, as idle: the threads' idle time is the limit
    assert "threads are idle 22% of the time" in _figures(
        threads=16, cores=16, busy=125.0, prefetch=16, cpu_seconds=150.0).verdict()
    # slices of tiny work: the hand-overs, not the batches made ahead
    tiny = _figures(busy=4.0, slices=40_000, prefetch=2,
                    stages={"read": 0.5, "decode": 3.0, "transform": 0.4, "assemble": 0.1})
    assert "a slice takes 0.10 ms" in tiny.verdict()
    assert "gate" not in tiny.verdict() and "prefetch" not in tiny.verdict()
    assert _figures(wait=0.01, step=9.0).verdict().startswith("input is not the bottleneck")
    remote = _figures(storage=14.0, requests=1200, stages={"read": 16.0, "decode": 2.0,
                                                           "transform": 0.3, "assemble": 0.2})
    assert "waiting on storage takes 76%" in remote.verdict()
    assert "cache_dir" in remote.verdict() and "1,200 requests" in remote.verdict()
    assert set(remote.to_dict()) >= {"wait_share", "shares", "verdict", "busy_share",
                                     "cores", "cpu_seconds", "built_at_once"}


def test_each_reader_has_its_own_window_and_a_stopped_report_writes_nothing(
        tmp_path: Path) -> None:
    log = tmp_path / "input.jsonl"
    with Loader(Dataset(str(_photos(tmp_path / "d", count=64))), batch_size=8, num_threads=2,
                transform=presets.train(size=32)) as loader:
        mine = loader.stats_window()
        batches = iter(loader)
        loader.report(every=1e-6, display=False, jsonl=log)  # attached mid-pass: it ticks
        for _ in range(4):
            next(batches)
        loader.stats()  # another reader's call does not shorten mine
        loader.report(None)
        written = len(log.read_text().splitlines())
        for _ in batches:
            pass
        assert len(log.read_text().splitlines()) == written >= 3  # stopped: nothing more
        assert loader.stats(mine).window.batches == 8
        assert loader.stats(mine).window.batches == 0


def test_a_pass_left_early_starts_the_next_with_its_first_batch() -> None:
    consumer = ConsumerClock()
    consumer.new_pass(time.perf_counter())
    consumer.asked()
    consumer.handed(4)  # a first batch: its wait is the pass's start
    consumer.asked()
    consumer.handed(4)
    started = consumer.start_wait
    time.sleep(0.01)  # the loop broke out; the next pass begins later
    consumer.new_pass(time.perf_counter())
    consumer.asked()
    consumer.handed(4)
    assert consumer.step < 0.01  # the gap between passes is no training step
    assert consumer.start_wait > started


def test_worker_processes_are_said_to_keep_their_stage_times() -> None:
    said = _figures(processes=True, busy=0.0,
                    stages={"read": 0.0, "decode": 0.0, "transform": 0.0,
                            "assemble": 0.0}).verdict()
    assert "worker processes, whose stage times are not collected" in said


def test_a_slow_batch_stage_is_named(tmp_path: Path) -> None:
    """An adapter's stage on whole batches (as the GPU decode is) that takes 20 ms a batch:
    its time is counted apart from the slices', and the verdict names it."""
    from shardfeed.pipeline import BatchStageBase

    class SlowStage(BatchStageBase):
        def __call__(self, batch: dict[str, Any], keys: Any, /) -> dict[str, Any]:
            time.sleep(0.02)
            return batch

    with Loader(Dataset(str(_photos(tmp_path / "d", count=64))), batch_size=8, num_threads=2,
                transform=presets.train(size=32)) as loader:
        loader.add_batch_stage(SlowStage())
        for epoch in range(2):
            loader.set_epoch(epoch)
            if epoch == 1:
                loader.stats()
            for _ in loader:
                pass
        stats = loader.stats()
    window = stats.window
    assert window.batch_stages >= 8 * 0.02
    assert "the batch stages" in stats.verdict, stats.verdict
