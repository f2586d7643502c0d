"""The admin's own pages: adding documents (uploads, URLs, data: URIs), the live status feed
and the search playground. Each one reads a form and calls a service or a selector."""

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from kb.errors import KBError
from kb.forms import DocumentSourceForm, DocumentUploadForm, PlaygroundForm
from kb.models import Chunk, Collection, Document
from kb.search import SearchResponse, search
from kb.selectors.admin import chunk_highlights, document_statuses, ingestion_queue
from kb.services.ingest import UPLOAD_PREFIX, IngestItem, IngestReport, document_ingest, network_file_roots
from kb.services.uploads import document_ingest_uploads

# --- adding documents -------------------------------------------------------------------------


def document_add(request: HttpRequest, model_admin: admin.ModelAdmin) -> HttpResponse:
    """Two ways in on one page: upload files, or name a source (URL, data: URI, file path)."""
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    initial = {"collection": request.GET.get("collection") or _only_collection()}
    upload_form = DocumentUploadForm(prefix="upload", initial=initial)
    source_form = DocumentSourceForm(prefix="source", initial=initial)
    if request.method == "POST" and request.POST.get("form") == "upload":
        upload_form = DocumentUploadForm(request.POST, request.FILES, prefix="upload")
        if upload_form.is_valid() and _ingest_uploads(request, upload_form):
            return _to_collection_documents(upload_form.cleaned_data["collection"].pk)
    elif request.method == "POST" and request.POST.get("form") == "source":
        source_form = DocumentSourceForm(request.POST, prefix="source")
        if source_form.is_valid() and _ingest_source(request, source_form):
            return _to_collection_documents(source_form.cleaned_data["collection"].pk)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": Document._meta,
        "title": "Add documents",
        "upload_form": upload_form,
        "source_form": source_form,
        "media": model_admin.media + upload_form.media,
    }
    return TemplateResponse(request, "admin/kb/document/add.html", context)


def _only_collection() -> int | None:
    """The collection to preselect when there is just one (the first steps of a new install)."""
    first_two = list(Collection.objects.values_list("pk", flat=True)[:2])
    return first_two[0] if len(first_two) == 1 else None


def _ingest_uploads(request: HttpRequest, form: DocumentUploadForm) -> bool:
    """Each file on its own: one bad file does not stop the others. True if any got in."""
    data = form.cleaned_data
    try:
        report = document_ingest_uploads(
            collection=data["collection"],
            uploads=data["files"],
            content_type=data["content_type"] or None,
            metadata=data["metadata"],
        )
    except KBError as error:  # the one file uploaded was refused
        report = IngestReport(items=[IngestItem(source_uri=data["files"][0].name, outcome="failed", error=error)])
    for item in report.items:
        name = item.source_uri.removeprefix(UPLOAD_PREFIX)
        if item.error:
            # Messages start with a word: the admin capitalises their first letter (file names too).
            messages.error(request, f"Not ingested: {name}: {item.error.message} ({item.error.code})")
        else:
            messages.success(request, f"{item.outcome.capitalize()}: {name}")
    return bool(report.documents)


def _ingest_source(request: HttpRequest, form: DocumentSourceForm) -> bool:
    data = form.cleaned_data
    try:
        report = document_ingest(
            collection=data["collection"],
            uri=data["uri"],
            file_roots=network_file_roots(),
            content_type=data["content_type"] or None,
            metadata=data["metadata"],
            title=data["title"] or None,
        )
    except KBError as error:
        messages.error(request, f"{error.message} ({error.code})")
        return False
    _report(request, report)
    return len(report.failed) < len(report.items)


def _report(request: HttpRequest, report: IngestReport) -> None:
    messages.info(request, f"Ingested {len(report.items)} source(s): {report.summary or 'nothing found'}.")
    for item in report.failed[:20]:
        error = item.error.message if item.error else "failed"
        messages.error(request, f"Not ingested: {item.source_uri}: {error}")


def _to_collection_documents(collection_id: int) -> HttpResponse:
    return HttpResponseRedirect(reverse("admin:kb_document_changelist") + f"?collection__id__exact={collection_id}")


# --- live status --------------------------------------------------------------------------------


def document_status(request: HttpRequest) -> JsonResponse:
    """Polled by kb/status.js: the given documents' status and progress, and the queue."""
    documents = document_statuses(ids=request.GET.getlist("id"))
    return JsonResponse({"documents": documents, "queue": ingestion_queue()})


# --- search playground ------------------------------------------------------------------------


def playground(request: HttpRequest, model_admin: admin.ModelAdmin) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    form = PlaygroundForm(request.GET if "q" in request.GET else None)
    response: SearchResponse | None = None
    if form.is_bound and form.is_valid():
        try:
            response = search(**form.search_arguments())
        except KBError as error:
            form.add_error(None, f"{error.message} ({error.code})")
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": Chunk._meta,
        "title": "Search playground",
        "form": form,
        "response": response,
        "results": _results_with_highlights(response) if response else [],
    }
    return TemplateResponse(request, "admin/kb/playground.html", context)


def _results_with_highlights(response: SearchResponse) -> list[dict[str, Any]]:
    highlights = chunk_highlights(query=response.query, chunk_ids=[result.chunk_id for result in response.results])
    return [
        {"result": result, "highlighted": highlights.get(result.chunk_id, result.content)}
        for result in response.results
    ]
