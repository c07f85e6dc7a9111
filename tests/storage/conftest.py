"""Fixtures for the storage tests: the S3-compatible server of s3_fixture.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from s3_fixture import S3Server, s3_server, s3_server_session

__all__ = ["S3Server", "s3_server", "s3_server_session"]
