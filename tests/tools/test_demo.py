"""The demo on its reduced size: outputs, figures in range, identical bytes, safe replacement."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed.tools.demo import WINDOW_LENGTH, WINDOW_STRIDE_SECONDS, demo
from shardfeed.tools.demo.data import DemoSizes, MissingDependencyError, load_photo
from shardfeed.tools.demo.output import MARKER_NAME
from shardfeed.tools.verify import verify

SIZES = DemoSizes.quick()


def _hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file outside timings/, by relative path."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and not rel.startswith("timings/"):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, str]]:
    out = tmp_path_factory.mktemp("demo") / "demo-out"
    result = demo(out, quick=True, bench_seconds=0.3)
    return out, result, _hashes(out)


def _png_ok(path: Path) -> bool:
    data = path.read_bytes()
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return data.startswith(b"\x89PNG\r\n\x1a\n") and image is not None and image.shape[0] > 100


def test_datasets_are_packed_and_verify(demo_run: tuple[Path, dict[str, Any], dict[str, str]]) -> None:
    out, result, _ = demo_run
    summary = result["summary"]
    assert set(summary["datasets"]) == {"timelapse", "highres", "labelled"}
    for name, info in summary["datasets"].items():
        assert info["verify"]["ok"], info["verify"]["first_problems"]
        report = verify(out / "datasets" / name, decode=True)  # checked again, independently
        assert report.ok and report.records == info["records"]
    expected_frames = SIZES.days * SIZES.frames_per_day - (SIZES.days // 2) * SIZES.dropped
    assert summary["datasets"]["timelapse"]["records"] == expected_frames
    assert summary["datasets"]["highres"]["records"] == SIZES.highres_images
    assert summary["datasets"]["labelled"]["records"] == SIZES.labelled_images
    # the labelled dataset keeps the mask of every image: twice as many decodes
    assert summary["datasets"]["labelled"]["verify"]["decoded"] == 2 * SIZES.labelled_images


def test_plots_exist_and_are_pngs(demo_run: tuple[Path, dict[str, Any], dict[str, str]]) -> None:
    out, result, _ = demo_run
    plots = result["summary"]["shuffle"]["plots"]
    assert len(plots) == 2
    for rel in [*plots, result["timings"]["bench"]["plot"]]:
        assert _png_ok(out / rel), rel
    assert (out / MARKER_NAME).is_file()
    assert (out / "timings" / "summary.txt").read_text().startswith("shardfeed demo")
    assert json.loads((out / "summary.json").read_text()) == json.loads(
        json.dumps(result["summary"])
    )


def test_shuffle_figures(demo_run: tuple[Path, dict[str, Any], dict[str, str]]) -> None:
    shuffle = demo_run[1]["summary"]["shuffle"]
    assert shuffle["records"] == SIZES.labelled_images and shuffle["classes"] == SIZES.classes
    assert abs(shuffle["exact"]["rho"]) < 0.2
    assert shuffle["buffer"]["rho"] > 0.5
    # over label-sorted data the buffer holds the last label back to the end of the epoch
    assert shuffle["buffer"]["latest_first_position"] > SIZES.labelled_images // 2
    assert shuffle["exact"]["latest_first_position"] < shuffle["buffer"]["latest_first_position"]


def _expected_windows(csv_path: Path) -> int:
    """Windows of 3 frames 16 s apart with no gap: counted straight from the CSV."""
    times: dict[str, set[float]] = defaultdict(set)
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            times[row["day"]].add(datetime.fromisoformat(row["timestamp"]).timestamp())
    count = 0
    for stamps in times.values():
        for t in stamps:
            if all(t + k * WINDOW_STRIDE_SECONDS in stamps for k in range(1, WINDOW_LENGTH)):
                count += 1
    return count


def test_windows_and_patches_counts(demo_run: tuple[Path, dict[str, Any], dict[str, str]]) -> None:
    out, result, _ = demo_run
    win = result["summary"]["windows"]
    expected = _expected_windows(out / "sources" / "timelapse" / "frames.csv")
    assert win["windows"] == win["samples"] == expected
    assert win["groups"] == SIZES.days
    assert win["excluded"]["off_grid"] + win["excluded"]["gap"] > 0  # the dropped frames
    assert win["image_shape"][1] == WINDOW_LENGTH and win["label_shape"][1] == 23
    pat = result["summary"]["patches"]
    n, r = pat["cache_images"], pat["refresh_every"]
    assert pat["patches"] == (pat["images"] - n + 1) * r
    train = result["summary"]["train"]
    assert train["images"] == (SIZES.labelled_images // train["batch_size"]) * train["batch_size"]
    assert train["mask_shape"] == train["image_shape"][:3]


def test_second_run_is_byte_identical(
    demo_run: tuple[Path, dict[str, Any], dict[str, str]],
) -> None:
    out, result, first = demo_run
    (out / "timings" / "note").write_text("from the first run")
    again = demo(out, quick=True, bench_seconds=0.3)
    assert _hashes(out) == first
    assert len(first) > 100
    assert again["summary"] == result["summary"]
    assert not (out / "timings" / "note").exists()  # the old output was replaced, not merged
    assert not Path(str(out) + ".old").exists() and not Path(str(out) + ".building").exists()


def test_refuses_a_folder_it_did_not_write(tmp_path: Path) -> None:
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    with pytest.raises(ValueError, match="no .shardfeed-demo"):
        demo(precious, quick=True)
    assert (precious / "thesis.tex").read_text() == "do not delete"
    assert sorted(os.listdir(precious)) == ["thesis.tex"]
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="not a folder"):
        demo(a_file, quick=True)


def test_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="classes"):
        DemoSizes(classes=50)
    with pytest.raises(ValueError, match="days"):
        DemoSizes(days=0)
    with pytest.raises(ValueError, match="dropped"):
        DemoSizes(frames_per_day=4, dropped=3)


def test_missing_scikit_image_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "skimage", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'shardfeed\[demo\]'"):
        load_photo("astronaut")
