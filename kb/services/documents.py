"""Storing documents and their chunks: the single place where chunks are written.

A document is unique per (collection, source URI). Saving identical content again is a
no-op; changed content replaces the chunks in one transaction and carries over the stored
vectors of chunks whose text did not change, so only new text is embedded again.
"""

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from kb.errors import ErrorCode, KBError
from kb.ingestion.chunking import ChunkDraft, ChunkSettings, chunk_text, content_hash, count_tokens
from kb.ingestion.formats import ParsedDocument, validate_content_type
from kb.models import SOURCE_URI_MAX_LENGTH, Chunk, Collection, Document, DocumentStatus
from kb.storable import check_json_size, check_storable
from kb.task_queue import enqueue_embedding
from kb.work_lanes import is_interactive

Outcome = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class StoredDocument:
    document: Document
    outcome: Outcome
    chunks_reused: int = 0

    @property
    def chunks_created(self) -> int:
        return self.document.chunk_count


def chunk_settings_of(collection: Collection) -> ChunkSettings:
    return ChunkSettings(
        max_tokens=collection.chunk_max_tokens,
        min_tokens=collection.chunk_min_tokens,
        overlap_tokens=collection.chunk_overlap_tokens,
    )


def document_create_from_text(
    *,
    collection: Collection,
    source_uri: str,
    text: str,
    content_type: str = "plain_text",
    title: str = "",
    metadata: dict[str, Any] | None = None,
) -> StoredDocument:
    """Store raw text as a document, chunked by the collection's settings, in one transaction."""
    content_type = validate_content_type(content_type)
    if content_type in ("pdf", "docx"):
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Raw text cannot have content_type {content_type!r}")
    if not text.strip():
        raise KBError(ErrorCode.INVALID_ARGUMENT, "The text is empty")
    check_storable(text, what="text")
    text = text.replace("\r\n", "\n")
    parsed = ParsedDocument(text=text, content_type=content_type, title=title)
    return document_save(
        collection=collection,
        source_uri=source_uri,
        parsed=parsed,
        source_hash=content_hash(text),
        size_bytes=len(text.encode("utf-8")),
        metadata=metadata,
    )


