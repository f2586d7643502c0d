"""Who is calling a tool: the access of the MCP request being served, and where files may be read.

The HTTP transports set it per request (mcp_endpoint.security), the stdio command once for the
process. The SDK carries context variables from the HTTP request that delivered a message to the
task that handles it, so a tool reads the caller of its own message, not of the session's first
request. Unset means the server is reached some other way: refused, never full access by default.
"""

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kb.access import Access
from kb.errors import ErrorCode, KBError
from kb.services.ingest import network_file_roots, stdio_server_file_roots


@dataclass(frozen=True)
class Caller:
    access: Access
    # stdio: the user's own process, which may read files under KB_FILE_ROOTS and the roots it was started with.
    local: bool = False
    local_file_roots: tuple[Path, ...] = ()

    def file_roots(self) -> list[Path]:
        return stdio_server_file_roots(self.local_file_roots) if self.local else network_file_roots()


_current: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("kb_mcp_caller", default=None)


def current_caller_or_none() -> Caller | None:
    return _current.get()


def current_caller() -> Caller:
    caller = _current.get()
    if caller is None:
        raise KBError(ErrorCode.UNAUTHORIZED, "This request reached the MCP server without credentials")
    return caller


def current_access() -> Access:
    return current_caller().access


@contextlib.contextmanager
def calling_as(caller: Caller | None) -> Iterator[None]:
    token = _current.set(caller)
    try:
        yield
    finally:
        _current.reset(token)
