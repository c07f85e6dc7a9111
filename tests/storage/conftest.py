"""Fixtures for the storage tests: the S3-compatible server of s3_fixture.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from s3_fixture import S3Server

__all__ = ["S3Server"]  # the s3_server fixtures come from tests/conftest.py
