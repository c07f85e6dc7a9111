"""Pack inputs of the fuzz target: WebDataset tars, NumPy ``.npz`` archives, Parquet files
and the ``.arrow`` file of a Hugging Face folder.

::

    corpus/ingest/   samples.tar     3 samples (key.png, key.cls, key.json) as webdataset
                                     writes
                     samples.tar.gz  the same samples, gzipped, with a .txt and nested JSON
                     arrays.npz      image (4, 8, 8, 3) uint8 and label (4,) int64, stored
                     rows.parquet    an image-bytes column, a label and a name
    corpus/hf/       data-00000-of-00001.arrow   (built by fuzz_hf)

A mutated input file is packed with :func:`shardfeed.pack` into a fresh folder and, when the
pack succeeds, the dataset it wrote is read back. Tar mutations rewrite header fields (size,
type, name) and, half of the time, the header's checksum so that the change gets past
``tarfile``'s own check; ``.tar.gz`` mutations rewrite a sample as an attacker would (a JSON
bomb: megabytes of numbers, nesting thousands deep, 5,000-digit integers, thousands of keys,
nulls, arrays no feature holds; members that take a sample past one record; text past its
limit); npz mutations rewrite the ``.npy`` headers inside the archive (shape, dtype); Parquet
mutations write hostile files (a dictionary value every row repeats, a list repeating one,
millions of list values, a page over one record, nested and map columns, thousands of
columns); ``.arrow`` mutations write hostile numbers into the stream's buffers (offsets,
lengths) or cut it.

Only a ShardfeedError may escape, and memory stays bounded: every pack runs at
``max_pixels=`` :data:`MAX_PIXELS` (one record: 2.6 MiB, a JSON member 64 KiB) and its peak
resident memory above what the worker held before it (VmHWM, reset first) must stay within
256 MiB and one record (:data:`BOUND_BYTES`; an :class:`AssertionError` is a finding).
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import random
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from shardfeed.tools.pack.limits import IngestLimits

FOLDER = "ingest"
FILES = {"tar": "samples.tar", "targz": "samples.tar.gz", "npz": "arrays.npz",
         "parquet": "rows.parquet"}
MAX_PIXELS = 1 << 16
"""The pixel limit every pack of the target runs at (the seeds' images are 8×8): small
limits, so that a bomb over them is cheap to make."""
LIMITS = IngestLimits.of(MAX_PIXELS)
BOUND_BYTES = (256 << 20) + LIMITS.record_bytes
"""The most a pack's peak memory may grow by."""

TAR_SIZES = (0, 1, 511, 512, 513, 1 << 20, 1 << 33, 10 << 30, (1 << 33) - 1)
TAR_TYPES = (b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"g", b"x", b"L", b"K", b"\x00")
TAR_NAMES = (b"../up.png", b"/etc/hostname", b"a.png", b"a.json", b"a.cls", b"a.seg.png",
             b"a", b".png", b"a.b.c.jpg", b"b.png", b"x/../../y.png", b"a.txt")
NPY_SWAPS = (
    (b"(4, 8, 8, 3)", b"(4096, 4096, 4096, 3)"), (b"(4, 8, 8, 3)", b"(5, 8, 8, 3)"),
    (b"(4, 8, 8, 3)", b"(4, 8, 8)"), (b"(4, 8, 8, 3)", b"(-4, 8, 8, 3)"),
    (b"(4, 8, 8, 3)", b"()"), (b"(4,)", b"(3,)"), (b"(4,)", b"(1099511627776,)"),
    (b"'|u1'", b"'|O'"), (b"'|u1'", b"'<f8'"), (b"'<i8'", b"'<U9'"),
    (b"'fortran_order': False", b"'fortran_order': True"), (b"'descr'", b"'dtype'"),
)


def build(folder: Path) -> None:
    """Write the four seed inputs into ``folder`` (created)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(4, 8, 8, 3), dtype=np.uint8)
    labels = np.arange(4, dtype=np.int64)
    pngs = [cv2.imencode(".png", im)[1].tobytes() for im in images]
    with tarfile.open(folder / FILES["tar"], "w", format=tarfile.USTAR_FORMAT) as tar:
        for k in range(3):
            for suffix, data in (("png", pngs[k]), ("cls", str(k).encode()),
                                 ("json", json.dumps({"caption": f"c{k}"}).encode())):
                info = tarfile.TarInfo(f"s{k:03d}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (folder / FILES["targz"]).write_bytes(_tar_gz([
        (f"s{k:03d}.{suffix}", data) for k in range(3) for suffix, data in (
            ("jpg", cv2.imencode(".jpg", images[k])[1].tobytes()), ("txt", b"a caption"),
            ("json", json.dumps({"w": 8, "opt": None if k else "x", "meta": {"h": k},
                                 "box": [[0, 0, 4, 4]], "tags": ["a", "b"]}).encode()))]))
    np.savez(folder / FILES["npz"], image=images, label=labels)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image": pngs, "label": labels, "name": [f"r{k}" for k in range(4)]})
    pq.write_table(table, folder / FILES["parquet"])


def _checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)


def mutate_tar(rng: random.Random, data: bytes) -> bytes:
    """One header of the tar rewritten: its size, type flag or name (checksum fixed or not)."""
    headers = [off for off in range(0, len(data) - 511, 512)
               if data[off + 257:off + 262] == b"ustar"]
    if not headers:
        return data
    off = rng.choice(headers)
    block = bytearray(data[off:off + 512])
    field = rng.randrange(3)
    if field == 0:
        size = rng.choice(TAR_SIZES)
        block[124:136] = (b"%011o\x00" % size) if size < 8**11 else (
            b"\x80" + size.to_bytes(11, "big"))
    elif field == 1:
        block[156:157] = rng.choice(TAR_TYPES)
        block[157:257] = rng.choice(TAR_NAMES).ljust(100, b"\x00")  # a link's target
    else:
        block[0:100] = rng.choice(TAR_NAMES).ljust(100, b"\x00")
    if rng.random() < 0.5:
        _checksum(block)
    return data[:off] + bytes(block) + data[off + 512:]


def mutate_npz(rng: random.Random, data: bytes) -> bytes:
    """An ``.npy`` header inside the archive rewritten: in place in the stored bytes (the
    member's CRC and sizes then disagree), or half of the time in a member that is written
    into a new, sound archive."""
    old, new = rng.choice(NPY_SWAPS)
    if rng.random() < 0.5:
        return data.replace(old, new, 1)
    out = io.BytesIO()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
            for info in src.infolist():  # the member's own time: the same bytes every run
                member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                dst.writestr(member, src.read(info).replace(old, new, 1))
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
        return data.replace(old, new, 1)
    return out.getvalue()


def pack(path: Path, out: Path) -> bool:
    """Pack ``path`` into ``out``: True when it packed (the caller then reads it back); an
    AssertionError when its peak memory grew past :data:`BOUND_BYTES`."""
    import shardfeed

    bounded(lambda: shardfeed.pack(path, out, records_per_shard=2, max_pixels=MAX_PIXELS))
    return True


def pack_saved(folder: Path, data: bytes, out: Path) -> bool:
    """Write ``data`` as the ``.arrow`` file of the Hugging Face folder ``folder`` and pack
    the folder into ``out``, as :func:`pack`."""
    import fuzz_hf

    (folder / fuzz_hf.DATA).write_bytes(data)
    return pack(folder, out)


# -- memory -----------------------------------------------------------------------------------


def _status(key: str) -> int:
    """A figure of /proc/self/status, in bytes (0 where there is none)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(key):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


def bounded(fn: Callable[[], Any]) -> None:
    """Run ``fn``; AssertionError when the process's peak resident memory grew by more than
    :data:`BOUND_BYTES` while it ran (the peak reset first, where Linux allows)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM := VmRSS
    except OSError:
        fn()  # no way to measure here: the worker's address-space limit still holds
        return
    before = _status("VmRSS:")
    try:
        fn()
    finally:
        grown = _status("VmHWM:") - before
        if grown > BOUND_BYTES:
            raise AssertionError(f"pack's peak memory grew by {grown >> 20} MiB, over "
                                 f"{BOUND_BYTES >> 20} MiB (256 MiB and one record)")


# -- hostile .tar.gz samples --------------------------------------------------------------------


def _tar_gz(members: Sequence[tuple[str, bytes | int]]) -> bytes:
    """A .tar.gz of ``members``: bytes, or a count of zero bytes (gzip members one after
    another are one gzip stream, so a run of zeros is compressed once and repeated)."""
    parts = []
    for name, data in members:
        info = tarfile.TarInfo(name)
        info.size = data if isinstance(data, int) else len(data)
        head = info.tobuf(tarfile.GNU_FORMAT)
        if isinstance(data, int):
            parts += [_gzip(head), _gzip_zeros(data), _gzip(bytes(-data % tarfile.BLOCKSIZE))]
        else:
            parts.append(_gzip(head + data + bytes(-len(data) % tarfile.BLOCKSIZE)))
    parts.append(_gzip(bytes(2 * tarfile.BLOCKSIZE)))
    return b"".join(parts)


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1, mtime=0)


@functools.lru_cache(maxsize=8)
def _gzip_zeros(size: int) -> bytes:
    return _gzip(bytes(size))


_MUTATED_BYTES = 32 << 20  # the most of a mutated tar read back to mutate it again


def _members(data: bytes) -> list[tuple[str, bytes]] | None:
    """The members of a (gzipped) tar, or None when it does not read as one (or holds more
    than the mutations ever put in one)."""
    try:
        if data[:2] == b"\x1f\x8b":
            inflate = zlib.decompressobj(31)
            data = inflate.decompress(data, _MUTATED_BYTES)
            if inflate.unconsumed_tail:
                return None
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            found = []
            for info in tar:
                if info.size > _MUTATED_BYTES:
                    return None
                f = tar.extractfile(info) if info.isfile() else None
                found.append((info.name, f.read() if f is not None else b""))
            return found
    except (OSError, EOFError, tarfile.TarError, ValueError, zlib.error):
        return None


def _numbers(count: int) -> bytes:
    return b'{"v": [' + b"0," * count + b'0]}'


JSON_BOMBS: tuple[Callable[[], bytes], ...] = (
    lambda: _numbers(30_000),                       # 60 KB: under the 64 KiB limit
    lambda: _numbers(40_000),                       # over it
    lambda: _numbers(400_000),                      # 800 KB
    lambda: _numbers(10_000_000),                   # 20 MB: past 256 MiB if it were parsed
    lambda: b'{"v": [' + b"[]," * 21_000 + b"[]]}",  # 63 KB of lists: 21 times as objects
    lambda: b"[" * 100_000 + b"]" * 100_000,
    lambda: b'{"a": ' * 5_000 + b"1" + b"}" * 5_000,
    lambda: b'{"v": ' + b"[" * 33 + b"1" + b"]" * 33 + b"}",
    lambda: b'{"n": ' + b"7" * 5_000 + b"}",
    lambda: b'{"n": -' + b"9" * 4_300 + b', "m": ' + b"1" * 4_301 + b"}",
    lambda: b'{"n": 1e999999, "m": -1e-999999, "x": NaN, "y": -Infinity}',
    lambda: json.dumps({f"k{i}": i for i in range(5_000)}).encode(),
    lambda: json.dumps({"a": [[1, 2], [3]], "b": [{"c": None}], "c": None, "d": {"e": None},
                        "f": [1, "x"], "g": [None], "h": 2**70, "i": [2**64], "j": []}).encode(),
    lambda: b'{"a/b": 1, "a": {"b": 2}}',
    lambda: b'{"box": [[1, 2]], "box/shape": 3}',
    lambda: b'{"x": "\\ud800", "y": "\xff\xfe"}',
    lambda: b'{"": {"": {"": null}}, "k": true}',
    lambda: b"null",
    lambda: b'{"x": 1} trailing',
)
SAMPLE_BOMBS: tuple[Callable[[str], list[tuple[str, bytes | int]]], ...] = (
    lambda key: [(f"{key}.b{j}", 1_400_000) for j in range(3)],  # past one record
    lambda key: [(f"{key}.b{j}", 1_400_000) for j in range(200)],  # 280 MB, past 256 MiB
    lambda key: [(f"{key}.big", LIMITS.value_bytes + 1)],  # past one value
    lambda key: [(f"{key}.text", b"x" * (LIMITS.value_bytes // 8 + 1))],  # past its limit
    lambda key: [(f"{key}.cls2", b"7" * 5_000)],
    lambda key: [(f"{key}.seg.png", bytes(8) + b"no image")],
)


def mutate_targz(rng: random.Random, data: bytes) -> bytes:
    """A sample of the ``.tar.gz`` given a JSON bomb or a hostile member (see the module
    docstring); unchanged when the input no longer reads as a tar."""
    found = _members(data)
    if not found:
        return data
    members: list[tuple[str, bytes | int]] = list(found)
    key = rng.choice(sorted({name.partition(".")[0] for name, _ in members}))
    if rng.random() < 0.65:
        body = rng.choice(JSON_BOMBS)()
        members = [(n, body if n.partition(".")[0] == key and n.endswith(".json") else b)
                   for n, b in members]
    else:
        at = max(i for i, (n, _) in enumerate(members) if n.partition(".")[0] == key)
        members[at + 1:at + 1] = rng.choice(SAMPLE_BOMBS)(key)
    return _tar_gz(members)


# -- hostile Parquet files ------------------------------------------------------------------


def _repeated(value: bytes, count: int) -> Any:
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, np.int32)),
                                          pa.array([value], pa.binary()))


def _parquet_table(rng: random.Random, pngs: list[bytes]) -> Any:
    """One hostile table (each a few KB as Parquet; one whose values repeat a dictionary
    value is written with dictionaries, as pyarrow would write each repeat otherwise)."""
    import pyarrow as pa

    rows = len(pngs)
    images = pa.array(pngs, pa.binary())
    labels = pa.array(np.arange(rows, dtype=np.int64))
    kind = rng.randrange(8)
    size = rng.choice((100_000, 1_000_000, LIMITS.record_bytes + 1))
    if kind == 0:  # the image column: one value every one of many rows repeats
        count = rng.choice((10, 1_000, 20_000))
        return pa.table({"image": _repeated(bytes(size), count),
                         "label": pa.array(np.arange(count, dtype=np.int64))})
    if kind == 1:  # a list repeating a dictionary value (pyarrow writes it from the values)
        count = rng.choice((3, 40))
        tags = pa.ListArray.from_arrays(pa.array([0] * rows + [count], pa.int32()),
                                        _repeated(bytes(size), count))
        return pa.table({"image": images, "label": labels, "tags": tags})
    if kind == 2:  # millions of list values in one row
        count = rng.choice((100_000, 1_000_000, 4_000_000))
        values = pa.array(np.zeros(count, np.int64))
        offsets = pa.array([0] * rows + [count], pa.int32())
        return pa.table({"image": images, "v": pa.ListArray.from_arrays(offsets, values)})
    if kind == 3:  # a plain page over one value, or over one record
        return pa.table({"image": images, "blob": pa.array(
            [b""] * (rows - 1) + [bytes(size)], pa.large_binary())})
    if kind == 4:  # nested lists of structs, and a map
        inner = pa.array([[{"a": b"x" * 10, "b": [1, 2]}] * 3] * rows)
        mapped = pa.array([[("k", b"v" * 100)]] * rows, pa.map_(pa.string(), pa.binary()))
        return pa.table({"image": images, "nested": inner, "m": mapped})
    if kind == 5:  # thousands of columns
        columns = {f"c{i}": pa.array([i] * rows) for i in range(2_000)}
        return pa.table({"image": images, **columns})
    if kind == 6:  # a column of nulls and an image of nulls
        return pa.table({"image": pa.array([None] * rows, pa.binary()),
                         "n": pa.nulls(rows)})
    return pa.table({"image": images, "label": labels,  # fixed-size lists and decimals
                     "f": pa.array([[1.0, 2.0]] * rows, pa.list_(pa.float64(), 2)),
                     "d": pa.array([1] * rows, pa.decimal128(10, 2))})


def mutate_parquet(rng: random.Random, data: bytes) -> bytes:
    """A hostile Parquet file (see :func:`_parquet_table`; ``data`` is not read: a file
    mutated before may be a bomb itself), its images those of the seed, written with options
    drawn too (dictionaries or not, page versions, row group sizes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _parquet_table(rng, _seed_pngs()[:rng.choice((1, 4))])
    repeats = any(pa.types.is_dictionary(t) or (pa.types.is_list(t) and pa.types.is_dictionary(
        t.value_type)) for t in table.schema.types)
    out = io.BytesIO()
    groups = rng.choice((2, 1 << 20)) if table.num_rows <= 10 else 1 << 20
    pq.write_table(table, out, compression=rng.choice(("zstd", "snappy", "none", "gzip")),
                   use_dictionary=repeats or rng.random() < 0.7, row_group_size=groups,
                   data_page_version=rng.choice(("1.0", "2.0")))
    return out.getvalue()


def _seed_pngs() -> list[bytes]:
    """The seed Parquet file's images (as :func:`build` makes them)."""
    images = np.random.default_rng(0).integers(0, 256, size=(4, 8, 8, 3), dtype=np.uint8)
    return [cv2.imencode(".png", im)[1].tobytes() for im in images]


# -- damaged .arrow files -------------------------------------------------------------------


def _bodies(data: bytes) -> list[tuple[int, int]]:
    """Where the record batches' bodies lie in an Arrow IPC stream (none when it does not
    read as one)."""
    import pyarrow as pa

    found = []
    try:
        stream = pa.BufferReader(data)
        while True:
            message = pa.ipc.read_message(stream)
            end = stream.tell()
            if message.body is not None and message.body.size:
                found.append((end - message.body.size, end))
    except (pa.ArrowException, OSError, ValueError, StopIteration, EOFError):
        pass
    return found

ARROW_NUMBERS = (-1, 0, 1, 7, 1 << 30, (1 << 31) - 1, -(1 << 31), 1 << 40)


def mutate_arrow(rng: random.Random, data: bytes) -> bytes:
    """A Hugging Face ``.arrow`` stream with a hostile number written into it (an offset, a
    length, a buffer's place: int32 or int64, 8-byte aligned as Arrow lays them out), a run
    of bytes set, or cut short."""
    if len(data) < 16:
        return data
    out = bytearray(data)
    roll = rng.random()
    bodies = _bodies(data)
    if roll < 0.6:  # mostly in a record batch's body: offsets, lengths, validity, values
        start, end = rng.choice(bodies) if bodies and rng.random() < 0.8 else (0, len(out))
        at = (start + rng.randrange(max(1, end - start - 8))) & ~3
        width = rng.choice((4, 8))
        value = rng.choice(ARROW_NUMBERS) % (1 << 8 * width)  # as two's complement
        out[at:at + width] = value.to_bytes(width, "little")
    elif roll < 0.8:
        at = rng.randrange(len(out))
        out[at:at + rng.choice((1, 4, 64))] = bytes([rng.choice((0x00, 0xFF, 0x80))]) * 64
        out = out[:len(data)]
    else:
        del out[rng.randrange(8, len(out)):]
    return bytes(out)
