"""Versions: what a store's answers name (ETag, generation, else a modification time, weak
while under a minute old), and local files checked with one stat a folder while it stays
unchanged."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

import pytest

from shardfeed.errors import ShardChangedError
from shardfeed.storage import versions
from shardfeed.storage.versions import LocalFiles, object_version, obstore_version


def test_an_etag_names_the_content_whatever_the_answer_it_comes_in() -> None:
    listed = object_version({"ETag": '"5d41"', "LastModified": dt.datetime(2026, 1, 1),
                             "size": 5})
    headed = obstore_version({"e_tag": '"5d41"', "version": None, "size": 5,
                              "last_modified": dt.datetime(2026, 1, 2)})
    assert listed is not None and headed is not None
    assert listed.text == 'etag="5d41"' and listed.etag == '"5d41"' and not listed.weak
    assert not listed.differs(headed)
    assert listed.differs(obstore_version({"e_tag": '"9999"'}))  # type: ignore[arg-type]
    assert object_version({"generation": 17, "updated": "x"}).text == "generation=17"  # type: ignore[union-attr]
    # a listing through GCS's JSON API and a HEAD through its XML API: not comparable
    json_api = object_version({"etag": "CKih16GjycICEAE=", "generation": "1700"})
    xml_api = obstore_version({"e_tag": '"9e107d9d372bb6826bd81d3542a419d6"'})
    assert json_api is not None and xml_api is not None and not json_api.differs(xml_api)
    assert object_version({"size": 5, "name": "b/x"}) is None


def test_a_modification_time_is_weak_for_a_minute() -> None:
    now = time.time()
    fresh = object_version({"Last-Modified": _http_date(now - 5)}, read_at=now)
    old = object_version({"Last-Modified": _http_date(now - 600)}, read_at=now)
    assert fresh is not None and fresh.weak and fresh.modified == int(now - 5)
    assert old is not None and not old.weak
    # the same second, in a listing's datetime and a HEAD's HTTP date: the same version
    listed = object_version({"LastModified": dt.datetime.fromtimestamp(
        int(now - 600) + 0.4, tz=dt.timezone.utc)}, read_at=now)
    assert listed is not None and not listed.differs(old)
    assert old.differs(object_version({"Last-Modified": _http_date(now)}))  # type: ignore[arg-type]


def _http_date(seconds: float) -> str:
    import email.utils

    return email.utils.formatdate(seconds, usegmt=True)


class StatCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real = os.stat

        def counted(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            self.paths.append(os.fspath(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "stat", counted)  # the module's os.stat: it reads no other


def test_an_unchanged_settled_folder_is_one_stat_a_check(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "SETTLED_SECONDS", 0.0)
    files = [tmp_path / f"f{i}" for i in range(50)]
    for f in files:
        f.write_bytes(b"x" * 10)
    watched = LocalFiles([str(f) for f in files])
    watched.check()
    counter = StatCounter(monkeypatch)
    for _ in range(3):
        watched.check()
    assert counter.paths == [str(tmp_path)] * 3  # the folder, not its 50 files
    replacement = tmp_path / "new"
    replacement.write_bytes(b"y" * 10)
    os.replace(replacement, files[7])
    with pytest.raises(ShardChangedError, match="f7") as raised:
        watched.check()
    assert raised.value.path == str(files[7])


def test_a_folder_changed_lately_has_its_files_looked_at(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Within SETTLED_SECONDS of its last change another change could keep its time (a
    coarse clock): each check looks at the files until then."""
    files = [tmp_path / f"f{i}" for i in range(3)]
    for f in files:
        f.write_bytes(b"x")
    watched = LocalFiles([str(f) for f in files])
    counter = StatCounter(monkeypatch)
    watched.check()
    assert sorted(counter.paths) == sorted([str(tmp_path), *map(str, files)])
