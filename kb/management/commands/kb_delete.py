from typing import Any

from django.core.management.base import CommandError, CommandParser

from kb.errors import KBError
from kb.management.base import KBCommand
from kb.services.documents import document_delete


class Command(KBCommand):
    help = (
        "Delete documents (with their chunks and embeddings) by ID; exits with status 1 if one was not found.\n"
        "Example: .venv/bin/python manage.py kb_delete 01HRE4KXQN8Z3J2X5Y7A9B4C6D"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("doc_ids", nargs="+", metavar="DOC_ID")

    def handle(self, *args: Any, doc_ids: list[str], **options: Any) -> None:
        failures = 0
        for doc_id in doc_ids:
            try:
                document = document_delete(doc_id=doc_id)
            except KBError as error:
                failures += 1
                self.stderr.write(f"{error.code}: {error.message}")
                continue
            self.stdout.write(f"Deleted {document.pk} ({document.source_uri}) from {document.collection.name}.")
        if failures:
            raise CommandError(f"{failures} document(s) could not be deleted", returncode=1)
