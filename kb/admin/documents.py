"""Documents: status badges that update themselves, filters, the actions a curator needs to fix
things (re-ingest, re-embed, retry, delete), and a read-only detail page."""

import json
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import actions as stock_actions
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.db.models.functions import Left, Length
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.defaultfilters import filesizeformat
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from kb.admin import views
from kb.admin.common import CuratedAdmin, RecordAdmin, explain_error, progress_bar, run_each, status_badge
from kb.ingestion.formats import CONTENT_TYPES
from kb.models import Document, DocumentStatus, IngestRefusal
from kb.selectors.admin import document_chunk_rows, documents_removal
from kb.services.documents import document_delete, document_mark_pending
from kb.services.embedding_pipeline import document_reembed
from kb.services.ingest import document_reingest, network_file_roots

PREVIEW_CHARS = 3000
CHUNK_ROWS = 200
# The actions a detail page offers as buttons: ModelAdmin method name -> button label.
DETAIL_ACTIONS = {"retry_failed": "Retry", "reingest": "Re-ingest", "reembed": "Re-embed"}


class ContentTypeFilter(admin.SimpleListFilter):
    """The known content types, without a DISTINCT over the whole table."""

    title = "content type"
    parameter_name = "content_type"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in CONTENT_TYPES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Document]) -> QuerySet[Document]:
        return queryset.filter(content_type=self.value()) if self.value() else queryset


