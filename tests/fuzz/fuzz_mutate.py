"""Deterministic mutations of seed files: bytes, text indexes, .npy files and JSON manifests.

Every mutation draws only from the ``random.Random`` it is given, so an input is a pure
function of ``(seed, input number)`` and any finding replays exactly.
"""

from __future__ import annotations

import json
import random
import struct
import sys
from collections.abc import Callable
from typing import Any

INTERESTING_BYTES = (0x00, 0xFF, 0x7F, 0x80, 0x01, 0x10)
INTERESTING_U64 = (
    0, 1, 15, 16, 17, 0x7F, 0x80, 0xFF, 1 << 16, 1 << 31, 1 << 32, (1 << 32) - 1, 1 << 34,
    1 << 40, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 16,
)
INTERESTING_NUMBERS = (
    0, -1, 1, 15, 16, 2**31, 2**32, 2**34, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**9,
    10**30, -(2**63), 1.5, -0.0, 1e308, 1e-320,
)
INTERESTING_TEXT = (
    # no URLs: the suite reaches no network (remote reading has tests of its own)
    "", "x", "../x", "/nonexistent/x", "a\x00b", "\ud800", ".", "..", "shardfeed.json",
    "uint8", "float64", "O", "raw", "jpeg", "path", "V1000000000", "<u8", "x" * 5000,
)
INTERESTING_TOKENS = (
    b"-1", b"18446744073709551616", b"18446744073709551615", b"9223372036854775808",
    b"4611686018427387904", b"0", b"15", b"16", b"99999999999999999999999", b"1e3", b"0x10",
    b"+5", b"1_0", b"",
)


