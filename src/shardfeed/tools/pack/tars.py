"""WebDataset tar shards as rows: one row a sample, the members sharing a key.

A member's name splits as WebDataset splits it: the *key* is the name up to the first dot of
its last part, the *type* the rest (``dir/x.rgb.jpg``: key ``dir/x``, type ``rgb.jpg``;
types are compared in lower case). The members of one sample are adjacent in the tar.

=========================  ==================================================================
member                     column of the row
=========================  ==================================================================
the image                  ``image`` (default: the one image member that is not a mask; or
                           the type ``RowFields(image=...)`` names, e.g. ``"rgb.jpg"``)
``seg.*`` / ``mask.*``     ``mask/encoded`` and ``mask/format`` (an image type: the mask)
``cls``                    ``label`` (one whole number as text)
``cls2``, ``index``        their type (whole numbers)
``txt``, ``text``          their type (UTF-8 text)
``json``, ``*.json``       one column a key, ``<type>/<key>`` (``json/weight``; nested
                           objects ``json/a/b``; a null: no column), and the member's
                           bytes as ``<type>`` (:mod:`~shardfeed.tools.pack.tarvalues`):
                           never merged with another member's columns, never an image
any other type             its type, the member's bytes
=========================  ==================================================================

Refused, naming the tar, the member and its offset, with what to do, from its header before
a byte of it is read: a member larger than :func:`member_limit` (a JSON, text or ``.cls``
member: than its own, smaller limit), a member that takes its sample past the limit of one
record (:class:`~shardfeed.tools.pack.limits.IngestLimits`), a link, device or other
non-file member. Refused once read: two members of one type in a sample, a sample whose
members are not adjacent (its key seen again), two image members with no
``RowFields(image=...)``, a member of an image type that is not an image, a ``.cls`` that is
not a whole number, a JSON member that is not a JSON object, a tar cut short or with a
damaged header. Directories,
names without a type and ``__*__`` names (WebDataset's metadata) are not samples' members
and are passed over, as WebDataset does. No message quotes a member's contents.

Plain tars and gzip-, bzip2- and xz-compressed ones (``.tar.gz``, ``.tgz``) are read, as a
stream: nothing of a member is held beyond the member being read.

Determinism: the rows are a function of the tars' bytes and the fields only. Memory: one
sample's members (together at most the limit of one record), and nothing of the members
passed (``tarfile``'s list of members is emptied as it grows).
"""

from __future__ import annotations

import io
import lzma
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.tools.pack.limits import IngestLimits
from shardfeed.tools.pack.rowfields import RowFields
from shardfeed.tools.pack.tarstream import HEADER_BYTES, Guarded, TooLarge, decompressed
from shardfeed.tools.pack.tarvalues import member_columns, value_limit
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
"""Files ``pack`` reads as WebDataset shards."""

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "gif")
"""A member whose type ends in one of these (``png``, ``rgb.jpg``) is an image."""

MASK_PREFIXES = ("seg", "mask")
"""An image member whose type starts with one of these (``seg.png``) is the sample's mask."""

KEY_COLUMN = "__key__"
"""The row's column that holds the sample's key (stored as ``image/filename``)."""

def member_limit(max_pixels: int = DEFAULT_MAX_PIXELS) -> int:
    """The most bytes one tar member may hold: an image of ``max_pixels`` pixels stored
    uncompressed (4 channels of 16 bits: 8 bytes a pixel) and 1 MiB of headers; 1 GiB +
    1 MiB at the default ``max_pixels``. A larger member is refused from its header."""
    return IngestLimits.of(max_pixels).value_bytes


def is_tar(path: str) -> bool:
    """Whether ``path`` names a WebDataset shard (:data:`TAR_SUFFIXES`)."""
    return path.endswith(TAR_SUFFIXES)


def tar_fields(fields: RowFields | None) -> RowFields:
    """The fields of a pack of tars: the sample's key is the record's name
    (``image/filename``) unless ``fields`` names another column."""
    fields = fields or RowFields()
    return fields if fields.name is not None else replace(fields, name=KEY_COLUMN)


