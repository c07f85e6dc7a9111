"""`shardfeed bench` on a tiny dataset: the memory growth it measures is within the Loader's
stated bound (it printed "ABOVE the bound" when the bound left out the loader's own costs),
also with the bound made tight by a ``max_pixels`` at the images' size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import simplejpeg

from shardfeed.cli.main import main
from shardfeed.format.writer import ShardWriter
from shardfeed.tools.bench import BenchOptions, bench
from shardfeed.transforms.decode.sizes import decode_peak_bytes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(200):
            image = np.full((48, 64, 3), (i * 7) % 250, np.uint8)
            writer.write_example({"image/encoded": bytes(simplejpeg.encode_jpeg(image)),
                                  "image/filename": f"img{i:04d}.jpg".encode(),
                                  "image/height": [48], "image/width": [64],
                                  "image/class/label": [i % 3]})
    return folder


@pytest.mark.parametrize(("threads", "batch", "size"), [(2, 16, 224), (8, 64, 32)])
def test_growth_is_within_the_tight_bound(tiny: Path, threads: int, batch: int,
                                          size: int) -> None:
    result = bench(tiny, seconds=0.5, warmup_seconds=0.0, decode_seconds=0.1,
                   num_threads=threads, batch_size=batch, size=size, max_pixels=48 * 64)
    assert result["within_bound"] is True, (result["rss_growth_bytes"],
                                            result["memory_budget"])
    budget = result["memory_budget"]
    assert budget["decode_bytes_per_thread"] == decode_peak_bytes(48 * 64)
    assert budget["fixed_bytes"] > 0 and result["max_pixels"] == 48 * 64


def test_the_command_prints_the_parts_of_the_bound(tiny: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", str(tiny), "--seconds", "0.3", "--threads", "2", "--batch", "16",
                 "--size", "32", "--max-pixels", str(48 * 64), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "(within)" in out and "ABOVE" not in out
    assert f"images up to --max-pixels {48 * 64}" in out


def test_max_pixels_is_checked() -> None:
    with pytest.raises(ValueError, match="max_pixels must be >= 1"):
        BenchOptions(max_pixels=0)
