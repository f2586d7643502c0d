"""Pieces shared by the knowledge base's admin pages."""

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import Model
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.safestring import SafeString

from kb.errors import ErrorCode, KBError
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


class RecordAdmin(admin.ModelAdmin):
    """Rows the services write and a curator only reads (and may delete, when ``deletable``)."""

    deletable = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.deletable and super().has_delete_permission(request, obj)
