"""``document_ingest``: how knowledge gets in, from every front door.

A URI (``file://`` or a bare path, ``http(s)://``, ``data:``), an upload, raw text or
caller-made chunks become documents: loaded, recognised, parsed and chunked here, in the
request; embedded later by the Celery worker.
"""

import itertools
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from django.conf import settings
from django.core.files import File
from django.db import transaction

from kb.errors import ErrorCode, KBError
from kb.ingestion.formats import (
    FILE_METADATA_MAX_CHARS,
    ParsedDocument,
    detect_content_type,
    parse,
    validate_content_type,
)
from kb.ingestion.sources import (
    LoadedSource,
    SkippedSource,
    confine,
    fetch_url,
    file_path_of,
    is_local_path_uri,
    iter_files,
    load_data_uri,
    load_file,
    source_hash,
    walk_folder,
)
from kb.models import MAX_CHUNK_INDEX, Collection, Document, IngestRefusal
from kb.selectors.documents import document_get
from kb.services.collections import collection_to_write
from kb.services.documents import (
    StoredDocument,
    check_metadata,
    collection_hold,
    document_keep_if_unchanged,
    document_save,
    drafts_from_chunks,
    source_lock,
    sources_lock,
)
from kb.storable import check_storable, storable_text
from kb.work_lanes import bulk_work

# skipped: a file of a folder whose type is not supported; failed: refused with an error.
ItemOutcome = Literal["created", "updated", "unchanged", "skipped", "failed"]
OUTCOMES: tuple[ItemOutcome, ...] = get_args(ItemOutcome)


@dataclass(frozen=True)
class IngestItem:
    source_uri: str
    outcome: ItemOutcome
    document: Document | None = None
    error: KBError | None = None
    chunks_reused: int = 0


@dataclass
class IngestReport:
    items: list[IngestItem] = field(default_factory=list)

    def count(self, outcome: ItemOutcome) -> int:
        return sum(1 for item in self.items if item.outcome == outcome)

    @property
    def summary(self) -> str:
        """``2 created, 1 failed, 3 unsupported files skipped`` (outcomes that happened)."""
        named = {"skipped": "unsupported files skipped"}
        counts = [(outcome, self.count(outcome)) for outcome in OUTCOMES]
        return ", ".join(f"{count} {named.get(outcome, outcome)}" for outcome, count in counts if count)

    @property
    def documents(self) -> list[Document]:
        return [item.document for item in self.items if item.document is not None]

    @property
    def failed(self) -> list[IngestItem]:
        return [item for item in self.items if item.outcome == "failed"]


@dataclass(frozen=True)
class ChunkInput:
    """A chunk made by the caller (SciRAG's store_document_chunks)."""

    index: int
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


def command_line_file_roots() -> list[Path]:
    """file:// roots for kb_ingest, whose operator types the paths: KB_FILE_ROOTS, else the current directory."""
    return [Path(root) for root in settings.KB_FILE_ROOTS] or [Path.cwd()]


def stdio_server_file_roots(given: Sequence[Path] = ()) -> list[Path]:
    """file:// roots for the stdio MCP server: KB_FILE_ROOTS and the roots it was started with (``--file-root``).

    Never its working directory: a desktop client starts it from anywhere, often ``/``, and the
    agent it serves should not read the whole disk. Without either, file:// is refused."""
    return [Path(root) for root in settings.KB_FILE_ROOTS] + list(given)


def network_file_roots() -> list[Path]:
    """file:// roots for callers over the network (HTTP API and MCP): only KB_FILE_ROOTS."""
    return [Path(root) for root in settings.KB_FILE_ROOTS]


def check_title(title: str) -> None:
    """A caller's title is stored as given or refused: a longer one had been cut to 500 characters
    and a NUL made U+FFFD, where the REST API refused both (a file's own title is still cut)."""
    check_storable(title, what="title")
    if len(title) > FILE_METADATA_MAX_CHARS:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"title: at most {FILE_METADATA_MAX_CHARS} characters")


