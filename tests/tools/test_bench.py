"""bench on tiny datasets: every field there, values sane (no timing thresholds)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from shardfeed.tools.bench import BenchOptions, bench
from shardfeed.tools.bench.probe import RssSampler, current_rss_bytes, decode_limit
from shardfeed.tools.demo.data import (
    TIMELAPSE_FLOATS,
    DemoSizes,
    write_highres,
    write_labelled,
    write_timelapse,
)
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.csvinput import CsvColumns

SIZES = DemoSizes(days=2, frames_per_day=8, frame_size=(96, 64), dropped=0, highres_images=3,
                  labelled_images=96, crop_pixels=40, classes=3)
FAST = {"seconds": 0.3, "warmup_seconds": 0.0, "decode_seconds": 0.1, "num_threads": 2}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench")
    labelled = write_labelled(str(root / "src" / "labelled"), SIZES)
    pack(labelled, root / "labelled", csv=CsvColumns(labels=("label",), mask="mask"),
         records_per_shard=40)
    frames = write_timelapse(str(root / "src" / "timelapse"), SIZES)
    pack(frames, root / "timelapse",
         csv=CsvColumns(floats=TIMELAPSE_FLOATS, group="day", order="timestamp"))
    pack(write_highres(str(root / "src" / "highres"), SIZES), root / "highres")
    return {"labelled": root / "labelled", "timelapse": root / "timelapse",
            "highres": root / "highres", "root": root}


def _common_checks(result: dict, *, records: int) -> None:
    assert result["records"] == records
    assert result["samples"] > 0 and result["batches"] > 0
    assert result["seconds"] >= 0.3
    assert result["samples_per_s"] == pytest.approx(result["samples"] / result["seconds"])
    assert result["output_mpix_per_s"] > 0
    assert result["time_to_first_batch_s"] > 0
    assert result["memory_bound_bytes"] > 0
    budget = result["memory_budget"]
    assert budget["threads"] == 2 and budget["batch_bytes"] > 0
    assert result["peak_rss_bytes"] > 10_000_000  # a Python process with NumPy and OpenCV
    limit = result["decode_limit"]
    assert limit["threads"] == 2 and limit["images"] >= 8 and limit["images_per_s"] > 0
    assert limit["distinct_images"] == records
    assert result["ratio_to_decode_limit"] == pytest.approx(
        result["images_per_s"] / limit["images_per_s"]
    )
    assert result["timeline"] and all(rate >= 0 for _, rate in result["timeline"])


def test_records(data: dict[str, Path]) -> None:
    plot = data["root"] / "out" / "throughput.png"
    result = bench(data["labelled"], size=32, batch_size=16, plot=plot, **FAST)
    _common_checks(result, records=SIZES.labelled_images)
    assert result["kind"] == "records" and result["images_per_s"] == result["samples_per_s"]
    assert result["frames_per_s"] is None and result["patches_per_s"] is None
    # 16 images of 32 x 32 a batch: output pixels follow from the samples exactly
    assert result["output_mpix_per_s"] == pytest.approx(result["samples_per_s"] * 32 * 32 / 1e6)
    assert result["source_mpix_per_s"] == pytest.approx(result["samples_per_s"] * 40 * 40 / 1e6)
    if result["read_mb_per_s"] is not None:
        assert result["read_mb_per_s"] >= 0
    assert result["batches"] * 16 == result["samples"]  # train preset drops partial batches
    data_png = plot.read_bytes()
    assert data_png.startswith(b"\x89PNG") and result["plot"] == str(plot)
    image = cv2.imdecode(np.frombuffer(data_png, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape[1] > 400
    # where the threads' time went, over the measured stretch, and drawn beside it
    stages = result["stages"]
    assert stages["batches"] == result["batches"] and stages["threads"] == 2
    assert stages["shares"]["decode"] > 0 and 0 < stages["busy_share"] <= 1
    assert result["stage_timeline"] and result["stage_plot"] == str(
        plot.with_name("throughput-stages.png"))
    drawn = cv2.imread(result["stage_plot"], cv2.IMREAD_COLOR)
    assert drawn is not None and drawn.shape[1] > 400


def test_eval_preset_reads_in_order(data: dict[str, Path]) -> None:
    result = bench(data["labelled"], preset="eval", size=24, batch_size=50, **FAST)
    _common_checks(result, records=SIZES.labelled_images)
    assert result["preset"] == "eval"


def test_windows(data: dict[str, Path]) -> None:
    result = bench(data["timelapse"], windows=3, stride=2, size=32, batch_size=4, **FAST)
    _common_checks(result, records=SIZES.days * SIZES.frames_per_day)
    assert result["kind"] == "windows" and result["stride"] == 2
    assert result["frames_per_s"] == pytest.approx(3 * result["samples_per_s"])
    assert result["images_per_s"] == result["frames_per_s"]
    assert result["output_mpix_per_s"] == pytest.approx(
        result["samples_per_s"] * 3 * 32 * 32 / 1e6
    )


def test_patches(data: dict[str, Path]) -> None:
    result = bench(data["highres"], patches=32, cache_images=2, refresh_every=8, batch_size=8,
                   **FAST)
    _common_checks(result, records=SIZES.highres_images)
    assert result["kind"] == "patches" and result["size"] == 32
    assert result["patches_per_s"] == result["samples_per_s"]
    assert result["output_mpix_per_s"] == pytest.approx(result["samples_per_s"] * 32 * 32 / 1e6)


def test_patches_on_fewer_images_than_the_default_cache(data: dict[str, Path]) -> None:
    from shardfeed.cli.main import main

    result = bench(data["highres"], patches=32, refresh_every=8, batch_size=8, **FAST)
    assert result["cache_images"] == SIZES.highres_images  # not the 64 a larger dataset gets
    assert main(["bench", str(data["highres"]), "--patches", "32", "--refresh-every", "8",
                 "--batch", "8", "--seconds", "0.3", "--threads", "2"]) == 0


def test_options_are_checked(data: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="preset"):
        BenchOptions(preset="fast")
    with pytest.raises(ValueError, match="exclude"):
        BenchOptions(windows=3, patches=32)
    with pytest.raises(ValueError, match="seconds"):
        BenchOptions(seconds=0)
    with pytest.raises(TypeError, match="batch_size"):
        BenchOptions(batch_size=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        bench(data["labelled"], options=BenchOptions(), seconds=1)
    with pytest.raises(ValueError, match="smaller than one batch"), pytest.warns(UserWarning):
        bench(data["labelled"], batch_size=1000, **FAST)


def test_decode_limit_and_rss_sampler() -> None:
    ok, jpeg = cv2.imencode(".jpg", np.full((30, 40, 3), 128, np.uint8))
    assert ok
    limit = decode_limit([jpeg.tobytes()], num_threads=2, seconds=0.05, min_images=20)
    assert limit.images >= 20 and limit.distinct_images == 1
    assert limit.mpix_per_s == pytest.approx(limit.images_per_s * 30 * 40 / 1e6)
    with pytest.raises(ValueError, match="at least one"):
        decode_limit([], num_threads=1, seconds=0.1)
    with RssSampler(interval_seconds=0.005) as rss:
        block = np.ones(40_000_000, np.uint8)  # 40 MB touched: the peak must see it
        held = current_rss_bytes()  # what was resident while the block was held
        rss.sample()
        del block
    if rss.peak_bytes is not None:
        # Growth from the start is not a fixed 40 MB (the allocator may reuse pages freed
        # before), but the peak can never be below what was resident with the block held.
        assert held is not None and rss.start_bytes is not None
        assert rss.peak_bytes >= held
    assert not math.isnan(limit.seconds)


def _mean_file_record_bytes(folder: Path, records: int) -> float:
    """The shard files' bytes over their records, from the files themselves."""
    return sum(p.stat().st_size for p in folder.glob("*.tfrecord")) / records


