"""Redirects to another host, refused: obstore's requests for any host but the store's own
go to a proxy in this process that forwards nothing.

obstore's client follows a redirect (301/302/307/308 with a Location) wherever it leads, and
sends the request's x-amz-security-token there again. Its requests are therefore given a
proxy that forwards nothing (:class:`_Refuse`, in this process), with the hosts the store
may talk to excluded from it: its endpoint, the cloud's own domains (S3's redirects between
its regional hosts stay as they are) and the credential services. A request for any other
host reaches the refuser, which answers 421 and names it; nothing leaves the machine.
Where the user has a proxy of their own (HTTPS_PROXY, ..., or obstore's proxy_url), it is
kept and redirects are not guarded. The guard is by host: a redirect to another port of
the endpoint's own host is not caught (the proxy's exclusions name hosts only).

Determinism: none needed. State: the refuser's port and the hosts it refused last, for the
process (a forked child starts its own). Memory: a thread a refused connection, briefly.
"""

from __future__ import annotations

import collections
import os
import socket
import socketserver
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["REFUSED", "REFUSED_MARK", "redirect_guard", "refuser_port"]

REFUSED_MARK = "shardfeed-refused-redirect"
"""In the body of the refuser's answers (obstore puts the body in its error)."""
_OWN_HOSTS = {"s3": ("amazonaws.com", "amazonaws.com.cn"),
              "gs": ("googleapis.com", "metadata.google.internal"),
              "az": ("core.windows.net", "microsoftonline.com", "azure.com")}
_CREDENTIAL_ADDRESSES = ("169.254.169.254", "169.254.170.2", "fd00:ec2::254")
_PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")


class _Refuse(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(5)
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                head += chunk
            words = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            target = words[1] if len(words) > 1 else "?"
            host = urlsplit(target).netloc or target  # GET http://host/... or CONNECT host:port
            REFUSED.append(host[:200])  # the host only: the request carries credentials
            body = f"{REFUSED_MARK} to {host[:200]}".encode("latin-1", "replace")
            sock.sendall(b"HTTP/1.1 421 Misdirected Request\r\nContent-Type: text/plain\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass


REFUSED: collections.deque[str] = collections.deque(maxlen=16)
"""The hosts of the last requests refused (for tests and messages)."""
_REFUSER: list[int] = []  # its port, once started in this process


def refuser_port() -> int:
    with _REFUSER_LOCK:
        if not _REFUSER:
            server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Refuse)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name="shardfeed-refuse-redirects",
                             daemon=True).start()
            _REFUSER.append(int(server.server_address[1]))
        return _REFUSER[0]


_REFUSER_LOCK = threading.Lock()


def redirect_guard(scheme: str, netloc: str, endpoint: str,
                    config: Mapping[str, Any]) -> dict[str, Any]:
    """obstore client options that send requests for hosts other than the store's own to
    the refuser (none where the user has a proxy)."""
    if "proxy_url" in config or any(os.environ.get(n) or os.environ.get(n.lower())
                                    for n in _PROXY_VARIABLES):
        return {}
    hosts = [*_OWN_HOSTS.get(scheme, ()), *_CREDENTIAL_ADDRESSES]
    for where in (endpoint, f"{scheme}://{netloc}" if scheme in ("http", "https") else ""):
        host = urlsplit(where).hostname if where else None
        if host:
            hosts.append(host)
    return {"proxy_url": f"http://127.0.0.1:{refuser_port()}",
            "proxy_excludes": ",".join(dict.fromkeys(hosts))}


def _forked() -> None:
    global _REFUSER_LOCK
    _REFUSER.clear()  # its thread stayed in the parent
    _REFUSER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forked)
