from typing import Any

from django.core.management.base import CommandParser

from kb.management.base import KBCommand
from kb.selectors.stats import kb_stats


class Command(KBCommand):
    help = (
        "Counts of collections, documents (by status), chunks and embeddings, and the storage they use.\n"
        "Example: .venv/bin/python manage.py kb_stats --collection docs"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--collection", help="only this collection")
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")

    def handle(self, *args: Any, collection: str | None, json: bool, **options: Any) -> None:
        stats = kb_stats(collection=collection)
        if json:
            self.write_json(stats)
            return
        rows = [(key.replace("_", " "), value) for key, value in stats.model_dump().items() if key != "filter"]
        self.stdout.write(f"Collection {collection}" if collection else "All collections")
        self.write_table(("", "COUNT"), rows)
