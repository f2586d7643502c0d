"""The MCP transports inside the ASGI host (config/asgi.py): the routes of every profile, and the
lifespan that runs their Streamable HTTP session managers (mounted apps never see theirs).

    /sse, /messages/, /mcp                        the default profile (MCP_DEFAULT_PROFILE)
    /profiles/<name>/sse, .../messages/, .../mcp  each profile of settings.MCP_PROFILES

Each profile is one MCP server with one SSE transport and one session manager, reachable under
both addresses when it is the default. Every request passes mcp_endpoint.security.MCPGuard.
"""

import contextlib
import logging
from collections.abc import AsyncIterator

import anyio
from django.conf import settings
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from mcp_endpoint.security import MCPGuard
from mcp_endpoint.servers import build_server
from mcp_endpoint.tooling import KBServer, stop_tool_threads

logger = logging.getLogger(__name__)
_session_managers: list[StreamableHTTPSessionManager] = []


def transports(server: KBServer) -> ASGIApp:
    """SSE (/sse with /messages/) and Streamable HTTP (/mcp) of one server, behind the guard."""
    # The guard checks Host and Origin against ALLOWED_HOSTS; the SDK's own check knows only loopback.
    checked_by_guard = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    sse = server.sse_app(sse_path="/sse", message_path="/messages/", transport_security=checked_by_guard)
    # Plain JSON answers to POSTs: no tool here streams progress, and an SSE stream per request
    # costs ~3 ms a call (the standalone GET stream still carries server notifications).
    http = server.streamable_http_app(
        streamable_http_path="/mcp",
        json_response=True,
        stateless_http=settings.MCP_STATELESS_HTTP,
        transport_security=checked_by_guard,
    )
    _session_managers.append(server.session_manager)
    return MCPGuard(Starlette(routes=[*sse.routes, *http.routes]))


def mcp_routes() -> list[BaseRoute]:
    apps = {profile: transports(build_server(profile)) for profile in settings.MCP_PROFILES}
    default = apps[settings.MCP_DEFAULT_PROFILE]
    return [
        Route("/sse", default, methods=["GET"]),
        Route("/messages/", default, methods=["POST"]),
        Route("/mcp", default, methods=["GET", "POST", "DELETE"]),
        *(Mount(f"/profiles/{profile}", app=app) for profile, app in apps.items()),
    ]


@contextlib.asynccontextmanager
async def mcp_lifespan(app: Starlette) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for manager in _session_managers:
            await stack.enter_async_context(manager.run())
        logger.info("MCP session managers started (%d profiles)", len(_session_managers))
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(stop_tool_threads)