def check_metadata(metadata: Any, *, what: str = "metadata") -> None:
    """A caller's metadata for a document or a chunk: a JSON object Postgres can store, at most
    KB_MAX_METADATA_CHARS as JSON (every search hit carries it)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"{what} must be a JSON object")
    check_storable(metadata, what=what)
    check_json_size(metadata, what=what, limit=settings.KB_MAX_METADATA_CHARS, setting="KB_MAX_METADATA_CHARS")


def document_save(
    *,
    collection: Collection,
    source_uri: str,
    parsed: ParsedDocument,
    source_hash: str,
    size_bytes: int,
    metadata: dict[str, Any] | None = None,
    drafts: Sequence[ChunkDraft] | None = None,
    force: bool = False,
    replacing_hash: str | None = None,
) -> StoredDocument:
    """Create or update the document of ``source_uri`` from parsed content.

    ``drafts`` are the chunks when the caller made them (pre-chunked input); otherwise the
    text is chunked with the collection's settings here, before any lock is taken.
    ``replacing_hash``: write only over the stored document holding this content, as read by a
    caller that re-chunks it. If a newer write came first, it stays (it was chunked with the
    current settings too); if the document was deleted meanwhile, DOCUMENT_NOT_FOUND.
    """
    _validate_source_uri(source_uri)
    check_storable(parsed.title, what="title")
    check_metadata(metadata)
    if drafts is None:
        drafts = chunk_text(
            parsed.text, content_type=parsed.content_type, settings=chunk_settings_of(collection), pages=parsed.pages
        )
    if not drafts:
        raise KBError(ErrorCode.LOAD_FAILED, f"No text to index in {source_uri}")
    _check_chunk_sizes(drafts)
    check_storable([draft.content for draft in drafts], what="text")
    merged_metadata = {**parsed.metadata, **(metadata or {}), "file_size": size_bytes, "ingestion_date": time.time()}
    fields = _content_fields(parsed, source_hash, size_bytes, merged_metadata, chunk_count=len(drafts))
    with transaction.atomic():
        # Concurrent writes of one source queue up here, and the second sees the first's hash.
        source_lock(collection=collection, source_uri=source_uri)
        if replacing_hash is None:
            document, created = Document.objects.select_for_update().get_or_create(
                collection=collection, source_uri=source_uri, defaults=fields
            )
        else:
            document, created = _stored_document(collection, source_uri), False
            if document.content_hash != replacing_hash:
                return _unchanged(document, None)
        if not created and document.content_hash == source_hash and not force:
            return _unchanged(document, metadata)
        old_chunk_ids = [] if created else list(document.chunks.values_list("id", flat=True))
        new_chunks = Chunk.objects.bulk_create(
            [_chunk(document, collection, draft) for draft in drafts], batch_size=1000
        )
        reused = 0
        if not created:
            reused = _carry_over_embeddings(old_chunk_ids, [chunk.id for chunk in new_chunks])
            Chunk.objects.filter(id__in=old_chunk_ids).delete()
            _replace_content(document, fields, embedded=_embedded_count(document, collection))
        if document.status == DocumentStatus.PENDING:
            enqueue_embedding(document.id, interactive=is_interactive(len(drafts)))
    return StoredDocument(document=document, outcome="created" if created else "updated", chunks_reused=reused)


def document_keep_if_unchanged(
    *, collection: Collection, source_uri: str, source_hash: str, metadata: dict[str, Any] | None = None
) -> StoredDocument | None:
    """The stored document of ``source_uri`` when it already holds this content (``metadata``
    merged into it), else None: callers check this before parsing, so an unchanged file costs a
    read and a hash, no parse, no chunking, no embedding.

    Looked up without a lock first, and locked only when it holds the content: a sync keeps its
    transaction open through a changed file's parse (the document commits with the sync's record
    of it), and the source's lock, with the collection's BM25 counters, had held up every writer
    of the collection (and any switch) for that parse, up to the 20 s a PDF may take."""
    held = Document.objects.filter(collection=collection, source_uri=source_uri, content_hash=source_hash)
    if not held.exists():
        return None
    with transaction.atomic():
        source_lock(collection=collection, source_uri=source_uri)
        document = held.first()
        return None if document is None else _unchanged(document, metadata)


def source_lock(*, collection: Collection, source_uri: str) -> None:
    """Serialise every write to the document of one source until the transaction ends (sources_lock)."""
    sources_lock(collection=collection, source_uris=[source_uri])


def sources_lock(*, collection: Collection, source_uris: Iterable[str]) -> None:
    """Serialise every write to the documents of these sources until the transaction ends.

    A row lock cannot do it alone: the document may not exist yet, and a writer that merges new
    chunks into the stored ones (document_store_chunks) must read them under the same lock it
    writes under, or two concurrent batches each keep only their own chunks. The lock is held
    per (collection, source URI); a hash collision only makes two writers wait for each other.

    The collection's row is held too (FOR KEY SHARE): a deletion under way finishes first and the
    write is COLLECTION_NOT_FOUND, or waits for the write and takes its document with it; without
    it, a write racing a deletion ended in a foreign-key violation (a 500).

    Then the collection's BM25 counters (collection_index_lock), before any document row. A
    transaction that writes several sources takes all their locks first, in sorted order: one that
    held the counters from its first source while it waited for the next source's lock deadlocked
    with that source's writer, which held its lock and waited for the counters.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("source_lock() needs a transaction")
    with connection.cursor() as cursor:
        for source_uri in sorted(set(source_uris)):  # taken again later in this transaction: no wait
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"{collection.pk}:{source_uri}"])
    collection_hold(collection=collection)
    collection_index_lock(collection_id=collection.pk)


def collection_hold(*, collection: Collection) -> None:
    """Keep ``collection`` from being deleted until the transaction ends (its row FOR KEY SHARE),
    for a write of a row that refers to it: a deletion under way finishes first and the write is
    COLLECTION_NOT_FOUND, instead of a foreign-key violation at commit (a 500). Its models stay
    as the write read them too: a switch waits for the write (collection_lock)."""
    if not _collection_held(collection.pk):
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection.name}")


def _collection_held(collection_id: int) -> bool:
    with connection.cursor() as cursor:
        # The shared turn first (collection_lock), then the row; a transaction that holds them
        # already takes both again without waiting.
        cursor.execute(
            "WITH turn AS (SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))) "
            "SELECT 1 FROM turn, kb_collection WHERE id = %s FOR KEY SHARE OF kb_collection",
            [_collection_turn(collection_id), collection_id],
        )
        return cursor.fetchone() is not None


