"""Checks of a manifest document and its sidecars, read as untrusted input.

A downloaded dataset's ``shardfeed.json`` may be damaged or hostile. Before anything is
built from it, the document is checked whole, in time and memory linear in its size:

- the text is UTF-8 JSON nested at most :data:`~shardfeed.format.spec.MAX_MANIFEST_DEPTH`
  levels (checked before parsing: a deep document would exhaust the parser's recursion);
- every field has its type (a string where a path or key belongs, an integer where a count
  belongs, never a bool), every number its range (no count past what 64-bit offsets hold);
- each shard's record count fits in its byte size (a record takes at least its 16 framing
  bytes), and the counts add up to the document's ``records``, so a claimed count can
  never reserve memory its files do not back: the shard sizes are checked against the
  files when a dataset is opened, before any per-record allocation.

Sidecars (``groups.npy``, ``order.npy``) are read by :func:`load_sidecar_array`: header
parsed without NumPy's literal evaluator, type and length checked before mapping.

Each failure is a :class:`~shardfeed.errors.FormatError` naming the file and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

import numpy as np

from shardfeed.errors import FormatError
from shardfeed.format import npyfile
from shardfeed.format import spec as S
from shardfeed.format.records_hash import P as RECORDS_HASH_P

Mode = Literal["embedded", "referenced", "raw", "tfrecord"]
"""How a manifest's records hold their images (see :class:`~shardfeed.format.manifest.Manifest`)."""
MODES: tuple[str, ...] = get_args(Mode)

REBUILD = "re-create it with `shardfeed index` or `shardfeed pack --resume`"
MAX_CRC32C = (1 << 32) - 1
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DEPTH_CHUNK = 1 << 20


def parse_document(raw: bytes, *, where: str) -> Any:
    """The JSON value of a manifest's bytes; :class:`FormatError` naming ``where`` if the
    bytes are not UTF-8 JSON of bounded nesting."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"file '{where}' is not UTF-8 text ({exc}); {REBUILD}") from None
    depth = nesting_depth(text)
    if depth > S.MAX_MANIFEST_DEPTH:
        raise FormatError(
            f"file '{where}' nests arrays or objects {depth} levels deep (a manifest has at "
            f"most {S.MAX_MANIFEST_DEPTH}); it is not a shardfeed manifest: {REBUILD}"
        )
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and integers past Python's digit limit
        raise FormatError(f"file '{where}' is not valid JSON ({exc}); {REBUILD}") from None


def nesting_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` outside JSON strings (linear time, memory for
    one chunk); 0 without a scan when the text holds too few brackets to pass
    ``MAX_MANIFEST_DEPTH``. For text that is not JSON the figure is only an upper bound on
    what a parser would reach, which is all a guard needs."""
    if text.count("[") + text.count("{") <= S.MAX_MANIFEST_DEPTH:
        return 0  # cannot be deeper: skip the scan for every real manifest
    bare = _STRING.sub("", text).encode("utf-8", "surrogatepass")
    deepest = level = 0
    for lo in range(0, len(bare), _DEPTH_CHUNK):
        c = np.frombuffer(bare, dtype=np.uint8, count=min(_DEPTH_CHUNK, len(bare) - lo),
                          offset=lo)
        step = ((c == ord("[")) | (c == ord("{"))).astype(np.int32)
        step -= ((c == ord("]")) | (c == ord("}"))).astype(np.int32)
        levels = np.cumsum(step, dtype=np.int64) + level
        if len(levels):
            deepest = max(deepest, int(levels.max()))
            level = int(levels[-1])
    return deepest


class _Fields:
    """Typed access to the fields of one JSON object, failing with the field's name."""

    def __init__(self, data: Mapping[str, Any], *, where: str, prefix: str) -> None:
        self.data, self.where, self.prefix = data, where, prefix

    def fail(self, name: str, problem: str) -> FormatError:
        return FormatError(f"file '{self.where}', field {self.prefix}{name}: {problem}; "
                           f"{REBUILD}")

    def integer(self, name: str, *, low: int, high: int) -> int:
        """A required integer within ``[low, high]`` (a bool is not an integer here)."""
        value = self.data.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"expected an integer, got {_shown(value)}")
        if not low <= value <= high:
            shown = str(value) if value.bit_length() < 256 else f"a {value.bit_length()}-bit number"
            raise self.fail(name, f"{shown} is outside [{low}, {high}]")
        return value

    def optional_integer(self, name: str, *, low: int, high: int) -> int | None:
        """Like :meth:`integer`, but None when absent or null."""
        return None if self.data.get(name) is None else self.integer(name, low=low, high=high)

    def text(self, name: str, *, path: bool = False) -> str | None:
        """An optional string (None when absent or null); ``path``: also non-empty, without
        NUL characters or lone surrogates (which no file system accepts)."""
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {_shown(value)}")
        if path:
            check_path_text(value, lambda problem: self.fail(name, problem))
        return value

    def mapping(self, name: str) -> Mapping[str, Any] | None:
        value = self.data.get(name)
        if value is not None and not isinstance(value, dict):
            raise self.fail(name, f"expected an object, got {_shown(value)}")
        return value


