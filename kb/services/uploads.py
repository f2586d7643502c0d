"""Several uploaded files at once (REST API, admin): each file reported, like a directory ingest."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kb.errors import ErrorCode, KBError
from kb.models import Collection
from kb.services.ingest import IngestItem, IngestReport, document_ingest_upload, ingest_item


@dataclass(frozen=True)
class Upload:
    filename: str
    read: Callable[[], bytes]


def document_ingest_uploads(
    *,
    collection: Collection,
    uploads: Sequence[Upload],
    content_type: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> IngestReport:
    """Ingest every upload. A single file raises its error; with several, each failure is reported."""
    report = IngestReport()
    for upload in uploads:
        try:
            if "\x00" in upload.filename:
                raise KBError(ErrorCode.INVALID_ARGUMENT, "A file name must not contain NUL characters")
            stored = document_ingest_upload(
                collection=collection,
                filename=upload.filename,
                data=upload.read(),
                content_type=content_type,
                metadata=metadata,
            )
        except KBError as error:
            if len(uploads) == 1:
                raise
            report.items.append(IngestItem(source_uri=upload.filename, outcome="failed", error=error))
            continue
        report.items.append(ingest_item(stored))
    return report
