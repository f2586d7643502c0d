"""``manage.py mcp_stdio [--profile NAME] [--read-only] [--file-root PATH ...]``: an MCP server on
stdin and stdout, for clients that spawn it (Claude Desktop, Claude Code, IDE agents).

Nothing but protocol goes to stdout: the SDK points file descriptor 1 at stderr while it serves, and
logging goes to stderr (config.settings.LOGGING). The process is the user's own, with the database
credentials in its environment, so it has full access; file:// ingestion reads under KB_FILE_ROOTS
and the --file-root paths only, never the working directory (see stdio_server_file_roots).
"""

from pathlib import Path
from typing import Any

import anyio
from django.conf import settings
from django.core.management.base import CommandParser

from kb.access import FULL_ACCESS
from kb.management.base import ExamplesInHelp
from mcp_endpoint.caller import Caller, calling_as
from mcp_endpoint.servers import build_server
from mcp_endpoint.tooling import stop_tool_threads


class Command(ExamplesInHelp):
    help = (
        "Serve MCP over stdio (for clients that start the server themselves).\n"
        "Example: .venv/bin/python manage.py mcp_stdio --profile scirag --file-root ~/papers"
    )
    # Start fast and write nothing: clients wait for the handshake.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--profile",
            choices=settings.MCP_PROFILES,
            default=settings.MCP_DEFAULT_PROFILE,
            help="Which tool set to serve (default: MCP_DEFAULT_PROFILE)",
        )
        parser.add_argument("--read-only", action="store_true", help="Leave out every tool that writes")
        parser.add_argument(
            "--file-root",
            action="append",
            type=Path,
            default=[],
            metavar="PATH",
            dest="file_roots",
            help="A directory file:// ingestion may read, besides KB_FILE_ROOTS (repeatable; default: none)",
        )

    def handle(self, *args: Any, profile: str, read_only: bool, file_roots: list[Path], **options: Any) -> None:
        server = build_server(profile, read_only=True if read_only else None)
        caller = Caller(access=FULL_ACCESS, local=True, local_file_roots=tuple(file_roots))
        try:
            with calling_as(caller):
                anyio.run(server.run_stdio_async)
        finally:
            stop_tool_threads()
