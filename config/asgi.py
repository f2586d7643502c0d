"""The ASGI host: one Starlette app in front of Django and the MCP transports.

Django's ASGI handler rejects lifespan events and mounted MCP apps never see theirs, so this
app owns the lifespan and runs the MCP session managers in it. Requests go to the MCP
transports (``/sse``, ``/messages/``, ``/mcp``, ``/profiles/<name>/...``), to static files, or
to Django (admin, API, health) for everything else.
"""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# This process embeds the queries (and writers' notes) of many callers at once: each run of the
# local model takes one core, and runs go side by side up to the number of cores. Two threads per
# run cost 25% more CPU per query for 2 ms less wall time on an idle machine (README, bench/load.py).
os.environ.setdefault("KB_ONNX_THREADS", "1")
django_application = get_asgi_application()

from django.conf import settings  # noqa: E402 - Django must be set up first
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.signals import request_finished  # noqa: E402
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


def close_request_connections(**_: object) -> None:
    """Django runs each request in a thread of its own under ASGI, so a request's persistent
    connection (CONN_MAX_AGE) is never used again: when the thread ends, only the cyclic collector
    would close it. Closed here, as the request finishes, they cannot pile up to Postgres' limit.
    (The MCP tools keep theirs: their threads live as long as the process, mcp_endpoint.tooling.)"""
    connections.close_all()


request_finished.connect(close_request_connections, sender=ASGIHandler)
application = OneOfEach(build_application())  # every door: the MCP transports and Django

# What is loaded by now lives as long as the process: frozen, the cyclic collector no longer walks
# it, and it looks at young objects after 20,000 new ones instead of 700. Under the 50-client load
# it had held the interpreter, every thread stopped, for 2.6 s a minute (full collections of
# 130 ms); now for about 0.1 s, with the same memory (README, bench/load.py).
gc.freeze()
gc.set_threshold(20_000, 10, 10)
