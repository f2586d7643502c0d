"""Documents and their chunks: one document, a page of a collection's, a chunk with its neighbours."""

import re
from typing import TYPE_CHECKING

from django.db.models import QuerySet

from kb.errors import ErrorCode, KBError, refuse_nul
from kb.models import MAX_CHUNK_INDEX, Chunk, Collection, Document, DocumentStatus
from kb.replicas import read_snapshot, reads_from_replica

if TYPE_CHECKING:  # kb.access reads documents through this module
    from kb.access import Access


ULID_FORM = re.compile(r"[0-9A-Za-z]{26}")  # document and sync run ids


def document_get(*, doc_id: str) -> Document:
    """The document of ``doc_id`` in any case; a malformed id is not found either, at every door."""
    if not ULID_FORM.fullmatch(doc_id):
        refuse_nul(doc_id)
        raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, "Document not found: a document id is 26 letters and digits")
    try:
        return Document.objects.select_related("collection").get(pk=doc_id)
    except Document.DoesNotExist:
        raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {doc_id}") from None


# Offsets beyond this cannot page anywhere useful and would overflow Postgres' bigint.
MAX_OFFSET = 1_000_000_000


DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


@reads_from_replica
def document_list(
    *, collection: Collection, limit: int = DEFAULT_PAGE_SIZE, offset: int = 0, status: str | None = None
) -> list[Document]:
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"limit must be between 1 and {MAX_PAGE_SIZE}")
    if not 0 <= offset <= MAX_OFFSET:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"offset must be between 0 and {MAX_OFFSET}")
    documents = Document.objects.filter(collection=collection).defer("raw_content").order_by("created_at", "id")
    if status:
        if status not in DocumentStatus.values:
            raise KBError(ErrorCode.INVALID_ARGUMENT, f"status must be one of {', '.join(DocumentStatus.values)}")
        documents = documents.filter(status=status)
    return list(documents[offset : offset + limit])


def document_chunks(*, document: Document) -> QuerySet[Chunk]:
    return Chunk.objects.filter(document=document).defer("search_vector").order_by("index")


@reads_from_replica
def document_with_chunks(*, access: "Access", doc_id: str, chunks: bool = True) -> tuple[Document, list[Chunk] | None]:
    """A document the caller may see and, if ``chunks``, its chunks, both of one version (one
    snapshot): a re-ingest between the two reads would pair the old text with the new chunks."""
    with read_snapshot():
        document = access.document(doc_id)
        return document, list(document_chunks(document=document)) if chunks else None


MAX_NEIGHBORS = 10


@reads_from_replica
def chunk_neighbors(*, document: Document, chunk_index: int, before: int = 1, after: int = 1) -> list[Chunk]:
    """A chunk of ``document`` and up to ``before``/``after`` chunks on each side of it, in order:
    the text around a search hit, without fetching the whole document."""
    for name, count in (("before", before), ("after", after)):
        if not 0 <= count <= MAX_NEIGHBORS:
            raise KBError(ErrorCode.INVALID_ARGUMENT, f"{name} must be between 0 and {MAX_NEIGHBORS}")
    if not 0 <= chunk_index <= MAX_CHUNK_INDEX:  # as stored (a caller's chunks may use any of them)
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"chunk_index must be between 0 and {MAX_CHUNK_INDEX}")
    with read_snapshot():  # the chunk and its neighbours from one version of the document
        ordered = document_chunks(document=document)
        hit = ordered.filter(index=chunk_index).first()
        if hit is None:
            count = Document.objects.filter(pk=document.pk).values_list("chunk_count", flat=True).first()
            if count is None:  # deleted since the caller found it
                raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {document.pk}")
            raise KBError(
                ErrorCode.INVALID_ARGUMENT, f"Document {document.pk} has no chunk {chunk_index} (it has {count} chunks)"
            )
        # By position, not index arithmetic: chunks stored by a client may skip indices.
        preceding = list(ordered.filter(index__lt=chunk_index).order_by("-index")[:before]) if before else []
        following = list(ordered.filter(index__gt=chunk_index)[:after]) if after else []
    return [*reversed(preceding), hit, *following]
