"""``shardfeed examples DIR``: the files the README's and guides' examples run on."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

import shardfeed
from shardfeed.cli.main import main
from shardfeed.tools.demo.examples import EXAMPLE_FILES, tensorflow_file, write_examples
from shardfeed.tools.verify import verify

TF_FIXTURES = Path(__file__).resolve().parents[1] / "data" / "tf"


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file()}


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples") / "ex"
    code, out, err = _run("examples", str(root))
    assert code == 0, err
    assert "out/" in out and f"cd {root}" in out
    return root


def test_the_command_makes_every_file_the_guides_name(examples: Path) -> None:
    for name in EXAMPLE_FILES:
        assert (examples / name).exists(), name
    photos = sorted(p.relative_to(examples / "photos").as_posix()
                    for p in (examples / "photos").rglob("*.jpg"))
    assert len(photos) == 36 and photos[0] == "cat/000.jpg" and photos[-1] == "fox/011.jpg"
    assert len(list((examples / "masks").rglob("*.png"))) == 36
    assert (examples / "labels.csv").read_text().splitlines()[1] == (
        "photos/cat/000.jpg,0,pet,cat,masks/cat/000.png")
    frames = (examples / "frames.csv").read_text().splitlines()
    assert frames[0] == "path,day,timestamp,VF,IRR0,IRR1,IRR2,IRR3" and len(frames) == 1 + 29
    assert not (examples / "frames/day1/006.jpg").exists()  # the gap of day 1


def test_the_datasets_open_and_verify(examples: Path) -> None:
    out = shardfeed.Dataset(examples / "out")
    assert (len(out), out.num_shards) == (36, 3)
    assert out[13]["image/filename"] == b"dog/001.jpg"
    days = shardfeed.Dataset(examples / "days")
    assert len(days) == 29 and days.group_ids is not None and days.order_keys is not None
    assert len(shardfeed.Dataset(examples / "big")) == 6
    for name in ("out", "days", "big"):
        assert verify(examples / name, decode=True).ok, name


def test_the_tensorflow_files_are_the_project_fixtures(examples: Path) -> None:
    same = {
        "existing/mixed.tfrecord": "mixed.tfrecord",
        "existing/second.tfrecord": "second.tfrecord",
        "old/compressed.tfrecord.gz": "compressed.tfrecord.gz",
        "damaged/data-crc.tfrecord": "damaged-data-crc.tfrecord",
        "damaged/length-crc.tfrecord": "damaged-length-crc.tfrecord",
        "damaged/truncated.tfrecord": "damaged-truncated.tfrecord",
    }
    for mine, fixture in same.items():
        assert (examples / mine).read_bytes() == (TF_FIXTURES / fixture).read_bytes(), mine
    assert sorted(p.name for p in (examples / "existing").iterdir()) == [
        "mixed.tfrecord", "second.tfrecord"]  # no index: the reader makes one
    report = verify(examples / "damaged")
    assert [(Path(p.path).name, p.record) for p in report.problems] == [
        ("data-crc.tfrecord", 2), ("length-crc.tfrecord", 4), ("truncated.tfrecord", 5)]
    with pytest.raises(ValueError, match="unknown example file"):
        tensorflow_file("empty.tfrecord")


def test_two_runs_write_identical_files(examples: Path, tmp_path: Path) -> None:
    again = write_examples(tmp_path / "again")
    assert again.folder == str(tmp_path / "again")
    assert _tree(tmp_path / "again") == _tree(examples)


def test_an_empty_folder_is_filled(tmp_path: Path) -> None:
    (tmp_path / "ex").mkdir()
    code, _out, _err = _run("examples", str(tmp_path / "ex"))
    assert code == 0 and (tmp_path / "ex/out/shardfeed.json").is_file()


def test_a_folder_with_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    mine = tmp_path / "ex"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    code, out, err = _run("examples", str(mine))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "is not empty" in err and str(mine) in err
    assert _tree(mine) == {"notes.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ex"]  # nothing half-built beside it


def test_an_interrupted_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardfeed.tools.pack as pack_module

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pack_module, "pack", interrupted)
    code, _out, err = _run("examples", str(tmp_path / "ex"))
    assert code == 130 and "interrupted" in err
    assert list(tmp_path.iterdir()) == []


def test_the_current_folder_can_be_filled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = tmp_path / "ex"
    here.mkdir()
    monkeypatch.chdir(here)
    code, _out, _err = _run("examples", ".")
    assert code == 0
    assert Path.cwd() == here and (here / "out/shardfeed.json").is_file()  # same folder, filled
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ex"]
