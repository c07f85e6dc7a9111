"""bench/bench_node.py, in its tiny mode: the node bench still runs every case, and its table
(printed last) and JSON have a row for each, a figure or 'skipped: <why>'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.transforms.decode import region

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_node.py"
CASES = {"decode", "torch-pil", "train", "train-held", "png28", "png28-held", "patches",
         "patches-held", "nvimgcodec-whole", "nvimgcodec-region", "gpu-train", "gpu-overlap"}


@pytest.mark.slow
def test_tiny_run_has_every_row(tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    # where nvImageCodec is installed, its rows and the GPU path run on its CPU backend, so
    # their code runs here too; without it they say why they were skipped
    device = ["--device", "cpu"] if region.backend() is not None else []
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--tiny", "--threads", "2", "--out", str(out),
         "--data", str(tmp_path), *device],
        capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {row["key"]: row for row in report["rows"]}
    assert {row["case"] for row in report["rows"]} == CASES
    for key in ("decode@1", "decode@2", "train@1", "train@4", "train@8", "train@2",
                "train-held@2", "train-held@8", "png28@1", "png28@2", "patches@1",
                "patches@2", "gpu-train@8", "gpu-train@2", "gpu-overlap@2"):
        assert key in rows, key
    for key in ("decode@2", "train@2", "train-held@2", "png28@2", "patches@2"):
        assert rows[key]["skipped"] is None, rows[key]
        assert rows[key]["images_per_s"] > 0
    if device:
        for key in ("nvimgcodec-region", "gpu-train@2"):
            assert rows[key]["skipped"] is None, rows[key]
    assert rows["gpu-overlap@2"]["skipped"]  # needs CUDA: never here
    assert report["peak_rss_mib"] > 0

    table = done.stdout.strip().splitlines()
    assert table[-1] == f"JSON: {out}"
    assert table[-2].startswith("peak host RSS")
    body = table[-3 - len(report["rows"]):-2]
    assert body[0].split()[:3] == ["case", "thr", "images/s"]
    for line, row in zip(body[1:], report["rows"]):
        assert line.split()[0] == row["case"]
        if row["skipped"] is not None:
            assert f"skipped: {row['skipped']}" in line
        else:
            assert f"{row['images_per_s']:,.0f}" in line
    assert list(tmp_path.iterdir()) == [out]  # the generated data is removed
