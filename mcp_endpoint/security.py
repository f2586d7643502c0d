"""The door of the MCP HTTP transports: the Host header checked against ALLOWED_HOSTS (DNS
rebinding), then the one access decision of kb.access (cross-site browsers, token, client
address). The request's access is what its tools see (mcp_endpoint.caller); a token also becomes
the SDK's authenticated user, so a session can only be used with the credential that opened it."""

import functools

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kb.access import Access, host_allowed, request_access
from kb.errors import ErrorCode, KBError
from mcp_endpoint.caller import Caller, calling_as
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
        with calling_as(Caller(access=access)):
            await self.app(scope, receive, send)
