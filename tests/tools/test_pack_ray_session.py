"""pack_ray as a user runs it: a driver process of its own that starts a fresh Ray session.

Each scenario is one driver process (``ray.init`` on 2 local CPUs in it): the first pack of a
fresh session must be ordered like every later one, and a driver killed mid-merge (SIGKILL,
at a phase chosen by patching the merge inside that process) must leave a folder every
reader refuses and that a rerun of the same ``pack_ray`` finishes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("ray.data")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from shardfeed import Dataset, Loader, pack
from shardfeed.errors import FormatError
from shardfeed.format.example import decode_example
from shardfeed.tools.pack.partition import PARTS_FOLDER
from shardfeed.tools.pack.rows import RowFields

SRC = Path(__file__).resolve().parents[2] / "src"
FILES, ROWS = 8, 30

_DRIVER = r"""
import os, signal, sys
import ray
from shardfeed.tools.pack import output, partition
from shardfeed.tools.pack.rows import RowFields
from shardfeed.tools.ray import pack_ray

phase, source, *outs = sys.argv[1:]

def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # as a crash or an OOM kill does: no clean-up

if phase == "mid-merge":  # three shards renamed to their final names, five still in _parts/
    rename, moved = partition._move_shard, []

    def move_then_die(src, dst):
        rename(src, dst)
        moved.append(dst)
        if len(moved) == 3:
            die()

    partition._move_shard = move_then_die
elif phase == "before-manifest":  # every shard renamed, the manifest not yet written
    output.write_manifest = lambda *args, **kwargs: die()

def pack_into(out, **options):
    pack_ray(ray.data.read_parquet(source), out, fields=RowFields(labels=["idx"]),
             records_per_shard=30, **options)

ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
         configure_logging=False)
try:
    for out in outs:
        pack_into(out)
    if phase == "then-overwrite":  # a pack over the finished one: refused, then replaced
        try:
            pack_into(outs[-1])
        except Exception as exc:
            print("refused:", type(exc).__name__, exc, flush=True)
        pack_into(outs[-1], overwrite=True)
        print("overwritten", flush=True)
finally:
    ray.shutdown()
