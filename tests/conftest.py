"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

# Keras picks its backend once, when first imported, and importing TensorFlow imports Keras:
# the in-process Keras tests run on torch whichever test module imports TensorFlow first
# (the other backends run in subprocesses of their own)
os.environ.setdefault("KERAS_BACKEND", "torch")

# SHARDFEED_TEST_WITHOUT=s3fs,gcsfs: the suite as where those are not installed (an import
# of one fails), e.g. the storage and remote suites with only obstore for s3:// and gs://
for _name in filter(None, os.environ.get("SHARDFEED_TEST_WITHOUT", "").split(",")):
    sys.modules[_name.strip()] = None  # type: ignore[assignment]

import pytest

TESTS = Path(__file__).resolve().parent
TF_FIXTURES = TESTS / "data" / "tf"

# The S3-compatible server on 127.0.0.1 (tests/storage/s3_fixture.py), defined here once so
# that every test area shares one session server: a per-folder re-export would start another.
sys.path.insert(0, str(TESTS / "storage"))
from s3_fixture import s3_server, s3_server_session

__all__ = ["s3_server", "s3_server_session", "tf_fixtures"]


@pytest.fixture(scope="session")
def tf_fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TFRecord files written by real TensorFlow 2.21 (see tests/data/tf/README.md).

    A fresh copy per test session, so that nothing a test does (an index built beside a file,
    say) can change the originals.
    """
    copy = tmp_path_factory.mktemp("tf-fixtures") / "tf"
    shutil.copytree(TF_FIXTURES, copy)
    return copy


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardfeed fuzz target (tests/fuzz)")
    group.addoption("--fuzz-inputs", type=int, default=None, metavar="N",
                    help="mutated inputs the fuzz target runs (default 2500, about 10 s)")
    group.addoption("--fuzz-seed", type=int, default=0, metavar="SEED",
                    help="seed of the fuzz target's inputs (default 0)")
