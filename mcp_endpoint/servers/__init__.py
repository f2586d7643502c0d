"""The MCP servers: the canonical one and one profile per seed, each built on the same services."""

from collections.abc import Callable

from django.conf import settings

from mcp_endpoint.tooling import KBServer


def _builders() -> dict[str, Callable[..., KBServer]]:
    # Imported here: the servers import their shared parts (prompts, resources) from this package.
    from mcp_endpoint.servers import canonical, hybrid, ragmcpserver, scirag, synthesis

    return {
        "canonical": canonical.build,
        "scirag": scirag.build,
        "hybrid": hybrid.build,
        "synthesis": synthesis.build,
        "ragmcpserver": ragmcpserver.build,
    }


def build_server(profile: str, *, read_only: bool | None = None) -> KBServer:
    """A new server of ``profile`` (one of settings.MCP_PROFILES); writing tools are left out in
    read-only mode (MCP_READ_ONLY unless given)."""
    builders = _builders()
    if profile not in builders:
        raise ValueError(f"Unknown MCP profile {profile!r}; use one of {', '.join(settings.MCP_PROFILES)}")
    return builders[profile](read_only=settings.MCP_READ_ONLY if read_only is None else read_only)
