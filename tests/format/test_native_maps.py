"""Records gathered straight from mapped shards by the compiled part: the same payloads as
the ranged and Python reads, a shard cut short while mapped named, not a crash, and the maps'
pages kept out of the process (dropped past a bound, without the GIL)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardfeed.dataset import Dataset
from shardfeed.format import native
from shardfeed.format.example import encode_example
from shardfeed.format.framing import frame
from tests.format.test_gather_columns import shards_of
from tests.format.test_native import dataset_bytes, without_compiled

WIRE = native.wire


@pytest.mark.parametrize("verify", [True, False])
def test_gathered_reads_equal_ranged_and_python_reads(tmp_path: Path, verify: bool) -> None:
    """Many shards, a shuffled order with repeats: the gather from the maps, the ranged reads
    checked in C, and the Python reads give the same payloads."""
    payloads = [encode_example({"x": os.urandom(i % 300), "i": [i]}) for i in range(700)]
    paths = shards_of(tmp_path, payloads, 97)
    order = np.concatenate([np.random.default_rng(1).permutation(700), [5, 5, 699, 0]])
    with Dataset(paths) as ds:
        ds.verify_crc = verify
        assert ds._shards.can_gather
        gathered = ds.read_payloads(order)
        ds._shards.can_gather = False
        ranged = ds.read_payloads(order)
        slow = without_compiled(ds.read_payloads, order)
    assert gathered == ranged == slow == [payloads[i] for i in order]


def test_gather_takes_only_64_bit_integer_offsets() -> None:
    assert WIRE is not None
    data = frame(b"abc")
    with pytest.raises(TypeError, match="64-bit"):
        WIRE.gather((data,), (np.array([0, len(data)], np.float64),),
                    np.zeros(1, np.int64), np.zeros(1, np.int64), True)
    # offsets past the map, out of order, or a record past the offsets: that position
    assert WIRE.gather((data,), (np.array([0, len(data) + 1], np.uint64),),
                       np.zeros(1, np.int64), np.zeros(1, np.int64), True) == 0
    assert WIRE.gather((data, data), (np.array([0, len(data)], np.uint64),) * 2,
                       np.array([0, 1, 1], np.int64), np.array([0, 0, 1], np.int64), True) == 2
    assert WIRE.gather((data,), (np.array([len(data), 0], np.uint64),),
                       np.zeros(1, np.int64), np.zeros(1, np.int64), True) == 0
    assert WIRE.gather((data,), (np.array([0, len(data)], np.uint64),),
                       np.zeros(1, np.int64), np.zeros(1, np.int64), True) == [b"abc"]


CUT_WHILE_MAPPED = """
import os, sys
import numpy as np
from shardfeed.dataset import Dataset
from shardfeed.errors import CorruptRecordError
from shardfeed.format import native

