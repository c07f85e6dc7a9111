"""A read-only S3-compatible server over a local folder, light enough not to compete with
the client for the CPU: what a cloud region looks like from the client's side (a latency
before the first byte, bodies streamed by the kernel), for benchmarks on small machines.

``ROOT/<bucket>/<key>`` is served as ``s3://<bucket>/<key>``. It answers what the storage
layer and s3fs send when reading: ``HEAD`` and ``GET`` of an object (``Range: bytes=a-b``
gives 206 and the body by ``sendfile``), ``ListObjectsV2`` with a prefix and delimiter,
``HEAD`` of a bucket; anything else is 501. Every request is held ``latency`` seconds before
it is answered (on its own thread: requests in flight overlap, as in a region) and counted
by method and suffix. Signatures are not checked.

    python bench/s3_light.py ROOT [--latency-ms 50]     # prints {"endpoint_url": ...}

Tests use moto (``tests/storage/s3_fixture.py``), which implements S3 in full; it is a
Python object model per request, and on two cores it takes the decoder's CPU.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


def _etag(stat: os.stat_result) -> str:
    """The object's ETag, the same in a HEAD, a GET and a listing (a client that pins the
    version a listing gave takes any other for a changed object)."""
    return f'"{stat.st_size:x}-{int(stat.st_mtime_ns):x}"'


class LightS3(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, latency: float, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.root = root.resolve()
        self.latency = latency
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self, method: str, path: str) -> None:
        with self._lock:
            self.counts[f"{method} {Path(path).suffix or path.rstrip('/').rsplit('/', 1)[-1]}"] += 1


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as real servers: a short answer is not held 40 ms for an ACK
    server: LightS3

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_PUT(self) -> None:
        self._error(501, "NotImplemented", "read-only server")

    do_POST = do_DELETE = do_PUT

    def _answer(self, *, body: bool) -> None:
        if self.server.latency:
            time.sleep(self.server.latency)
        url = urlsplit(self.path)
        bucket, _, key = unquote(url.path).lstrip("/").partition("/")
        self.server.count(self.command, url.path)
        query = parse_qs(url.query)
        if not key:
            if not (self.server.root / bucket).is_dir():
                return self._error(404, "NoSuchBucket", bucket, body=body)
            if not body:
                return self._send(200, b"", "application/xml", body=False)
            return self._list(bucket, query)
        path = self.server.root / bucket / key
        if not path.is_file() or self.server.root not in path.resolve().parents:
            return self._error(404, "NoSuchKey", key, body=body)
        self._object(path, body=body)

    def _object(self, path: Path, *, body: bool) -> None:
        stat = path.stat()
        start, end, status = 0, stat.st_size - 1, 200
        match = _RANGE.match(self.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
            end = min(int(match.group(2) or end), stat.st_size - 1)
            if start >= stat.st_size:
                return self._error(416, "InvalidRange", path.name, body=body)
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime, usegmt=True))
        self.send_header("ETag", _etag(stat))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{stat.st_size}")
        self.end_headers()
        if body and end >= start:
            with path.open("rb") as f:
                self.wfile.flush()
                self.connection.sendfile(f, start, end - start + 1)

    def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        base = self.server.root / bucket
        keys = sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
        contents, prefixes = [], set()
        for key in keys:
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
                continue
            stat = (base / key).stat()
            modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(stat.st_mtime))
            contents.append(f"<Contents><Key>{escape(key)}</Key><LastModified>{modified}"
                            f"</LastModified><Size>{stat.st_size}</Size><ETag>{escape(_etag(stat))}"
                            f"</ETag><StorageClass>STANDARD</StorageClass></Contents>")
        common = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
                         for p in sorted(prefixes))
        xml = ('<?xml version="1.0" encoding="UTF-8"?>'
               '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
               f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
               f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>1000</MaxKeys>"
               f"<Delimiter>{escape(delimiter)}</Delimiter><IsTruncated>false</IsTruncated>"
               f"{''.join(contents)}{common}</ListBucketResult>")
        self._send(200, xml.encode(), "application/xml", body=True)

    def _error(self, status: int, code: str, what: str, *, body: bool = True) -> None:
        xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
               f"<Message>{escape(what)}</Message><Resource>{escape(quote(what))}</Resource>"
               "</Error>").encode()
        self._send(status, xml, "application/xml", body=body)

    def _send(self, status: int, data: bytes, kind: str, *, body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="folder of buckets (ROOT/<bucket>/<key>)")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = LightS3(args.root, args.latency_ms / 1000, args.port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"endpoint_url": server.endpoint_url, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:  # any line: print the request counts; EOF: stop
        del line
        print(json.dumps(dict(server.counts)), flush=True)
    server.shutdown()


if __name__ == "__main__":
    main()