def bit_flips(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(len(out))
        out[pos] ^= 1 << rng.randrange(8)
    return bytes(out)


def interesting_byte(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return bytes([rng.choice(INTERESTING_BYTES)])
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] = rng.choice(INTERESTING_BYTES)
    return bytes(out)


def interesting_word(rng: random.Random, data: bytes) -> bytes:
    """Overwrite 8, 4 or 2 bytes (a length, CRC, offset or header size) with an extreme value."""
    width, fmt = rng.choice(((8, "<Q"), (4, "<I"), (2, "<H"), (8, ">Q")))
    value = rng.choice(INTERESTING_U64 + (len(data), len(data) + 1, len(data) - 1))
    value %= 1 << (8 * width)
    if len(data) < width:
        return data + struct.pack(fmt, value)
    # aligned positions hit length fields and array items more often
    pos = rng.randrange(0, len(data) - width + 1, width if rng.random() < 0.5 else 1)
    return data[:pos] + struct.pack(fmt, value) + data[pos + width:]


def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[:rng.randrange(len(data) + 1)] if data else data


def duplicate_chunk(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.randint(1, 256))
    at = rng.randrange(len(data) + 1)
    return data[:at] + data[a:b] + data[at:]


def delete_chunk(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    a = rng.randrange(len(data))
    return data[:a] + data[min(len(data), a + rng.randint(1, 256)):]


def insert_random(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.randbytes(rng.randint(1, 32)) + data[at:]


BYTE_MUTATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "bit_flips": bit_flips,
    "interesting_byte": interesting_byte,
    "interesting_word": interesting_word,
    "truncate": truncate,
    "duplicate_chunk": duplicate_chunk,
    "delete_chunk": delete_chunk,
    "insert_random": insert_random,
}


def splice(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """A prefix of ``data`` followed by a suffix of ``other``."""
    return data[:rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1):]


def mutate_text_index(rng: random.Random, data: bytes) -> bytes:
    """Replace a token of a DALI ``offset size`` index, or drop/duplicate/swap a line."""
    lines = data.split(b"\n")
    choice = rng.randrange(4)
    if choice == 0 and lines:
        k = rng.randrange(len(lines))
        tokens = lines[k].split(b" ")
        tokens[rng.randrange(len(tokens))] = rng.choice(INTERESTING_TOKENS)
        lines[k] = b" ".join(tokens)
    elif choice == 1 and lines:
        del lines[rng.randrange(len(lines))]
    elif choice == 2 and lines:
        k = rng.randrange(len(lines))
        lines.insert(rng.randrange(len(lines) + 1), lines[k])
    elif len(lines) > 1:
        a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[a], lines[b] = lines[b], lines[a]
    return b"\n".join(lines)


NPY_HEADER_SWAPS = (
    (b"'<u8'", b"'<i8'"), (b"'<u8'", b"'|O'"), (b"'<u8'", b"'>u8'"), (b"'<u8'", b"'<f8'"),
    (b"'<i8'", b"'<U1'"), (b"'<f8'", b"'|O'"), (b"'<f8'", b"'<f4'"),
    (b"False", b"True"), (b"False", b"((((((((("), (b"'shape': (", b"'shape': (3, "),
    (b"'shape': (", b"'shape': (-1"), (b"'shape': (", b"'shape': (99999999999999999999"),
    (b"'shape': (", b"'shape': ("), (b",)", b")"), (b",)", b", 2)"), (b"{", b"{{"),
    (b"'descr'", b"'descr' "), (b"}", b""), (b"'", b'"'),
)


def mutate_npy(rng: random.Random, data: bytes) -> bytes:
    """Header-aware .npy mutations: header text, version, header length, extreme values."""
    choice = rng.randrange(5)
    if choice == 0:
        old, new = rng.choice(NPY_HEADER_SWAPS)
        return data.replace(old, new, 1)
    if choice == 1 and len(data) > 8:  # format version
        return data[:6] + bytes([rng.choice((0, 1, 2, 3, 4, 255)), rng.choice((0, 1))]) + data[8:]
    if choice == 2 and len(data) > 10:  # header length field
        return data[:8] + struct.pack("<H", rng.choice((0, 1, 100, 118, 65535))) + data[10:]
    if choice == 3 and len(data) >= 136:  # an array item (data starts at 128)
        k = rng.randrange((len(data) - 128) // 8)
        value = rng.choice(INTERESTING_U64)
        return data[:128 + 8 * k] + struct.pack("<Q", value) + data[136 + 8 * k:]
    return interesting_word(rng, data)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and indices) to a node of a JSON value, the root included."""
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for k, item in enumerate(value):
            out.extend(_paths(item, (*prefix, k)))
    return out


class _Deep:
    """Nesting ``depth`` levels deep, written into the document text by :func:`_dump` (the
    encoder itself would run out of recursion)."""

    def __init__(self, depth: int, objects: bool) -> None:
        self.depth, self.objects = depth, objects

    def text(self) -> str:
        if self.objects:
            return '{"a":' * self.depth + "0" + "}" * self.depth
        return "[" * self.depth + "0" + "]" * self.depth


def _deep(rng: random.Random) -> _Deep:
    """Arrays or objects nested 10 to 100,000 levels (beyond any recursion limit)."""
    return _Deep(rng.choice((10, 65, 500, 5000, 100_000)), rng.random() < 0.5)


def _replacement(rng: random.Random) -> Any:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.choice(INTERESTING_NUMBERS)
    if kind == 1:
        return rng.choice(INTERESTING_TEXT)
    if kind == 2:
        return rng.choice((None, True, False, [], {}, [1, 2], {"path": "x"}))
    if kind == 3:
        return float(rng.choice(("nan", "inf", "-inf")))
    if kind == 4:
        return 10 ** rng.choice((20, 400, 5000)) - 1  # past float range, past digit limits
    if kind == 5:
        return _deep(rng)
    if kind == 6:
        return {"path": rng.choice(INTERESTING_TEXT), "records": rng.choice(INTERESTING_NUMBERS),
                "bytes": rng.choice(INTERESTING_NUMBERS)}
    return rng.choice(INTERESTING_NUMBERS[:10])


def _dump(value: Any) -> bytes:
    deep: list[_Deep] = []

    def placeholder(obj: object) -> str:
        if not isinstance(obj, _Deep):
            raise TypeError(type(obj).__name__)
        deep.append(obj)
        return f"@@deep{len(deep) - 1}@@"

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # let huge integers through to the reader
    try:
        text = json.dumps(value, indent=1, default=placeholder)
    finally:
        sys.set_int_max_str_digits(old)
    for k, node in enumerate(deep):
        text = text.replace(f'"@@deep{k}@@"', node.text(), 1)
    return text.encode("utf-8", "surrogatepass")


def _field_paths(doc: Any) -> list[tuple[Any, ...]]:
    """The fields of a manifest a damaged or hostile one is most likely to change."""
    if not isinstance(doc, dict):
        return []
    out: list[tuple[Any, ...]] = [(k,) for k in ("version", "mode", "root", "group_key",
                                                 "order_key", "records")]
    shards = doc.get("shards")
    if isinstance(shards, list):
        out += [("shards", k, f) for k, s in enumerate(shards) if isinstance(s, dict)
                for f in ("path", "records", "bytes", "crc32c")]
    schema = doc.get("schema")
    if isinstance(schema, dict) and isinstance(schema.get("image"), dict):
        out += [("schema", "image", f) for f in ("key", "encoding", "dtype", "height_key")]
    return out


def _near(rng: random.Random, value: Any) -> Any:
    """A value a damaged file might hold instead of ``value``: off by a little or a lot, of
    another type, or a hostile string."""
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.6:
        return rng.choice((value + 1, value - 1, value * 2, value * 16, value // 16, 0, -value,
                           value + (1 << 32), value * 10**9))
    if isinstance(value, str) and rng.random() < 0.5:
        return rng.choice((value + "x", value[:-1], value.upper(), "../" + value,
                           "/" + value, value + "/", value + "\x00"))
    return _replacement(rng)


def mutate_json(rng: random.Random, data: bytes) -> bytes:
    """Replace, delete or duplicate one node of a JSON document, or set a field to another
    type, an extreme number, a hostile string or deep nesting."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # already damaged past parsing
        return bit_flips(rng, data)
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.4 and _field_paths(doc):
            path = rng.choice(_field_paths(doc))
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = _near(rng, parent.get(path[-1]))
            continue
        paths = _paths(doc)
        path = rng.choice(paths)
        if not path:
            doc = _replacement(rng) if rng.random() < 0.1 else doc
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        op = rng.randrange(4)
        if op == 0:
            parent[last] = _replacement(rng)
        elif op == 1:
            del parent[last]
        elif op == 2 and isinstance(parent, list):
            parent.insert(rng.randrange(len(parent) + 1), parent[last])
        elif op == 2:
            parent[f"{last}2"] = parent[last]
        else:  # keep the node, change its type
            value = parent[last]
            parent[last] = [value] if not isinstance(value, list) else {"0": value}
    return _dump(doc)


def _records(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of the whole framed records at the start of ``data`` (lengths trusted
    as far as they stay inside the data)."""
    out = []
    pos = 0
    while pos + 16 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 16 + length
        if end > len(data):
            break
        out.append((pos, end))
        pos = end
    return out


def _framed(payload: bytes, length: int | None = None) -> bytes:
    """One record with valid CRCs; ``length``: the length field to write instead of the
    payload's (its CRC is made to match, so only the framing check can catch it)."""
    from shardfeed.format.crc import masked_crc32c

    head = struct.pack("<Q", len(payload) if length is None else length)
    return (head + struct.pack("<I", masked_crc32c(head)) + payload
            + struct.pack("<I", masked_crc32c(payload)))


def mutate_framing(rng: random.Random, data: bytes) -> bytes:
    """TFRecord-aware: damage a record behind valid CRCs (a wrong length, a changed payload),
    or drop, duplicate or swap whole records."""
    records = _records(data)
    if not records:
        return interesting_word(rng, data)
    k = rng.randrange(len(records))
    a, b = records[k]
    payload = data[a + 12:b - 4]
    op = rng.randrange(5)
    if op == 0:
        length = rng.choice(INTERESTING_U64 + (len(payload) + 1, max(0, len(payload) - 1)))
        new = _framed(payload, length % (1 << 64))
    elif op == 1:
        mutation = rng.choice(sorted(BYTE_MUTATIONS))
        new = _framed(BYTE_MUTATIONS[mutation](rng, payload))
    elif op == 2:
        new = b""
    elif op == 3:
        new = data[a:b] * 2
    else:
        c, d = records[rng.randrange(len(records))]
        new = data[c:d]
    return data[:a] + new + data[b:]


def mutate_example(rng: random.Random, payload: bytes) -> bytes:
    """Example-aware: decode, change feature kinds, counts and names, encode again."""
    from shardfeed.errors import ShardfeedError
    from shardfeed.format.example import decode_example, encode_example

    try:
        features: dict[str, Any] = dict(decode_example(payload))
    except ShardfeedError:
        return bit_flips(rng, payload)
    names = sorted(features)
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(names) if names and rng.random() < 0.8 else rng.choice(
            ("image/height", "image/width", "image/encoded", "label", "\u00e9", "", "a/b"))
        op = rng.randrange(6)
        if op == 0:
            features.pop(name, None)
        elif op == 1:
            features[name] = [rng.choice(INTERESTING_NUMBERS[:10])] * rng.choice((0, 1, 2, 1000))
        elif op == 2:
            features[name] = [rng.random()] * rng.choice((0, 1, 3, 1000))
        elif op == 3:
            features[name] = [rng.randbytes(rng.randint(0, 16))] * rng.choice((0, 1, 2, 50))
        elif op == 4:
            features[name] = rng.randbytes(rng.randint(0, 64))
        else:
            features[name] = rng.choice((-(2**63), 2**63 - 1, 0, -1, 2**31))
    try:
        return encode_example(features)
    except (ValueError, TypeError):  # a value the encoder refuses (an empty list, say)
        return payload
