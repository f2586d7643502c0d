"""Routes and lifespan of the MCP transports inside the ASGI host (filled in by the MCP app)."""

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.routing import BaseRoute


def mcp_routes() -> list[BaseRoute]:
    return []


@contextlib.asynccontextmanager
async def mcp_lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