def check_path_text(value: str, fail: Callable[[str], Exception]) -> None:
    """Raise ``fail(problem)`` unless ``value`` can name a file: non-empty, no NUL, valid
    Unicode (no lone surrogates)."""
    if not value:
        raise fail("an empty path")
    if "\x00" in value:
        raise fail(f"a path holding a NUL character ({value!r})")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise fail(f"a path that is not valid Unicode ({value!r})") from None


def _shown(value: object) -> str:
    """A value's type and its first characters, for a message."""
    plain = isinstance(value, (str, float, bool, type(None))) or (
        isinstance(value, int) and value.bit_length() < 256)
    text = json.dumps(value) if plain else ""
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}".rstrip()


def check_document(data: object, *, where: str) -> None:
    """Raise :class:`FormatError` naming ``where`` and the field unless ``data`` is a
    well-formed manifest document of a version this shardfeed reads."""
    if not isinstance(data, dict) or data.get("format") != S.FORMAT_NAME:
        raise FormatError(
            f"file '{where}' is not a shardfeed manifest (no \"format\": "
            f"\"{S.FORMAT_NAME}\"); open the shards as a list or glob instead"
        )
    top = _Fields(data, where=where, prefix="")
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > S.FORMAT_VERSION:
        raise FormatError(
            f"file '{where}' has manifest version {version!r}; this shardfeed reads up to "
            f"version {S.FORMAT_VERSION}: upgrade shardfeed"
        )
    top.integer("version", low=1, high=S.FORMAT_VERSION)
    mode = top.text("mode")
    if mode is not None and mode not in MODES:
        raise top.fail("mode", f"{mode!r} is not one of {', '.join(MODES)}")
    top.text("root", path=True)
    top.text("group_key")
    top.text("order_key")
    top.mapping("extra")
    shards = data.get("shards")
    if not isinstance(shards, list):
        raise top.fail("shards", f"expected a list of shards, got {_shown(shards)}")
    total_records = total_bytes = 0
    for k, shard in enumerate(shards):
        records, size = _check_shard(shard, where=where, prefix=f"shards[{k}].")
        total_records += records
        total_bytes += size
    if total_bytes > S.MAX_FILE_BYTES:
        raise top.fail("shards", f"the shards add up to {total_bytes} bytes, more than "
                                 f"{S.MAX_FILE_BYTES}")
    claimed = top.optional_integer("records", low=0, high=S.MAX_FILE_BYTES)
    if claimed is not None and claimed != total_records:
        raise FormatError(
            f"file '{where}' says {claimed} records but its shards add up to "
            f"{total_records}; re-create it with `shardfeed index`"
        )
    top.mapping("schema")  # its fields: Schema.from_json


def _check_shard(shard: object, *, where: str, prefix: str) -> tuple[int, int]:
    """(records, bytes) of one entry of ``shards``, checked."""
    if not isinstance(shard, dict):
        raise FormatError(f"file '{where}', field {prefix.rstrip('.')}: expected an object "
                          f"with path, records and bytes, got {_shown(shard)}; {REBUILD}")
    fields = _Fields(shard, where=where, prefix=prefix)
    if fields.text("path", path=True) is None:
        raise fields.fail("path", "missing")
    size = fields.integer("bytes", low=0, high=S.MAX_FILE_BYTES)
    records = fields.integer("records", low=0, high=S.MAX_FILE_BYTES)
    if records > size // S.FRAMING_BYTES:
        raise fields.fail(
            "records", f"{records} records cannot fit in the shard's {size} bytes (a record "
            f"takes at least {S.FRAMING_BYTES})"
        )
    fields.optional_integer("crc32c", low=0, high=MAX_CRC32C)
    fields.optional_integer("records_hash", low=0, high=RECORDS_HASH_P - 1)
    return records, size


SIDECAR_DTYPES: dict[str, tuple[str, ...]] = {
    S.GROUPS_NAME: ("<i8",),
    S.ORDER_NAME: ("<f8",),
}
"""The value type of each sidecar (what ``save_sidecars`` writes: int64, float64)."""


def load_sidecar_array(url: str, name: str, *, records: int, data: bytes | None) -> np.ndarray:
    """The checked values of the sidecar ``name`` at ``url``: its own bytes when ``data`` is
    given (remote files), else the local file memory-mapped. Raises :class:`FormatError`
    for a damaged file, a value type other than the sidecar's, or a length other than
    ``records``; ``OSError`` when a local file cannot be opened."""
    fix = "the sidecar is damaged: re-run `shardfeed index` to rebuild it"
    dtypes = SIDECAR_DTYPES[name]
    what = f"a {name} sidecar"
    if data is None:
        arr = npyfile.map_vector(url, dtypes=dtypes, what=what, fix=fix)
    else:
        arr = npyfile.parse_vector(data, path=url, dtypes=dtypes, what=what, fix=fix)
    if arr.shape[0] != records:
        raise FormatError(
            f"file '{url}' has shape {arr.shape} but the dataset has {records} records; the "
            "sidecar is stale: re-run `shardfeed index`"
        )
    return arr
