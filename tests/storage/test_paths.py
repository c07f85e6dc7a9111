"""The containment check itself, on the shapes hostile paths take (the readers' tests are in
tests/dataset/test_contained_paths.py and tests/pipeline/test_referenced_paths.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardfeed.errors import UnsafePathError
from shardfeed.storage.paths import UnconfinedRoot, confines, contained


def _check(base: str | Path, path: str, **options: bool) -> str:
    return contained(str(base), path, where="manifest 'm.json'", what="shard", **options)


@pytest.mark.parametrize("path", ["a/../../x", "/etc/passwd", "file:///etc/passwd",
                                  "https://host/x", "s3://bucket/x", "a/\x00b"])
def test_local_paths_that_leave_the_base_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(UnsafePathError) as caught:
        _check(tmp_path, path)
    assert caught.value.named == path and "manifest 'm.json'" in str(caught.value)
    assert "\x00" not in str(caught.value)  # shown escaped


def test_the_path_read_is_the_path_checked_whatever_links_lie_on_the_way(tmp_path: Path) -> None:
    """``link/../x`` is read as ``base/x``, never as the link target's parent's ``x``."""
    os.symlink("/", tmp_path / "link")
    assert _check(tmp_path, "link/../x") == str(tmp_path / "x")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        _check(tmp_path, "link/etc/passwd")
    assert _check(tmp_path, str(tmp_path / "sub" / ".." / "y")) == str(tmp_path / "y")


@pytest.mark.parametrize("path", ["../x", "%2e%2e/x", "..%2fx", "..\\x", "s3://other/ds/x",
                                  "s3://b/dsx", "gs://b/ds/x", "/b/ds/x"])
def test_urls_stay_under_their_bucket_and_prefix(path: str) -> None:
    with pytest.raises(UnsafePathError):
        _check("s3://b/ds", path)


@pytest.mark.parametrize("path,expected", [("x", "s3://b/ds/x"), ("a/../x", "s3://b/ds/x"),
                                           ("s3://b/ds/sub/x", "s3://b/ds/sub/x")])
def test_urls_inside_the_prefix_are_kept(path: str, expected: str) -> None:
    assert _check("s3://b/ds", path) == expected


def test_the_opt_in_reads_anything_but_a_nul_byte(tmp_path: Path) -> None:
    assert _check(tmp_path, "/etc/passwd", allow_outside=True) == "/etc/passwd"
    assert _check(tmp_path, "http://h/x", allow_outside=True) == "http://h/x"
    with pytest.raises(UnsafePathError, match="NUL"):
        _check(tmp_path, "a\x00b", allow_outside=True)


def test_an_unconfined_root_is_a_str_that_says_so() -> None:
    import pickle

    root = UnconfinedRoot("/data")
    assert root == "/data" and not confines(root) and confines("/data") and confines(None)
    assert not confines(pickle.loads(pickle.dumps(root)))
