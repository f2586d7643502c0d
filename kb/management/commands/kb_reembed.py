from typing import Any

from django.core.management.base import CommandParser

from kb.management.base import KBCommand
from kb.models import EmbeddingProvider
from kb.selectors import collection_get
from kb.services.embedding import collection_switch_model


class Command(KBCommand):
    help = (
        "Re-embed a collection with another embedding model. The Celery worker fills the new vectors in the "
        "background; search keeps using the current model until every chunk has a new vector, then switches.\n"
        "Example: python manage.py kb_reembed --collection docs --provider ollama --model nomic-embed-text"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--collection", required=True)
        parser.add_argument("--model", required=True, help="the embedding model's name")
        parser.add_argument(
            "--provider", choices=EmbeddingProvider.values, help="default: the collection's current provider"
        )

    def handle(self, *args: Any, collection: str, model: str, provider: str | None, **options: Any) -> None:
        target = collection_get(name=collection)
        target = collection_switch_model(
            collection=target, provider=provider or target.embedding_model.provider, model_name=model
        )
        if target.next_embedding_model is None:
            self.stdout.write(f"Collection {target.name} already uses {target.embedding_model}: nothing to do.")
            return
        self.stdout.write(
            f"Re-embedding collection {target.name} with {target.next_embedding_model} in the background; "
            f"search uses {target.embedding_model} until it is complete."
        )
