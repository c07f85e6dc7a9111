"""An HTTP server on 127.0.0.1 that answers 404 to everything and counts what it is asked:
a test proves that a refused URL sends no request at all."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest


class CountingServer:
    """Records the path of every request (any method) in ``requests``."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append(self.path)
                self.send_response(404)
                self.end_headers()

            do_HEAD = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def counting_server() -> Iterator[CountingServer]:
    server = CountingServer()
    try:
        yield server
    finally:
        server.close()
