"""The door of the MCP HTTP transports: the Host header checked against ALLOWED_HOSTS (DNS
rebinding), then the one access decision of kb.access (cross-site browsers, token, client
address). The request's access is what its tools see (mcp_endpoint.caller); a token also becomes
the SDK's authenticated user, so a session can only be used with the credential that opened it."""

import functools
import json
import re
from typing import Any
from urllib.parse import parse_qs
from uuid import UUID

from django.conf import settings
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.types import INTERNAL_ERROR, ErrorData, JSONRPCError
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kb.access import Access, host_allowed, request_access
from kb.errors import ErrorCode, KBError
from mcp_endpoint.caller import Caller, calling_as
from mcp_endpoint.sessions import CallQuota, SessionQuota, caller_key
from mcp_endpoint.tooling import in_thread


async def scope_access(scope: Scope, headers: Headers) -> Access:
    client = scope.get("client")
    decide = functools.partial(request_access, headers=headers, client_address=client[0] if client else None)
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
        self.calls = CallQuota(settings.MCP_MAX_CALLS_PER_SESSION)

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
            await too_many(
                f"This caller has {self.sessions.limit} MCP sessions open (MCP_MAX_SESSIONS_PER_CALLER): "
                "close some (DELETE the session, or end its SSE stream) or let them idle out"
            )(scope, receive, send)
            return
        if opens_stream:
            with self.sessions.stream(caller):
                await self._sse_stream(scope, receive, send)
            return
        sse_session = _sse_session(scope) if method == "POST" and path.endswith("/messages/") else None
        if sse_session is not None:
            await self._sse_post(sse_session, scope, receive, send)
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
            if method == "POST":
                await self._http_post(session_id, scope, receive, watched)
            else:
                await self.app(scope, receive, watched)
        if method == "DELETE" and answer.get("status") in (200, 204):
            self.sessions.closed(caller, session_id)

    async def _http_post(self, session_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        """A message to a Streamable HTTP session: a request waits until its answer is sent."""
        body, replay = await _whole_body(receive)
        if not _is_request(body):
            await self.app(scope, replay, send)
        elif not self.calls.admits(session_id):
            await self._too_many_calls(scope, replay, send)
        else:
            with self.calls.waiting(session_id):
                await self.app(scope, replay, send)

    async def _sse_post(self, session_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        """A message to an SSE session: a request accepted waits for its answer on the stream."""
        body, replay = await _whole_body(receive)
        request = _is_request(body)
        if request and not self.calls.admits(session_id):
            await self._too_many_calls(scope, replay, send)
            return
        if request:
            self.calls.asked(session_id)  # before the SDK takes it: its answer may come at once
        status: dict[str, int] = {}

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, replay, watched)
        finally:
            if request and status.get("code") != 202:  # not taken: no answer will come
                self.calls.answered(session_id)

    async def _too_many_calls(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = (
            f"This session has {self.calls.limit} requests waiting for their answers "
            "(MCP_MAX_CALLS_PER_SESSION): wait for some before sending more"
        )
        await too_many(message)(scope, receive, send)

    async def _sse_stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An SSE stream: its first event names the session, each answer written frees a request."""
        session: list[str] = []

        async def counted(message: Message) -> None:
            await send(message)
            if message["type"] != "http.response.body":
                return
            chunk = message.get("body", b"")
            if not session:
                if found := _ENDPOINT_SESSION.search(chunk):
                    session.append(found.group(1).decode())
            elif _is_answer(chunk):
                self.calls.answered(session[0])

        try:
            await self.app(scope, receive, counted)
        finally:
            if session:
                self.calls.forget(session[0])


_ENDPOINT_SESSION = re.compile(rb"^event: endpoint\r?\ndata: \S*[?&]session_id=([0-9a-f]{32})", re.MULTILINE)


def _sse_session(scope: Scope) -> str | None:
    """The session an SSE message names (``/messages/?session_id=...``)."""
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_id")
    try:  # as the SDK reads it: one session however its id is spelled
        return UUID(hex=values[0]).hex if values else None
    except ValueError:
        return None  # the SDK refuses it


async def _whole_body(receive: Receive) -> tuple[bytes | None, Receive]:
    """The request's body, and a receive that gives it again; None past the SDK's size limit, whose
    413 it then answers, having read the rest itself (only that much is kept here)."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more and size <= DEFAULT_MAX_REQUEST_BODY_SIZE:
        message = await receive()
        if message["type"] != "http.request":
            return None, receive  # the client went away
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": more}

    return (None if more else body), replay


def _is_request(body: bytes | None) -> bool:
    """Whether a JSON-RPC message asks for an answer (a notification or a response does not)."""
    if body is None:
        return False
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):  # malformed, or nested past the parser: the SDK answers it
        return False
    return isinstance(message, dict) and "method" in message and "id" in message


def _is_answer(chunk: bytes) -> bool:
    """Whether an SSE event carries a JSON-RPC result or error (the SDK writes "jsonrpc" and "id"
    first, then "result" or "error"; a request or notification of the server's has "method")."""
    head = chunk[:256]
    return (
        head.startswith(b"event: message") and b'"method"' not in head and (b'"result"' in head or b'"error"' in head)
    )


def too_many(message: str) -> Response:
    """The SDK's own answer to its overall session limit (a JSON-RPC error), with 429: for one
    caller's sessions, or for one session's requests."""
    error = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=INTERNAL_ERROR, message=message))
    return Response(
        error.model_dump_json(by_alias=True, exclude_unset=True), status_code=429, media_type="application/json"
    )