"""


def _driver(phase: str, source: Path, *outs: Path) -> subprocess.CompletedProcess[str]:
    """Run a driver that starts its own Ray session; whatever it started is ended after."""
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, phase, str(source),
                             *map(str, outs)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        try:  # a killed driver's session leaves Ray's agents behind: end them
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _parquet(folder: Path) -> list[Path]:
    """8 Parquet files x 30 rows: a small PNG each and an ``idx`` column 0..239."""
    folder.mkdir()
    rng = np.random.default_rng(31)
    paths = []
    for f in range(FILES):
        idx = list(range(f * ROWS, (f + 1) * ROWS))
        images = [bytes(cv2.imencode(".png", rng.integers(0, 256, (5, 7, 3), np.uint8))[1])
                  for _ in idx]
        paths.append(folder / f"part-{f}.parquet")
        pq.write_table(pa.table({"image": images, "idx": idx}), paths[-1])
    return paths


def _records(folder: Path) -> tuple[list[int], list[bytes], str]:
    with Dataset(str(folder)) as ds:
        payloads = ds.read_payloads(range(len(ds)))
        return ([int(decode_example(p)["idx"][0]) for p in payloads], payloads,
                ds.fingerprint)


def _same_stream(a: Path, b: Path) -> None:
    """A loader state saved on the dataset ``a`` restores into one on ``b`` and goes on
    with the same batches."""
    def loader(folder: Path) -> Loader:
        return Loader(Dataset(str(folder)), batch_size=16, seed=5, num_threads=2)

    with loader(a) as first:
        it = iter(first)
        for _ in range(4):
            next(it)
        state = first.state()
        rest = [batch["idx"].tolist() for _, batch in zip(range(6), it)]
    with loader(b) as second:
        second.restore(state)
        assert [batch["idx"].tolist() for _, batch in zip(range(6), second)] == rest


def test_the_first_pack_of_a_fresh_ray_session_is_in_the_rows_order(tmp_path: Path) -> None:
    paths = _parquet(tmp_path / "in")
    # one shard of 240 records here, shards of 30 on Ray: cut elsewhere, the same records
    pack([str(p) for p in paths], tmp_path / "one", fields=RowFields(labels=["idx"]))
    idx, payloads, fingerprint = _records(tmp_path / "one")
    assert idx == list(range(FILES * ROWS))
    assert len(list((tmp_path / "one").glob("*.tfrecord"))) == 1

    run = _driver("all", tmp_path / "in", tmp_path / "first", tmp_path / "later")
    assert run.returncode == 0, run.stderr[-3000:]
    for out in ("first", "later"):  # the first pack of the session, then a later one
        got_idx, got, got_fingerprint = _records(tmp_path / out)
        assert got_idx[::ROWS] == list(range(0, FILES * ROWS, ROWS)), out
        assert got_idx == idx and got == payloads  # the same records, byte for byte
        assert got_fingerprint == fingerprint  # a state saved on either restores on both
        assert len(list((tmp_path / out).glob("*.tfrecord"))) == FILES
    _same_stream(tmp_path / "one", tmp_path / "first")
    _same_stream(tmp_path / "later", tmp_path / "one")


def _killed(phase: str, source: Path, out: Path) -> None:
    """Run a driver killed at ``phase`` of its merge into ``out``; check that every reader
    refuses the folder it left."""
    run = _driver(phase, source, out)
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    assert (out / PARTS_FOLDER).is_dir() and not (out / "shardfeed.json").exists()
    shards = sorted(str(p) for p in out.glob("*.tfrecord"))
    for where in (str(out), str(out / "*.tfrecord"), shards):  # folder, glob, list
        with pytest.raises(FormatError) as refused:
            Dataset(where)
        message = str(refused.value)
        assert f"'{out}'" in message and f"{PARTS_FOLDER}/" in message
        assert "run the same pack again" in message and "glob" not in message


def _finished(out: Path, expected: tuple[list[int], list[bytes], str]) -> None:
    assert _records(out) == expected  # records, order and fingerprint of the one-machine pack
    assert not (out / PARTS_FOLDER).exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("shard-")) == [
        "shardfeed.json"]


def test_a_driver_killed_mid_merge_or_before_its_manifest_leaves_a_refused_folder(
    tmp_path: Path,
) -> None:
    """Two drivers killed (SIGKILL, no clean-up): one after 3 of its 8 renames, one after
    every rename but before the manifest. Every reader refuses both folders; the same
    pack_ray run again (one driver for both) finishes each; a pack over a finished one needs
    overwrite=True, which replaces it."""
    paths = _parquet(tmp_path / "in")
    pack([str(p) for p in paths], tmp_path / "one", fields=RowFields(labels=["idx"]),
         records_per_shard=30)
    expected = _records(tmp_path / "one")
    mid, late = tmp_path / "mid-merge", tmp_path / "before-manifest"
    _killed("mid-merge", tmp_path / "in", mid)
    assert len(list(mid.glob("shard-*.tfrecord"))) == 3  # the others still in _parts/
    _killed("before-manifest", tmp_path / "in", late)
    assert len(list(late.glob("shard-*-of-00008.tfrecord"))) == 8  # every shard renamed
    run = _driver("then-overwrite", tmp_path / "in", mid, late)
    assert run.returncode == 0, run.stderr[-3000:]
    # the rerun finished; a pack over that dataset needs overwrite=True, which replaces it
    refused = [line for line in run.stdout.splitlines() if line.startswith("refused:")]
    assert len(refused) == 1 and "PackError" in refused[0] and "overwrite=True" in refused[0]
    assert "overwritten" in run.stdout
    _finished(mid, expected)
    _finished(late, expected)
