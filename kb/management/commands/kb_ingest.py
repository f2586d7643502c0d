import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from kb.errors import KBError
from kb.ingestion.sources import file_path_of, is_local_path_uri
from kb.management.base import KBCommand, positive_seconds
from kb.management.progress import Progress
from kb.models import Collection, Document
from kb.selectors.ingestion import documents_embedding_progress
from kb.services.collections import collection_to_write
from kb.services.ingest import IngestItem, IngestReport, command_line_file_roots, document_ingest

POLL_SECONDS = 0.5


class Command(KBCommand):
    help = (
        "Ingest files, folders (every supported file in them) or URIs into a collection, with a progress bar "
        "and a closing summary; exits with status 1 if anything failed. Paths must lie under KB_FILE_ROOTS "
        "(default: the current directory). Embedding runs in the Celery worker; --wait waits for it.\n"
        "Example: .venv/bin/python manage.py kb_ingest ./docs https://example.org/guide.md "
        "--collection docs --create --wait"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("sources", nargs="+", metavar="PATH_OR_URI", help="path, file://, http(s):// or data: URI")
        parser.add_argument("--collection", required=True, help="the target collection")
        parser.add_argument("--create", action="store_true", help="create the collection if it does not exist")
        parser.add_argument("--recursive", action="store_true", help="also ingest the files in subfolders of folders")
        parser.add_argument("--content-type", help="override the detected content type (e.g. markdown, python)")
        parser.add_argument("--force", action="store_true", help="re-chunk even unchanged sources")
        parser.add_argument("--wait", action="store_true", help="wait until the worker embedded every document")
        parser.add_argument("--timeout", type=positive_seconds, default=3600.0, help="seconds --wait waits at most")

    def handle(self, *args: Any, sources: list[str], **options: Any) -> None:
        name = options["collection"]
        collection = collection_to_write(name=name, create=options["create"])
        report = IngestReport(items=self._ingest(collection, sources, options))
        embedding_failures: list[Document] = []
        if options["wait"]:
            embedding_failures = self._wait([document.pk for document in report.documents], options["timeout"])
        self._summarise(collection, report, embedding_failures)
        if not options["recursive"] and any(_has_subfolders(source) for source in sources):
            self.stdout.write("Subfolders were not read: add --recursive to include them.")
        failed = report.count("failed") + len(embedding_failures)
        if failed:
            raise CommandError(f"{failed} source(s) failed", returncode=1)

    def _ingest(self, collection: Collection, sources: list[str], options: dict[str, Any]) -> list[IngestItem]:
        items: list[IngestItem] = []
        with Progress(self.stderr, description="Ingesting", unit="files") as progress:

            def record(item: IngestItem) -> None:
                items.append(item)
                progress.step(f"{item.outcome:9} {item.source_uri}")
                if item.outcome == "failed":
                    progress.note(f"failed: {item.source_uri}: {item.error}")

            for source in sources:
                try:
                    document_ingest(
                        collection=collection,
                        uri=source,
                        file_roots=command_line_file_roots(),
                        content_type=options["content_type"],
                        recursive=options["recursive"],
                        force=options["force"],
                        on_item=record,
                        whole_folder=True,
                    )
                except KBError as error:  # a single source that failed; folders report each file
                    record(IngestItem(source_uri=source, outcome="failed", error=error))
        return items

    def _wait(self, doc_ids: list[str], timeout: float) -> list[Document]:
        """Follow the worker's progress over the chunks of ``doc_ids``; returns the documents that failed."""
        deadline = time.monotonic() + timeout
        state = documents_embedding_progress(doc_ids=doc_ids)
        with Progress(self.stderr, description="Embedding", unit="chunks", total=state.chunks) as progress:
            while True:
                progress.update_to(state.embedded_chunks, state.chunks)
                if state.done:
                    return state.failed
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"Gave up waiting after {timeout:g}s: {state.embedded_chunks}/{state.chunks} chunks embedded. "
                        "Is a Celery worker running? (`make run` starts one; or `celery -A config worker`)"
                    )
                time.sleep(POLL_SECONDS)
                state = documents_embedding_progress(doc_ids=doc_ids)

    def _summarise(self, collection: Collection, report: IngestReport, embedding_failures: list[Document]) -> None:
        self.stdout.write(f"Collection {collection.name}: {report.summary or 'nothing found'}")
        for item in report.failed:
            self.stdout.write(f"  failed: {item.source_uri}: {item.error}")
        skipped = [item.source_uri for item in report.items if item.outcome == "skipped"]
        if skipped:
            shown = ", ".join(uri.rsplit("/", 1)[-1] for uri in skipped[:SKIPPED_NAMED])
            more = f" and {len(skipped) - SKIPPED_NAMED} more" if len(skipped) > SKIPPED_NAMED else ""
            self.stdout.write(f"  skipped (type not supported): {shown}{more}")
        for document in embedding_failures:
            self.stdout.write(f"  embedding failed: {document.source_uri}: {document.error_code}: {document.error}")


SKIPPED_NAMED = 10


def _has_subfolders(source: str) -> bool:
    if not is_local_path_uri(source):
        return False
    try:
        folder = file_path_of(source)
        return folder.is_dir() and any(child.is_dir() and not child.name.startswith(".") for child in folder.iterdir())
    except (KBError, OSError):
        return False
