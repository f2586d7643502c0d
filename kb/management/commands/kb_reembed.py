import sys
import time
from typing import Any

from django.core.management.base import CommandError, CommandParser
from tqdm import tqdm

from kb.management.base import KBCommand
from kb.models import Collection, EmbeddingProvider
from kb.selectors.collections import collection_get, collection_reembedding
from kb.services.model_switch import collection_reembed_cancel, collection_reembed_retry, collection_switch_model

POLL_SECONDS = 1.0


class Command(KBCommand):
    help = (
        "Re-embed a collection with another embedding model. The Celery worker fills the new vectors in the "
        "background; search keeps using the current model until every chunk has a new vector, then switches. "
        "--wait shows the progress until it is done or stops; a stopped re-embed says why, and --retry or "
        "--cancel (stay on the current model) is the way out.\n"
        "Example: .venv/bin/python manage.py kb_reembed --collection docs --provider ollama "
        "--model nomic-embed-text --wait"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--collection", required=True)
        what = parser.add_mutually_exclusive_group(required=True)
        what.add_argument("--model", help="the embedding model's name")
        what.add_argument("--retry", action="store_true", help="start a stopped re-embed again")
        what.add_argument("--cancel", action="store_true", help="give up a re-embed; search keeps the current model")
        what.add_argument("--status", action="store_true", help="say how far a re-embed is, or why it stopped")
        parser.add_argument(
            "--provider", choices=EmbeddingProvider.values, help="default: the collection's current provider"
        )
        parser.add_argument("--wait", action="store_true", help="show progress until it is done or stops")

    def handle(
        self,
        *args: Any,
        collection: str,
        model: str | None,
        provider: str | None,
        retry: bool,
        cancel: bool,
        status: bool,
        wait: bool,
        **options: Any,
    ) -> None:
        target = collection_get(name=collection)
        if cancel:
            target = collection_reembed_cancel(collection=target)
            self.stdout.write(f"Re-embedding cancelled: {target.name} stays on {target.embedding_model}.")
            return
        if retry:
            target = collection_reembed_retry(collection=target)
        elif model is not None:
            target = collection_switch_model(collection=target, provider=provider, model_name=model)
        self._report(target)
        if wait:
            self._wait(target)

    def _report(self, collection: Collection) -> None:
        reembedding = collection_reembedding(collection=collection)
        if reembedding is None:
            self.stdout.write(f"Collection {collection.name} uses {collection.embedding_model}: nothing to re-embed.")
        else:
            self.stdout.write(
                f"Collection {collection.name}: {reembedding.summary}. "
                f"Search uses {collection.embedding_model} until it is complete."
            )

    def _wait(self, collection: Collection) -> None:
        reembedding = collection_reembedding(collection=collection)
        if reembedding is None:
            return
        stream = getattr(self.stderr, "_out", sys.stderr)  # the stream itself: tqdm redraws one line
        with tqdm(total=reembedding.total, unit="chunk", desc=f"re-embedding {collection.name}", file=stream) as bar:
            while True:
                collection.refresh_from_db()
                reembedding = collection_reembedding(collection=collection)
                if reembedding is None:
                    bar.update(bar.total - bar.n)
                    break
                bar.total = reembedding.total
                bar.update(reembedding.done - bar.n)
                if reembedding.state == "stopped":
                    break
                bar.set_postfix_str(f"retrying: {reembedding.error}"[:60] if reembedding.error else "")
                time.sleep(POLL_SECONDS)
        if reembedding is not None:
            raise CommandError(f"{reembedding.summary}.")
        collection.refresh_from_db()
        self.stdout.write(f"Done: {collection.name} now searches with {collection.embedding_model}.")
