"""Pieces shared by the knowledge base's admin pages."""

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import SafeString

from kb.errors import ErrorCode, KBError
from kb.middleware import request_middleware
from kb.models import DocumentStatus

# What each error code means for a curator, shown above the error's own message.
ERROR_EXPLANATIONS = {
    ErrorCode.LOAD_FAILED: "The source could not be read: it is missing, unreachable, too large, or has no text.",
    ErrorCode.INVALID_URI: "The address is not one the knowledge base may read (check the scheme and KB_FILE_ROOTS).",
    ErrorCode.TEXT_TOO_LONG: "A piece of the text is too long to index; lower the collection's chunk size.",
    ErrorCode.EMBEDDING_ERROR: "The embedding provider failed; check that it is running, then retry.",
    ErrorCode.DATABASE_ERROR: "An internal error stopped processing; retrying usually helps.",
    ErrorCode.INVALID_ARGUMENT: "The request was not valid.",
    ErrorCode.DOCUMENT_NOT_FOUND: "The document no longer exists.",
    ErrorCode.COLLECTION_NOT_FOUND: "The collection no longer exists.",
}


def explain_error(code: str) -> str:
    return ERROR_EXPLANATIONS.get(code, "Processing failed.") if code else ""


def status_badge(*, doc_id: str, status: str, error_code: str = "", error: str = "") -> SafeString:
    """The status of a document as a badge the polling script keeps up to date."""
    return render_to_string(
        "admin/kb/includes/status_badge.html",
        {
            "doc_id": doc_id,
            "status": status,
            "label": DocumentStatus(status).label if status in DocumentStatus.values else status,
            "error": f"{error_code}: {error}" if error_code else error,
        },
    )


def progress_bar(*, doc_id: str, embedded: int, total: int) -> SafeString:
    return render_to_string(
        "admin/kb/includes/progress.html", {"doc_id": doc_id, "embedded": min(embedded, total), "total": total}
    )


def adopt(instance: Model, saved: Model) -> None:
    """Make the admin's unsaved form instance the row a service created, so that the admin's
    log entry and redirect after "Save" point at that row."""
    for field in saved._meta.concrete_fields:
        setattr(instance, field.attname, getattr(saved, field.attname))
    instance._state.adding = False
    instance._state.db = saved._state.db


def run_each(
    request: HttpRequest,
    items: Iterable[Any],
    call: Callable[[Any], Any],
    *,
    done: str,
    name: Callable[[Any], str] = str,
) -> int:
    """Call a service for each selected item; report successes once and each failure by name."""
    succeeded = 0
    for item in items:
        try:
            call(item)
        except KBError as error:
            messages.error(request, f"Failed for “{name(item)}”: {error.message}")
        else:
            succeeded += 1
    if succeeded:
        messages.success(request, done.format(count=succeeded, s="" if succeeded == 1 else "s"))
    return succeeded


SEARCH_MAX_WORDS, SEARCH_MAX_CHARS = 10, 200
ACTION_MAX_ROWS = 1000