def document_ingest(
    *,
    collection: Collection,
    uri: str,
    file_roots: Sequence[Path],
    content_type: str | None = None,
    metadata: dict[str, Any] | None = None,
    title: str | None = None,
    recursive: bool = True,
    force: bool = False,
    on_item: Callable[[IngestItem], None] | None = None,
    whole_folder: bool = False,
) -> IngestReport:
    """Ingest what ``uri`` names. A single source raises its error; a directory reports each file.

    A request must end: a folder of more than KB_INGEST_MAX_FILES files is refused before any is
    read, unless ``whole_folder`` (the operator's kb_ingest, which shows its progress)."""
    uri = (uri or "").strip()
    # A lone surrogate (JSON's "\ud800", a command line's undecodable byte) had reached the URL
    # quoting and the file system's encoding, an internal error at every door.
    try:
        check_storable(uri, what="The URI")
    except KBError as error:
        raise KBError(ErrorCode.INVALID_URI, error.message) from None
    check_metadata(metadata)
    if title is not None:
        check_title(title)
    if content_type:
        validate_content_type(content_type)  # before anything is fetched
    options = {"content_type": content_type, "metadata": metadata, "title": title, "force": force}
    if uri.startswith("data:"):
        sources: Iterable[LoadedSource | SkippedSource] = [load_data_uri(uri)]
    elif uri.startswith(("http://", "https://")):
        sources = [fetch_url(uri)]
    elif uri and is_local_path_uri(uri):
        path = confine(file_path_of(uri), file_roots)  # resolved and checked once
        if path.is_dir():
            if not whole_folder:
                _check_folder_size(path, recursive=recursive)
            with bulk_work():
                files = iter_files(path, roots=file_roots, recursive=recursive)
                deadline = None if whole_folder else IngestDeadline()  # the operator's command takes its time
                return _ingest_many(collection, files, options, on_item, deadline, folder_uri=path.as_uri())
        sources = [load_file(path)]
    else:
        raise KBError(
            ErrorCode.INVALID_URI, f"Cannot ingest {uri[:200]!r}: use a file:// path, an http(s):// URL or a data: URI"
        )
    report = IngestReport()
    for source in sources:
        assert isinstance(source, LoadedSource)  # single sources raise rather than skip
        stored = ingest_loaded(collection=collection, source=source, **options)
        report.items.append(ingest_item(stored))
        if on_item:
            on_item(report.items[-1])
    return report


def _check_folder_size(folder: Path, *, recursive: bool) -> None:
    most = settings.KB_INGEST_MAX_FILES
    if sum(1 for _ in itertools.islice(walk_folder(folder, recursive=recursive), most + 1)) > most:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"{folder} holds more than {most} files (KB_INGEST_MAX_FILES): follow it with a source, "
            "which syncs it in the background, or ingest it with kb_ingest",
        )


class IngestDeadline:
    """The time one request may spend ingesting several files (KB_INGEST_REQUEST_SECONDS): 100
    uploads or a folder of 1,000 files, each within its own parse budget, had kept a web thread
    for half an hour."""

    def __init__(self) -> None:
        self.at = time.monotonic() + settings.KB_INGEST_REQUEST_SECONDS

    def passed(self) -> KBError | None:
        """The error of a file not read because the time had run out, or None while it lasts."""
        if time.monotonic() <= self.at:
            return None
        return KBError(
            ErrorCode.LOAD_FAILED,
            f"Not read: the request had spent its {settings.KB_INGEST_REQUEST_SECONDS} s "
            "(KB_INGEST_REQUEST_SECONDS) on the files before; send it again, or follow the folder with a source",
        )


def _ingest_many(
    collection: Collection,
    sources: Iterable[LoadedSource | SkippedSource],
    options: dict[str, Any],
    on_item: Callable[[IngestItem], None] | None,
    deadline: IngestDeadline | None,
    *,
    folder_uri: str,
) -> IngestReport:
    report = IngestReport()
    for source in sources:
        if deadline and (late := deadline.passed()):
            # The rest is not even read: one item stands for it.
            report.items.append(IngestItem(source_uri=folder_uri, outcome="failed", error=late))
            if on_item:
                on_item(report.items[-1])
            break
        if isinstance(source, SkippedSource):
            outcome: ItemOutcome = "skipped" if source.unsupported else "failed"
            item = IngestItem(source_uri=source.source_uri, outcome=outcome, error=source.error)
        else:
            try:
                item = ingest_item(ingest_loaded(collection=collection, source=source, **options))
            except KBError as error:
                item = IngestItem(source_uri=source.source_uri, outcome="failed", error=error)
        report.items.append(item)
        if on_item:
            on_item(item)
    ingest_refusals_record(collection=collection, items=report.items)
    return report


def ingest_refusals_record(*, collection: Collection, items: Sequence[IngestItem]) -> None:
    """Keep the files that did not become documents where a curator looks (the newest KB_REFUSALS_KEPT)."""
    refused = [
        IngestRefusal(
            collection=collection,
            source_uri=storable_text(item.source_uri, limit=2000),
            skipped=item.outcome == "skipped",
            error_code=item.error.code,
            error=storable_text(item.error.message, limit=2000),
        )
        for item in items
        if item.error is not None
    ]
    if not refused:
        return
    with transaction.atomic():
        collection_hold(collection=collection)  # deleted meanwhile: COLLECTION_NOT_FOUND, not a 500
        IngestRefusal.objects.bulk_create(refused)
        oldest_kept = IngestRefusal.objects.values_list("id", flat=True)[
            settings.KB_REFUSALS_KEPT - 1 : settings.KB_REFUSALS_KEPT
        ]
        if oldest_kept:
            IngestRefusal.objects.filter(id__lt=oldest_kept[0]).delete()


