"""The door of the MCP HTTP transports: the Host header checked against ALLOWED_HOSTS (DNS
rebinding), then the one access decision of kb.access (cross-site browsers, token, client
address). The request's access is what its tools see (mcp_endpoint.caller); a token also becomes
the SDK's authenticated user, so a session can only be used with the credential that opened it."""

import functools
from typing import Any

from django.conf import settings
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.types import INTERNAL_ERROR, ErrorData, JSONRPCError
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kb.access import Access, host_allowed, request_access
from kb.errors import ErrorCode, KBError
from mcp_endpoint.caller import Caller, calling_as
from mcp_endpoint.sessions import SessionQuota, caller_key
from mcp_endpoint.tooling import in_thread


async def scope_access(scope: Scope, headers: Headers) -> Access:
    client = scope.get("client")
    decide = functools.partial(
        request_access,
        authorization=headers.get("authorization"),
        client_address=client[0] if client else None,
        host=headers.get("host"),
        origin=headers.get("origin"),
        fetch_site=headers.get("sec-fetch-site"),
    )
    # Only a token needs the database; everything else is decided without a thread.
    return await in_thread(decide) if headers.get("authorization") else decide()


def error_response(error: KBError) -> Response:
    headers = {"WWW-Authenticate": 'Bearer realm="mcp"'} if error.code == ErrorCode.UNAUTHORIZED else None
    return JSONResponse(error.as_dict(), status_code=error.http_status, headers=headers)


def token_user(access: Access) -> AuthenticatedUser | None:
    if access.token is None:
        return None
    principal = AccessToken(token=access.token.prefix, client_id=f"kb-token-{access.token.pk}", scopes=[access.scope])
    return AuthenticatedUser(principal)


class MCPGuard:
    """ASGI middleware in front of one MCP server's transports."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.sessions = SessionQuota(settings.MCP_MAX_SESSIONS_PER_CALLER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not host_allowed(headers.get("host")):
            await PlainTextResponse("Invalid Host header", status_code=421)(scope, receive, send)
            return
        try:
            access = await scope_access(scope, headers)
        except KBError as error:
            await error_response(error)(scope, receive, send)
            return
        if user := token_user(access):
            scope["user"] = user
        client = scope.get("client")
        caller = caller_key(access, client[0] if client else None)
        with calling_as(Caller(access=access)):
            await self._counted(caller, scope, receive, send, headers.get("mcp-session-id"))

    async def _counted(self, caller: str, scope: Scope, receive: Receive, send: Send, session_id: str | None) -> None:
        """Serve the request, keeping count of the caller's open sessions (mcp_endpoint.sessions)."""
        method, path = scope["method"], scope["path"]
        if method == "HEAD":  # Starlette answers HEAD as GET: an SSE stream, uncounted, that never ended well
            allow = "GET" if path.endswith("/sse") else "GET, POST, DELETE"
            refusal = PlainTextResponse("Method Not Allowed", status_code=405, headers={"Allow": allow})
            await refusal(scope, receive, send)
            return
        opens_stream = method == "GET" and path.endswith("/sse")
        opens_session = method == "POST" and path.endswith("/mcp") and session_id is None
        if (opens_stream or opens_session) and not self.sessions.admits(caller):
            await too_many_sessions(self.sessions.limit)(scope, receive, send)
            return
        if opens_stream:
            with self.sessions.stream(caller):
                await self.app(scope, receive, send)
            return
        answer: dict[str, Any] = {}

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["session_id"] = Headers(raw=message["headers"]).get("mcp-session-id")
            await send(message)

        if session_id is None:
            await self.app(scope, receive, watched)
            if answer.get("status") == 200 and answer.get("session_id"):
                self.sessions.seen(caller, answer["session_id"])  # opened
            return
        with self.sessions.serving(caller, session_id):
            await self.app(scope, receive, watched)
        if method == "DELETE" and answer.get("status") in (200, 204):
            self.sessions.closed(caller, session_id)


def too_many_sessions(limit: int) -> Response:
    """The SDK's own answer to its overall limit (a JSON-RPC error), with 429 for one caller's."""
    error = JSONRPCError(
        jsonrpc="2.0",
        id=None,
        error=ErrorData(
            code=INTERNAL_ERROR,
            message=f"This caller has {limit} MCP sessions open (MCP_MAX_SESSIONS_PER_CALLER): "
            "close some (DELETE the session, or end its SSE stream) or let them idle out",
        ),
    )
    return Response(
        error.model_dump_json(by_alias=True, exclude_unset=True), status_code=429, media_type="application/json"
    )
