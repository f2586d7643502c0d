"""API tokens: created once (the plaintext is returned only then), stored as a SHA-256 hash."""

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from kb.errors import ErrorCode, KBError
from kb.models import ApiToken, Collection, TokenScope

TOKEN_PREFIX = "kb_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def token_create(
    *,
    name: str,
    scope: str = TokenScope.READ,
    collections: Sequence[str] = (),
    created_by: object | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; returns it with its plaintext, which is not stored and cannot be shown again."""
    if not name or not name.strip():
        raise KBError(ErrorCode.INVALID_ARGUMENT, "A token needs a name")
    if scope not in TokenScope.values:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"scope must be one of {', '.join(TokenScope.values)}")
    found = list(Collection.objects.filter(name__in=list(collections)))
    missing = sorted(set(collections) - {collection.name for collection in found})
    if missing:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {', '.join(missing)}")
    prefix = secrets.token_hex(4)
    raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        token = ApiToken.objects.create(
            name=name.strip(),
            prefix=prefix,
            key_hash=hash_token(raw),
            scope=scope,
            created_by=created_by,
            expires_at=expires_at,
            limited_to_collections=bool(found),
        )
        token.collections.set(found)
    return token, raw


def token_revoke(*, prefix: str) -> ApiToken:
    updated = ApiToken.objects.filter(prefix=prefix, revoked_at__isnull=True).update(revoked_at=timezone.now())
    try:
        token = ApiToken.objects.get(prefix=prefix)
    except ApiToken.DoesNotExist:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"No token with prefix {prefix!r}") from None
    if not updated and token.revoked_at is None:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Token {prefix!r} could not be revoked")
    return token


def token_authenticate(*, raw: str) -> ApiToken:
    """The live token for a plaintext, or UNAUTHORIZED. Records when it was last used."""
    raw = (raw or "").strip()
    try:
        token = ApiToken.objects.prefetch_related("collections").get(key_hash=hash_token(raw))
    # A lone surrogate cannot be hashed as UTF-8: no token has it.
    except (ApiToken.DoesNotExist, UnicodeEncodeError):
        raise KBError(ErrorCode.UNAUTHORIZED, "Invalid API token") from None
    now = timezone.now()
    if token.revoked_at is not None:
        raise KBError(ErrorCode.UNAUTHORIZED, "This API token was revoked")
    if token.expires_at is not None and token.expires_at <= now:
        raise KBError(ErrorCode.UNAUTHORIZED, "This API token has expired")
    # At most one write a minute per token: authentication stays a read on hot paths.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
