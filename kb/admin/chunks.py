"""Chunks: read-only, found through the full-text index, linked to their document; the home of
the search playground (a chunk is what a search returns)."""

from typing import Any

from django.contrib import admin
from django.contrib.postgres.search import SearchQuery
from django.db import DatabaseError, connection, transaction
from django.db.models import QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.html import format_html

from kb.admin import views
from kb.admin.common import CuratedAdmin
from kb.models import Chunk


@admin.register(Chunk)
class ChunkAdmin(CuratedAdmin):
    list_display = ["chunk_column", "document_column", "collection", "lines", "page", "token_count", "preview"]
    list_filter = ["collection"]
    linked_filters = ("document",)  # a document's page links to its chunks
    # The search box uses the chunks' full-text index (get_search_results), not a LIKE scan.
    search_fields = ["content"]
    search_help_text = "Words to find in the chunks (full-text, stemmed)."
    list_per_page = 100
    show_full_result_count = False
    # The column itself, not the document's default ordering: the (document, index) index serves it.
    ordering = ["document_id", "index"]
    fields = [
        "document_link",
        "collection",
        "index",
        "lines",
        "page",
        "heading_path",
        "token_count",
        "content_hash",
        "metadata",
        "content",
    ]
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Chunk]:
        return (
            super()
            .get_queryset(request)
            .select_related("document", "collection")
            # A list shows 160 characters of each chunk; the detail page loads the rest.
            .defer("search_vector", "content", "document__raw_content", "document__metadata", "document__error")
            .annotate(content_preview=Left("content", 160))
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Chunk], search_term: str
    ) -> tuple[QuerySet[Chunk], bool]:
        term = search_term.strip()  # cut to a few words by CuratedAdmin.changelist_view
        if not term:
            return queryset, False
        return queryset.filter(search_vector=SearchQuery(term, config="english", search_type=_syntax(term))), False

    def get_urls(self) -> list[Any]:
        return [
            path("playground/", self.admin_site.admin_view(self.playground_view), name="kb_playground"),
            *super().get_urls(),
        ]

    def playground_view(self, request: HttpRequest) -> HttpResponse:
        return views.playground(request, self)

    @admin.display(description="Chunk", ordering="index")
    def chunk_column(self, obj: Chunk) -> str:
        return f"#{obj.index}"

    @admin.display(description="Document")
    def document_column(self, obj: Chunk) -> str:
        url = reverse("admin:kb_document_change", args=[obj.document_id])
        return format_html('<a href="{}">{}</a>', url, str(obj.document)[:100])

    @admin.display(description="Document")
    def document_link(self, obj: Chunk) -> str:
        return self.document_column(obj)

    @admin.display(description="Text")
    def preview(self, obj: Chunk) -> str:
        return obj.content_preview

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Chunk | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Chunk | None = None) -> bool:
        return False


def _syntax(term: str) -> str:
    """Web search syntax ("quotes", or, -word) where Postgres can parse the term, else plain words:
    33 dashes run its parser out of stack ("tsquery stack too small"), a 500 for the whole page."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT websearch_to_tsquery('english', %s)", [term])
    except DatabaseError:
        return "plain"
    return "websearch"
