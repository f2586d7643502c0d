"""A small real HTTP server on loopback for ingestion tests and fake provider APIs."""

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Route = Callable[[BaseHTTPRequestHandler, bytes], tuple[int, dict[str, str], bytes]]


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A caller that hung up (a worker killed mid-request by a fault test) is not the fake's error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serve(routes: dict[str, Route], host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``routes`` (path -> handler) on a free port; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _dispatch(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            route = routes.get(self.path.split("?")[0])
            status, headers, payload = route(self, body) if route else (404, {}, b"not found")
            self.send_response(status)
            for name, value in {"content-length": str(len(payload)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _dispatch

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = _Server((host, port), Handler)
    # A short poll interval: shutdown() waits for the loop to notice, half a second by default.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def text(body: str, content_type: str = "text/plain") -> Route:
    return lambda handler, request: (200, {"content-type": content_type}, body.encode())


def redirect(location: str) -> Route:
    return lambda handler, request: (302, {"location": location}, b"")


def json_body(request: bytes) -> dict[str, Any]:
    return json.loads(request or b"{}")