@admin.register(Document)
class DocumentAdmin(CuratedAdmin):
    list_display = [
        "title_column",
        "status_column",
        "progress_column",
        "collection",
        "content_type",
        "chunks_column",
        "size_column",
        "updated_column",
    ]
    list_display_links = ["title_column"]
    list_filter = ["collection", "status", ContentTypeFilter]
    list_select_related = ["collection"]
    search_fields = ["title", "source_uri"]
    search_help_text = "Search by title or source."
    list_per_page = 100
    # The filtered count is enough; a second COUNT over every document is not.
    show_full_result_count = False
    actions = ["retry_failed", "reingest", "reembed", "delete_selected"]
    readonly_fields = [
        "title",
        "collection_link",
        "source_uri",
        "content_type",
        "status_column",
        "error_explained",
        "progress_column",
        "chunk_count",
        "size_column",
        "id",
        "content_hash",
        "embed_attempts",
        "created_at",
        "updated_at",
        "metadata_pretty",
        "content_preview",
        "chunks_table",
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "title",
                    "collection_link",
                    "source_uri",
                    "content_type",
                    "status_column",
                    "error_explained",
                    "progress_column",
                    "size_column",
                    "id",
                    "content_hash",
                    "embed_attempts",
                    "created_at",
                    "updated_at",
                ]
            },
        ),
        ("Metadata", {"fields": ["metadata_pretty"]}),
        ("Content", {"fields": ["content_preview"]}),
        ("Chunks", {"fields": ["chunks_table"]}),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Document]:
        # The raw text can be megabytes: never on a list; the detail page reads only a preview.
        return super().get_queryset(request).defer("raw_content", "metadata")

    def get_urls(self) -> list[Any]:
        site = self.admin_site
        return [
            path("status/", site.admin_view(self.status_view), name="kb_document_status"),
            path(
                "<path:object_id>/run/<str:action>/",
                site.admin_view(require_POST(self.run_action_view)),
                name="kb_document_run",
            ),
            *super().get_urls(),
        ]

    # --- list columns -------------------------------------------------------------------

    @admin.display(description="Document", ordering="title")
    def title_column(self, obj: Document) -> str:
        title = obj.title or obj.source_uri
        return format_html('{}<br><span class="kb-muted kb-source">{}</span>', title[:120], obj.source_uri[:120])

    @admin.display(description="Status", ordering="status")
    def status_column(self, obj: Document) -> str:
        return status_badge(doc_id=obj.pk, status=obj.status, error_code=obj.error_code, error=obj.error)

    @admin.display(description="Embedded")
    def progress_column(self, obj: Document) -> str:
        return progress_bar(doc_id=obj.pk, embedded=obj.embedded_count, total=obj.chunk_count)

    @admin.display(description="Chunks", ordering="chunk_count")
    def chunks_column(self, obj: Document) -> int:
        return obj.chunk_count

    @admin.display(description="Updated", ordering="updated_at")
    def updated_column(self, obj: Document) -> str:
        return date_format(timezone.localtime(obj.updated_at), "Y-m-d H:i")

    @admin.display(description="Size", ordering="size_bytes")
    def size_column(self, obj: Document) -> str:
        return filesizeformat(obj.size_bytes)

    # --- detail fields ------------------------------------------------------------------

    @admin.display(description="Collection")
    def collection_link(self, obj: Document) -> str:
        url = reverse("admin:kb_collection_change", args=[obj.collection_id])
        return format_html('<a href="{}">{}</a>', url, obj.collection.name)

    @admin.display(description="Error")
    def error_explained(self, obj: Document) -> str:
        if not obj.error and not obj.error_code:
            return "—"
        return format_html(
            '<div class="kb-error" role="note"><strong>{}</strong><br>{}<br><span class="kb-muted">{}</span></div>',
            explain_error(obj.error_code),
            obj.error,
            obj.error_code,
        )

    @admin.display(description="Metadata")
    def metadata_pretty(self, obj: Document) -> str:
        return render_to_string(
            "admin/kb/document/metadata.html",
            {"items": [(key, _readable(key, value)) for key, value in sorted(obj.metadata.items())]},
        )

    @admin.display(description="Content preview")
    def content_preview(self, obj: Document) -> str:
        preview, length = (
            Document.objects.filter(pk=obj.pk)
            .annotate(preview=Left("raw_content", PREVIEW_CHARS), length=Length("raw_content"))
            .values_list("preview", "length")
            .get()
        )
        note = f"The first {PREVIEW_CHARS:,} of {length:,} characters." if length > PREVIEW_CHARS else ""
        return format_html('<pre class="kb-pre kb-preview">{}</pre><p class="help">{}</p>', preview, note)

    @admin.display(description="Chunks")
    def chunks_table(self, obj: Document) -> str:
        return render_to_string(
            "admin/kb/document/chunks_table.html",
            {
                "document": obj,
                "chunks": document_chunk_rows(document=obj, limit=CHUNK_ROWS),
                "all_url": reverse("admin:kb_chunk_changelist") + f"?document__id__exact={obj.pk}",
            },
        )

    # --- pages --------------------------------------------------------------------------

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict | None = None) -> HttpResponse:
        return views.document_add(request, self)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        # Nothing on this page is edited by hand: documents change through ingestion.
        context = {
            **(extra_context or {}),
            "title": "Document",
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
            "detail_actions": self._detail_actions(request),
        }
        return super().change_view(request, object_id, form_url, context)

    def _detail_actions(self, request: HttpRequest) -> list[tuple[str, str]]:
        actions = self.get_actions(request)
        return [(name, label) for name, label in DETAIL_ACTIONS.items() if name in actions]

    def save_model(self, request: HttpRequest, obj: Document, form: Any, change: bool) -> None:
        """Documents are written by the ingestion services only."""

    def status_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return views.document_status(request)

    def run_action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """A detail page's button: the list action of that name, on this one document."""
        actions = self.get_actions(request)
        if action not in DETAIL_ACTIONS or action not in actions:
            raise PermissionDenied
        document = get_object_or_404(self.get_queryset(request), pk=object_id)
        actions[action][0](self, request, self.get_queryset(request).filter(pk=document.pk))
        return HttpResponseRedirect(reverse("admin:kb_document_change", args=[document.pk]))

    # --- actions: each calls a service per document and reports failures by name --------

    @admin.action(permissions=["change"], description="Retry failed documents")
    def retry_failed(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        failed = _labels(queryset.filter(status=DocumentStatus.FAILED))
        if not failed:
            messages.warning(request, "None of the selected documents has failed.")
            return
        run_each(
            request,
            failed,
            lambda doc: document_mark_pending(doc_id=doc[0]),
            done="Queued {count} document{s} for embedding again.",
            name=_label,
        )

    @admin.action(permissions=["change"], description="Re-ingest from the source")
    def reingest(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        roots = network_file_roots()
        run_each(
            request,
            _labels(queryset),
            lambda doc: document_reingest(doc_id=doc[0], file_roots=roots),
            done="Re-ingested {count} document{s}; their chunks are being embedded.",
            name=_label,
        )

    @admin.action(permissions=["change"], description="Re-embed")
    def reembed(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        run_each(
            request,
            _labels(queryset),
            lambda doc: document_reembed(doc_id=doc[0]),
            done="Queued {count} document{s} for re-embedding.",
            name=_label,
        )

    @admin.action(permissions=["delete"], description="Delete selected documents")
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Document]) -> HttpResponse | None:
        response = stock_actions.delete_selected(self, request, queryset)
        if isinstance(response, TemplateResponse):
            ids = list(queryset.values_list("pk", flat=True))
            response.context_data["kb_removal"] = documents_removal(document_ids=ids)
        return response

    def delete_model(self, request: HttpRequest, obj: Document) -> None:
        document_delete(doc_id=obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        for doc_id in list(queryset.values_list("pk", flat=True)):
            document_delete(doc_id=doc_id)

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
        context["kb_removal"] = documents_removal(document_ids=[context["object"].pk])
        return super().render_delete_form(request, context)


def _readable(key: str, value: Any) -> str:
    """Metadata values as a curator reads them: dates (stored as epoch seconds) as dates."""
    if key.endswith("_date") and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            moment = datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):  # caller metadata: 1e20 is no date
            return str(value)
        return f"{date_format(timezone.localtime(moment), 'DATETIME_FORMAT')} ({value})"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _labels(queryset: QuerySet[Document]) -> list[tuple[str, str]]:
    return [(pk, title or source) for pk, title, source in queryset.values_list("pk", "title", "source_uri")]


def _label(doc: tuple[str, str]) -> str:
    return doc[1][:120]


@admin.register(IngestRefusal)
class IngestRefusalAdmin(RecordAdmin):
    """Files of uploads and folder ingests that did not become documents, and why."""

    deletable = True  # a curator clears what was dealt with
    list_display = ["source_uri", "collection", "reason", "created_at"]
    list_filter = ["skipped", "error_code", "collection"]
    search_fields = ["source_uri", "error"]

    @admin.display(description="Why")
    def reason(self, obj: IngestRefusal) -> str:
        return "skipped: type not supported" if obj.skipped else f"{obj.error_code}: {obj.error}"
