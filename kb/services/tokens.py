"""API tokens: created once (the plaintext is returned only then), stored as a SHA-256 hash."""

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from kb.errors import ErrorCode, KBError
from kb.models import ApiToken, Collection, TokenScope
from kb.storable import check_storable

TOKEN_PREFIX = "kb_"
TOKEN_NAME_MAX_LENGTH = ApiToken._meta.get_field("name").max_length

# What a curator must be allowed to do in the admin to hand out each scope: a token does no more
# than the person who made it could (a staff user allowed only to add tokens had minted admin ones).
# Each scope needs its own permissions and those of the scopes below it.
SCOPE_PERMISSIONS = {
    # Chunks too: a read token's searches answer with chunks' whole text, which the admin shows only
    # with view_chunk (a curator without it had minted a read token to read them).
    TokenScope.READ: ("kb.view_collection", "kb.view_document", "kb.view_chunk", "kb.view_source", "kb.view_syncrun"),
    TokenScope.WRITE: (
        "kb.add_collection",
        "kb.add_document",
        "kb.change_document",
        "kb.delete_document",
        "kb.add_source",
        "kb.change_source",
        "kb.delete_source",
    ),
    TokenScope.ADMIN: ("kb.change_collection", "kb.delete_collection"),
}


def scopes_grantable_by(user: Any) -> list[str]:
    """The scopes ``user`` may put on a token, weakest first."""
    needed: list[str] = []
    grantable = []
    for scope in TokenScope.values:
        needed += SCOPE_PERMISSIONS[TokenScope(scope)]
        if not user.has_perms(needed):
            break
        grantable.append(scope)
    return grantable


def validate_expiry(expires_at: datetime | None) -> None:
    if expires_at is not None and expires_at <= timezone.now():
        raise KBError(ErrorCode.INVALID_ARGUMENT, "A token's expiry must be in the future")


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def token_create(
    *,
    name: str,
    scope: str = TokenScope.READ,
    collections: Sequence[str] = (),
    created_by: Any | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; returns it with its plaintext, which is not stored and cannot be shown again.

    ``created_by``, the admin user making it, must hold the permissions of its scope
    (``scopes_grantable_by``); without one (the operator's command line) any scope may be made."""
    if not name or not name.strip():
        raise KBError(ErrorCode.INVALID_ARGUMENT, "A token needs a name")
    check_storable(name, what="token name")
    if len(name.strip()) > TOKEN_NAME_MAX_LENGTH:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"A token's name has at most {TOKEN_NAME_MAX_LENGTH} characters")
    if scope not in TokenScope.values:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"scope must be one of {', '.join(TokenScope.values)}")
    if created_by is not None and scope not in scopes_grantable_by(created_by):
        raise KBError(ErrorCode.PERMISSION_DENIED, f"You may not hand out a token of scope {scope!r}")
    validate_expiry(expires_at)
    prefix = secrets.token_hex(4)
    raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        # Locked until the token's links commit: a deletion of one waits, instead of breaking them.
        named = Collection.objects.filter(name__in=list(collections)).order_by("pk")
        found = list(named.select_for_update(no_key=True))
        missing = sorted(set(collections) - {collection.name for collection in found})
        if missing:
            raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {', '.join(missing)}")
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
