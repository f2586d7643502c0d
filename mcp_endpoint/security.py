"""The door of the MCP HTTP transports: Host and Origin headers checked against ALLOWED_HOSTS (DNS
rebinding), then the bearer token (kb.access). The request's access is what its tools see
(mcp_endpoint.caller); a token also becomes the SDK's authenticated user, so a session can only be
used with the credential that opened it."""

from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kb.access import FULL_ACCESS, Access, access_from_authorization, auth_required
from kb.errors import ErrorCode, KBError
from mcp_endpoint.caller import Caller, calling_as
from mcp_endpoint.tooling import in_thread


def allowed_hosts() -> list[str]:
    # As Django itself: with DEBUG on and no ALLOWED_HOSTS, local names are allowed.
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return settings.ALLOWED_HOSTS


def host_allowed(host: str | None) -> bool:
    domain, _port = split_domain_port(host or "")
    return bool(domain) and validate_host(domain, allowed_hosts())


def origin_allowed(origin: str | None) -> bool:
    """Browsers send Origin with cross-site requests (a rebinding page among them); other clients
    usually send none."""
    if origin is None or origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and host_allowed(parts.netloc)


def header_refusal(headers: Headers) -> Response | None:
    if not host_allowed(headers.get("host")):
        return PlainTextResponse("Invalid Host header", status_code=421)
    if not origin_allowed(headers.get("origin")):
        return PlainTextResponse("Invalid Origin header", status_code=403)
    return None


async def request_access(authorization: str | None) -> Access:
    if not authorization and not auth_required():
        return FULL_ACCESS
    return await in_thread(access_from_authorization, authorization)


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
        refusal = header_refusal(headers)
        if refusal is None:
            try:
                access = await request_access(headers.get("authorization"))
            except KBError as error:
                refusal = error_response(error)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if user := token_user(access):
            scope["user"] = user
        with calling_as(Caller(access=access)):
            await self.app(scope, receive, send)
