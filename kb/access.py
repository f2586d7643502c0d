"""Who may do what: the one access decision of every door that serves requests (REST API, MCP on
every transport and profile, /health).

``request_access`` takes what a request says about itself (its credentials, the address it comes
from, the site a browser says it comes from) and returns an ``Access``:

- A request that a browser sends from another site is refused, with or without a token: a page the
  operator visits must never write into (or read from) the knowledge base.
- A request with a bearer token has the token's scope and collections.
- A request without a token has full access only from loopback and only while KB_REQUIRE_AUTH is
  off (the embedded default); from any other address a token is required, whatever the server
  was told about where it listens.

A token limited to some collections cannot see the others at all: they are reported as not found,
in listings and search results too (``Access.collection`` / ``Access.document``).
"""

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from kb.errors import ErrorCode, KBError
from kb.models import SCOPE_LEVELS, ApiToken, Collection, Document, Source, SyncRun, TokenScope
from kb.selectors.collections import collection_get
from kb.selectors.documents import document_get
from kb.selectors.sources import source_get, sync_run_get
from kb.services.tokens import token_authenticate


@dataclass(frozen=True)
class Access:
    scope: TokenScope
    # None: every collection. Empty: none (a limited token whose collections were all deleted).
    collections: frozenset[str] | None = None
    token: ApiToken | None = None

    def allows(self, scope: str) -> bool:
        return SCOPE_LEVELS[TokenScope(self.scope)] >= SCOPE_LEVELS[TokenScope(scope)]

    def require(self, scope: str) -> None:
        if not self.allows(scope):
            raise KBError(
                ErrorCode.PERMISSION_DENIED,
                f"This token's scope is {str(self.scope)!r}; {str(scope)!r} is needed",
            )

    def can_see(self, collection: str) -> bool:
        return self.collections is None or collection in self.collections

    def check_collection(self, collection: str) -> None:
        """Hidden means not found: a token never learns that a collection it may not use exists."""
        if not self.can_see(collection):
            raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection}")

    def collection(self, name: str) -> Collection:
        self.check_collection(name)
        return collection_get(name=name)

    def document(self, doc_id: str) -> Document:
        """A document the caller may see; one in a hidden collection is reported as not found."""
        document = document_get(doc_id=doc_id)
        if not self.can_see(document.collection.name):
            raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {doc_id}")
        return document

    def source(self, name: str) -> Source:
        """A source the caller may see: one of a hidden collection is reported as not found."""
        source = source_get(name=name)
        if not self.can_see(source.collection.name):
            raise KBError(ErrorCode.NOT_FOUND, f"Source not found: {name}")
        return source

    def sync_run(self, run_id: str) -> SyncRun:
        run = sync_run_get(run_id=run_id)
        if not self.can_see(run.source.collection.name):
            raise KBError(ErrorCode.NOT_FOUND, f"Sync run not found: {run_id}")
        return run

    @property
    def unrestricted(self) -> bool:
        """Whether this access covers every collection (not a token limited to some)."""
        return self.collections is None

    def require_unrestricted(self, action: str) -> None:
        """Actions that are not about one visible collection (creating one, server-wide stats...)."""
        if not self.unrestricted:
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


# The operator's own processes (commands, the stdio MCP server) and loopback clients of the default.
FULL_ACCESS = Access(scope=TokenScope.ADMIN)


# Sent with every request the server's own fetcher makes (kb.ingestion.sources). A URL a caller
# ingests may lead back to this server, from loopback, where no token is needed: the fetch must not
# lend the caller that access (a token limited to one collection had read another by ingesting its
# API's URL, with loopback allowed to the fetcher). Anyone may send it; it only takes access away.
FETCHED_FOR_A_CALLER = "X-KB-Fetched-For-A-Caller"


def request_access(*, headers: Mapping[str, str], client_address: str | None) -> Access:
    """The access of one request, from its headers (any mapping whose ``get`` ignores case) and the
    address it comes from. Its Origin and Sec-Fetch-Site headers are set by browsers and cannot be
    forged by pages; other clients usually send neither. Its Host: a browser's request is ours only
    from a page of the same origin."""
    refuse_cross_site(headers)
    authorization = headers.get("authorization")
    if not authorization:
        trusted = is_loopback(client_address) and not headers.get(FETCHED_FOR_A_CALLER)
        if settings.KB_REQUIRE_AUTH or not trusted:
            raise KBError(ErrorCode.UNAUTHORIZED, "An API token is required: send 'Authorization: Bearer <token>'")
        return FULL_ACCESS
    scheme, _, raw = authorization.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise KBError(ErrorCode.UNAUTHORIZED, "Send the API token as 'Authorization: Bearer <token>'")
    return token_access(token_authenticate(raw=raw))


def token_access(token: ApiToken) -> Access:
    return Access(scope=TokenScope(token.scope), collections=token.collection_limit(), token=token)


def is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


def refuse_cross_site(headers: Mapping[str, str]) -> None:
    """A request a browser sends from another site (its Origin and Sec-Fetch-Site headers) is refused."""
    fetch_site, host = headers.get("sec-fetch-site"), headers.get("host")
    if (fetch_site or "").strip().lower() == "cross-site" or not origin_allowed(headers.get("origin"), host=host):
        raise KBError(
            ErrorCode.PERMISSION_DENIED,
            "Requests from another site are refused (Origin / Sec-Fetch-Site); "
            "add the site to DJANGO_CSRF_TRUSTED_ORIGINS if it is yours",
        )


def allowed_hosts() -> list[str]:
    # As Django itself: with DEBUG on and no ALLOWED_HOSTS, local names are allowed.
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return settings.ALLOWED_HOSTS


def host_allowed(host: str | None) -> bool:
    """A Host header naming this server (DNS rebinding defence for what Django does not serve)."""
    domain, _port = split_domain_port(host or "")
    return bool(domain) and validate_host(domain, allowed_hosts())


def origin_allowed(origin: str | None, *, host: str | None) -> bool:
    """No Origin (not a browser, or a same-origin GET), a trusted origin (DJANGO_CSRF_TRUSTED_ORIGINS),
    or the page's own origin: same host *and port* as the request's Host, as Django's CSRF check
    has it (a page served by another program on another local port is another site). "null"
    (sandboxed frames, file: pages) and anything unparsable name another site."""
    if origin is None or origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return False
    same_origin = bool(host) and parts.netloc.lower() == host.strip().lower()
    return parts.scheme in ("http", "https") and same_origin and host_allowed(parts.netloc)
