"""One road to object storage: obstore does every operation of s3:// (reads, listings, writes,
renames, removals), so a user with only ``shardfeed[s3]`` installed (no s3fs) packs, opens,
verifies and trains; a Dataset's own storage options reach every read of its files (the
manifest, the indexes, a folder's listing), not its shards only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardfeed import Dataset
from shardfeed.storage.process_state import SETTINGS

pytest.importorskip("obstore")

_SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_user_without_s3fs_packs_opens_verifies_and_trains_on_s3(
        s3_server: Any, tmp_path: Path) -> None:
    """In a fresh process where s3fs and gcsfs cannot be imported: pack to s3:// (the CLI),
    index again, verify, open as a folder and through its manifest, glob, train one epoch,
    then remove the dataset; nothing imports s3fs."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    photos = tmp_path / "photos"
    script = textwrap.dedent(f"""
        import sys
        sys.modules["s3fs"] = None
        sys.modules["gcsfs"] = None
        from pathlib import Path
        import numpy as np, simplejpeg
        rng = np.random.default_rng(3)
        for name in ("cat", "dog"):
            (Path({str(photos)!r}) / name).mkdir(parents=True)
            for i in range(6):
                pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
                (Path({str(photos)!r}) / name / f"{{i}}.jpg").write_bytes(
                    simplejpeg.encode_jpeg(pixels))
        from shardfeed.cli.main import main
        assert main(["pack", {str(photos)!r}, {url!r}, "--records-per-shard", "4",
                     "--no-progress"]) == 0
        assert main(["verify", {url!r}, "--no-progress"]) == 0
        import shardfeed
        from shardfeed.storage import files
        names = files.listdir({url!r})
        assert "shardfeed.json" in names and len(files.glob({url!r} + "/*.tfrecord")) == 3, names
        ds = shardfeed.Dataset({url!r})
        assert len(ds) == 12
        loader = shardfeed.Loader(ds, batch_size=4, shuffle=True, seed=1,
                                  transform=shardfeed.presets.eval(16))
        assert sum(len(b["image"]) for b in loader) == 12
        files.remove_tree({url!r})
        assert not files.exists({url!r})
        assert "s3fs" not in [m for m in sys.modules if sys.modules[m] is not None]
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_datasets_storage_options_reach_every_read_of_its_files(
        s3_server: Any, records_dataset: Callable[[int, int], Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No process-wide options and no endpoint in the environment: the Dataset's own
    ``storage_options`` find the manifest, the indexes and, for a folder without a manifest,
    its listing (they went to the default endpoint before)."""
    with_manifest = s3_server.upload_folder(records_dataset(20, 2))
    folder = s3_server.upload_folder(records_dataset(20, 2), prefix="bare")
    s3_server.filesystem().rm(f"{folder.removeprefix('s3://')}/shardfeed.json")
    own = {"storage_options": s3_server.storage_options(), "retries": 0,
           "deadline_seconds": 5}
    monkeypatch.setattr(SETTINGS, "storage_options", {})
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for url in (with_manifest, folder):
        with Dataset(url, source_options=own) as ds:
            assert [r["name"] for r in ds.read_many(range(20))] == [
                f"r{i}".encode() for i in range(20)]


def test_a_forked_worker_without_s3fs_is_told_to_spawn_and_a_spawned_one_reads(
        s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path) -> None:
    """A store is the process's: a worker forked after obstore ran cannot use obstore, and
    with no s3fs it is told what to do (start workers with spawn or forkserver); a spawned
    worker opens its own store and reads the same records."""
    url = s3_server.upload_folder(records_dataset(20, 2))
    script = textwrap.dedent(f"""
        import sys
        sys.modules["s3fs"] = None
        import multiprocessing
        import shardfeed

        def read(ds, out):
            try:
                out.put([r["name"] for r in ds.read_many([1, 12])])
            except BaseException as exc:
                out.put(f"{{type(exc).__name__}}: {{exc}}")

        if __name__ == "__main__":
            ds = shardfeed.Dataset({url!r})
            assert [r["name"] for r in ds.read_many([1, 12])] == [b"r1", b"r12"]
            for method in ("fork", "spawn"):
                context = multiprocessing.get_context(method)
                out = context.Queue()
                child = context.Process(target=read, args=(ds, out))
                child.start()
                print(method, out.get(timeout=120))
                child.join(timeout=30)
    """)
    path = tmp_path / "workers.py"  # a file: spawned workers import their __main__
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(path)], check=False, capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fork, spawn = done.stdout.strip().splitlines()[-2:]
    assert fork.startswith("fork StorageError") and "'spawn' or" in fork, fork
    assert spawn == "spawn [b'r1', b'r12']", spawn
