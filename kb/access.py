"""Who may do what: the access of a request, from its bearer token or the loopback default.

Tokens are required on the REST API and the MCP HTTP transports when KB_REQUIRE_AUTH is set or
the server listens beyond loopback; otherwise (the embedded default) a request without a token
has full access. A token limited to some collections cannot see the others at all: they are
reported as not found, in listings and search results too.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.conf import settings

from kb.errors import ErrorCode, KBError
from kb.models import SCOPE_LEVELS, ApiToken, TokenScope
from kb.services.tokens import token_authenticate


@dataclass(frozen=True)
class Access:
    scope: str
    # None: every collection.
    collections: frozenset[str] | None = None
    token: ApiToken | None = None

    def require(self, scope: str) -> None:
        if SCOPE_LEVELS[TokenScope(self.scope)] < SCOPE_LEVELS[TokenScope(scope)]:
            raise KBError(ErrorCode.PERMISSION_DENIED, f"This token's scope is {self.scope!r}; {scope!r} is needed")

    def can_see(self, collection: str) -> bool:
        return self.collections is None or collection in self.collections

    def check_collection(self, collection: str) -> None:
        if not self.can_see(collection):
            raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection}")

    def require_unrestricted(self, action: str) -> None:
        """Actions that are not about one visible collection (creating one, server-wide stats...)."""
        if self.collections is not None:
            raise KBError(ErrorCode.PERMISSION_DENIED, f"A token limited to some collections cannot {action}")

    def visible(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if self.can_see(name)]

    def search_collections(self, requested: Sequence[str] | None) -> list[str] | None:
        """The collections a search may cover: the requested ones (each must be visible), or all visible."""
        if requested is None:
            return None if self.collections is None else sorted(self.collections)
        for name in requested:
            self.check_collection(name)
        return list(requested)


FULL_ACCESS = Access(scope=TokenScope.ADMIN)


def auth_required() -> bool:
    return settings.KB_REQUIRE_AUTH


def access_from_authorization(header: str | None) -> Access:
    """The access of a request given its ``Authorization`` header (``Bearer <token>``)."""
    if not header:
        if auth_required():
            raise KBError(ErrorCode.UNAUTHORIZED, "An API token is required: send 'Authorization: Bearer <token>'")
        return FULL_ACCESS
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise KBError(ErrorCode.UNAUTHORIZED, "Send the API token as 'Authorization: Bearer <token>'")
    token = token_authenticate(raw=raw)
    names = frozenset(collection.name for collection in token.collections.all())
    return Access(scope=token.scope, collections=names or None, token=token)
