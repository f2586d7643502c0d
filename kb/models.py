"""The knowledge base's data: collections of documents, split into chunks, embedded per model.

Child rows are removed by the database (``ON DELETE CASCADE`` constraints added in the
migrations), not by Django's collector: deleting a collection of 100,000 chunks is one
statement, and the BM25 postings, which Django does not model, go with their chunks.
"""

import re
import uuid
from typing import Any, Literal

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from pgvector.django import VectorField
from ulid import ULID

# For JSON schemas and OpenAPI (where "$" is the end of the text); Python checks the whole name
# with fullmatch (validate_collection_name), since Python's "$" also matches before a final newline.
COLLECTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]+$"
COLLECTION_NAME_MAX_LENGTH = 100
_COLLECTION_NAME = re.compile(r"[a-zA-Z0-9_-]+")


def is_collection_name(name: object) -> bool:
    return isinstance(name, str) and len(name) <= COLLECTION_NAME_MAX_LENGTH and bool(_COLLECTION_NAME.fullmatch(name))


def validate_collection_name_field(name: str) -> None:
    if not is_collection_name(name):
        raise ValidationError("Use letters, digits, '-' and '_' only.", code="invalid")


def new_ulid() -> str:
    return str(ULID())


class UlidField(models.CharField):
    """A ULID key. ULIDs are case-insensitive (Crockford base32); they are stored upper-case, so
    every lookup is upper-cased too and an id an agent copied in lower case still finds its row."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 26)
        super().__init__(*args, **kwargs)

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return value.upper() if isinstance(value, str) else value


class EmbeddingProvider(models.TextChoices):
    LOCAL = "local", "Local (sentence-transformers)"
    OLLAMA = "ollama", "Ollama"
    OPENAI = "openai", "OpenAI-compatible"


# The choices as a type, for the API's and MCP's schemas.
ProviderName = Literal[tuple(EmbeddingProvider.values)]  # type: ignore[valid-type]


EMBEDDING_MODEL_NAME_MAX_LENGTH = 200


class EmbeddingModel(models.Model):
    """One embedding space: vectors of different models are never compared."""

    provider = models.CharField(max_length=20, choices=EmbeddingProvider.choices)
    name = models.CharField(max_length=EMBEDDING_MODEL_NAME_MAX_LENGTH)
    # Known once the first vector comes back; the HNSW index of the model is created then.
    dimensions = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "name"], name="kb_embedding_model_unique")]

    def __str__(self) -> str:
        dims = f", {self.dimensions}d" if self.dimensions else ""
        return f"{self.provider}:{self.name}{dims}"


# A collection's chunking and search settings: defaults and bounds, checked by kb.services.collections
# and kb.search; the API's schemas, the admin's forms and the MCP tools take them from here.
DEFAULT_CHUNK_MAX_TOKENS, DEFAULT_CHUNK_MIN_TOKENS, DEFAULT_CHUNK_OVERLAP_TOKENS = 512, 50, 0
CHUNK_MAX_TOKENS_RANGE = (16, 8192)
DEFAULT_TOP_K = 10
MAX_TOP_K = 100


class Collection(models.Model):
    name = models.CharField(
        max_length=COLLECTION_NAME_MAX_LENGTH,
        unique=True,
        validators=[validate_collection_name_field],
    )
    description = models.TextField(blank=True, default="")
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    embedding_model = models.ForeignKey(EmbeddingModel, on_delete=models.PROTECT, related_name="collections")
    # Set while the collection is being re-embedded with another model; search keeps using
    # `embedding_model` until every chunk has a vector of this one, then they are switched.
    next_embedding_model = models.ForeignKey(
        EmbeddingModel, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # Why re-embedding with next_embedding_model cannot go on ("" while it can), and since when it
    # has stopped for good (None while it runs or retries): a curator retries or cancels it.
    reembed_error = models.TextField(blank=True, default="")
    reembed_stopped_at = models.DateTimeField(null=True, blank=True)
    chunk_max_tokens = models.PositiveIntegerField(default=DEFAULT_CHUNK_MAX_TOKENS)
    chunk_min_tokens = models.PositiveIntegerField(default=DEFAULT_CHUNK_MIN_TOKENS)
    chunk_overlap_tokens = models.PositiveIntegerField(default=DEFAULT_CHUNK_OVERLAP_TOKENS)
    search_top_k = models.PositiveIntegerField(default=DEFAULT_TOP_K)
    search_hybrid = models.BooleanField(default=True)
    # None: the server-wide KB_SEMANTIC_WEIGHT.
    semantic_weight = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DocumentStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    PROCESSING = "processing", "Processing"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


DocumentStatusName = Literal[tuple(DocumentStatus.values)]  # type: ignore[valid-type]


# A document's source URI (and so any URL a source follows) is at most this long.
SOURCE_URI_MAX_LENGTH = 4096


class Document(models.Model):
    id = UlidField(primary_key=True, default=new_ulid, editable=False)
    collection = models.ForeignKey(
        Collection, on_delete=models.DO_NOTHING, db_constraint=False, related_name="documents"
    )
    source_uri = models.TextField()
    content_type = models.CharField(max_length=40)
    title = models.CharField(max_length=500, blank=True, default="")
    raw_content = models.TextField(blank=True, default="")
    # sha256 of the bytes (or text) the document was made from: identical re-ingests are no-ops.
    content_hash = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField(default=0)
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=DocumentStatus.choices, default=DocumentStatus.PENDING)
    error_code = models.CharField(max_length=40, blank=True, default="")
    error = models.TextField(blank=True, default="")
    chunk_count = models.PositiveIntegerField(default=0)
    embedded_count = models.PositiveIntegerField(default=0)
    # The worker embedding this document renews the lease; an expired lease is taken over.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    embed_attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["collection", "source_uri"], name="kb_document_source_unique"),
        ]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="kb_document_status_idx"),
            models.Index(fields=["collection", "-created_at"], name="kb_document_recent_idx"),
        ]

    def __str__(self) -> str:
        return self.title or self.source_uri[:100]


# Chunk.index is a Postgres integer; a caller's chunk index beyond it is refused before any write.
MAX_CHUNK_INDEX = 2**31 - 1


class Chunk(models.Model):
    id = models.BigAutoField(primary_key=True)
    document = models.ForeignKey(Document, on_delete=models.DO_NOTHING, db_constraint=False, related_name="chunks")
    # Denormalised from the document so that search filters by collection without a join.
    collection = models.ForeignKey(Collection, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    index = models.PositiveIntegerField()
    content = models.TextField()
    token_count = models.PositiveIntegerField()
    line_start = models.PositiveIntegerField()
    line_end = models.PositiveIntegerField()
    page = models.PositiveIntegerField(null=True, blank=True)
    # Titles of the sections the chunk starts in, outermost first (Markdown, HTML, DOCX).
    heading_path = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    content_hash = models.CharField(max_length=64)
    metadata = models.JSONField(default=dict, blank=True)
    search_vector = models.GeneratedField(
        expression=SearchVector("content", config="english"),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    class Meta:
        ordering = ["document", "index"]
        constraints = [
            # Deferred: an update inserts the new chunks before deleting the old ones, whose
            # vectors it copies first (see kb.services.documents).
            models.UniqueConstraint(
                fields=["document", "index"], name="kb_chunk_position_unique", deferrable=models.Deferrable.DEFERRED
            )
        ]
        indexes = [
            GinIndex(fields=["search_vector"], name="kb_chunk_search_vector_gin"),
            models.Index(fields=["content_hash"], name="kb_chunk_content_hash_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.index}"

    @property
    def lines(self) -> str:
        return f"{self.line_start}-{self.line_end}"


class Embedding(models.Model):
    """A chunk's vector in one model's space. HNSW indexes are per model (see kb.vector_index)."""

    id = models.BigAutoField(primary_key=True)
    chunk = models.ForeignKey(Chunk, on_delete=models.DO_NOTHING, db_constraint=False, related_name="embeddings")
    model = models.ForeignKey(EmbeddingModel, on_delete=models.PROTECT, related_name="embeddings")
    collection = models.ForeignKey(Collection, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    vector = VectorField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["chunk", "model"], name="kb_embedding_chunk_model_unique")]
        indexes = [models.Index(fields=["model", "collection"], name="kb_embedding_model_coll_idx")]


class TokenScope(models.TextChoices):
    READ = "read", "Read (search, list, get)"
    WRITE = "write", "Write (also ingest, re-embed, delete documents, create collections)"
    ADMIN = "admin", "Admin (also delete collections and change their settings)"


SCOPE_LEVELS = {TokenScope.READ: 1, TokenScope.WRITE: 2, TokenScope.ADMIN: 3}


class ApiToken(models.Model):
    """A bearer token for the REST API and the MCP HTTP transports. Only its hash is stored."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, help_text="The start of the token, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=10, choices=TokenScope.choices, default=TokenScope.READ)
    # A limited token may use only `collections`. The flag, not an empty list, says "every
    # collection": deleting a token's last collection leaves it limited to nothing (fail closed).
    limited_to_collections = models.BooleanField(default=False)
    collections = models.ManyToManyField(Collection, blank=True, related_name="api_tokens")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.scope})"

    def collection_limit(self) -> frozenset[str] | None:
        """The names of the collections it may use; None: every collection."""
        if not self.limited_to_collections:
            return None
        return frozenset(collection.name for collection in self.collections.all())

    def collections_label(self) -> str:
        """How listings show the limit (admin, kb_token list)."""
        limit = self.collection_limit()
        if limit is None:
            return "(all)"
        return ", ".join(sorted(limit)) or "(none left: its collections were deleted)"

    @property
    def state(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= timezone.now():
            return "expired"
        return "active"


# --- The BM25 index. Tables and triggers are created by migration 0002 and written only by the
# database; these models let Django know the tables (so test flushes truncate them too) and
# allow read-only inspection.


class Posting(models.Model):
    pk = models.CompositePrimaryKey("collection_id", "term", "chunk")
    collection_id = models.BigIntegerField()
    term = models.TextField()
    chunk = models.ForeignKey(Chunk, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    tf = models.IntegerField()
    chunk_length = models.IntegerField()

    class Meta:
        db_table = "kb_posting"


class TermStats(models.Model):
    pk = models.CompositePrimaryKey("collection_id", "term")
    collection_id = models.BigIntegerField()
    term = models.TextField()
    df = models.IntegerField()

    class Meta:
        db_table = "kb_term_stats"
        verbose_name_plural = "term stats"


class CollectionStats(models.Model):
    collection = models.OneToOneField(
        Collection, on_delete=models.DO_NOTHING, db_constraint=False, primary_key=True, related_name="+"
    )
    chunk_count = models.BigIntegerField()
    total_length = models.BigIntegerField()

    class Meta:
        db_table = "kb_collection_stats"
        verbose_name_plural = "collection stats"


class WorkerHeartbeat(models.Model):
    """A Celery worker that is alive: it renews ``last_seen_at`` every KB_WORKER_HEARTBEAT_SECONDS
    and removes its row when it stops. /health reads it to say whether every queue is consumed."""

    hostname = models.CharField(max_length=255, unique=True)
    queues = models.JSONField(default=list)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.hostname


class IngestRefusal(models.Model):
    """A file of an upload or a folder ingest that did not become a document: refused (its
    error) or skipped (a type that is not supported). Kept for the curator: the dashboard and
    the admin list them; the newest KB_REFUSALS_KEPT are kept."""

    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="+")
    source_uri = models.TextField()
    skipped = models.BooleanField(default=False)
    error_code = models.CharField(max_length=40)
    error = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.source_uri


# --- Sources: a collection that follows a folder or a list of URLs (kb.services.sources).

SOURCE_NAME_MAX_LENGTH = 100


class SourceKind(models.TextChoices):
    FOLDER = "folder", "Folder"
    URLS = "urls", "URLs"


class Source(models.Model):
    """A folder under KB_FILE_ROOTS (with include/exclude globs) or a list of http(s) URLs (and
    the URLs of a sitemap) that a collection follows: each sync adds, updates and removes its
    documents to match. ``interval_minutes`` schedules it; None: on demand only."""

    name = models.CharField(max_length=SOURCE_NAME_MAX_LENGTH, unique=True, validators=[validate_collection_name_field])
    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="sources")
    kind = models.CharField(max_length=10, choices=SourceKind.choices)
    folder = models.TextField(blank=True, default="", help_text="A folder under KB_FILE_ROOTS")
    recursive = models.BooleanField(default=True)
    include = models.JSONField(default=list, blank=True, help_text="Globs a file must match (none: every file)")
    exclude = models.JSONField(default=list, blank=True, help_text="Globs of files to leave out")
    urls = models.JSONField(default=list, blank=True)
    sitemap_url = models.TextField(blank=True, default="")
    interval_minutes = models.PositiveIntegerField(null=True, blank=True)
    next_sync_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class SourceItem(models.Model):
    """A file or URL a source brought into its collection: what the next sync compares against,
    and what it may remove once a complete scan no longer finds it."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="items")
    uri = models.TextField()
    # The document the source created. Deleted by anyone, it is no longer the source's (the
    # database deletes this record with it, as it does chunks): one ingested again by hand under
    # the same URI had been removed by the source's next sync.
    document = models.ForeignKey(Document, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    etag = models.TextField(blank=True, default="")
    last_modified = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["source", "uri"], name="kb_source_item_unique")]


class SyncStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


SyncStatusName = Literal[tuple(SyncStatus.values)]  # type: ignore[valid-type]
ACTIVE_SYNC_STATUSES = (SyncStatus.QUEUED, SyncStatus.RUNNING)


class SyncRun(models.Model):
    """One sync of a source: one Celery job. At most one is queued or running per source."""

    id = UlidField(primary_key=True, default=new_ulid, editable=False)
    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="runs")
    status = models.CharField(max_length=10, choices=SyncStatus.choices, default=SyncStatus.QUEUED)
    trigger = models.CharField(max_length=10, default="manual")  # manual or schedule
    # Where it ran: a source moved since runs in another collection (its history must not say so).
    collection_name = models.CharField(max_length=COLLECTION_NAME_MAX_LENGTH, blank=True, default="")
    # Files or URLs found by the scan, and how many of them were handled so far.
    total = models.PositiveIntegerField(default=0)
    processed = models.PositiveIntegerField(default=0)
    added = models.PositiveIntegerField(default=0)
    updated = models.PositiveIntegerField(default=0)
    unchanged = models.PositiveIntegerField(default=0)
    removed = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    # [{"uri", "code", "message"}] of the failed items (the first KB_SYNC_FAILURES_KEPT).
    failures = models.JSONField(default=list, blank=True)
    # Why the run failed as a whole (the scan could not complete: nothing was removed).
    error = models.TextField(blank=True, default="")
    worker = models.CharField(max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # Two syncs of one source never run at once: the database refuses a second active run.
            models.UniqueConstraint(
                fields=["source"],
                condition=models.Q(status__in=["queued", "running"]),
                name="kb_sync_run_one_active",
            )
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.id} ({self.status})"