def test_read_rate_counts_the_records_of_memory_mapped_shards(
    data: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Local shards are memory-mapped: the OS read counter saw none of it ("MB/s read 0.0")."""
    from shardfeed.cli.main import main

    result = bench(data["labelled"], size=32, batch_size=16, **FAST)
    mean = _mean_file_record_bytes(data["labelled"], SIZES.labelled_images)
    assert result["read_counted"] == "records" and result["read_note"] is None
    assert result["mean_record_bytes"] == pytest.approx(mean)
    assert result["records_read_per_s"] == pytest.approx(result["samples_per_s"])
    assert result["read_mb_per_s"] == pytest.approx(result["samples_per_s"] * mean / 1e6)

    frames = bench(data["timelapse"], windows=3, stride=2, size=32, batch_size=4, **FAST)
    assert frames["records_read_per_s"] == pytest.approx(frames["frames_per_s"])
    patches = bench(data["highres"], patches=32, cache_images=2, refresh_every=8,
                    batch_size=8, **FAST)
    # patches read a record only to decode it: far fewer records than patches (none at all
    # once the 3 images stay in the cache, which holds 2 + 2 spare + L decoded ahead)
    assert 0 <= patches["records_read_per_s"] < patches["patches_per_s"]
    assert patches["read_mb_per_s"] == pytest.approx(
        patches["records_read_per_s"] * _mean_file_record_bytes(
            data["highres"], SIZES.highres_images) / 1e6)

    assert main(["bench", str(data["labelled"]), "--size", "32", "--batch", "16",
                 "--seconds", "0.3", "--threads", "2", "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "MB/s read" in x)
    shown = float(line.split()[2].replace(",", ""))
    assert shown > 0 and "records/s x" in line and "kB, their mean size" in line


def test_what_if_measures_the_change_beside_the_run(data: dict[str, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from shardfeed.cli.main import main

    assert main(["bench", str(data["labelled"]), "--size", "32", "--batch", "16",
                 "--seconds", "0.3", "--threads", "1", "--no-progress",
                 "--what-if", "threads=2"]) == 0
    out = capsys.readouterr().out
    assert "threads       busy" in out and "decode" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("what if threads=2:"))
    assert "images/s (" in line and "x; one run each" in line
    # a plot path that is a folder, and a name it does not know, are said before measuring
    started = time.perf_counter()
    assert main(["bench", str(data["labelled"]), "--plot", str(data["root"]),
                 "--no-progress"]) != 0
    assert "is a folder" in capsys.readouterr().err and time.perf_counter() - started < 5
    assert main(["bench", str(data["labelled"]), "--what-if", "cores=2", "--no-progress"]) != 0
    assert "give NAME=VALUE with NAME one of threads" in capsys.readouterr().err
    assert main(["bench", str(data["labelled"]), "--what-if", "threads=abc",
                 "--no-progress"]) != 0
    assert "--what-if 'threads=abc'" in capsys.readouterr().err
    assert main(["bench", str(data["labelled"]), "--what-if", "cache-images=8",
                 "--no-progress"]) != 0
    assert "belongs to --patches" in capsys.readouterr().err
