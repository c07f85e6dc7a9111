"""Every on-disk constant of shardfeed, in one place.

Record framing (TFRecord, bit-exact with TensorFlow)::

    +----------------+------------------+---------------+------------------+
    | uint64 length  | uint32 masked    | data          | uint32 masked    |
    | little endian  | crc32c(length)   | (length bytes)| crc32c(data)     |
    +----------------+------------------+---------------+------------------+
      8 bytes          4 bytes            length          4 bytes

    masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8   (mod 2**32)

Index files beside each shard ``name.tfrecord``:

- ``name.tfrecord.idx``: text, one line ``offset size`` per record, size including the 16
  framing bytes (the format of DALI's ``tfrecord2idx``);
- ``name.tfrecord.idx.npy``: the n+1 record start offsets (the last is the file size) as a
  NumPy ``uint64`` array, memory-mapped when a dataset is opened (8 bytes a record).
"""

from __future__ import annotations

from typing import Final

# --- record framing -------------------------------------------------------------------------
LENGTH_BYTES: Final = 8
"""Size of the little-endian uint64 record length."""
CRC_BYTES: Final = 4
"""Size of one masked CRC32C."""
HEADER_BYTES: Final = LENGTH_BYTES + CRC_BYTES
"""Bytes before the payload: length + masked CRC of the length."""
FOOTER_BYTES: Final = CRC_BYTES
"""Bytes after the payload: masked CRC of the payload."""
FRAMING_BYTES: Final = HEADER_BYTES + FOOTER_BYTES
"""Framing overhead of one record (16 bytes)."""
CRC_MASK_DELTA: Final = 0xA282EAD8
"""Added to the rotated CRC32C to form the masked CRC (TensorFlow's ``kMaskDelta``)."""
MAX_RECORD_BYTES: Final = 1 << 40
"""Largest payload length accepted when scanning; a larger length means garbage (1 TiB)."""
MAX_FILE_BYTES: Final = (1 << 63) - 1
"""Largest byte offset or size an index or manifest may name (the largest POSIX ``off_t``)."""

# --- compressed-file signatures (refused: byte offsets would be meaningless) -----------------
GZIP_MAGIC: Final = b"\x1f\x8b"
ZLIB_FIRST_BYTE: Final = 0x78
ZLIB_SECOND_BYTES: Final = frozenset({0x01, 0x5E, 0x9C, 0xDA})

# --- file names -----------------------------------------------------------------------------
SHARD_SUFFIX: Final = ".tfrecord"
TEXT_INDEX_SUFFIX: Final = ".idx"
BINARY_INDEX_SUFFIX: Final = ".idx.npy"
TEMP_SUFFIX: Final = ".tmp"
MANIFEST_NAME: Final = "shardfeed.json"
"""A dataset's manifest, written last: the dataset's commit point."""
PACK_PLAN_NAME: Final = ".shardfeed-pack.json"
"""The plan of a pack in progress, saved before its first shard and removed right after the
manifest: a folder that holds it is an unfinished pack (``pack --resume`` finishes it)."""
PARTS_FOLDER: Final = "_parts"
"""Where the tasks of a pack in parts (``pack_ray``, a pack of data) write, removed after the
merge: without a manifest beside it, the folder is an unfinished pack."""
MERGE_JOURNAL_NAME: Final = "merge.json"
"""In the parts folder: the final names a merge renames parts to, saved before the first
rename, so that a rerun removes exactly what an interrupted merge left."""
GROUPS_NAME: Final = "groups.npy"
ORDER_NAME: Final = "order.npy"
FORMAT_VERSION: Final = 1
MAX_MANIFEST_DEPTH: Final = 64

MAX_MANIFEST_BYTES: Final = 256 << 20
"""The largest manifest read (a million shards take some 200 MB): a larger answer is
refused before its body is read."""
"""Deepest nesting of arrays and objects accepted in a manifest (pack writes 4 levels;
``extra`` is free-form JSON)."""
FORMAT_NAME: Final = "shardfeed"

# --- standard feature names -----------------------------------------------------------------
IMAGE_ENCODED: Final = "image/encoded"
IMAGE_FORMAT: Final = "image/format"
IMAGE_FILENAME: Final = "image/filename"
IMAGE_HEIGHT: Final = "image/height"
IMAGE_WIDTH: Final = "image/width"
IMAGE_CHANNELS: Final = "image/channels"
IMAGE_LABEL: Final = "image/class/label"
IMAGE_PATH: Final = "image/path"
IMAGE_RAW: Final = "image/raw"
MASK_ENCODED: Final = "mask/encoded"
MASK_FORMAT: Final = "mask/format"
MASK_RAW: Final = "mask/raw"
MASK_PATH: Final = "mask/path"
MASK_HEIGHT: Final = "mask/height"
MASK_WIDTH: Final = "mask/width"


def text_index_path(shard: str) -> str:
    """The text ``.idx`` path that belongs to ``shard``."""
    return shard + TEXT_INDEX_SUFFIX


def binary_index_path(shard: str) -> str:
    """The binary ``.idx.npy`` path that belongs to ``shard``."""
    return shard + BINARY_INDEX_SUFFIX