def tars_name(paths: Sequence[str]) -> str:
    """The tars in messages: the path of one, the count of several."""
    return paths[0] if len(paths) == 1 else f"{len(paths)} tar files"


def tar_rows(paths: Sequence[str], fields: RowFields | None = None, *,
             max_pixels: int = DEFAULT_MAX_PIXELS) -> Iterator[dict[str, Any]]:
    """The samples of WebDataset tar shards as rows (see the module's table), in the order
    of ``paths`` and of the members in each; PackError naming the tar and member for a bad
    one. ``fields``: the image type and the label columns (default: :func:`tar_fields`)."""
    fields = tar_fields(fields)
    limits = IngestLimits.of(max_pixels)
    for path in paths:
        try:
            with open(path, "rb") as raw, decompressed(raw) as inner:
                guard = Guarded(inner)
                with tarfile.open(fileobj=guard, mode="r:") as tar:  # type: ignore[call-overload]
                    yield from _Reader(path, tar, guard, fields, limits).samples()
        except TooLarge as exc:
            raise PackError(f"'{path}': a header at about byte {exc.at} of the tar claims "
                            f"{exc.size} bytes (over {HEADER_BYTES}); the tar is damaged "
                            "or hostile: re-write it with tarfile or WebDataset's TarWriter"
                            ) from None
        except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise PackError(f"cannot read the tar file '{path}': {_reason(exc)}; check that "
                            "it is a whole tar (re-fetch or re-write it)") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


@dataclass(slots=True)
class _Sample:
    key: str
    members: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)
    size: int = 0  # the members' bytes, from their headers


