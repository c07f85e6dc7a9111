"""Every command that reads a dataset refuses one whose manifest names a shard outside it,
in one line naming the path and the flag, and reads it with ``--allow-outside-paths``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardfeed.cli.main import main


@pytest.fixture
def hostile(small_csv: Path, tmp_path: Path) -> Path:
    """downloads/ds: a packed dataset whose second shard was moved beside the folder and is
    named ``../elsewhere.tfrecord`` by the manifest."""
    out = tmp_path / "downloads" / "ds"
    assert main(["pack", str(small_csv), str(out), "--csv-labels", "label",
                 "--records-per-shard", "3", "--no-progress"]) == 0
    manifest = json.loads((out / "shardfeed.json").read_text())
    moved = manifest["shards"][1]["path"]
    shutil.move(out / moved, out.parent / "elsewhere.tfrecord")
    for index in out.glob(moved + ".idx*"):
        index.unlink()
    manifest["shards"][1]["path"] = "../elsewhere.tfrecord"
    (out / "shardfeed.json").write_text(json.dumps(manifest))
    return out


COMMANDS = {
    "verify": ["verify", "{ds}", "--decode", "--no-progress"],
    "inspect": ["inspect", "{ds}"],
    "bench": ["bench", "{ds}", "--seconds", "0.1", "--batch", "2", "--threads", "1",
              "--size", "8", "--no-progress"],
    "shuffle-report": ["shuffle-report", "{ds}", "--buffer", "2", "--batch", "2",
                       "--no-progress"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_shard_outside_the_dataset_needs_the_flag(
    hostile: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(ds=hostile) for a in COMMANDS[command]]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "../elsewhere.tfrecord" in err and "--allow-outside-paths" in err
    assert not list(hostile.parent.glob("elsewhere.tfrecord.idx*"))  # nothing written there

    assert main([*argv, "--allow-outside-paths"]) == 0
    capsys.readouterr()
