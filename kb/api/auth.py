"""Bearer-token authentication of the REST API, by the rules of kb.access.

On the embedded loopback default a request without a token has full access; with
KB_REQUIRE_AUTH (or when listening beyond loopback) every request needs a token.
"""

import ipaddress
from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer

from kb.access import Access, access_from_authorization
from kb.errors import ErrorCode, KBError
from kb.models import Document
from kb.selectors import document_get


class BearerToken(HttpBearer):
    def __call__(self, request: HttpRequest) -> Access:
        # Unlike HttpBearer, no header is not a failure by itself: kb.access decides.
        header = request.headers.get("Authorization")
        if not header and not _from_loopback(request):
            # A request from another machine means the server listens beyond loopback, even if
            # KB_HOST was not told so (e.g. uvicorn started by hand on 0.0.0.0): a token is required.
            raise KBError(ErrorCode.UNAUTHORIZED, "An API token is required: send 'Authorization: Bearer <token>'")
        return access_from_authorization(header)

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return access_from_authorization(f"Bearer {token}")


def _from_loopback(request: HttpRequest) -> bool:
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def access_of(request: HttpRequest) -> Access:
    return request.auth  # type: ignore[attr-defined] - set by BearerToken


def visible_document(access: Access, doc_id: str) -> Document:
    """The document, unless it lies in a collection the token cannot see (then: not found)."""
    document = document_get(doc_id=doc_id)
    if not access.can_see(document.collection.name):
        raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {doc_id}")
    return document
