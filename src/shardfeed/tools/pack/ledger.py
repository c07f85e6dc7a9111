"""Pack's ledger of its output folder: which files it wrote there, and which shards it finished.

The plan file ``.shardfeed-pack.json`` is written before the first shard and removed after
the manifest; it is JSON lines::

    {"digest": ..., "options": ..., "shards": [{"name", "records", "digest"}, ...],
     "files": ["shard-00000-of-00002.tfrecord", "...idx", "...idx.npy", "shardfeed.json", ...]}
    {"done": "shard-00000-of-00002.tfrecord", "records": 8, "bytes": 1234, "crc32c": 567}
    {"done": "shard-00001-of-00002.tfrecord", ...}          one line appended a finished shard

The first line is the plan and every file the pack writes into the folder; each later line
records a finished shard's size and whole-file CRC32C (fsynced before the next shard starts),
so ``resume`` can tell a kept shard from one damaged since. A line cut short by a crash is
ignored. The manifest of a completed pack carries the same list (``extra.pack_files``).

Ownership: ``overwrite`` removes exactly the files named by the manifest a pack wrote and by
the plan file, plus temporary files of pack's own naming for them (``NAME.tmp``,
``.NAME.XXXXXXXX.tmp``); everything else in the folder stays. A manifest without
``pack_files`` (written by ``shardfeed index``, or by a pack of an earlier version) owns
nothing. A new pack that would write a file of a name it does not own refuses.

Cost: the plan file is rewritten once a run; a finished shard appends one line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.format.manifest import ShardInfo
from shardfeed.tools.pack.plan import PackPlan

PLAN_NAME = spec.PACK_PLAN_NAME
SKIPPED_NAME = "skipped.csv"
COMMIT_NAMES = (spec.MANIFEST_NAME, spec.GROUPS_NAME, spec.ORDER_NAME, SKIPPED_NAME)
"""The files a pack writes after its shards (the manifest last)."""


def shard_files(name: str) -> tuple[str, str, str]:
    """A shard's file and its two indexes."""
    return (name, spec.text_index_path(name), spec.binary_index_path(name))


def planned_files(plan: PackPlan, commit: Iterable[str]) -> list[str]:
    """Every file a pack of ``plan`` writes: its shards with their indexes, then ``commit``
    (the manifest, and whichever of the sidecars and the skipped list it writes)."""
    names = [f for s in plan.shards for f in shard_files(s.name)]
    return names + [n for n in commit if n not in names]


@dataclass(frozen=True, slots=True)
class Ledger:
    """A plan file read back: the plan document, the files the pack writes, and the shards
    it recorded as finished (name -> ShardInfo with the CRC32C of the whole file)."""

    plan: Mapping[str, Any]
    files: frozenset[str]
    done: Mapping[str, ShardInfo] = field(default_factory=dict)


def ledger_bytes(plan: Mapping[str, Any], files: Iterable[str],
                 done: Iterable[ShardInfo] = ()) -> bytes:
    """The content of a plan file: the plan with ``files``, then one line a finished shard."""
    head = dict(plan)
    head["files"] = sorted(set(files))
    lines = [json.dumps(head, separators=(",", ":"))]
    lines += [_done_line(info) for info in done]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _done_line(info: ShardInfo) -> str:
    return json.dumps({"done": info.path, "records": info.records, "bytes": info.bytes,
                       "crc32c": info.crc32c}, separators=(",", ":"))


def write_ledger(out: str, plan: PackPlan, *, files: Iterable[str],
                 done: Iterable[ShardInfo] = ()) -> None:
    """Write the plan file of ``plan`` into ``out`` (atomically), with the shards in ``done``
    already recorded as finished."""
    from shardfeed.format._fileio import write_bytes_atomic

    write_bytes_atomic(os.path.join(out, PLAN_NAME), ledger_bytes(plan.to_json(), files, done))


