"""Keep the paths a dataset names inside the dataset.

A dataset names paths of its own: its manifest names shard files and an image root, its
records name referenced images. A downloaded dataset is untrusted input, so by default each
such path must resolve inside a trusted ``base`` (the dataset folder, the folder that holds
it, or the image root)::

    base = data/packed              named               resolves to         verdict
                                    train-0.tfrecord    data/packed/train-0 inside: read
                                    ../secret           data/secret         outside: refused
                                    ../packed-old/x     data/packed-old/x   a sibling: refused
                                    /etc/passwd         /etc/passwd         outside: refused
                                    http://host/x       (a request)         other scheme: refused
                                    link -> /home/u     /home/u             symlink out: refused

On object storage the base is a bucket and prefix (``s3://bucket/ds``): a path must stay
under that prefix, with the same scheme. Paths are compared name by name, never as text
(``data/packed-old`` starts like ``data/packed`` and lies outside it). Local paths are
checked twice: as written (``..`` steps applied) and as the file system resolves them
(symbolic links followed, the base's own too), so a link inside the dataset cannot lead out
of it. A path holding a NUL byte is refused always.

Datasets meant to reference files elsewhere (images on a shared mount, shards indexed
where they lie) open with the explicit opt-in ``allow_outside_paths=True`` (CLI:
``--allow-outside-paths``); a root the user passes (``Dataset(..., root=...)``) is trusted,
the paths under it are still confined to it. :class:`UnconfinedRoot` carries that opt-in
from a dataset to the transforms that read its referenced images.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from urllib.parse import unquote

from shardfeed.errors import UnsafePathError
from shardfeed.storage.process_state import PROCESS, REAL_FOLDERS

OPT_IN = (
    "open it with allow_outside_paths=True (on the command line: --allow-outside-paths)"
)
"""What every refusal says a user who trusts the dataset can do."""


class UnconfinedRoot(str):
    """A root of referenced images whose paths may lead outside it.

    A plain ``str`` root confines the paths under it (:func:`contained`); a dataset opened
    with ``allow_outside_paths=True`` hands its transforms its root as this type instead.
    """

    __slots__ = ()


def confines(root: str | None) -> bool:
    """False for an :class:`UnconfinedRoot` (the opt-in), True for any other root."""
    return not isinstance(root, UnconfinedRoot)


def _scheme(url: str) -> str | None:
    head, sep, _rest = url.partition("://")
    return head.lower() if sep and head and "/" not in head else None


def _local_text(path: str) -> str:
    return path.removeprefix("file://")


def join_named(base: str, path: str) -> str:
    """Where ``path`` as a dataset names it points, relative to ``base`` (no check).

    A URL stays as it is (a ``file://`` URL under a local base becomes its path); a local
    path is joined to ``base`` (unless absolute) and normalised: ``..`` steps are applied to
    the text, so the file read is the one :func:`contained` checked, whatever links lie on
    the way.
    """
    scheme = _scheme(path)
    local_base = _scheme(base) in (None, "file")
    if scheme is not None and not (scheme == "file" and local_base):
        return path
    if not local_base:
        joined = posixpath.join(base, path)
        if ".." not in path.replace("\\", "/").split("/"):
            return joined
        base_scheme, _, rest = joined.partition("://")
        return f"{base_scheme}://{posixpath.normpath(rest)}"
    return os.path.normpath(os.path.join(_local_text(base), _local_text(path)))


def _remote_key(rest: str) -> str:
    """A URL's path as servers may read it: percent-escapes decoded, ``\\`` as ``/``,
    ``..`` applied."""
    return posixpath.normpath(unquote(rest).replace("\\", "/")).lstrip("/")


def _under(parent: str, child: str, sep: str) -> bool:
    """True when ``child`` is ``parent`` or lies below it, compared name by name, never as
    text: ``/data/imgs-private`` is not under ``/data/imgs`` (a sibling whose name starts
    the same). Both are normalised (``..`` applied); an empty ``parent`` holds everything."""
    top = [name for name in parent.split(sep) if name]
    return [name for name in child.split(sep) if name][:len(top)] == top


def _remote_reason(base: str, path: str) -> str | None:
    base_scheme = _scheme(base)
    scheme = _scheme(path)
    if scheme is None:
        if path.startswith(("/", "\\")) or os.path.isabs(path):
            return f"is a path on this machine, and the dataset is on object storage ('{base}')"
        scheme, rest = base_scheme, posixpath.join(base.partition("://")[2], path)
    else:
        rest = path.partition("://")[2]
    if scheme != base_scheme:
        return f"is on other storage ({scheme}://) than the dataset ('{base}')"
    if not _under(_remote_key(base.partition("://")[2]), _remote_key(rest), "/"):
        return f"leads out of '{base}'"
    return None


def _real_folder(folder: str) -> str:
    """``os.path.realpath`` of a folder, once a process (resolving costs an ``lstat`` a
    component: more than reading a small image; past :data:`REAL_FOLDERS` folders, the
    first kept is dropped, and resolved again when next met). Links are taken as they were when a folder was first seen: a dataset
    is not rewritten under a reader by the hostile party whose download it is, and whoever
    can rewrite it could write the files themselves."""
    with PROCESS.lock:
        found = PROCESS.real_folders.get(folder)
    if found is None:
        resolved = os.path.realpath(folder)
        with PROCESS.lock:
            if len(PROCESS.real_folders) >= REAL_FOLDERS:
                del PROCESS.real_folders[next(iter(PROCESS.real_folders))]
            found = PROCESS.real_folders.setdefault(folder, resolved)
    return found


def _real(path: str) -> str:
    """``os.path.realpath(path)`` of an absolute, normalised path: its folder's resolved path
    (cached) and one ``lstat`` of the name unless the name is itself a link."""
    if os.path.islink(path):
        return os.path.realpath(path)
    folder, name = os.path.split(path)
    return os.path.join(_real_folder(folder), name) if name else _real_folder(folder)


def _local_reason(base: str, path: str) -> str | None:
    scheme = _scheme(path)
    if scheme not in (None, "file"):
        return f"is a URL ({scheme}://), and the dataset is on this machine ('{base}')"
    top = os.path.abspath(_local_text(base))
    target = os.path.abspath(join_named(top, _local_text(path)))
    if not _under(top, target, os.sep):
        return f"leads out of '{base}'"
    real_top = _real_folder(top)
    real = _real(target)
    if not _under(real_top, real, os.sep):
        return f"leads out of '{base}' through a symbolic link (to '{real}')"
    return None


def _show(path: str) -> str:
    """``path`` for a message: control characters escaped."""
    return path.encode("unicode_escape", "backslashreplace").decode("ascii") \
        if any(ord(c) < 32 or 0xD800 <= ord(c) < 0xE000 for c in path) else path


def _check(
    base: str, path: str, *, where: str, what: str, allow_outside: bool, opt_in: str,
    error: type[UnsafePathError], advice: str | None = None,
) -> str:
    if not isinstance(path, str):
        raise error(
            f"{where} gives the {what} as {type(path).__name__} {path!r:.80}, not a path; the "
            "dataset is damaged or hostile: re-create or re-download it", named=str(path),
        )
    if "\x00" in path:
        raise error(
            f"{where} names the {what} '{_show(path)}', which holds a NUL byte: no file has "
            "such a name. The dataset is damaged or hostile; re-create or re-download it",
            named=path,
        )
    joined = join_named(base, path)
    if allow_outside:
        return joined
    remote = _scheme(base) not in (None, "file")
    reason = _remote_reason(base, path) if remote else _local_reason(base, path)
    if reason is None:
        return joined
    if advice is None:
        advice = ("By default the paths a dataset names must stay inside it; if you trust "
                  f"this dataset, {opt_in}")
    raise error(f"{where} names the {what} '{_show(path)}', which {reason}. {advice}",
                named=path)


def contained(
    base: str,
    path: str,
    *,
    where: str,
    what: str,
    allow_outside: bool = False,
    opt_in: str = OPT_IN,
    error: type[UnsafePathError] = UnsafePathError,
    advice: str | None = None,
) -> str:
    """The file ``path`` (as a dataset names it) is, relative to the trusted ``base``.

    Raises ``error`` (an :class:`UnsafePathError`) naming ``where`` (the manifest, the
    record), ``what`` (a shard, the image root), the path and ``opt_in`` when the path leads
    outside ``base`` (see the module docstring); ``advice`` replaces the sentences that say
    what to do (the default rule, then ``opt_in``). With ``allow_outside`` only a NUL byte
    is refused. The result is the path joined to ``base`` with ``..`` applied (links are
    only checked, not substituted), or a URL / absolute path as it is.
    """
    return _check(base, path, where=where, what=what, allow_outside=allow_outside,
                  opt_in=opt_in, error=error, advice=advice)


def contained_all(
    base: str,
    paths: Sequence[str],
    *,
    where: str,
    what: str,
    allow_outside: bool = False,
    opt_in: str = OPT_IN,
) -> list[str]:
    """:func:`contained` for many paths under one ``base`` (a manifest's shard list); each
    local folder is resolved once, each file costs one ``lstat``."""
    return [_check(base, p, where=where, what=what, allow_outside=allow_outside,
                   opt_in=opt_in, error=UnsafePathError) for p in paths]


__all__ = ["OPT_IN", "UnconfinedRoot", "confines", "contained", "contained_all", "join_named"]
