"""The REST API's door: every request's access comes from kb.access.request_access."""

from typing import Any

from django.http import HttpRequest
from ninja.parser import Parser
from ninja.security import HttpBearer
from ninja.types import DictStrAny

from kb.access import Access, request_access
from kb.errors import ErrorCode, KBError
from kb.models import TokenScope

# Bodies a page on another site can send without asking first (text/plain, form-urlencoded,
# multipart/form-data) are never read as JSON: JSON comes as application/json (JsonBodies), files as
# multipart/form-data.
JSON_BODY = "application/json"
BODY_TYPES = (JSON_BODY, "multipart/form-data")


class JsonBodies(Parser):
    """A JSON body is read only when it says it is one (multipart/form-data was read as JSON too)."""

    def parse_body(self, request: HttpRequest) -> DictStrAny:
        if (request.content_type or "").lower() != JSON_BODY:
            raise KBError(
                ErrorCode.INVALID_ARGUMENT,
                f"This endpoint takes a JSON body: send it as {JSON_BODY}, not {request.content_type!r}",
            )
        return super().parse_body(request)


def access_of_request(request: HttpRequest) -> Access:
    return request_access(headers=request.headers, client_address=request.META.get("REMOTE_ADDR"))


class BearerToken(HttpBearer):
    def __call__(self, request: HttpRequest) -> Access:
        # Unlike HttpBearer, no header is not a failure by itself: kb.access decides.
        access = access_of_request(request)
        _check_body_type(request)
        return access

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return self(request)


def _check_body_type(request: HttpRequest) -> None:
    if request.method in ("GET", "HEAD", "OPTIONS") or not _has_body(request):
        return
    if (request.content_type or "").lower() not in BODY_TYPES:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"Unsupported Content-Type {request.content_type!r}: send JSON as application/json "
            "(uploads as multipart/form-data)",
        )


def _has_body(request: HttpRequest) -> bool:
    if "HTTP_TRANSFER_ENCODING" in request.META:  # chunked: no length, but a body
        return True
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return True


def sees_health_details(request: HttpRequest) -> bool:
    """/health answers everyone (load balancers have no token); its details only admins."""
    try:
        access = access_of_request(request)
    except KBError:
        return False
    return access.allows(TokenScope.ADMIN) and access.collections is None


def access_of(request: HttpRequest) -> Access:
    return request.auth  # type: ignore[attr-defined] - set by BearerToken