path = sys.argv[1]
ds = Dataset(path)
everything = ds.read_payloads(range(len(ds)))  # the shard is mapped now
maps = (ds._shards._sources[0].mapping(),)
offsets = (ds._table.offsets_view(0),)
os.truncate(path, os.path.getsize(path) // 2)  # cut short under the map
at = native.wire.gather(maps, offsets, np.zeros(len(ds), np.int64),
                        np.arange(len(ds), dtype=np.int64), True)
print("gather", at)
try:
    ds.read_payloads(range(len(ds)))
except CorruptRecordError as exc:
    print("error", exc)
"""


def cut_in_a_child(tmp_path: Path, script: str) -> tuple[list[bytes], Path, list[str]]:
    """``script`` run in a child process on a shard of 100 records of 5 KB (it cuts the
    shard short under its map): the records, the shard, and the lines it printed; an
    assertion where the child died."""
    payloads = [encode_example({"x": os.urandom(5000), "i": [i]}) for i in range(100)]
    path = dataset_bytes(tmp_path, payloads)
    run = subprocess.run([sys.executable, "-c", script, str(path)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"the reading process died ({run.returncode}): {run.stderr}"
    return payloads, path, run.stdout.splitlines()


def test_a_shard_cut_short_while_mapped_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """Pages a file lost under its map raise SIGBUS when read; the gather catches it and the
    read names the first record the file no longer holds (in a child process: without the
    catch the signal kills the process)."""

    payloads, path, lines = cut_in_a_child(tmp_path, CUT_WHILE_MAPPED)
    first_lost = next(r for r in range(100)
                      if sum(len(p) + 16 for p in payloads[:r + 1]) > path.stat().st_size)
    gathered = int(lines[0].split()[1])
    assert first_lost - 2 <= gathered <= first_lost  # a record on the first lost page
    assert lines[1].startswith("error ") and f"record {first_lost}" in lines[1]
    assert "truncated" in lines[1] and str(path) in lines[1]


def resident_file_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssFile in /proc/self/status")


def test_drop_pages_drops_a_maps_resident_pages_and_keeps_its_bytes(tmp_path: Path) -> None:
    """The compiled drop (which gives the GIL up, where mmap.madvise keeps it) leaves the
    map reading the same bytes, with its pages out of the process; what is not a map that
    starts on a page is refused, not advised."""
    assert WIRE is not None
    data = os.urandom(16 << 20)
    path = tmp_path / "mapped"
    path.write_bytes(data)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        before = resident_file_bytes()
        view = memoryview(m)
        assert sum(view[at] for at in range(0, len(m), 4096)) >= 0  # every page read in
        view.release()
        touched = resident_file_bytes()
        assert touched - before >= 12 << 20
        WIRE.drop_pages(m)
        assert touched - resident_file_bytes() >= 12 << 20
        assert m[:] == data
        WIRE.drop_pages(m)  # nothing resident: still fine
        with pytest.raises(ValueError, match="starts on a page"):
            WIRE.drop_pages(memoryview(m)[1:])
        with open(path, "rb") as f:
            private = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        private[:5] = b"hello"
        with pytest.raises(ValueError, match="read-only"):  # its writes would be lost
            WIRE.drop_pages(private)
        assert private[:5] == b"hello"
        private.close()
        with pytest.raises(TypeError):
            WIRE.drop_pages(12)
    finally:
        m.close()


def test_pages_read_through_maps_do_not_stay_in_the_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read pages of a map count in the process's resident memory: past the bound they are
    dropped, so reading a dataset does not make the process as large as the dataset."""
    from shardfeed.dataset import open_shards

    monkeypatch.setattr(open_shards, "MAPPED_RESIDENT_BYTES", 2 << 20)
    payloads = [encode_example({"x": os.urandom(256 << 10)}) for _ in range(96)]  # 24 MiB
    paths = shards_of(tmp_path, payloads, 24)
    with Dataset(paths) as ds:
        before = resident_file_bytes()
        for first in range(0, 96, 4):
            assert ds.read_payloads(range(first, first + 4)) == payloads[first:first + 4]
        grown = resident_file_bytes() - before
    assert grown < 8 << 20, f"{grown >> 20} MiB of mapped pages stayed resident"


CUT_UNDER_TWO_MODULES = """
import os, sys
import numpy as np
from shardfeed.dataset import Dataset
from shardfeed.format import native
from shardfeed.pipeline import _jpeg_record

path = sys.argv[1]
ds = Dataset(path)
ds.read_payloads(range(len(ds)))  # mapped, and _wire's catch set up
n = len(ds)
maps = (ds._shards._sources[0].mapping(),)
offsets = (ds._table.offsets_view(0),)
one = np.zeros(1, np.int64)

def decode(record):
    return _jpeg_record.decode(maps, offsets, one, np.array([record], np.int64), True,
                               (b"x", b"i"), 2, 0, 1, 1 << 27)

print("before", decode(n - 1))  # its own catch set up (not a JPEG: None)
os.truncate(path, os.path.getsize(path) // 2)  # cut short under the map
for turn in range(2):  # each module's catch, after the other's met a lost page
    print("gather", native.wire.gather(maps, offsets, np.zeros(n, np.int64),
                                       np.arange(n, dtype=np.int64), True))
    print("decode", decode(n - 1))
"""


def test_a_cut_short_map_read_by_two_compiled_modules_is_no_crash(tmp_path: Path) -> None:
    """Each compiled module that reads maps (``_wire``, and those that compile it in) catches
    SIGBUS on its own threads' reads: a lost page met by one, then by the other, then by the
    first again is each time a refusal, never the signal's default (the process killed)."""
    _, _, lines = cut_in_a_child(tmp_path, CUT_UNDER_TWO_MODULES)
    assert lines[0] == "before None"
    assert [line.split()[0] for line in lines[1:]] == ["gather", "decode"] * 2
    assert all(int(line.split()[1]) < 100 for line in lines[1::2])  # the first lost record
    assert all(line == "decode None" for line in lines[2::2])