def record_done(out: str, info: ShardInfo) -> None:
    """Append one finished shard to the plan file in ``out``, durably."""
    path = os.path.join(out, PLAN_NAME)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(_done_line(info) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def remove_ledger(out: str) -> None:
    """Remove the plan file (the pack is complete)."""
    try:
        os.remove(os.path.join(out, PLAN_NAME))
    except FileNotFoundError:
        pass


def parse_ledger(data: bytes, *, where: str) -> Ledger:
    """Read a plan file's content; raises PackError naming ``where`` when it is not one.

    Plans written before the ledger had lines (one indented JSON document, no ``files``)
    are read too: their shards, with indexes, and the commit files are their files.
    """
    try:
        text = data.decode("utf-8")
        try:
            lines: list[Any] = [json.loads(text)]
        except ValueError:
            lines = [json.loads(text.splitlines()[0])]
            for line in text.splitlines()[1:]:
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    continue  # cut short by a crash: that shard was not recorded
        return _ledger(lines[0], lines[1:])
    except (ValueError, IndexError, TypeError, KeyError, RecursionError) as exc:
        raise PackError(
            f"cannot read the saved plan '{where}' ({type(exc).__name__}: {exc}); pass "
            "--overwrite to start over"
        ) from None


def _ledger(head: Any, rest: Sequence[Any]) -> Ledger:
    if not isinstance(head, dict) or not isinstance(head.get("shards"), list):
        raise TypeError("no list of shards")
    names = [str(s["name"]) for s in head["shards"]]
    if "files" in head:
        files = [str(f) for f in head["files"]]
    else:
        files = [f for n in names for f in shard_files(n)] + list(COMMIT_NAMES)
    done: dict[str, ShardInfo] = {}
    for line in rest:
        if not isinstance(line, dict) or line.get("done") not in names:
            continue
        crc = line.get("crc32c")
        if not isinstance(crc, int) or isinstance(crc, bool):
            continue
        done[str(line["done"])] = ShardInfo(path=str(line["done"]), records=int(line["records"]),
                                            bytes=int(line["bytes"]), crc32c=crc)
    return Ledger(plan=head, files=frozenset(plain_names(files)), done=done)


def plain_names(names: Iterable[str]) -> list[str]:
    """The names that are plain file names inside the folder (no separators, not ``..``), or
    plain names inside an append's version folder (``v2/name``): nothing a record names can
    reach outside its folder."""
    return [n for n in names if _plain(n) or (
        n.count("/") == 1 and _VERSION_FOLDER.match(n.split("/")[0]) and _plain(n.split("/")[1]))]


_VERSION_FOLDER = re.compile(r"^v[1-9][0-9]*(-[0-9a-f]{8})?$")  # local v2/, remote v2-<token>/


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def manifest_files(data: bytes | None) -> list[str]:
    """The files a pack's manifest says that pack wrote (``extra.pack_files``, and the
    manifest itself); nothing for another manifest or one that cannot be read."""
    if data is None:
        return []
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return []
    if not isinstance(doc, dict) or doc.get("format") != spec.FORMAT_NAME:
        return []
    extra = doc.get("extra")
    listed = extra.get("pack_files") if isinstance(extra, dict) else None
    if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
        return []
    return plain_names([*listed, spec.MANIFEST_NAME])


def is_pack_temp(entry: str, names: Collection[str]) -> bool:
    """True for a temporary file of pack's naming for one of ``names``: ``NAME.tmp`` (a shard
    or index being written) or ``.NAME.XXXXXXXX.tmp`` (an atomic write of a small file)."""
    if not entry.endswith(spec.TEMP_SUFFIX):
        return False
    if entry.removesuffix(spec.TEMP_SUFFIX) in names:
        return True
    if entry.startswith("."):
        base, _, rest = entry[1:].rpartition(".")
        head, _, _token = base.rpartition(".")
        return rest == spec.TEMP_SUFFIX[1:] and head in names
    return False


@dataclass(frozen=True, slots=True)
class Ownership:
    """The entries of an output folder split by who wrote them.

    ``owned``: what earlier packs wrote (their manifest and plan file say so) and temporary
    files of pack's naming; ``others``: everything else, which pack never removes;
    ``in_the_way``: entries of ``others`` that a new pack would write over.
    """

    owned: tuple[str, ...]
    others: tuple[str, ...]
    in_the_way: tuple[str, ...]


def ownership(entries: Iterable[str], *, manifest: bytes | None, ledger: Ledger | None,
              planned: Collection[str]) -> Ownership:
    """Split ``entries`` (names in the folder) for a new pack that writes ``planned``."""
    written = set(manifest_files(manifest)) | {PLAN_NAME}
    if ledger is not None:
        written |= ledger.files
    names = written | set(planned) | set(COMMIT_NAMES)
    folders = {name.split("/", 1)[0] for name in written if "/" in name}  # an append's vN/
    owned: list[str] = []
    others: list[str] = []
    for entry in sorted(entries):
        mine = entry in written or entry in folders or is_pack_temp(entry, names)
        (owned if mine else others).append(entry)
    wanted = set(planned) | {PLAN_NAME}
    return Ownership(tuple(owned), tuple(others), tuple(e for e in others if e in wanted))


def owned_files(owned: Iterable[str], listed: Iterable[str]) -> list[str]:
    """The files to remove for the owned entries ``owned`` of a folder: each plain name, and
    for an owned version folder of an append (``v2``) the names under it that ``listed``
    (what the manifest or plan says pack wrote) holds; never the folder itself."""
    names = list(listed)
    out: list[str] = []
    for entry in owned:
        if _VERSION_FOLDER.match(entry):
            out += [n for n in names if n.startswith(f"{entry}/")]
        else:
            out.append(entry)
    return out


def refuse_in_the_way(where: str, found: Ownership) -> None:
    """Raise PackError when a new pack would write over a file no pack wrote."""
    if not found.in_the_way:
        return
    if spec.MANIFEST_NAME in found.in_the_way:
        raise PackError(
            f"output '{where}' holds a {spec.MANIFEST_NAME} that pack did not write (made by "
            "`shardfeed index`, or by an earlier version of pack, which did not record its "
            "files): pack cannot tell which files there are its own and removes none; move "
            "that dataset's files away, or choose an empty folder"
        )
    first = found.in_the_way[0]
    more = len(found.in_the_way) - 1
    also = f" (and {more} more)" if more else ""
    raise PackError(
        f"output '{where}' holds '{first}'{also}, which no earlier pack there wrote, and this "
        "pack would write a file of that name; pack does not overwrite files it did not "
        "write: move it away, choose another --prefix (prefix=), or choose an empty folder"
    )
