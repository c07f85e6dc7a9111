"""``shardfeed index train/ val/`` makes two datasets: train never reads val's records.

The user's steps, each in a fresh process as they run them: index the TFRecord files of two
folders in one command, open each folder with ``Dataset(folder)``; name one manifest over
both with ``--manifest``; and open a folder whose manifest (written by an older
``shardfeed index train/ val/``) names the other folder's files, following what the refusal
says.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed import Dataset
from shardfeed.cli.main import main
from shardfeed.errors import UnsafePathError
from shardfeed.format.writer import ShardWriter

BIN = Path(sys.executable).parent
TRAIN = list(range(7))
VAL = list(range(100, 104))

READ = """
import json, sys
import shardfeed
out = {}
for source in sys.argv[1:]:
    with shardfeed.Dataset(source) as ds:
        out[source] = [int(r["label"][0]) for r in ds]
print(json.dumps(out))
"""


def _split(folder: Path, labels: list[int]) -> None:
    """``folder`` holding two TFRecord files (no index, no manifest) of ``labels``."""
    folder.mkdir()
    half = len(labels) // 2
    for k, part in enumerate((labels[:half], labels[half:])):
        with ShardWriter(folder / f"{folder.name}-{k:05d}-of-00002.tfrecord") as writer:
            for label in part:
                writer.write_example({"label": [label], "split": folder.name.encode()})


@pytest.fixture
def splits(tmp_path: Path) -> Path:
    """tmp_path holding train/ and val/, TFRecord files as TensorFlow leaves them."""
    _split(tmp_path / "train", TRAIN)
    _split(tmp_path / "val", VAL)
    return tmp_path


def _shardfeed(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "shardfeed"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)


def _read(cwd: Path, *sources: str) -> dict[str, list[int]]:
    """The labels of ``Dataset(source)`` for each source, read in a fresh Python."""
    done = subprocess.run([sys.executable, "-c", READ, *sources], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, list[int]] = json.loads(done.stdout)
    return result


def test_index_of_train_and_val_gives_each_folder_its_own_dataset(splits: Path) -> None:
    done = _shardfeed(splits, "index", "train/", "val/", "--no-progress")
    assert done.returncode == 0, done.stderr
    train_line, val_line = done.stdout.splitlines()  # one line a manifest written
    assert train_line.startswith("indexed 7 records in 2 files (")
    assert train_line.endswith(str(splits / "train" / "shardfeed.json"))
    assert val_line.startswith("indexed 4 records in 2 files (")
    assert val_line.endswith(str(splits / "val" / "shardfeed.json"))
    for name in ("train", "val"):
        shards = json.loads((splits / name / "shardfeed.json").read_text())["shards"]
        assert [s["path"] for s in shards] == [
            f"{name}-00000-of-00002.tfrecord", f"{name}-00001-of-00002.tfrecord"]

    read = _read(splits, "train/", "val/")
    assert sorted(read["train/"]) == TRAIN  # every train record, no val record
    assert sorted(read["val/"]) == VAL

    summary = json.loads(_shardfeed(splits, "index", "train/", "val/", "--json",
                                    "--no-progress").stdout)
    assert summary["manifest"] is None and summary["records"] == 11
    assert [(m["manifest"], m["records"]) for m in summary["manifests"]] == [
        (str(splits / "train" / "shardfeed.json"), 7),
        (str(splits / "val" / "shardfeed.json"), 4)]


def test_one_manifest_over_both_folders_only_under_a_name_of_its_own(splits: Path) -> None:
    assert _shardfeed(splits, "index", "train/", "val/", "--no-progress").returncode == 0
    own = (splits / "train" / "shardfeed.json").read_bytes()

    # train's own manifest over val's files too: refused, usage error, nothing written
    refused = _shardfeed(splits, "index", "train/", "val/", "--manifest", "train/")
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "val-00000-of-00002.tfrecord" in refused.stderr
    assert f"--manifest {splits / 'all.json'}" in refused.stderr
    assert (splits / "train" / "shardfeed.json").read_bytes() == own

    # the fix it names: one manifest of its own, opened by its path
    done = _shardfeed(splits, "index", "train/", "val/", "--manifest",
                      str(splits / "all.json"), "--no-progress")
    assert done.returncode == 0, done.stderr
    read = _read(splits, "all.json", "train/", "val/")
    assert sorted(read["all.json"]) == TRAIN + VAL
    assert sorted(read["train/"]) == TRAIN and sorted(read["val/"]) == VAL

    # a manifest named in train/ is written there as itself: train's own is left as it is
    done = _shardfeed(splits, "index", "train/", "val/", "--manifest", "train/both.json",
                      "--no-progress")
    assert done.returncode == 0, done.stderr
    assert (splits / "train" / "shardfeed.json").read_bytes() == own
    assert sorted(_read(splits, "train/")["train/"]) == TRAIN


def _spanning_manifest(splits: Path) -> None:
    """train/shardfeed.json naming val's files as ``../val/...``, as ``shardfeed index train/
    val/`` wrote it before it wrote one manifest a folder."""
    for name in ("train", "val"):
        assert main(["index", str(splits / name), "--no-progress"]) == 0
    train = json.loads((splits / "train" / "shardfeed.json").read_text())
    val = json.loads((splits / "val" / "shardfeed.json").read_text())
    for shard in val["shards"]:
        train["shards"].append({**shard, "path": f"../val/{shard['path']}"})
    train["records"] += val["records"]
    (splits / "train" / "shardfeed.json").write_text(json.dumps(train))
    (splits / "val" / "shardfeed.json").unlink()


def test_the_refusal_of_a_manifest_over_train_and_val_leads_to_train_alone(
    splits: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _spanning_manifest(splits)
    with pytest.raises(UnsafePathError) as caught:
        Dataset(splits / "train")
    message = str(caught.value)
    assert "../val/val-00000-of-00002.tfrecord" in message
    assert main(["inspect", str(splits / "train")]) == 1
    assert capsys.readouterr().err.strip().endswith(message)

    # what it says first, run as it is written: train then holds train's records alone
    command = re.search(r"`(shardfeed index [^`]*)`", message)
    assert command is not None, message
    assert message.index(command.group(1)) < message.index("allow_outside_paths")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(shlex.split(command.group(1)), cwd=splits, env=env, check=True,
                   capture_output=True, timeout=120)
    assert sorted(_read(splits, "train/")["train/"]) == TRAIN


def test_help_says_one_manifest_a_folder(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["index", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "shardfeed index train/ val/ # train/shardfeed.json, val/shardfeed.json" in text
    assert "--manifest PATH write one manifest over all the files" in text
