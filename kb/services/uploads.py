"""Several uploaded files at once (REST API, admin): each file reported, like a directory ingest."""

from collections.abc import Sequence
from typing import Any

from django.core.files import File

from kb.errors import ErrorCode, KBError
from kb.models import Collection
from kb.services.documents import check_metadata
from kb.services.ingest import (
    IngestDeadline,
    IngestItem,
    IngestReport,
    document_ingest_upload,
    ingest_item,
    ingest_refusals_record,
    upload_name,
    upload_uri,
)


def document_ingest_uploads(
    *,
    collection: Collection,
    uploads: Sequence[File],
    content_type: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> IngestReport:
    """Ingest every uploaded file (named by its ``name``). A single file raises its error; with
    several, each failure is reported."""
    check_metadata(metadata)  # the request's, not a file's: refused once, as with one file
    report = IngestReport()
    names: set[str] = set()
    deadline = IngestDeadline()
    for upload in uploads:
        filename = upload.name or ""
        try:
            if late := deadline.passed():
                raise late
            if "\x00" in filename:
                raise KBError(ErrorCode.INVALID_ARGUMENT, "A file name must not contain NUL characters")
            name = upload_name(filename)
            _check_unique(name, names)
            stored = document_ingest_upload(
                collection=collection, filename=filename, data=upload, content_type=content_type, metadata=metadata
            )
            names.add(name)  # stored: a later file of this name would replace it
        except KBError as error:
            report.items.append(IngestItem(source_uri=upload_uri(filename), outcome="failed", error=error))
            continue
        report.items.append(ingest_item(stored))
    ingest_refusals_record(collection=collection, items=report.items)
    if len(uploads) == 1 and report.failed:
        raise report.failed[0].error
    return report


def _check_unique(name: str, stored: set[str]) -> None:
    """Two files of one upload with one name would be one document, the second silently replacing
    the first (folders are not part of the name): the second is refused instead."""
    if name in stored:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"Another file of this upload is named {name!r}: each file becomes upload://<its name>, names must differ",
        )
