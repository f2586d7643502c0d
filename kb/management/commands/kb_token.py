from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from kb.management.base import KBCommand
from kb.models import TokenScope
from kb.selectors.tokens import token_list
from kb.services.tokens import token_create, token_revoke

# A century. Far larger values overflow Python's dates (past year 9999): a traceback, not an error.
MAX_EXPIRES_DAYS = 36_500


class Command(KBCommand):
    help = (
        "Create, list or revoke API tokens for the REST API and the MCP HTTP transports. A token is shown once, "
        "when created; only its hash is stored. Send it as 'Authorization: Bearer <token>'.\n"
        "Examples: .venv/bin/python manage.py kb_token create ci-bot --scope write --collection docs "
        "--expires-days 90\n"
        "          .venv/bin/python manage.py kb_token list\n"
        "          .venv/bin/python manage.py kb_token revoke 1a2b3c4d"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{create,list,revoke}")
        create = actions.add_parser("create", help="create a token and print it (once)")
        create.add_argument("name", help="what the token is for")
        create.add_argument(
            "--scope", choices=TokenScope.values, default=TokenScope.READ, help="read, write or admin (default: read)"
        )
        create.add_argument(
            "--collection", action="append", dest="collections", default=[], help="limit to a collection (repeatable)"
        )
        create.add_argument("--expires-days", type=int, help="expire after this many days (default: never)")
        actions.add_parser("list", help="every token, with its prefix, scope and last use")
        revoke = actions.add_parser("revoke", help="revoke a token by its prefix")
        revoke.add_argument("prefix", help="the 8 characters after 'kb_' (see the list)")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        {"create": self._create, "list": self._list, "revoke": self._revoke}[action](**options)

    def _create(self, name: str, scope: str, collections: list[str], expires_days: int | None, **options: Any) -> None:
        if expires_days is not None and not 1 <= expires_days <= MAX_EXPIRES_DAYS:
            raise CommandError(f"--expires-days must be between 1 and {MAX_EXPIRES_DAYS}")
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        token, raw = token_create(name=name, scope=scope, collections=collections, expires_at=expires_at)
        self.stderr.write(f"Created token {token.prefix} ({token.scope}). Store it now, it is not shown again:")
        self.stdout.write(raw)

    def _list(self, **options: Any) -> None:
        rows = [
            (token.prefix, token.name, token.scope, token.collections_label(),
             token.created_at, token.last_used_at, token.expires_at, token.state)
            for token in token_list()
        ]  # fmt: skip
        self.write_table(("PREFIX", "NAME", "SCOPE", "COLLECTIONS", "CREATED", "LAST USED", "EXPIRES", "STATE"), rows)

    def _revoke(self, prefix: str, **options: Any) -> None:
        token = token_revoke(prefix=prefix.removeprefix("kb_"))
        self.stdout.write(f"Revoked token {token.prefix} ({token.name}).")
