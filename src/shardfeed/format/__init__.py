"""format layer: TFRecord framing, CRC32C, index files, the Example codec, schema, manifest,
and the shard writer. Every on-disk constant is in :mod:`shardfeed.format.spec`."""

from shardfeed.format.crc import crc32c, masked_crc32c
from shardfeed.format.example import FeatureSpec, decode_example, encode_example, example_kinds
from shardfeed.format.framing import frame, scan, unframe, unframe_bytes
from shardfeed.format.index import (
    load_binary_index,
    read_text_index,
    write_binary_index,
    write_text_index,
)
from shardfeed.format.manifest import Manifest, ShardInfo
from shardfeed.format.schema import FeatureInfo, ImageInfo, Schema, infer_schema
from shardfeed.format.writer import ShardWriter

__all__ = [
    "FeatureInfo",
    "FeatureSpec",
    "ImageInfo",
    "Manifest",
    "Schema",
    "ShardInfo",
    "ShardWriter",
    "crc32c",
    "decode_example",
    "encode_example",
    "example_kinds",
    "frame",
    "infer_schema",
    "load_binary_index",
    "masked_crc32c",
    "read_text_index",
    "scan",
    "unframe",
    "unframe_bytes",
    "write_binary_index",
    "write_text_index",
]