UPLOAD_PREFIX = "upload://"


def upload_uri(filename: str) -> str:
    """The source URI of an uploaded file: ``upload://<its name>``, kept as the name was given."""
    return f"{UPLOAD_PREFIX}{filename}"


def upload_name(filename: str) -> str:
    """The name an uploaded file is known by (its source URI is ``upload://<name>``): folders are dropped."""
    name = Path(filename or "").name
    if not name:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "An uploaded file needs a name")
    if any(unicodedata.category(character) == "Cc" for character in name):
        # Shown in lists, logs and terminals: "a\x1b[31mb.md" had kept its escape sequence.
        raise KBError(ErrorCode.INVALID_ARGUMENT, "An uploaded file's name must not hold control characters")
    return name


def document_ingest_upload(
    *,
    collection: Collection,
    filename: str,
    data: bytes | File,
    content_type: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> StoredDocument:
    """An uploaded file; its source URI is ``upload://<filename>``, so uploading it again updates it.

    ``data`` may be Django's uploaded file (kept on disk when large): its size is checked before
    it is read into memory."""
    name = upload_name(filename)
    size = len(data) if isinstance(data, bytes) else data.size
    if size > settings.KB_MAX_DOCUMENT_BYTES:
        raise KBError(
            ErrorCode.LOAD_FAILED,
            f"{name} is {size} bytes; the limit is {settings.KB_MAX_DOCUMENT_BYTES} (KB_MAX_DOCUMENT_BYTES)",
        )
    check_metadata(metadata)
    content = data if isinstance(data, bytes) else data.read()
    source = LoadedSource(source_uri=upload_uri(name), data=content, filename=name)
    return ingest_loaded(collection=collection, source=source, content_type=content_type, metadata=metadata)


def ingest_loaded(
    *,
    collection: Collection,
    source: LoadedSource,
    content_type: str | None = None,
    metadata: dict[str, Any] | None = None,
    title: str | None = None,
    force: bool = False,
) -> StoredDocument:
    detected = detect_content_type(
        data=source.data, filename=source.filename, mime_type=source.mime_type, override=content_type
    )
    digest = source_hash(source.data, detected)
    metadata = {**source.metadata, **(metadata or {})}
    if not force:
        kept = document_keep_if_unchanged(
            collection=collection, source_uri=source.source_uri, source_hash=digest, metadata=metadata
        )
        if kept is not None:
            return kept
    parsed = parse(source.data, content_type=detected, filename=source.filename)
    if title:
        parsed = replace(parsed, title=title)
    return document_save(
        collection=collection,
        source_uri=source.source_uri,
        parsed=parsed,
        source_hash=digest,
        size_bytes=len(source.data),
        metadata=metadata,
        force=force,
    )


# A caller's chunk holds at most this many characters per token of KB_MAX_CHUNK_TOKENS: the token
# count alone let one "word" of 3.9 million letters through as a single unknown token, and a search
# returning 25 of them answered with 97 MB.
MAX_CHARS_PER_TOKEN = 16


def document_store_chunks(
    *,
    collection: Collection,
    source_uri: str,
    chunks: Sequence[ChunkInput],
    title: str = "",
    metadata: dict[str, Any] | None = None,
) -> StoredDocument:
    """Store caller-made chunks as given. Chunks of the same source stored earlier are kept,
    except those with an index given again, which are replaced (batches can be sent one by one,
    or at the same time: each batch merges into what the one before it stored)."""
    if not chunks:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "No chunks to store")
    indices = Counter(chunk.index for chunk in chunks)
    if repeated := [index for index, count in indices.items() if count > 1]:
        # Which text would stand for it is not for us to guess (the last had won, both counted stored).
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Chunk index {repeated[0]} is given twice for {source_uri}")
    most_chars = settings.KB_MAX_CHUNK_TOKENS * MAX_CHARS_PER_TOKEN
    for chunk in chunks:
        if not chunk.text.strip():
            raise KBError(ErrorCode.INVALID_ARGUMENT, f"Chunk {chunk.index} has no text")
        if len(chunk.text) > most_chars:
            raise KBError(
                ErrorCode.TEXT_TOO_LONG,
                f"Chunk {chunk.index} has {len(chunk.text)} characters; the limit is {most_chars} "
                f"({MAX_CHARS_PER_TOKEN} per token of KB_MAX_CHUNK_TOKENS)",
            )
        if not 0 <= chunk.index <= MAX_CHUNK_INDEX:
            raise KBError(
                ErrorCode.INVALID_ARGUMENT, f"Chunk index {chunk.index} must be between 0 and {MAX_CHUNK_INDEX}"
            )
    check_metadata(metadata)
    check_storable([[chunk.text, chunk.metadata, chunk.index] for chunk in chunks], what="chunks")
    for chunk in chunks:
        check_metadata(chunk.metadata, what=f"chunk {chunk.index}'s metadata")
    with transaction.atomic():
        source_lock(collection=collection, source_uri=source_uri)
        stored = Document.objects.filter(collection=collection, source_uri=source_uri).first()
        by_index = _stored_chunks(stored)
        by_index.update({chunk.index: (chunk.text, chunk.metadata) for chunk in chunks})
        text, drafts = drafts_from_chunks([(index, *by_index[index]) for index in sorted(by_index)])
        if len(text) > settings.KB_MAX_TEXT_CHARS:  # batch after batch, as any document's text
            raise KBError(
                ErrorCode.TEXT_TOO_LONG,
                f"{source_uri}'s chunks would hold {len(text)} characters; the limit is "
                f"{settings.KB_MAX_TEXT_CHARS} (KB_MAX_TEXT_CHARS)",
            )
        parsed = ParsedDocument(text=text, content_type="plain_text", title=title, metadata={})
        return document_save(
            collection=collection,
            source_uri=source_uri,
            parsed=parsed,
            source_hash=source_hash(text.encode("utf-8"), "chunks"),
            size_bytes=len(text.encode("utf-8")),
            # Metadata of earlier batches is kept; this batch's values win.
            metadata={**(stored.metadata if stored else {}), **(metadata or {})},
            drafts=drafts,
        )


