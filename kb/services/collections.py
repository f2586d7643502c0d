from dataclasses import dataclass

from django.db import IntegrityError, transaction

from kb.errors import ErrorCode, KBError
from kb.models import COLLECTION_NAME_MAX_LENGTH, Chunk, Collection, Document, is_collection_name
from kb.services.embedding_models import embedding_model_choose, embedding_model_default
from kb.storable import check_storable


@dataclass(frozen=True)
class CollectionDeletion:
    name: str
    documents: int
    chunks: int


def validate_collection_name(name: str) -> str:
    if isinstance(name, str) and len(name) > COLLECTION_NAME_MAX_LENGTH:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT, f"Collection name is longer than {COLLECTION_NAME_MAX_LENGTH} characters"
        )
    if not is_collection_name(name):
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"Invalid collection name {str(name)[:120]!r}: use letters, digits, '-' and '_' only",
        )
    return name


def validate_chunk_settings(*, max_tokens: int, min_tokens: int, overlap_tokens: int) -> None:
    if not 16 <= max_tokens <= 8192:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "max_tokens must be between 16 and 8192")
    if not 0 <= min_tokens <= max_tokens:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "min_tokens must be between 0 and max_tokens")
    if not 0 <= overlap_tokens < max_tokens // 2:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "overlap_tokens must be at least 0 and below half of max_tokens")


def validate_semantic_weight(weight: float | None) -> float | None:
    if weight is not None and not 0.0 <= weight <= 1.0:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "semantic_weight must be between 0.0 and 1.0")
    return weight


def collection_create(
    *,
    name: str,
    description: str = "",
    embedding_provider: str | None = None,
    embedding_model: str | None = None,
    chunk_max_tokens: int = 512,
    chunk_min_tokens: int = 50,
    chunk_overlap_tokens: int = 0,
    semantic_weight: float | None = None,
) -> Collection:
    validate_collection_name(name)
    check_storable(description, what="description")
    validate_chunk_settings(
        max_tokens=chunk_max_tokens, min_tokens=chunk_min_tokens, overlap_tokens=chunk_overlap_tokens
    )
    validate_semantic_weight(semantic_weight)
    if embedding_provider or embedding_model:
        from django.conf import settings

        model = embedding_model_choose(provider=embedding_provider or settings.EMBEDDING_PROVIDER, name=embedding_model)
    else:
        model = embedding_model_default()
    try:
        with transaction.atomic():
            return Collection.objects.create(
                name=name,
                description=description or "",
                embedding_model=model,
                chunk_max_tokens=chunk_max_tokens,
                chunk_min_tokens=chunk_min_tokens,
                chunk_overlap_tokens=chunk_overlap_tokens,
                semantic_weight=semantic_weight,
            )
    except IntegrityError:
        raise KBError(ErrorCode.COLLECTION_EXISTS, f"Collection already exists: {name}") from None


def collection_get_or_create(*, name: str, description: str = "") -> Collection:
    try:
        return Collection.objects.get(name=name)
    except Collection.DoesNotExist:
        pass
    try:
        return collection_create(name=name, description=description)
    except KBError as error:
        if error.code == ErrorCode.COLLECTION_EXISTS:  # created concurrently
            return Collection.objects.get(name=name)
        raise


def collection_update(
    *,
    collection: Collection,
    description: str | None = None,
    chunk_max_tokens: int | None = None,
    chunk_min_tokens: int | None = None,
    chunk_overlap_tokens: int | None = None,
    search_top_k: int | None = None,
    search_hybrid: bool | None = None,
    semantic_weight: float | None = None,
    clear_semantic_weight: bool = False,
) -> Collection:
    """Change descriptive, chunking and search settings. New chunk settings apply to later ingests.

    Only the settings given are written, to the row as it is now (locked): a concurrent change
    of other fields (a model switch finishing in the worker, another curator's edit) is kept."""
    if description is not None:
        check_storable(description, what="description")
    validate_semantic_weight(semantic_weight)
    if search_top_k is not None and not 1 <= search_top_k <= 100:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "search top_k must be between 1 and 100")
    changes: dict[str, object] = {
        "description": description,
        "chunk_max_tokens": chunk_max_tokens,
        "chunk_min_tokens": chunk_min_tokens,
        "chunk_overlap_tokens": chunk_overlap_tokens,
        "search_top_k": search_top_k,
        "search_hybrid": search_hybrid,
    }
    changes = {name: value for name, value in changes.items() if value is not None}
    if semantic_weight is not None or clear_semantic_weight:
        changes["semantic_weight"] = semantic_weight
    with transaction.atomic():
        current = Collection.objects.select_for_update().get(pk=collection.pk)
        for name, value in changes.items():
            setattr(current, name, value)
        validate_chunk_settings(
            max_tokens=current.chunk_max_tokens,
            min_tokens=current.chunk_min_tokens,
            overlap_tokens=current.chunk_overlap_tokens,
        )
        current.save(update_fields=[*changes, "updated_at"])
    collection.refresh_from_db()
    return collection


def collection_delete(*, name: str) -> CollectionDeletion:
    """Delete a collection with its documents, chunks and embeddings (cascaded by the database)."""
    with transaction.atomic():
        try:
            collection = Collection.objects.select_for_update().get(name=name)
        except Collection.DoesNotExist:
            raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {name}") from None
        deletion = CollectionDeletion(
            name=collection.name,
            documents=Document.objects.filter(collection=collection).count(),
            chunks=Chunk.objects.filter(collection=collection).count(),
        )
        collection.delete()
    return deletion
