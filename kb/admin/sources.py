"""Sources a collection follows, their sync runs, and the button that starts a sync now."""

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from kb.admin.common import CuratedAdmin, RecordAdmin, adopt, run_each
from kb.forms import SourceForm
from kb.models import Source, SyncRun
from kb.selectors.sources import SyncRunOut
from kb.services.sources import source_create, source_delete, source_update, sync_start

RUN_FIELDS = ["status", "trigger", "total", "added", "updated", "unchanged", "removed", "skipped", "failed",
              "error", "created_at", "finished_at"]  # fmt: skip


# A source synced every minute makes 1,440 runs a day: its page had shown every one (20,000: a
# minute and 51 MB of HTML). The rest are in the runs' own list, filtered to the source.
RECENT_RUNS = 20


class SyncRunInline(admin.TabularInline):
    model = SyncRun
    fields = RUN_FIELDS
    readonly_fields = RUN_FIELDS
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    verbose_name_plural = f"Sync runs (the newest {RECENT_RUNS}; all of them under Sync runs)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[SyncRun]:
        runs = super().get_queryset(request)
        source_id = request.resolver_match.kwargs.get("object_id") if request.resolver_match else None
        try:  # the formset filters by the source after this: no slice here, the newest ids instead
            newest = list(SyncRun.objects.filter(source_id=source_id).order_by("-created_at")[:RECENT_RUNS])
        except (ValueError, ValidationError):  # an id the change view refuses anyway
            return runs.none()
        return runs.filter(pk__in=[run.pk for run in newest]).order_by("-created_at")


# A source adds, updates and removes documents: making, changing or syncing one takes the curator's
# own right to do that to documents, not only the source's permissions (a curator holding only
# those had added documents through a source, and removed them by narrowing it).
DOCUMENT_WRITES = ("kb.add_document", "kb.change_document", "kb.delete_document")


def writes_documents(request: HttpRequest) -> bool:
    return request.user.has_perms(DOCUMENT_WRITES)


@admin.register(Source)
class SourceAdmin(CuratedAdmin):
    form = SourceForm
    change_form_template = "admin/kb/source/change_form.html"
    list_display = ["name", "collection", "follows", "schedule", "last_run", "next_sync_at"]
    list_select_related = ["collection"]
    search_fields = ["name", "folder", "sitemap_url"]
    inlines = [SyncRunInline]
    actions = ["sync_now"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and writes_documents(request)

    def has_change_permission(self, request: HttpRequest, obj: Source | None = None) -> bool:
        return super().has_change_permission(request, obj) and writes_documents(request)

    def get_urls(self) -> list[Any]:
        return [
            path(
                "<path:object_id>/sync/",
                self.admin_site.admin_view(require_POST(self.sync_view)),
                name="kb_source_sync",
            ),
            *super().get_urls(),
        ]

    @admin.display(description="Follows")
    def follows(self, obj: Source) -> str:
        return obj.folder or obj.sitemap_url or f"{len(obj.urls)} URLs"

    @admin.display(description="Schedule")
    def schedule(self, obj: Source) -> str:
        return f"every {obj.interval_minutes} min" if obj.interval_minutes else "on demand"

    @admin.display(description="Last sync")
    def last_run(self, obj: Source) -> str:
        run = obj.runs.first()
        return f"{run.status}: {SyncRunOut.of(run).summary}" if run else "never"

    def save_model(self, request: HttpRequest, obj: Source, form: SourceForm, change: bool) -> None:
        data = form.cleaned_data
        fields = {key: data[key] for key in SourceForm.Meta.fields if key != "collection"}
        if change:
            adopt(obj, source_update(source=obj, collection=data["collection"], **fields))
        else:
            adopt(obj, source_create(collection=data["collection"], **fields))

    def delete_model(self, request: HttpRequest, obj: Source) -> None:
        source_delete(source=obj)

    def sync_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The "Sync now" button of a source's page."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        source = self.get_object(request, object_id)
        if source is None:
            raise Http404
        self.sync_now(request, Source.objects.filter(pk=source.pk))
        return HttpResponseRedirect(reverse("admin:kb_source_change", args=[source.pk]))

    @admin.action(permissions=["change"], description="Sync selected sources now")
    def sync_now(self, request: HttpRequest, queryset: QuerySet[Source]) -> None:
        def start(source: Source) -> None:
            if not sync_start(source=source).started:
                messages.info(request, f"A sync of {source.name} was already queued or running.")

        run_each(request, list(queryset), start, done="Sync started for {count} source{s}; the worker runs it.")


@admin.register(SyncRun)
class SyncRunAdmin(RecordAdmin):
    list_display = ["id", "source", *RUN_FIELDS]
    list_filter = ["status", "source"]
    list_select_related = ["source"]
    readonly_fields = ["source", "worker", "started_at", "failures", "processed", *RUN_FIELDS]
