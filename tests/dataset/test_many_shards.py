"""Datasets of many shards stay within the process's limit of open file descriptors."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import shardfeed.dataset.dataset as dataset_module
import shardfeed.dataset.open_shards as open_shards_module
from shardfeed import Dataset
from shardfeed.format.example import encode_example
from shardfeed.format.framing import frame
from shardfeed.format.index import write_binary_index, write_text_index


def write_shards(folder: Path, shards: int, per_shard: int = 3) -> Path:
    """``shards`` indexed shards in TF's naming; record i holds ``index = [i]``."""
    folder.mkdir(parents=True, exist_ok=True)
    i = 0
    for k in range(shards):
        records = []
        for _ in range(per_shard):
            records.append(frame(encode_example({"index": [i]})))
            i += 1
        path = folder / f"train-{k:05d}-of-{shards:05d}"
        path.write_bytes(b"".join(records))
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in records])]).astype(np.uint64)
        write_text_index(str(path) + ".idx", offsets)
        write_binary_index(str(path) + ".idx.npy", offsets)
    return folder


def open_in(folder: Path, *, suffix: str = "") -> int:
    """Descriptors of this process open on files of ``folder`` (ending with ``suffix``)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)) and target.endswith(suffix):
            count += 1
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux /proc")
def test_open_shards_are_bounded_and_reads_stay_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(open_shards_module, "MAX_OPEN_LOCAL", 6)
    monkeypatch.setattr(dataset_module, "MAX_MAPPED_INDEXES", 10)
    folder = write_shards(tmp_path / "many", 40)
    order = np.random.default_rng(3).permutation(120)
    seen: list[int] = []
    errors: list[BaseException] = []
    with Dataset(folder) as ds:
        assert ds.num_shards == 40

        def read(part: np.ndarray) -> None:
            try:
                for start in range(0, len(part), 5):
                    idx = part[start:start + 5]
                    got = [int(r["index"][0]) for r in ds.read_many(idx)]
                    assert got == idx.tolist()
                    seen.append(open_in(folder))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=read, args=(p,)) for p in np.array_split(order, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        # 6 idle shards kept open, plus those being read by the 4 threads at that moment
        assert max(seen) <= 6 + 4 * 5
        assert open_in(folder) <= 6
        assert open_in(folder, suffix=".idx.npy") == 0  # 40 indexes > 10: read, not mapped
    assert open_in(folder) == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux /proc")
def test_more_shards_than_the_descriptor_limit(tmp_path: Path) -> None:
    """A process allowed 200 descriptors reads a shuffled epoch of 300 shards."""
    folder = write_shards(tmp_path / "many", 300, per_shard=2)
    code = (
        "import resource, sys\n"
        "import numpy as np\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))\n"
        "from shardfeed import Dataset\n"
        f"with Dataset({str(folder)!r}) as ds:\n"
        "    order = np.random.default_rng(0).permutation(len(ds))\n"
        "    got = [int(r['index'][0]) for r in ds.read_many(order)]\n"
        "    assert got == order.tolist(), 'wrong records'\n"
        "print('ok', len(got))\n"
    )
    # the limit must hold whatever the bound in the library is: keep it below 200 here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code.replace(
            "from shardfeed import Dataset\n",
            "import shardfeed.dataset.open_shards as s\ns.MAX_OPEN_LOCAL = 150\n"
            "from shardfeed import Dataset\n")],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok", "600"]
