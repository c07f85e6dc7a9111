"""Fixtures for the storage tests: the S3-compatible server of s3_fixture.py and the stalled
endpoint of stalled_server.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from s3_fixture import S3Server
from stalled_server import StalledServer, stalled_server

# the s3_server fixtures come from tests/conftest.py
__all__ = ["S3Server", "StalledServer", "stalled_server"]
