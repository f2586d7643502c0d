import textwrap
from typing import Any

from django.core.management.base import CommandParser

from kb.management.base import KBCommand
from kb.search import MODES, SearchResult, search

SNIPPET_CHARS = 400


class Command(KBCommand):
    help = (
        "Search the knowledge base from the shell: ranked results with scores, source and line range; "
        "--json prints the REST API's search response for scripts.\n"
        'Example: .venv/bin/python manage.py kb_search "how do I deploy?" --collection docs --top-k 5'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("query")
        parser.add_argument(
            "--collection", action="append", dest="collections", help="search this collection (repeatable)"
        )
        parser.add_argument("--mode", choices=MODES, help="default: the collection's setting, else hybrid")
        parser.add_argument("--top-k", type=int, help="number of results (1-100); default: the collection's, else 10")
        parser.add_argument("--semantic-weight", type=float, help="hybrid fusion weight, 0.0 (keyword) to 1.0")
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")

    def handle(self, query: str, **options: Any) -> None:
        response = search(
            query=query,
            collections=options["collections"],
            top_k=options["top_k"],
            mode=options["mode"],
            semantic_weight=options["semantic_weight"],
        )
        if options["json"]:
            self.write_json(response)
            return
        for warning in response.warnings:
            self.stderr.write(f"warning: {warning}")
        if not response.results:
            self.stdout.write("No results.")
        for result in response.results:
            self.stdout.write(_format_result(result))


def _format_result(result: SearchResult) -> str:
    similarity = "" if result.similarity is None else f"  similarity {result.similarity:.3f}"
    page = "" if result.page is None else f" page {result.page}"
    header = (
        f"{result.rank:>2}. score {result.score:.4f}{similarity}  [{result.collection}] "
        f"{result.source_uri}  lines {result.lines}{page}  (doc {result.document_id}, chunk {result.chunk_index})"
    )
    text = " ".join(result.content.split())
    snippet = text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"
    return header + "\n" + textwrap.indent(textwrap.fill(snippet, width=100), "    ") + "\n"
