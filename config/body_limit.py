"""Request bodies held to a limit before Django reads them.

Django's ASGI handler copies a whole request body to a temporary file before any middleware,
authentication or size check runs: a 1.5 GB chunked POST with a made-up token was written to
disk in full and only then answered 401. Here a body declared larger than its limit is refused
at once, and one that grows past it while arriving is cut off there. The limit is
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``KB_UPLOAD_MAX_MEMORY_BYTES``), what Django allows a body that
is not a file upload, and ``KB_UPLOAD_MAX_BYTES`` for ``multipart/form-data`` (files).
"""

from django.conf import settings
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kb.errors import ErrorCode, KBError


class _BodyTooLarge(Exception):
    pass


def body_limit(headers: Headers) -> tuple[int, str]:
    """The most bytes this request's body may hold, and the setting that says so."""
    if headers.get("content-type", "").lower().startswith("multipart/form-data"):
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
        limit, setting = body_limit(headers)
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


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int, setting: str) -> None:
    error = KBError(ErrorCode.INVALID_ARGUMENT, f"The request body is larger than {limit} bytes ({setting})")
    response = JSONResponse(error.as_dict(), status_code=413, headers={"Connection": "close"})
    await response(scope, receive, send)
