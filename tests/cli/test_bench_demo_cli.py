"""``shardfeed bench`` and ``shardfeed demo`` through main(): output, JSON, exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shardfeed.cli.main import main
from shardfeed.tools.demo.data import DemoSizes, write_labelled
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.csvinput import CsvColumns


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-bench")
    sizes = DemoSizes(labelled_images=64, crop_pixels=32, classes=2)
    csv = write_labelled(str(root / "src"), sizes)
    pack(csv, root / "ds", csv=CsvColumns(labels=("label",), mask="mask"))
    return root / "ds"


def test_bench_prints_the_figures(labelled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", str(labelled), "--size", "24", "--batch", "8", "--threads", "2",
               "--seconds", "0.3"])
    out = capsys.readouterr().out
    assert rc == 0
    for words in ("images/s", "MPix/s", "MB/s read", "first batch", "stated bound",
                  "decode limit", "x the decode limit"):
        assert words in out, words


def test_bench_json_and_plot(labelled: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "t.png"
    rc = main(["bench", str(labelled), "--size", "24", "--batch", "8", "--threads", "1",
               "--seconds", "0.3", "--json", "--plot", str(plot), "--preset", "eval"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert result["preset"] == "eval" and result["threads"] == 1 and result["size"] == 24
    assert result["images_per_s"] > 0 and result["decode_limit"]["threads"] == 1
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("argv, words", [
    (["--stride", "2"], "--stride belongs to --windows"),
    (["--cache-images", "4"], "belong to --patches"),
    (["--windows", "3", "--patches", "8"], "exclude each other"),
])
def test_bench_usage_errors(labelled: Path, capsys: pytest.CaptureFixture[str],
                            argv: list[str], words: str) -> None:
    assert main(["bench", str(labelled), *argv]) == 2
    assert words in capsys.readouterr().err


def test_bench_seconds_must_be_positive(labelled: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", str(labelled), "--seconds", "0"])
    assert exc.value.code == 2


def test_demo_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo-out"
    assert main(["demo", "--out", str(out), "--quick"]) == 0
    captured = capsys.readouterr()
    assert "[1/9]" in captured.err and "[9/9]" in captured.err
    text = captured.out
    for words in ("verify ok", "images/s", "windows", "patches", "shardfeed exact shuffle",
                  "shuffle buffer", "report/position_vs_index.png", "identical every run"):
        assert words in text, words
    # the quick demo packs its small datasets into one shard each: worded as one
    assert re.search(r"\b1 shard\b", text) and "1 shards" not in text
    assert (out / "summary.json").is_file() and (out / "timings" / "timings.json").is_file()


def test_demo_refuses_other_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("keep")
    assert main(["demo", "--out", str(tmp_path), "--quick"]) == 2
    assert "choose another --out" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "keep"
