"""Collections: counts per status at a glance, settings, model switches, deletes that say what goes."""

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import actions as stock_actions
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from kb.admin.common import CuratedAdmin, RecordAdmin, adopt
from kb.errors import KBError
from kb.forms import CollectionForm
from kb.models import Collection, EmbeddingModel
from kb.selectors.admin import collections_removal
from kb.selectors.collections import collection_list, collection_reembedding
from kb.services.collections import collection_create, collection_delete, collection_update
from kb.services.model_switch import collection_reembed_cancel, collection_reembed_retry


@admin.register(Collection)
class CollectionAdmin(CuratedAdmin):
    form = CollectionForm
    list_display = [
        "name",
        "model_column",
        "documents_column",
        "chunks_column",
        "ready_column",
        "pending_column",
        "processing_column",
        "failed_column",
        "updated_at",
    ]
    search_fields = ["name", "description"]
    actions = ["delete_selected"]
    fieldsets = [
        (None, {"fields": ["name", "description", "uuid"]}),
        ("Embeddings", {"fields": ["embedding_provider", "embedding_model_name", "model_status"]}),
        ("Chunking", {"fields": ["chunk_max_tokens", "chunk_min_tokens", "chunk_overlap_tokens"]}),
        ("Search defaults", {"fields": ["search_top_k", "search_hybrid", "semantic_weight"]}),
        ("Contents", {"fields": ["contents", "created_at", "updated_at"]}),
    ]

    def get_urls(self) -> list[Any]:
        return [
            path(
                "<path:object_id>/reembed/<str:action>/",
                self.admin_site.admin_view(require_POST(self.reembed_view)),
                name="kb_collection_reembed",
            ),
            *super().get_urls(),
        ]

    def reembed_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """The Retry / Cancel buttons of a collection being re-embedded."""
        calls = {"retry": collection_reembed_retry, "cancel": collection_reembed_cancel}
        if action not in calls or not self.has_change_permission(request):
            raise PermissionDenied
        collection = self.get_object(request, object_id)
        if collection is None:
            raise Http404
        try:
            collection = calls[action](collection=collection)
        except KBError as error:
            messages.error(request, error.message)
        else:
            if action == "retry":
                messages.success(request, f"Re-embedding {collection.name} again.")
            else:
                stays = f"{collection.name} stays on {collection.embedding_model}"
                messages.success(request, f"Re-embedding cancelled: {stays}.")
        return HttpResponseRedirect(reverse("admin:kb_collection_change", args=[collection.pk]))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        collection = self.get_object(request, object_id)
        context = {
            **(extra_context or {}),
            "kb_reembedding": collection_reembedding(collection=collection) if collection else None,
        }
        return super().change_view(request, object_id, form_url, context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Collection]:
        # One query: document counts per status and chunk totals come annotated.
        return collection_list()

    def get_fieldsets(self, request: HttpRequest, obj: Collection | None = None) -> list[Any]:
        if obj is None:
            return [(None, {"fields": ["name", "description"]}), *self.fieldsets[1:4]]
        return self.fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Collection | None = None) -> list[str]:
        fields = ["uuid", "model_status", "contents", "created_at", "updated_at"]
        # Renaming is not supported: clients (and API tokens) refer to collections by name.
        return ["name", *fields] if obj is not None else fields

    # --- list columns -------------------------------------------------------------------

    @admin.display(description="Embedding model", ordering="embedding_model__name")
    def model_column(self, obj: Collection) -> str:
        if obj.next_embedding_model_id:
            return format_html(
                "{} <span class='kb-muted'>→ {} (re-embedding)</span>", obj.embedding_model, obj.next_embedding_model
            )
        return str(obj.embedding_model)

    @admin.display(description="Documents", ordering="document_total")
    def documents_column(self, obj: Collection) -> str:
        url = reverse("admin:kb_document_changelist") + f"?collection__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, obj.document_total)

    @admin.display(description="Chunks", ordering="chunk_total")
    def chunks_column(self, obj: Collection) -> int:
        return obj.chunk_total

    @admin.display(description="Ready", ordering="ready_total")
    def ready_column(self, obj: Collection) -> str:
        return self._status_link(obj, "ready", obj.ready_total)

    @admin.display(description="Pending", ordering="pending_total")
    def pending_column(self, obj: Collection) -> str:
        return self._status_link(obj, "pending", obj.pending_total)

    @admin.display(description="Processing", ordering="processing_total")
    def processing_column(self, obj: Collection) -> str:
        return self._status_link(obj, "processing", obj.processing_total)

    @admin.display(description="Failed", ordering="failed_total")
    def failed_column(self, obj: Collection) -> str:
        return self._status_link(obj, "failed", obj.failed_total)

    def _status_link(self, obj: Collection, status: str, count: int) -> str:
        if not count:
            return "0"
        url = reverse("admin:kb_document_changelist") + f"?collection__id__exact={obj.pk}&status__exact={status}"
        return format_html('<a class="kb-count kb-count-{}" href="{}">{}</a>', status, url, count)

    # --- detail fields ------------------------------------------------------------------

    @admin.display(description="Search uses")
    def model_status(self, obj: Collection) -> str:
        reembedding = collection_reembedding(collection=obj)
        if reembedding is None:
            return str(obj.embedding_model)
        if reembedding.state == "stopped":
            return format_html(
                '{} — <strong class="kb-count-failed">re-embedding with {} stopped</strong> at {} of {} chunks: {}. '
                "Retry it, or cancel it to stay on the current model (buttons above).",
                obj.embedding_model,
                reembedding.model,
                reembedding.done,
                reembedding.total,
                reembedding.error,
            )
        retrying = format_html(" Retrying after: {}.", reembedding.error) if reembedding.error else ""
        return format_html(
            "{} — re-embedding with {}: {} of {} chunks done; search switches when all are.{}",
            obj.embedding_model,
            reembedding.model,
            reembedding.done,
            reembedding.total,
            retrying,
        )

    @admin.display(description="Contents")
    def contents(self, obj: Collection) -> str:
        url = reverse("admin:kb_document_changelist") + f"?collection__id__exact={obj.pk}"
        playground = reverse("admin:kb_playground") + f"?collections={obj.name}"
        return format_html(
            '<a href="{}">{} documents</a> ({} ready, {} pending, {} processing, {} failed), {} chunks. '
            '<a href="{}">Search this collection</a>.',
            url,
            obj.document_total,
            obj.ready_total,
            obj.pending_total,
            obj.processing_total,
            obj.failed_total,
            obj.chunk_total,
            playground,
        )

    # --- writes go through the services -------------------------------------------------

    def save_model(self, request: HttpRequest, obj: Collection, form: CollectionForm, change: bool) -> None:
        data = form.cleaned_data
        settings = {
            "description": data["description"],
            "embedding_provider": data["embedding_provider"],
            "embedding_model": data["embedding_model_name"],
            "chunk_max_tokens": data["chunk_max_tokens"],
            "chunk_min_tokens": data["chunk_min_tokens"],
            "chunk_overlap_tokens": data["chunk_overlap_tokens"],
            "search_top_k": data["search_top_k"],
            "search_hybrid": data["search_hybrid"],
            "semantic_weight": data["semantic_weight"],
        }
        if not change:
            adopt(obj, collection_create(name=data["name"], **settings))
            return
        switching_to = obj.next_embedding_model_id
        collection = collection_update(
            collection=obj, clear_semantic_weight=data["semantic_weight"] is None, **settings
        )
        if collection.next_embedding_model_id and collection.next_embedding_model_id != switching_to:
            messages.info(
                request,
                f"Re-embedding {collection.name} with {collection.next_embedding_model} in the background; "
                f"search keeps using {collection.embedding_model} until every chunk has a new vector.",
            )
        elif switching_to and not collection.next_embedding_model_id:
            messages.info(request, f"Re-embedding cancelled: {collection.name} stays on {collection.embedding_model}.")

    def delete_model(self, request: HttpRequest, obj: Collection) -> None:
        removed = collection_delete(name=obj.name, confirm=True)  # on Django's confirmation page
        messages.info(request, f"Removed {removed.documents} documents and {removed.chunks} chunks of {removed.name}.")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Collection]) -> None:
        for name in list(queryset.values_list("name", flat=True)):
            collection_delete(name=name, confirm=True)

    # --- delete confirmations list what the database will cascade ------------------------

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
        context["kb_removal"] = collections_removal(collection_ids=[context["object"].pk])
        return super().render_delete_form(request, context)

    @admin.action(permissions=["delete"], description="Delete selected collections")
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Collection]) -> HttpResponse | None:
        response = stock_actions.delete_selected(self, request, queryset)
        if isinstance(response, TemplateResponse):
            ids = list(queryset.values_list("pk", flat=True))
            response.context_data["kb_removal"] = collections_removal(collection_ids=ids)
        return response


@admin.register(EmbeddingModel)
class EmbeddingModelAdmin(RecordAdmin):
    """Read-only: models are recorded by the services when a collection first uses them."""

    list_display = ["provider", "name", "dimensions", "created_at"]
    list_filter = ["provider"]
