"""Documents: list per collection, get, read a chunk's neighbours, ingest by URI, upload files, re-ingest,
re-embed, delete."""

from django.http import HttpRequest
from ninja import File, Form, Query, Router, UploadedFile

from kb.api.auth import access_of
from kb.api.errors import with_errors
from kb.api.schemas import (
    CollectionName,
    DocumentDeletedOut,
    DocumentGetQuery,
    DocumentId,
    DocumentListOut,
    DocumentListQuery,
    DocumentOut,
    DocumentSummaryOut,
    IngestIn,
    IngestItemOut,
    IngestOut,
    NeighborsOut,
    NeighborsQuery,
    UploadForm,
    WaitQuery,
)
from kb.errors import ErrorCode
from kb.models import Document, TokenScope
from kb.selectors.documents import chunk_neighbors, document_list, document_with_chunks
from kb.services.documents import document_delete
from kb.services.embedding_pipeline import document_reembed, documents_embed_for_writer
from kb.services.ingest import document_ingest, document_reingest, network_file_roots
from kb.services.uploads import document_ingest_uploads

router = Router(tags=["documents"])
# Loading a source (a URL, a file) can fail upstream: 502 LOAD_FAILED; a too long chunk: 400 TEXT_TOO_LONG.
INGEST_ERRORS = (ErrorCode.COLLECTION_NOT_FOUND, ErrorCode.INVALID_URI, ErrorCode.LOAD_FAILED, ErrorCode.TEXT_TOO_LONG)


@router.get(
    "/collections/{name}/documents",
    response=with_errors({200: DocumentListOut}, ErrorCode.COLLECTION_NOT_FOUND),
    summary="List a collection's documents (oldest first, paginated)",
)
def list_documents(request: HttpRequest, name: CollectionName, query: Query[DocumentListQuery]) -> DocumentListOut:
    access = access_of(request)
    access.require(TokenScope.READ)
    documents = document_list(
        collection=access.collection(name), limit=query.limit, offset=query.offset, status=query.status
    )
    return DocumentListOut(
        collection=name,
        documents=[DocumentSummaryOut.of(document) for document in documents],
        count=len(documents),
        offset=query.offset,
        limit=query.limit,
    )


@router.post(
    "/collections/{name}/documents",
    response=with_errors({200: IngestOut}, *INGEST_ERRORS),
    summary="Ingest a document (or a directory) by URI",
    description="A single source that fails answers with its error; a directory reports each file in `items`. "
    "Chunks are keyword-searchable at once and semantically searchable once the worker embedded them.",
)
def ingest_document(
    request: HttpRequest, name: CollectionName, payload: IngestIn, options: Query[WaitQuery]
) -> IngestOut:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    report = document_ingest(
        collection=access.collection(name),
        uri=payload.uri,
        file_roots=network_file_roots(),
        content_type=payload.content_type,
        metadata=payload.metadata,
        title=payload.title,
        recursive=payload.recursive,
        force=payload.force,
    )
    return IngestOut.of(name, report.items, searchable=_waited(payload.wait or options.wait, report.documents))


@router.post(
    "/collections/{name}/uploads",
    response=with_errors({200: IngestOut}, *INGEST_ERRORS),
    summary="Upload one or more files (multipart/form-data, field `files`)",
    description="Each file becomes the document `upload://<file name>` (without folders); uploading it again "
    "updates it, and a second file of one upload with the same name is refused. "
    "A single file that fails answers with its error; with several, each failure is reported in `items`.",
)
def upload_documents(
    request: HttpRequest,
    name: CollectionName,
    form: Form[UploadForm],
    files: File[list[UploadedFile]],
    options: Query[WaitQuery],
) -> IngestOut:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    report = document_ingest_uploads(
        collection=access.collection(name),
        uploads=files,
        content_type=form.content_type,
        metadata=form.metadata,
    )
    return IngestOut.of(name, report.items, searchable=_waited(form.wait or options.wait, report.documents))


def _waited(wait: bool, documents: list[Document]) -> bool | None:
    return documents_embed_for_writer(documents=documents) if wait else None


@router.get(
    "/documents/{doc_id}",
    response=with_errors({200: DocumentOut}, ErrorCode.DOCUMENT_NOT_FOUND),
    summary="A document: metadata, status, and optionally its text and chunks",
)
def get_document(request: HttpRequest, doc_id: DocumentId, query: Query[DocumentGetQuery]) -> DocumentOut:
    access = access_of(request)
    access.require(TokenScope.READ)
    document, chunks = document_with_chunks(access=access, doc_id=doc_id, chunks=query.chunks)
    return DocumentOut.of_document(document, chunks=chunks, content=document.raw_content if query.content else None)


@router.get(
    "/documents/{doc_id}/chunks/{chunk_index}/neighbors",
    response=with_errors({200: NeighborsOut}, ErrorCode.DOCUMENT_NOT_FOUND),
    summary="A chunk and the chunks around it (a search hit's context)",
    description="`chunk_index` is a search result's `chunk_index`; `before` and `after` (0-10, default 1) "
    "count chunks in document order.",
)
def chunk_neighbors_of(
    request: HttpRequest, doc_id: DocumentId, chunk_index: int, query: Query[NeighborsQuery]
) -> NeighborsOut:
    access = access_of(request)
    access.require(TokenScope.READ)
    document = access.document(doc_id)
    chunks = chunk_neighbors(document=document, chunk_index=chunk_index, before=query.before, after=query.after)
    return NeighborsOut.of(document, chunks)


@router.post(
    "/documents/{doc_id}/reingest",
    response=with_errors({200: IngestItemOut}, ErrorCode.DOCUMENT_NOT_FOUND, *INGEST_ERRORS),
    summary="Load a document again from its source and re-chunk it with the collection's settings",
)
def reingest_document(request: HttpRequest, doc_id: DocumentId) -> IngestItemOut:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    access.document(doc_id)
    stored = document_reingest(doc_id=doc_id, file_roots=network_file_roots())
    return IngestItemOut.of_stored(stored)


@router.post(
    "/documents/{doc_id}/reembed",
    response=with_errors({200: DocumentSummaryOut}, ErrorCode.DOCUMENT_NOT_FOUND),
    summary="Drop a document's vectors and embed it again (in the background)",
)
def reembed_document(request: HttpRequest, doc_id: DocumentId) -> DocumentSummaryOut:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    access.document(doc_id)
    return DocumentSummaryOut.of(document_reembed(doc_id=doc_id))


@router.delete(
    "/documents/{doc_id}",
    response=with_errors({200: DocumentDeletedOut}, ErrorCode.DOCUMENT_NOT_FOUND),
    summary="Delete a document with its chunks and embeddings",
)
def delete_document(request: HttpRequest, doc_id: DocumentId) -> DocumentDeletedOut:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    access.document(doc_id)
    document = document_delete(doc_id=doc_id)
    return DocumentDeletedOut(
        success=True, deleted_doc_id=document.id, source_uri=document.source_uri, collection=document.collection.name
    )
