"""A local folder served over HTTP on 127.0.0.1 as a plain web server serves it, for the tests
of versions and rewrites: HEAD, GET, one byte range; ``Last-Modified`` (to the second) where
``last_modified``, an ``ETag`` of the content where ``etags``; ``If-Match`` and
``If-Unmodified-Since`` honoured with HTTP 412. Counts the GETs of shard bytes and the
refusals."""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import re
import threading
from pathlib import Path

from shardfeed.format.writer import ShardWriter


class FolderServer:
    def __init__(self, root: Path, *, last_modified: bool = True, etags: bool = False) -> None:
        self.gets = 0
        self.refused = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, *, body: bool) -> None:
                path = root / self.path.lstrip("/")
                if not path.is_file():
                    self._empty(404)
                    return
                data = path.read_bytes()
                modified = int(path.stat().st_mtime)
                etag = f'"{hashlib.md5(data).hexdigest()}"'
                if self._refused(etag if etags else None, modified):
                    owner.refused += 1
                    self._empty(412)
                    return
                found = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                status, part = 200, data
                if found:
                    start = int(found[1])
                    end = int(found[2]) if found[2] else len(data) - 1
                    status, part = 206, data[start : end + 1]
                self.send_response(status)
                self.send_header("Content-Length", str(len(part)))
                self.send_header("Accept-Ranges", "bytes")
                if found:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                if last_modified:
                    self.send_header("Last-Modified",
                                     email.utils.formatdate(modified, usegmt=True))
                if etags:
                    self.send_header("ETag", etag)
                self.end_headers()
                if body:
                    owner.gets += path.suffix == ".tfrecord"
                    self.wfile.write(part)

            def _empty(self, status: int) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _refused(self, etag: str | None, modified: int) -> bool:
                match = self.headers.get("If-Match")
                if match is not None:
                    return etag is None or match.strip() != etag
                since = self.headers.get("If-Unmodified-Since")
                if since is not None:
                    return modified > email.utils.parsedate_to_datetime(since).timestamp()
                return False

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_shard(path: Path, prefix: str, n: int) -> None:
    """``n`` records named ``{prefix}000``...: the same size for any one-letter prefix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(path)) as writer:
        for i in range(n):
            writer.write_example({"index": [i], "name": f"{prefix}{i:03d}".encode()})