class _Reader:
    """The members of one tar, gathered into samples and made into rows."""

    def __init__(self, path: str, tar: tarfile.TarFile, guard: Guarded, fields: RowFields,
                 limits: IngestLimits) -> None:
        self.path, self.tar, self.guard, self.fields = path, tar, guard, fields
        self.limits, self.limit, self.max_pixels = limits, limits.value_bytes, limits.max_pixels
        self.done: dict[str, str] = {}  # key -> a member of the finished sample
        self.count = 0  # members read so far

    def where(self, member: tarfile.TarInfo) -> str:
        return f"'{self.path}': member '{member.name}' (header at byte {member.offset})"

    def samples(self) -> Iterator[dict[str, Any]]:
        sample: _Sample | None = None
        for member in self._members():
            key, kind = _split(member.name)
            if sample is not None and key != sample.key:
                yield self._row(sample)
                self.done[sample.key] = next(iter(sample.members.values())).name
                sample = None
            if key in self.done:
                raise PackError(
                    f"{self.where(member)}: sample '{key}' appears again after other "
                    f"samples (its member '{self.done[key]}' came earlier); a WebDataset "
                    "sample's members are adjacent and its key unique in the tar: re-write "
                    "the tar with each sample's members together (e.g. sorted by name)")
            sample = sample or _Sample(key)
            if kind in sample.members:
                raise PackError(
                    f"{self.where(member)}: sample '{key}' has two members of type '{kind}' "
                    f"('{sample.members[kind].name}' and this one); keep one of them, or "
                    "give the other a type of its own (e.g. x.left.png, x.right.png)")
            self._check_size(sample, member, kind)
            sample.members[kind] = member
            sample.data[kind] = self._read(member)
        if sample is not None:
            yield self._row(sample)
        self._check_end()

    def _check_size(self, sample: _Sample, member: tarfile.TarInfo, kind: str) -> None:
        """``member`` within the limit of its type, and its sample within the limit of one
        record with it, from the headers, before a byte of it is read."""
        limit, what = value_limit(kind, self.limits)
        if member.size > limit:
            raise PackError(
                f"{self.where(member)}: its header says {member.size} bytes, over the limit "
                f"of {limit} for {what}; nothing of it was read. Remove it from the tar, or "
                f"store it as another type; {self.limits.raise_it}")
        sample.size += member.size
        if sample.size > self.limits.record_bytes:
            raise PackError(
                f"{self.where(member)}: its header says {member.size} bytes, which takes "
                f"sample '{sample.key}' to {sample.size} bytes ({len(sample.members) + 1} "
                f"members), over the limit of {self.limits.record_bytes} for one record (an "
                f"image of max_pixels={self.max_pixels} pixels with its mask is smaller); "
                f"nothing of it was read. Remove members from the sample; "
                f"{self.limits.raise_it}")

    def _members(self) -> Iterator[tarfile.TarInfo]:
        """The tar's file members that belong to samples, each checked from its header."""
        while True:
            member = self.tar.next()
            if member is None:
                return
            # tarfile keeps every header read (a list it has no public name for): emptied,
            # or a tar of millions of empty members holds them all
            self.tar.members.clear()  # type: ignore[attr-defined]
            self.count += 1
            if member.size > self.limit:
                raise PackError(
                    f"{self.where(member)}: its header says {member.size} bytes, over the "
                    f"limit of {self.limit} for one member (an image of max_pixels="
                    f"{self.max_pixels} pixels, uncompressed, is smaller); nothing of it was "
                    "read. Remove it from the tar, or raise max_pixels (--max-pixels) if it "
                    "is a genuine image that large")
            if member.isdir():
                continue
            if not member.isfile():
                what = ("a symbolic link" if member.issym() else "a hard link"
                        if member.islnk() else "a device or FIFO"
                        if member.isdev() else f"of tar type {member.type!r}")
                raise PackError(
                    f"{self.where(member)}: is {what}, not a file; links are never "
                    "followed: put the file itself in the tar, or remove the member")
            base = member.name.rpartition("/")[2]
            if "." not in base or (base.startswith("__") and base.endswith("__")):
                continue
            yield member

    def _read(self, member: tarfile.TarInfo) -> bytes:
        self.guard.allowed = max(HEADER_BYTES, member.size)
        out = io.BytesIO()  # grown in place and handed over whole: one copy of the member
        try:
            f = self.tar.extractfile(member)
            while f is not None and out.tell() < member.size:
                chunk = f.read(min(HEADER_BYTES, member.size - out.tell()))
                if not chunk:
                    break
                out.write(chunk)
        finally:
            self.guard.allowed = HEADER_BYTES
        data = out.getvalue()
        if len(data) != member.size:
            raise PackError(f"{self.where(member)}: holds {len(data)} of the {member.size} "
                            "bytes its header says; the tar is cut short: re-fetch it")
        return data

    def _check_end(self) -> None:
        """The tar ends with its end-of-archive marker (a zero block), not cut short or
        damaged (``tarfile`` stops quietly at a bad header past the first)."""
        at = self.tar.offset
        self.guard.seek(at)
        block = self.guard.read(tarfile.BLOCKSIZE)
        if block == bytes(tarfile.BLOCKSIZE):
            return
        what = ("ends without its end-of-archive marker (it may be cut short)" if not block
                else "has a damaged member header")
        raise PackError(f"'{self.path}': the tar {what} at byte {at}, after "
                        f"{self.count} member(s); re-fetch or re-write it")

    def _row(self, sample: _Sample) -> dict[str, Any]:
        """The row of one sample: key, image, ``label`` first of the labels, the other
        members' columns in tar order, the mask last; two members giving one column are
        refused."""
        image = self._image_kind(sample)
        mask = self._mask_kind(sample, image)
        row: dict[str, Any] = {KEY_COLUMN: sample.key,
                               self.fields.image: self._image(sample, image)}
        owners = {KEY_COLUMN: "the key", self.fields.image: sample.members[image].name}
        rest: dict[str, Any] = {}
        for kind, data in sample.data.items():
            if kind in (image, mask):
                continue
            member = sample.members[kind]
            for column, value in self._columns(member, kind, data):
                if column in owners:
                    raise PackError(
                        f"{self.where(member)}: gives the column '{column}', which "
                        f"{owners[column]} gives too; give one of the members another "
                        "type, or rename the JSON key")
                owners[column] = f"member '{member.name}'"
                rest[column] = value
        if "label" in rest:
            row["label"] = rest.pop("label")
        row.update(rest)
        if mask is not None:
            data = self._image(sample, mask)
            row[spec.MASK_ENCODED] = data
            row[spec.MASK_FORMAT] = _format(data)
        return row

    def _image_kind(self, sample: _Sample) -> str:
        types = ", ".join(sample.members) or "none"
        named = self.fields.image
        if named != "image":
            if named not in sample.members:
                raise PackError(
                    f"'{self.path}': sample '{sample.key}' has no member of type '{named}' "
                    f"(the image named; its members' types: {types}); a tar sample's image "
                    "is one of its image members: name its type (e.g. --image-column jpg)")
            if not _is_image(named):
                raise PackError(
                    f"{self.where(sample.members[named])}: is named as the image, but "
                    f"'{named}' is not an image type ({', '.join(IMAGE_SUFFIXES)})")
            return named
        found = [k for k in sample.members if _is_image(k) and not _is_mask(k)]
        if not found:
            raise PackError(
                f"'{self.path}': sample '{sample.key}' has no image member (its members' "
                f"types: {types}; image types end in {', '.join(IMAGE_SUFFIXES)}); if its "
                "image comes later in the tar, the sample's members are not adjacent: "
                "re-write the tar with each sample's members together")
        if len(found) > 1:
            a, b = (sample.members[k].name for k in found[:2])
            raise PackError(
                f"'{self.path}': sample '{sample.key}' has two image members, '{a}' and "
                f"'{b}'; name the image by its type: --image-column {found[0]} "
                f"(RowFields(image='{found[0]}')); the other is kept as bytes")
        return found[0]

    def _mask_kind(self, sample: _Sample, image: str) -> str | None:
        masks = [k for k in sample.members if k != image and _is_image(k) and _is_mask(k)]
        if len(masks) > 1:
            a, b = (sample.members[k].name for k in masks[:2])
            raise PackError(f"'{self.path}': sample '{sample.key}' has two masks, '{a}' and "
                            f"'{b}'; keep one (a record holds one mask)")
        return masks[0] if masks else None

    def _image(self, sample: _Sample, kind: str) -> bytes:
        from shardfeed.tools.pack.record import image_shape

        member, data = sample.members[kind], sample.data[kind]
        if _format(data) == "other":
            raise PackError(
                f"{self.where(member)}: its type '{kind}' says image, but its bytes are not "
                "an image shardfeed reads (JPEG, PNG, WebP, BMP, TIFF, GIF, PNM); fix or "
                "remove the member")
        image_shape(data, where=self.where(member), max_pixels=self.max_pixels)
        return data

    def _columns(self, member: tarfile.TarInfo, kind: str,
                 data: bytes) -> Iterator[tuple[str, Any]]:
        return member_columns(kind, data, where=self.where(member), labels=self.fields.labels)


def _split(name: str) -> tuple[str, str]:
    """WebDataset's key and type of a member name: ``a/b.rgb.jpg`` -> ``a/b``, ``rgb.jpg``
    (the type in lower case)."""
    folder, _, base = name.rpartition("/")
    stem, _, kind = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), kind.lower()


def _is_image(kind: str) -> bool:
    return kind.rpartition(".")[2] in IMAGE_SUFFIXES


def _is_mask(kind: str) -> bool:
    return "." in kind and kind.partition(".")[0] in MASK_PREFIXES


def _format(data: bytes) -> str:
    from shardfeed.tools.pack.record import image_format

    return image_format(data)


__all__ = ["IMAGE_SUFFIXES", "KEY_COLUMN", "MASK_PREFIXES", "TAR_SUFFIXES", "is_tar",
           "member_limit", "tar_fields", "tar_rows", "tars_name"]
