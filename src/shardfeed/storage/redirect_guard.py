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

Determinism: none needed. State: the refuser's port and the hosts it refused last, kept by
:data:`~shardfeed.storage.process_state.PROCESS` (a forked child starts a refuser of its
own). Memory: a thread a refused connection, briefly.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from shardfeed.storage.process_state import PROCESS

__all__ = ["REFUSED", "REFUSED_MARK", "redirect_guard", "refuser_port"]

REFUSED_MARK = "shardfeed-refused-redirect"
"""In the body of the refuser's answers (obstore puts the body in its error)."""
_OWN_HOSTS = MappingProxyType({"s3": ("amazonaws.com", "amazonaws.com.cn"),
                               "gs": ("googleapis.com", "metadata.google.internal"),
                               "az": ("core.windows.net", "microsoftonline.com", "azure.com")})
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
            with PROCESS.lock:  # the host only: the request carries credentials
                PROCESS.refused.append(host[:200])
            body = f"{REFUSED_MARK} to {host[:200]}".encode("latin-1", "replace")
            sock.sendall(b"HTTP/1.1 421 Misdirected Request\r\nContent-Type: text/plain\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass


REFUSED = PROCESS.refused
"""The hosts of the last requests refused (for tests and messages)."""


def refuser_port() -> int:
    """The refuser's port (started the first time, once a process)."""
    return PROCESS.once(PROCESS.ports, "refuser", _start_refuser)


def _start_refuser() -> int:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Refuse)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="shardfeed-refuse-redirects",
                     daemon=True).start()
    return int(server.server_address[1])


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
