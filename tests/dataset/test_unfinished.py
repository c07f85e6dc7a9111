"""A folder whose pack (or copy, or writer) did not finish is refused by every reader.

The pack is really interrupted: a ``pack`` process kills itself with SIGKILL once three of its
30 shards are complete, leaving what any crash leaves (complete shards named ``-of-00030``,
the plan file, no manifest).
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg

from shardfeed import Dataset, Loader
from shardfeed.cli.main import main
from shardfeed.errors import FormatError
from shardfeed.format import spec
from shardfeed.format.example import encode_example
from shardfeed.format.writer import ShardWriter
from shardfeed.tools.inspect import inspect
from shardfeed.tools.verify import verify

SRC = Path(__file__).resolve().parents[2] / "src"

_KILLED_PACK = """
import os, signal, sys
from shardfeed.tools.pack import pack

done = []

def stop_hard(path):
    done.append(path)
    if len(done) == 3:  # three complete shards, then the process dies like a crash
        os.kill(os.getpid(), signal.SIGKILL)

pack(sys.argv[1], sys.argv[2], records_per_shard=1, on_shard=stop_hard)
"""


def _photos(folder: Path, per_class: int = 15) -> Path:
    rng = np.random.default_rng(3)
    for name in ("cat", "dog"):
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
            (folder / name / f"{i:02d}.jpg").write_bytes(simplejpeg.encode_jpeg(pixels))
    return folder


def _killed_pack(photos: Path, out: Path) -> None:
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _KILLED_PACK, str(photos), str(out)],
                          env=env, capture_output=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""  # no "ok", no partial report
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_killed_pack_is_refused_by_every_reader_until_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos = _photos(tmp_path / "photos")
    out = tmp_path / "out"
    _killed_pack(photos, out)
    shards = sorted(out.glob("*.tfrecord"))
    assert [p.name for p in shards] == [f"shard-0000{i}-of-00030.tfrecord" for i in range(3)]
    assert not (out / spec.MANIFEST_NAME).exists()

    refused = r"did not finish.*shardfeed pack SOURCE .*out --resume.*allow_partial=True"
    for source in (out, f"{out}/", str(out / "*.tfrecord"), [str(p) for p in shards],
                   str(shards[0])):
        with pytest.raises(FormatError, match=refused):
            Dataset(source)  # type: ignore[arg-type]
    with pytest.raises(FormatError, match=refused):
        Loader(Dataset(out), batch_size=2, shuffle=True, seed=0)
    with pytest.raises(FormatError, match=refused):
        verify(out)
    with pytest.raises(FormatError, match=refused):
        inspect(out)
    for argv in (["verify", str(out), "--no-progress"], ["verify", *map(str, shards)],
                 ["inspect", str(out)], ["shuffle-report", str(out), "--no-progress"],
                 ["bench", str(out), "--seconds", "0.1", "--no-progress"]):
        assert main(argv) == 1, argv
        line = _one_error_line(capsys)
        assert "did not finish" in line and "--resume" in line, line

    # indexing the shards would write a manifest that makes them look whole: refused too
    assert main(["index", str(out), "--no-progress"]) == 1
    line = _one_error_line(capsys)
    assert "did not finish" in line and "--resume" in line, line
    assert not (out / "shardfeed.json").exists()
    with pytest.raises(FormatError, match=refused):
        Dataset(out)

    # the one explicit way to read what is there
    with Dataset(out, allow_partial=True) as partial:
        assert len(partial) == 3
        with pickle.loads(pickle.dumps(partial)) as reopened:  # as process workers get it
            assert len(reopened) == 3

    # finishing the pack as the message says makes the folder a dataset for every reader
    assert main(["pack", str(photos), str(out), "--records-per-shard", "1", "--resume",
                 "--no-progress"]) == 0
    capsys.readouterr()
    with Dataset(out) as ds:
        assert len(ds) == 30 and ds.num_shards == 30
    assert main(["verify", str(out), "--no-progress"]) == 0
    assert "ok: 30 records in 30 shards" in capsys.readouterr().out
    assert inspect(out)["records"] == 30


def _records(n: int, first: int = 0) -> list[bytes]:
    return [encode_example({"index": first + i, "name": f"r{first + i}"}) for i in range(n)]


def _write(path: Path, payloads: list[bytes]) -> None:
    with ShardWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)


def test_folders_written_by_other_tools_open(tmp_path: Path) -> None:
    """TF-named shards (all present, no manifest), Spark part files: no sign of an unfinished
    write, so they open as they are, from the folder, a glob or a list."""
    tf = tmp_path / "tf"
    tf.mkdir()
    for k in range(3):
        _write(tf / f"train-{k:05d}-of-00003", _records(4, 4 * k))
        _write(tf / f"validation-{k:05d}-of-00003", _records(1, 100 + k))
    spark = tmp_path / "spark"
    spark.mkdir()
    _write(spark / "part-r-00000", _records(2))
    _write(spark / "part-r-00001", _records(2, 2))
    (spark / "_SUCCESS").write_bytes(b"")
    for source in (tf, str(tf / "train-*"), [str(tf / "train-00001-of-00003")], spark):
        with Dataset(source) as ds:  # type: ignore[arg-type]
            assert len(ds) > 0
    with Dataset(str(tf / "train-*")) as ds:
        assert [int(r["index"][0]) for r in ds] == list(range(12))
    assert verify(tf).ok and inspect(spark)["records"] == 4


def test_partial_copy_of_tf_named_shards_is_refused(tmp_path: Path) -> None:
    """2 of the 3 shards of train-*-of-00003: a copy or download that stopped part-way."""
    folder = tmp_path / "tf"
    folder.mkdir()
    for k in range(3):
        _write(folder / f"train-{k:05d}-of-00003.tfrecord", _records(4, 4 * k))
    (folder / "train-00002-of-00003.tfrecord").unlink()
    refused = r"no shardfeed\.json and only 2 of the 3 shards named train-NNNNN-of-00003"
    for source in (folder, str(folder / "*.tfrecord"),
                   [str(folder / "train-00000-of-00003.tfrecord")]):
        with pytest.raises(FormatError, match=refused):
            Dataset(source)  # type: ignore[arg-type]
    with pytest.raises(FormatError, match=refused):
        verify(folder)
    with Dataset(folder, allow_partial=True) as ds:
        assert [int(r["index"][0]) for r in ds] == list(range(8))


def test_shard_being_written_is_refused_until_its_writer_closes(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    _write(folder / "a.tfrecord", _records(3))
    writer = ShardWriter(folder / "b.tfrecord")
    writer.write(_records(1)[0])
    assert (folder / "b.tfrecord.tmp").exists()
    with pytest.raises(FormatError, match=r"holds 'b\.tfrecord\.tmp', a shard whose writing"):
        Dataset(folder)
    with pytest.raises(FormatError, match=r"b\.tfrecord\.tmp"):
        Dataset([str(folder / "a.tfrecord")])
    writer.close()
    with Dataset(folder) as ds:
        assert len(ds) == 4


def test_committed_dataset_ignores_leftovers_beside_its_manifest(tmp_path: Path) -> None:
    """The manifest is the commit point: stray files beside it (an old temp file, a shard
    of another run) do not change what the dataset is."""
    photos = _photos(tmp_path / "photos", per_class=2)
    out = tmp_path / "out"
    assert main(["pack", str(photos), str(out), "--records-per-shard", "2",
                 "--no-progress"]) == 0
    shutil.copy(out / "shard-00000-of-00002.tfrecord", out / "stray-00000-of-00009.tfrecord")
    (out / "shard-00001-of-00002.tfrecord.tmp").write_bytes(b"left over")
    with Dataset(out) as ds:
        assert len(ds) == 4 and ds.num_shards == 2
    assert verify(out).ok
