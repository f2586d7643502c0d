"""Collections: one by name or UUID, the list with its totals, a model switch under way."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from pydantic import BaseModel, ConfigDict

from kb.errors import ErrorCode, KBError, refuse_nul
from kb.models import Chunk, Collection, DocumentStatus, Embedding


def collection_get(*, name: str) -> Collection:
    """The collection of ``name``; any name that is none (malformed too) is not found, at every door."""
    refuse_nul(name)
    try:
        return Collection.objects.select_related("embedding_model", "next_embedding_model").get(name=name)
    except Collection.DoesNotExist:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {name}") from None


ReembedState = Literal["running", "retrying", "stopped"]


@dataclass(frozen=True)
class Reembedding:
    """A model switch under way: how far it is, and why it cannot go on if it cannot."""

    model: str
    done: int
    total: int
    state: ReembedState  # "retrying": an error, will try again; "stopped": a curator retries or cancels
    error: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def summary(self) -> str:
        text = f"re-embedding with {self.model}: {self.done} of {self.total} chunks"
        if self.state == "stopped":
            return f"{text}; stopped: {self.error} (retry or cancel it: admin, REST API or kb_reembed)"
        if self.state == "retrying":
            return f"{text}; retrying after: {self.error}"
        return text


def collection_reembedding(*, collection: Collection) -> Reembedding | None:
    if not collection.next_embedding_model_id:
        return None
    total = Chunk.objects.filter(collection=collection).count()
    done = Embedding.objects.filter(collection=collection, model_id=collection.next_embedding_model_id).count()
    state = "retrying" if collection.reembed_error else "running"
    if collection.reembed_stopped_at:
        state = "stopped"
    return Reembedding(
        model=str(collection.next_embedding_model), done=done, total=total, state=state, error=collection.reembed_error
    )


def collection_get_by_uuid(*, collection_uuid: str) -> Collection:
    try:
        parsed = uuid.UUID(str(collection_uuid))
    except ValueError:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Not a collection UUID: {collection_uuid}") from None
    try:
        return Collection.objects.select_related("embedding_model").get(uuid=parsed)
    except Collection.DoesNotExist:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection_uuid}") from None


def collection_list() -> QuerySet[Collection]:
    """Collections with their document counts per status and chunk totals (one query)."""
    return (
        Collection.objects.select_related("embedding_model", "next_embedding_model")
        .annotate(
            document_total=Count("documents"),
            chunk_total=Coalesce(Sum("documents__chunk_count"), 0),
            pending_total=Count("documents", filter=Q(documents__status=DocumentStatus.PENDING)),
            processing_total=Count("documents", filter=Q(documents__status=DocumentStatus.PROCESSING)),
            ready_total=Count("documents", filter=Q(documents__status=DocumentStatus.READY)),
            failed_total=Count("documents", filter=Q(documents__status=DocumentStatus.FAILED)),
        )
        .order_by("name")
    )


def collection_get_with_totals(*, name: str) -> Collection:
    """One collection with the annotations of ``collection_list``."""
    collection = collection_list().filter(name=name).first()
    if collection is None:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {name}")
    return collection


# --- the listing's shape ---------------------------------------------------------------------


class EmbeddingModelInfo(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    provider: str
    name: str
    dimensions: int | None


class CollectionSummary(BaseModel):
    """A collection in a listing: REST ``GET /api/collections`` and ``kb_collections list --json``."""

    name: str
    description: str
    uuid: str
    documents: int
    chunks: int
    embedding_model: EmbeddingModelInfo
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, collection: Collection) -> "CollectionSummary":
        return cls(
            name=collection.name,
            description=collection.description,
            uuid=str(collection.uuid),
            documents=collection.document_total,
            chunks=collection.chunk_total,
            embedding_model=EmbeddingModelInfo.model_validate(collection.embedding_model),
            created_at=collection.created_at,
            updated_at=collection.updated_at,
        )


class CollectionListing(BaseModel):
    collections: list[CollectionSummary]
    total: int

    @classmethod
    def of(cls, collections: Sequence[Collection]) -> "CollectionListing":
        return cls(collections=[CollectionSummary.of(c) for c in collections], total=len(collections))
