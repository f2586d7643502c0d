from typing import Any

from django.core.management.base import CommandParser

from kb.management.base import KBCommand
from kb.models import EmbeddingProvider
from kb.selectors.collections import CollectionListing, collection_list
from kb.services.collections import collection_create, collection_delete


class Command(KBCommand):
    help = (
        "List, create or delete collections.\n"
        "Examples: .venv/bin/python manage.py kb_collections list\n"
        '          .venv/bin/python manage.py kb_collections create docs --description "Product documentation"\n'
        "          .venv/bin/python manage.py kb_collections delete docs --yes"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{list,create,delete}")
        listing = actions.add_parser("list", help="collections with their document and chunk totals")
        listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
        create = actions.add_parser("create", help="create a collection")
        create.add_argument("name", help="letters, digits, '-' and '_'")
        create.add_argument("--description", default="")
        create.add_argument("--provider", choices=EmbeddingProvider.values, help="embedding provider")
        create.add_argument("--model", help="embedding model (default: the provider's default)")
        create.add_argument("--chunk-max-tokens", type=int, default=512)
        create.add_argument("--chunk-min-tokens", type=int, default=50)
        create.add_argument("--chunk-overlap-tokens", type=int, default=0)
        delete = actions.add_parser("delete", help="delete a collection with all its documents")
        delete.add_argument("name")
        delete.add_argument("--yes", action="store_true", help="confirm the deletion (required)")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        {"list": self._list, "create": self._create, "delete": self._delete}[action](**options)

    def _list(self, json: bool, **options: Any) -> None:
        collections = list(collection_list())
        if json:
            self.write_json(CollectionListing.of(collections))
            return
        rows = [
            (c.name, c.document_total, c.ready_total, c.pending_total + c.processing_total, c.failed_total,
             c.chunk_total, str(c.embedding_model), c.description[:40])
            for c in collections
        ]  # fmt: skip
        self.write_table(("NAME", "DOCS", "READY", "PENDING", "FAILED", "CHUNKS", "MODEL", "DESCRIPTION"), rows)

    def _create(self, name: str, **options: Any) -> None:
        collection = collection_create(
            name=name,
            description=options["description"],
            embedding_provider=options["provider"],
            embedding_model=options["model"],
            chunk_max_tokens=options["chunk_max_tokens"],
            chunk_min_tokens=options["chunk_min_tokens"],
            chunk_overlap_tokens=options["chunk_overlap_tokens"],
        )
        self.stdout.write(f"Created collection {collection.name} (embedding model {collection.embedding_model}).")

    def _delete(self, name: str, yes: bool, **options: Any) -> None:
        deletion = collection_delete(name=name, confirm=yes, how_to_confirm="--yes")
        self.stdout.write(
            f"Deleted collection {deletion.name} with {deletion.documents} documents and {deletion.chunks} chunks."
        )
