"""Requests refused before anything reads them: bodies held to a limit before Django reads them,
and headers that decide access given twice.

Django's ASGI handler copies a whole request body to a temporary file before any middleware,
authentication or size check runs: a 1.5 GB chunked POST with a made-up token was written to
disk in full and only then answered 401. Here a body declared larger than its limit is refused
at once, and one that grows past it while arriving is cut off there. The limit is
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``KB_UPLOAD_MAX_MEMORY_BYTES``), what Django allows a body that
is not a file upload, and ``KB_UPLOAD_MAX_BYTES`` for ``multipart/form-data`` sent to a view that
takes files (the API's uploads and the admin's upload page): a multipart body of 250 MB sent to
/api/search or the admin's login had been read whole before the token was checked. The admin's
pages get the refusal as a page, the rest as the API's JSON error.
"""

import html
from importlib import import_module
from types import SimpleNamespace

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.db import DatabaseError, connections
from django.http.cookie import parse_cookie
from django.urls import Resolver404, ResolverMatch, resolve
from starlette.datastructures import Headers
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kb.access import refuse_cross_site, request_access
from kb.errors import ErrorCode, KBError, database_error
from kb.models import TokenScope

# Headers the access decision reads (kb.access): given twice, Django joined them and the MCP door
# took the first, so one request could be judged differently by two doors.
SINGLE_HEADERS = frozenset({b"authorization", b"origin", b"host", b"sec-fetch-site"})


class OneOfEach:
    """Refuse a request that gives an access header twice, or an X-Forwarded-For with an empty
    entry (400), at every door."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (message := _ambiguous(scope["headers"])):
            await refuse(scope, receive, send, KBError(ErrorCode.INVALID_ARGUMENT, message), 400)
            return
        await self.app(scope, receive, send)


def _ambiguous(headers: list[tuple[bytes, bytes]]) -> str | None:
    names = [name.lower() for name, _ in headers if name.lower() in SINGLE_HEADERS]
    if len(names) != len(set(names)):
        repeated = sorted({name.decode() for name in names if names.count(name) > 1})
        return f"The request gives the {', '.join(repeated)} header more than once"
    # uvicorn skips an empty entry and keeps the proxy's own address: "X-Forwarded-For: 8.8.8.8,"
    # from a proxy on the same host had looked local, and local callers need no token.
    forwarded = [value for name, value in headers if name.lower() == b"x-forwarded-for"]
    if any(not entry.strip() for value in forwarded for entry in value.split(b",")):
        return "The X-Forwarded-For header has an empty entry"
    return None


class _BodyTooLarge(Exception):
    pass


# The views that take files, by their URL names.
ADMIN_UPLOAD = "admin:kb_document_add"
FILE_VIEWS = frozenset({"api:upload_documents", ADMIN_UPLOAD})


def file_view(path: str) -> ResolverMatch | None:
    """The view that takes files ``path`` names, if it names one."""
    try:
        match = resolve(path)
    except Resolver404:
        return None
    return match if match.view_name in FILE_VIEWS else None


def body_limit(path: str, headers: Headers) -> tuple[int, str]:
    """The most bytes this request's body may hold, and the setting that says so."""
    if headers.get("content-type", "").lower().startswith("multipart/form-data") and file_view(path):
        return settings.KB_UPLOAD_MAX_BYTES, "KB_UPLOAD_MAX_BYTES"
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE, "KB_UPLOAD_MAX_MEMORY_BYTES"


class BodyLimit:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit, setting = body_limit(scope["path"], headers)
        if limit > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            try:  # files: the caller may add them there, or none of them is read
                await sync_to_async(_may_upload, thread_sensitive=False)(scope, headers)
            except KBError as error:
                await refuse(scope, receive, send, error, error.http_status)
                return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(scope, receive, send, limit, setting)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _BodyTooLarge:
            if started:
                raise
            await _refuse(scope, receive, send, limit, setting)


def _may_upload(scope: Scope, headers: Headers) -> None:
    """The access decision of a view that takes files, taken before the body is read (the view
    takes it again): a made-up token's 401 had come after 256 MB were written to a temporary file,
    and so had the admin's answer to a caller who had not even signed in."""
    match = file_view(scope["path"])
    try:
        if match is not None and match.view_name == ADMIN_UPLOAD:
            refuse_cross_site(headers)
            _require_curator(headers)
            return
        client = scope.get("client")
        access = request_access(headers=headers, client_address=client[0] if client else None)
        access.require(TokenScope.WRITE)
        if match is not None:
            access.collection(match.kwargs["name"])  # one it may see, which exists
    except DatabaseError as error:
        raise database_error(error) from None
    finally:
        connections.close_all()  # this thread's


def _require_curator(headers: Headers) -> None:
    """A signed-in curator who may add documents, as the admin's session says."""
    cookies = parse_cookie("; ".join(headers.getlist("cookie")))  # all of them, as Django joins them
    key = cookies.get(settings.SESSION_COOKIE_NAME)
    if key and "\x00" in key:  # no session's: the database would refuse the look-up itself
        key = None
    session = import_module(settings.SESSION_ENGINE).SessionStore(key)
    # Read only: get_user deletes a session that no longer verifies and renews one signed with an
    # old secret, which only the response Django sends may do (with the new cookie).
    session.flush = session.cycle_key = lambda: None
    user = get_user(SimpleNamespace(session=session))  # checks the session against the password, as Django does
    if not (user.is_active and user.is_staff and user.has_perm("kb.add_document")):
        raise KBError(ErrorCode.PERMISSION_DENIED, "Sign in to the admin as a curator who may add documents")


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int, setting: str) -> None:
    error = KBError(ErrorCode.INVALID_ARGUMENT, f"The request body is larger than {limit} bytes ({setting})")
    await refuse(scope, receive, send, error, 413, advice=TOO_LARGE_ADVICE)


async def refuse(scope: Scope, receive: Receive, send: Send, error: KBError, status: int, advice: str = "") -> None:
    """The API's JSON error, or a page on the admin's paths (a curator's browser)."""
    headers = {"Connection": "close"}
    if scope["path"].startswith("/admin/"):
        page = ADMIN_PAGE.format(message=html.escape(error.message), advice=advice)
        response: Response = HTMLResponse(page, status_code=status, headers=headers)
    else:
        response = JSONResponse(error.as_dict(), status_code=status, headers=headers)
    await response(scope, receive, send)


ADMIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Not sent</title></head>
<body><h1>Not sent</h1><p>{message}. Nothing was stored.</p>{advice}
<p><a href="/admin/">Admin home</a></p></body></html>"""
TOO_LARGE_ADVICE = (
    "<p>Larger files go through the upload form (up to KB_UPLOAD_MAX_BYTES) or the <code>kb_ingest</code> command.</p>"
)