def collection_lock(*, collection: Collection) -> Collection:
    """The collection as it is now, its row locked for update until the transaction ends: for what
    changes the models its writers use (a switch, its end or cancel), its settings, or deletes it.
    COLLECTION_NOT_FOUND if it was deleted.

    Writers hold the row FOR KEY SHARE (collection_hold) and Postgres lets a new share locker
    overtake a waiting update, so under steady writes a switch waited minutes, or for ever. So
    both first take the collection's turn, an advisory lock (shared for writers, exclusive here),
    which Postgres grants in the order asked: writers that come after a waiting switch wait for
    it. Every transaction takes the turn before the row, never after it, so the two cannot
    deadlock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [_collection_turn(collection.pk)])
    locked = Collection.objects.select_for_update().filter(pk=collection.pk).first()
    if locked is None:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection.name}")
    return locked


def _collection_turn(collection_id: int) -> str:
    return f"collection:{collection_id}"  # never a source's key (source_lock), which starts with a digit


def collection_index_lock(*, collection_id: int) -> None:
    """Hold the collection's BM25 counters (its kb_collection_stats row) until the transaction
    ends. Every chunk insert and delete updates them (kb/migrations/0002); taken first, before any
    document row, they order the writers of one collection. Taken by the triggers, after the
    document rows and the per-term counters, a writer (inserting the new chunks' terms, then
    deleting the old ones') and a delete of another document had deadlocked."""
    with connection.cursor() as cursor:
        # Locked as an UPDATE would lock it, without writing a new version of the row for every
        # write (a sync checks thousands of files). Two statements: the second one's snapshot
        # sees the row another writer made and committed while the first waited for it.
        cursor.execute(
            "INSERT INTO kb_collection_stats (collection_id, chunk_count, total_length) VALUES (%s, 0, 0) "
            "ON CONFLICT (collection_id) DO NOTHING",
            [collection_id],
        )
        cursor.execute("SELECT 1 FROM kb_collection_stats WHERE collection_id = %s FOR NO KEY UPDATE", [collection_id])


def _chunk(document: Document, collection: Collection, draft: ChunkDraft) -> Chunk:
    return Chunk(
        document=document,
        collection=collection,
        index=draft.index,
        content=draft.content,
        token_count=draft.token_count,
        line_start=draft.line_start,
        line_end=draft.line_end,
        page=draft.page,
        heading_path=list(draft.heading_path),
        content_hash=draft.content_hash,
        metadata=draft.metadata or {},
    )


def document_delete(*, doc_id: str) -> Document:
    """Delete a document; its chunks, postings and embeddings go with it (database cascade).
    Its source is locked first, in the order every writer of the source takes (source_lock)."""
    found = Document.objects.select_related("collection").filter(pk=doc_id).first()
    if found is None:
        raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {doc_id}")
    with transaction.atomic():
        source_lock(collection=found.collection, source_uri=found.source_uri)
        document = document_lock(doc_id=doc_id)
        Document.objects.filter(pk=document.pk).delete()
    return document


def _stored_document(collection: Collection, source_uri: str) -> Document:
    document = Document.objects.select_for_update().filter(collection=collection, source_uri=source_uri).first()
    if document is None:
        raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {source_uri}")
    return document


def document_lock(*, doc_id: str) -> Document:
    """The document, its row locked until the transaction ends, after its collection's key (FOR
    KEY SHARE), in the order every writer takes them (source_lock). The row is written under the
    lock, and writing it twice in one transaction makes Postgres check its foreign key, which
    takes the collection's key: taken then, after the document, an embedding that finished
    deadlocked with a deletion of the collection, which holds the collection and then deletes
    its documents. (FOR UPDATE of the collection instead, as a bare FOR UPDATE of the join did,
    had deadlocked with every writer holding its key.)"""
    collection_id = Document.objects.filter(pk=doc_id).values_list("collection_id", flat=True).first()
    if collection_id is not None and _collection_held(collection_id):
        try:
            return Document.objects.select_for_update(of=("self",)).select_related("collection").get(pk=doc_id)
        except Document.DoesNotExist:
            pass
    raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {doc_id}")


def document_mark_pending(*, doc_id: str, reset_attempts: bool = True) -> Document:
    """Queue a document for embedding again (retry after failure, or re-embed)."""
    with transaction.atomic():
        return document_requeue_locked(document_lock(doc_id=doc_id), reset_attempts=reset_attempts)


def document_requeue_locked(document: Document, *, reset_attempts: bool = True) -> Document:
    """Mark a document the caller holds locked (``document_lock``) pending, and send its task
    when the caller's transaction commits."""
    document.status = DocumentStatus.PENDING
    document.error = document.error_code = ""
    document.lease_expires_at = pending_requeue_deadline()
    if reset_attempts:
        document.embed_attempts = 0
    document.save(update_fields=["status", "error", "error_code", "lease_expires_at", "embed_attempts", "updated_at"])
    enqueue_embedding(document.id, interactive=is_interactive(document.chunk_count))
    return document


# A queue of bulk work can take this long to reach a message; only then is it sent again.
PENDING_RESEND_SECONDS = 600


def pending_requeue_deadline() -> Any:
    """When a still-pending document's task message counts as lost and is sent again."""
    return timezone.now() + timedelta(seconds=PENDING_RESEND_SECONDS)


def _validate_source_uri(source_uri: str) -> None:
    if not source_uri or not source_uri.strip():
        raise KBError(ErrorCode.INVALID_URI, "The source URI is empty")
    check_storable(source_uri, what="source URI")
    if len(source_uri) > SOURCE_URI_MAX_LENGTH:
        raise KBError(ErrorCode.INVALID_URI, f"The source URI is longer than {SOURCE_URI_MAX_LENGTH} characters")


def _check_chunk_sizes(drafts: Sequence[ChunkDraft]) -> None:
    limit = settings.KB_MAX_CHUNK_TOKENS
    for draft in drafts:
        if draft.token_count > limit:
            raise KBError(
                ErrorCode.TEXT_TOO_LONG,
                f"Chunk {draft.index} has more than {limit} tokens (KB_MAX_CHUNK_TOKENS)",
            )


def _unchanged(document: Document, metadata: dict[str, Any] | None) -> StoredDocument:
    if metadata and any(document.metadata.get(key) != value for key, value in metadata.items()):
        document.metadata = {**document.metadata, **metadata}
        document.save(update_fields=["metadata", "updated_at"])
    return StoredDocument(document=document, outcome="unchanged")


def _carry_over_embeddings(old_chunk_ids: list[int], new_chunk_ids: list[int]) -> int:
    """Copy every model's vector of an old chunk to the new chunk that embeds the same text."""
    if not old_chunk_ids:
        return 0
    # Section titles are part of what is embedded with KB_EMBED_HEADINGS (chunking.embedding_text).
    same_headings = "AND old.heading_path = new.heading_path" if settings.KB_EMBED_HEADINGS else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO kb_embedding (chunk_id, model_id, collection_id, vector, created_at)
            SELECT DISTINCT ON (new.id, e.model_id) new.id, e.model_id, e.collection_id, e.vector, e.created_at
            FROM kb_chunk AS new
            JOIN kb_chunk AS old ON old.content_hash = new.content_hash AND old.id = ANY(%s) {same_headings}
            JOIN kb_embedding AS e ON e.chunk_id = old.id
            WHERE new.id = ANY(%s)
            ORDER BY new.id, e.model_id
            """,
            [old_chunk_ids, new_chunk_ids],
        )
        return cursor.rowcount


def _embedded_count(document: Document, collection: Collection) -> int:
    return Chunk.objects.filter(document=document, embeddings__model_id=collection.embedding_model_id).count()


def _content_fields(
    parsed: ParsedDocument, source_hash: str, size_bytes: int, metadata: dict[str, Any], *, chunk_count: int
) -> dict[str, Any]:
    """A document's fields for new content, waiting for its first vector."""
    return {
        "content_type": parsed.content_type,
        "title": parsed.title,
        "raw_content": parsed.text,
        "content_hash": source_hash,
        "size_bytes": size_bytes,
        "metadata": metadata,
        "chunk_count": chunk_count,
        "embedded_count": 0,
        "status": DocumentStatus.PENDING,
        "error": "",
        "error_code": "",
        "embed_attempts": 0,
        "lease_expires_at": pending_requeue_deadline(),
    }


def _replace_content(document: Document, fields: dict[str, Any], *, embedded: int) -> None:
    title = fields["title"] or document.title  # keep a title the new content does not carry
    for name, value in fields.items():
        setattr(document, name, value)
    document.title = title
    document.embedded_count = embedded
    if embedded >= document.chunk_count:  # every chunk kept its vector: nothing to embed
        document.status = DocumentStatus.READY
        document.lease_expires_at = None
    document.save()


def drafts_from_chunks(chunks: Sequence[tuple[int, str, dict[str, Any]]]) -> tuple[str, list[ChunkDraft]]:
    """Chunks given by a caller (index, text, metadata), in order, as drafts over their joined
    text, so that they get line ranges like any other chunk."""
    parts: list[str] = []
    drafts: list[ChunkDraft] = []
    line = 1
    for index, text, chunk_metadata in chunks:
        lines = text.count("\n") + 1
        drafts.append(
            ChunkDraft(
                index=index,
                content=text,
                token_count=count_tokens(text, at_most=settings.KB_MAX_CHUNK_TOKENS),  # refused past it
                line_start=line,
                line_end=line + lines - 1,
                page=_page_of(chunk_metadata),
                metadata=chunk_metadata,
            )
        )
        parts.append(text)
        line += lines + 1  # chunks are joined with a blank line
    return "\n\n".join(parts) + "\n", drafts


def _page_of(chunk_metadata: dict[str, Any]) -> int | None:
    page = chunk_metadata.get("page") if chunk_metadata else None
    return page if isinstance(page, int) and page >= 0 else None
