"""tests/data/tf is a verbatim copy of the project's shared TensorFlow fixtures."""

from __future__ import annotations

from pathlib import Path

TF_FIXTURES = Path(__file__).resolve().parent / "data" / "tf"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "tf"


def test_copy_matches_shared_fixtures_when_present() -> None:
    tf_fixtures = TF_FIXTURES
    names = sorted(p.name for p in tf_fixtures.iterdir() if p.name != "ORIGIN.md")
    assert "mixed.tfrecord" in names and "expected.json" in names
    if SHARED.is_dir():  # beside a checkout; a standalone clone has only the copy
        assert names == sorted(p.name for p in SHARED.iterdir())
        for name in names:
            assert (SHARED / name).read_bytes() == (tf_fixtures / name).read_bytes(), name