def document_store_chunk_batch(
    *, collection_name: str, chunks: Sequence[ChunkInput], sources: Sequence[str], create_collection: bool
) -> list[StoredDocument]:
    """Chunks of several sources (``sources[i]`` is the source of ``chunks[i]``), one document per
    source, into a collection created when missing if ``create_collection`` (collection_to_write);
    all or nothing. A source's metadata is the union of its chunks' metadata. Every source is
    locked before any is written (sources_lock)."""
    check_storable([collection_name, list(sources)], what="collection and source names")
    by_source: dict[str, list[ChunkInput]] = {}
    for chunk, source in zip(chunks, sources, strict=True):
        by_source.setdefault(source, []).append(chunk)
    stored = []
    with transaction.atomic():
        collection = collection_to_write(name=collection_name, create=create_collection)
        sources_lock(collection=collection, source_uris=by_source)
        for source in sorted(by_source):
            metadata: dict[str, Any] = {}
            for chunk in by_source[source]:
                metadata.update(chunk.metadata)
            stored.append(
                document_store_chunks(
                    collection=collection,
                    source_uri=source,
                    chunks=by_source[source],
                    title=str(metadata.get("title") or ""),
                    metadata=metadata,
                )
            )
    return stored


def _stored_chunks(document: Document | None) -> dict[int, tuple[str, dict[str, Any]]]:
    if document is None:
        return {}
    stored = document.chunks.values_list("index", "content", "metadata")
    return {index: (content, chunk_metadata or {}) for index, content, chunk_metadata in stored}


def document_reingest(*, doc_id: str, file_roots: Sequence[Path]) -> StoredDocument:
    """Load a document again from its source and re-chunk it with the collection's current settings.

    Sources that cannot be read again (uploads, data: URIs, text and caller chunks) are re-chunked
    from the stored text.
    """
    document = document_get(doc_id=doc_id)
    uri = document.source_uri
    if uri.startswith(("http://", "https://")):
        source = fetch_url(uri)
    elif uri.startswith("file://"):
        source = load_file(confine(file_path_of(uri), file_roots))
    else:
        parsed = ParsedDocument(text=document.raw_content, content_type=document.content_type, title=document.title)
        return document_save(
            collection=document.collection,
            source_uri=uri,
            parsed=parsed,
            source_hash=document.content_hash,
            size_bytes=document.size_bytes,
            metadata=document.metadata,
            force=True,
            replacing_hash=document.content_hash,  # read without a lock: a newer write wins
        )
    return ingest_loaded(collection=document.collection, source=source, content_type=document.content_type, force=True)


def ingest_item(stored: StoredDocument) -> IngestItem:
    """The report line of a stored document."""
    return IngestItem(
        source_uri=stored.document.source_uri,
        outcome=stored.outcome,
        document=stored.document,
        chunks_reused=stored.chunks_reused,
    )
