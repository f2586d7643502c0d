"""The ASGI host: one Starlette app in front of Django and the MCP transports.

Django's ASGI handler rejects lifespan events and mounted MCP apps never see theirs, so this
app owns the lifespan and runs the MCP session managers in it. Requests go to the MCP
transports (``/sse``, ``/messages/``, ``/mcp``, ``/profiles/<name>/...``), to static files, or
to Django (admin, API, health) for everything else.
"""

import asyncio
import gc
import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# This process embeds the queries (and writers' notes) of many callers at once: each run of the
# local model takes one core, and runs go side by side up to the number of cores. Two threads per
# run cost 25% more CPU per query for 2 ms less wall time on an idle machine (README, bench/load.py).
os.environ.setdefault("KB_ONNX_THREADS", "1")
django.setup(set_prefix=False)

from asgiref.sync import sync_to_async  # noqa: E402 - Django must be set up first
from django.conf import settings  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.db import connections  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402
from starlette.staticfiles import StaticFiles  # noqa: E402

from config.body_limit import BodyLimit, OneOfEach  # noqa: E402
from mcp_endpoint.asgi import mcp_lifespan, mcp_routes  # noqa: E402


def build_application() -> Starlette:
    application = Starlette(
        routes=[
            *mcp_routes(),
            Mount(
                f"/{settings.STATIC_URL.strip('/')}", app=StaticFiles(directory=settings.STATIC_ROOT, check_dir=False)
            ),
        ],
        lifespan=mcp_lifespan,
    )
    # Every other path is Django's: as the router's default, not a Mount("/"), whose pattern does
    # not match a path holding a newline (%0A), which got Starlette's plain-text 404 instead.
    application.router.default = BodyLimit(django_application)
    return application


LIVENESS_PATH = "/health/live"


class TurnTakingHandler(ASGIHandler):
    """Django's ASGI handler running at most KB_WEB_MAX_REQUESTS views at once; the others wait
    their turn, in order, after their body was read and holding no database connection.

    Each view runs in a thread of its own that ends with the request, so its persistent connection
    (CONN_MAX_AGE) would never be used again: it is closed as the view ends, or only the cyclic
    collector would close it (a client polling the REST API had brought Postgres to "too many
    clients" within a minute). The MCP tools keep theirs: their threads live as long as the process
    (mcp_endpoint.tooling)."""

    def __init__(self) -> None:
        super().__init__()
        self._turns: asyncio.Semaphore | None = None

    async def run_get_response(self, request: Any) -> Any:
        if request.path_info == LIVENESS_PATH:  # no database: a container's health check never waits its turn
            return await super().run_get_response(request)
        if self._turns is None:  # made in the server's event loop
            self._turns = asyncio.Semaphore(settings.KB_WEB_MAX_REQUESTS)
        async with self._turns:
            try:
                return await super().run_get_response(request)
            finally:
                await sync_to_async(connections.close_all)()  # in the view's thread


django_application = TurnTakingHandler()
application = OneOfEach(build_application())  # every door: the MCP transports and Django

# What is loaded by now lives as long as the process: frozen, the cyclic collector no longer walks
# it, and it looks at young objects after 20,000 new ones instead of 700. Under the 50-client load
# it had held the interpreter, every thread stopped, for 2.6 s a minute (full collections of
# 130 ms); now for about 0.1 s, with the same memory (README, bench/load.py).
gc.freeze()
gc.set_threshold(20_000, 10, 10)
