"""Pack inputs of the fuzz target: WebDataset tars, NumPy ``.npz`` archives and Parquet files.

::

    corpus/ingest/   samples.tar   3 samples (key.png, key.cls, key.json) as webdataset writes
                     arrays.npz    image (4, 8, 8, 3) uint8 and label (4,) int64, stored
                     rows.parquet  an image-bytes column, a label and a name

A mutated input file is packed with :func:`shardfeed.pack` into a fresh folder and, when the
pack succeeds, the dataset it wrote is read back. Tar mutations rewrite header fields (size,
type, name) and, half of the time, the header's checksum so that the change gets past
``tarfile``'s own check; npz mutations rewrite the ``.npy`` headers inside the archive (shape,
dtype); a Parquet file gets the byte mutations. Only a ShardfeedError may escape.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
import zipfile
from pathlib import Path

import cv2
import numpy as np

FOLDER = "ingest"
FILES = {"tar": "samples.tar", "npz": "arrays.npz", "parquet": "rows.parquet"}

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
    """Write the three seed inputs into ``folder`` (created)."""
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
    """Pack ``path`` into ``out``: True when it packed (the caller then reads it back)."""
    import shardfeed

    shardfeed.pack(path, out, records_per_shard=2)
    return True
