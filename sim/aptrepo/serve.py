"""A loopback-only static HTTP server for the stand-in repositories (apt's and pip's clients fetch from it).

Dot paths (the signing key's GNUPGHOME, the recipe file) are never served (a "." path segment is fine); directory listings are off (a
directory with an index.html serves that file).
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(SimpleHTTPRequestHandler):
    def send_head(self):
        parts = self.path.split("?", 1)[0].split("/")
        # "." itself is allowed: a flat repository's Packages says "Filename: ./x.deb", so apt asks for <url>/./x.deb.
        if any(part.startswith(".") for part in parts if part not in ("", ".")):
            self.send_error(404)
            return None
        path = self.path.split("?", 1)[0]
        # No directory listings (a repository is fetched by known paths), except a directory's own index.html:
        # a PEP 503 index (sim/pypi) serves /simple/<project>/ that way.
        if path.endswith("/") and not Path(self.translate_path(path), "index.html").is_file():
            self.send_error(404)
            return None
        return super().send_head()

    def log_message(self, format, *args):  # quiet: apt fetches dozens of files per host
        pass


class RepoServer(ThreadingHTTPServer):
    daemon_threads = True


def make_server(root: Path, host: str, port: int) -> RepoServer:
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"repository server address {host}: only loopback (127.0.0.0/8) is allowed")
    return RepoServer((host, port), partial(_Handler, directory=str(root)))


@contextlib.contextmanager
def serve(root: Path, host: str, port: int = 0) -> Iterator[str]:
    """Serve ``root`` on ``host:port`` in a thread; yields the base URL (``http://host:port``)."""
    server = make_server(root, host, port)
    thread = threading.Thread(target=server.serve_forever, name="aptrepo-http", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