class CuratedAdmin(admin.ModelAdmin):
    """What every model admin of the knowledge base refuses that Django's allows.

    - Changelist filters are only those the page offers (its ``list_filter``, and the links of
      ``linked_filters``), as equality or null tests. Django allows any lookup on a model's own
      fields: ``?key_hash__startswith=`` read a token's hash a digit at a time, and ``?title__regex=(``
      was a 500.
    - An action's selection that names no possible row is refused with a message, not a 500.
    - Deleting a row deletes the records that hang off it (a source's sync runs) although a curator
      may not delete those one by one: Django had refused to delete any source that ever synced.
    """

    linked_filters: tuple[str, ...] = ()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponseBase:
        """A search of more than SEARCH_MAX_WORDS words or SEARCH_MAX_CHARS characters is cut, by a
        redirect (the page repeats the query in every link): Django matches every word against
        every search field, and 5,000 words had held the database for 40 s."""
        query = request.GET.get(SEARCH_VAR, "")
        words = query.split()
        kept = " ".join(words[:SEARCH_MAX_WORDS])[:SEARCH_MAX_CHARS]
        if kept == " ".join(words):
            return super().changelist_view(request, extra_context)
        self.message_user(
            request,
            f"Searched for the first {SEARCH_MAX_WORDS} words ({SEARCH_MAX_CHARS} characters at most) only.",
            messages.WARNING,
        )
        params = request.GET.copy()
        params[SEARCH_VAR] = kept
        return HttpResponseRedirect(f"{request.path}?{params.urlencode()}")

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> HttpResponseBase:
        """ "Save as new" only where offered: Django honours it on any change page, and on pages
        that only show a row it had logged additions of rows that never existed."""
        if request.method == "POST" and "_saveasnew" in request.POST and not self.save_as:
            return HttpResponseBadRequest("This page does not save copies.", content_type="text/plain")
        return super().changeform_view(request, object_id, form_url, extra_context)

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        """A save that changed nothing is not a change in the history."""
        return super().log_change(request, obj, message) if message else None

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        offered = set(self.linked_filters)
        for item in self.get_list_filter(request) if request else self.list_filter:
            if isinstance(item, str):
                offered.add(item)
            elif isinstance(item, tuple | list):
                offered.add(item[0])
            else:  # a SimpleListFilter: its own parameter
                offered.add(item.parameter_name)
                if lookup == item.parameter_name:
                    return True
        field, *rest = lookup.split(LOOKUP_SEP)
        shapes = ([], ["exact"], ["isnull"], ["id", "exact"])  # [] : an all-values filter asks ?field=value
        return field in offered and rest in shapes and super().lookup_allowed(lookup, value, request)

    def response_action(self, request: HttpRequest, queryset: QuerySet) -> HttpResponseBase | None:
        """An action runs in the request: on at most ACTION_MAX_ROWS rows (re-ingesting 9,000
        documents at once had taken 71 s), and only on rows that can exist."""
        primary_key = self.model._meta.pk
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        try:
            for value in selected:
                primary_key.to_python(value)
        except ValidationError:
            return self._refused_action(request, "The selection names rows that cannot exist.")
        across = request.POST.get("select_across", "0") == "1"
        if (queryset.count() if across else len(selected)) > ACTION_MAX_ROWS:
            return self._refused_action(
                request, f"An action takes at most {ACTION_MAX_ROWS:,} rows at a time: filter the list, then select."
            )
        return super().response_action(request, queryset)

    def _refused_action(self, request: HttpRequest, message: str) -> HttpResponseBase:
        self.message_user(request, message, messages.ERROR)
        return HttpResponseRedirect(request.get_full_path())

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, set[str], Any]:
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        records = {
            str(model._meta.verbose_name)
            for model, model_admin in self.admin_site._registry.items()
            if isinstance(model_admin, RecordAdmin) and model is not self.model
        }
        return deleted, counts, perms_needed - records, protected


class RecordAdmin(CuratedAdmin):
    """Rows the services write and a curator only reads (and may delete, when ``deletable``)."""

    deletable = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.deletable and super().has_delete_permission(request, obj)


def _posted_to_admin(request: HttpRequest) -> bool:
    return request.method == "POST" and _in_admin(request)


def _in_admin(request: HttpRequest) -> bool:
    return request.path.startswith(reverse("admin:index"))  # both with the script prefix, if any


def _nul_refusal(request: HttpRequest) -> HttpResponse | None:
    """A NUL character in an admin URL, filter, search or form value is a 400. Postgres text cannot
    hold one, and Django's admin passed it on to a query: a 500 (DataError) on a dozen pages."""
    if not _in_admin(request):
        return None
    forms = [request.GET, request.POST] if _posted_to_admin(request) else [request.GET]
    texts = [request.path, *(text for form in forms for key, values in form.lists() for text in (key, *values))]
    if not any("\x00" in text for text in texts):
        return None
    return HttpResponseBadRequest("A NUL character cannot be part of an admin request.", content_type="text/plain")


# A form's body (an upload's too) is parsed in a thread, as the admin's own views would parse it.
refuse_nul_in_admin = request_middleware(refuse=_nul_refusal, refuse_in_thread=_posted_to_admin)
