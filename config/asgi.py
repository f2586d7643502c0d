"""The ASGI host: one Starlette app in front of Django and the MCP transports.

Django's ASGI handler rejects lifespan events and mounted MCP apps never see theirs, so this
app owns the lifespan and runs the MCP session managers in it. Requests go to the MCP
transports (``/sse``, ``/messages/``, ``/mcp``, ``/profiles/<name>/...``), to static files, or
to Django (admin, API, health) for everything else.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# This process embeds the queries (and writers' notes) of many callers at once: each run of the
# local model takes one core, and runs go side by side up to the number of cores. Two threads per
# run cost 25% more CPU per query for 2 ms less wall time on an idle machine (README, bench/load.py).
os.environ.setdefault("KB_ONNX_THREADS", "1")
django_application = get_asgi_application()

from django.conf import settings  # noqa: E402 - Django must be set up first
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402
from starlette.staticfiles import StaticFiles  # noqa: E402

from mcp_endpoint.asgi import mcp_lifespan, mcp_routes  # noqa: E402


def build_application() -> Starlette:
    return Starlette(
        routes=[
            *mcp_routes(),
            Mount(
                f"/{settings.STATIC_URL.strip('/')}", app=StaticFiles(directory=settings.STATIC_ROOT, check_dir=False)
            ),
            Mount("/", app=django_application),
        ],
        lifespan=mcp_lifespan,
    )


application = build_application()
