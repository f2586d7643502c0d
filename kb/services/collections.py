from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from kb.errors import ErrorCode, KBError
from kb.models import (
    CHUNK_MAX_TOKENS_RANGE,
    COLLECTION_NAME_MAX_LENGTH,
    DEFAULT_CHUNK_MAX_TOKENS,
    DEFAULT_CHUNK_MIN_TOKENS,
    DEFAULT_CHUNK_OVERLAP_TOKENS,
    DEFAULT_TOP_K,
    Chunk,
    Collection,
    Document,
    Source,
    is_collection_name,
)
from kb.search import validate_top_k
from kb.selectors.collections import collection_get
from kb.services.documents import collection_lock
from kb.services.embedding_models import embedding_model_choose, embedding_model_default
from kb.services.model_switch import collection_switch_model
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
    lowest, highest = CHUNK_MAX_TOKENS_RANGE
    if not lowest <= max_tokens <= highest:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"max_tokens must be between {lowest} and {highest}")
    if not 0 <= min_tokens <= max_tokens:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "min_tokens must be between 0 and max_tokens")
    if not 0 <= overlap_tokens < max_tokens // 2:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "overlap_tokens must be at least 0 and below half of max_tokens")


def validate_description(description: str) -> None:
    check_storable(description, what="description")
    if len(description) > settings.KB_MAX_DESCRIPTION_CHARS:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"The description has {len(description)} characters; the limit is "
            f"{settings.KB_MAX_DESCRIPTION_CHARS} (KB_MAX_DESCRIPTION_CHARS)",
        )


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
    chunk_max_tokens: int = DEFAULT_CHUNK_MAX_TOKENS,
    chunk_min_tokens: int = DEFAULT_CHUNK_MIN_TOKENS,
    chunk_overlap_tokens: int = DEFAULT_CHUNK_OVERLAP_TOKENS,
    search_top_k: int = DEFAULT_TOP_K,
    search_hybrid: bool = True,
    semantic_weight: float | None = None,
) -> Collection:
    """A new collection. Its model: the one named (a blank name is the provider's default, a
    provider left out the server's), else the server's default; checked before it is accepted."""
    validate_collection_name(name)
    validate_description(description)
    validate_chunk_settings(
        max_tokens=chunk_max_tokens, min_tokens=chunk_min_tokens, overlap_tokens=chunk_overlap_tokens
    )
    validate_top_k(search_top_k, name="search_top_k")
    validate_semantic_weight(semantic_weight)
    if embedding_provider or embedding_model:
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
                search_top_k=search_top_k,
                search_hybrid=search_hybrid,
                semantic_weight=semantic_weight,
            )
    except IntegrityError:
        raise KBError(ErrorCode.COLLECTION_EXISTS, f"Collection already exists: {name}") from None


def collection_get_or_create(*, name: str, description: str = "", **settings: Any) -> Collection:
    """The collection of ``name``; created with ``settings`` (collection_create's) when missing."""
    try:
        return Collection.objects.get(name=name)
    except Collection.DoesNotExist:
        pass
    try:
        return collection_create(name=name, description=description, **settings)
    except KBError as error:
        if error.code == ErrorCode.COLLECTION_EXISTS:  # created concurrently
            return Collection.objects.get(name=name)
        raise


def collection_to_write(*, name: str, create: bool, description: str = "", **settings: Any) -> Collection:
    """The collection a seed's write goes to, created on first use (with ``settings``) when
    ``create`` (as those seeds do). A caller limited to some collections never creates one: a
    collection of theirs deleted meanwhile is COLLECTION_NOT_FOUND, not brought back by their next
    write."""
    if not create:
        return collection_get(name=name)
    return collection_get_or_create(name=name, description=description, **settings)


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
    embedding_provider: str | None = None,
    embedding_model: str | None = None,
) -> Collection:
    """Change settings and, when a provider or model is given, switch the embedding model
    (``collection_switch_model``: re-embedded in the background). New chunk settings apply to
    later ingests. One transaction: a refused model leaves the settings unchanged.

    Only the settings given are written, to the row as it is now (locked): a concurrent change
    of other fields (a model switch finishing in the worker, another curator's edit) is kept."""
    if description is not None:
        validate_description(description)
    validate_semantic_weight(semantic_weight)
    validate_top_k(search_top_k, name="search_top_k")
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
    if embedding_provider or embedding_model:
        # Asked of the provider before the row is locked: every writer of the collection waits for
        # the lock, and a slow provider had held them all up for as long as it took to answer.
        unlocked = Collection.objects.select_related("embedding_model").filter(pk=collection.pk).first()
        provider = embedding_provider or (unlocked.embedding_model.provider if unlocked else "")
        if provider:  # a deleted collection is refused below, as without a switch
            embedding_model_choose(provider=provider, name=embedding_model)
    with transaction.atomic():
        current = collection_lock(collection=collection)  # COLLECTION_NOT_FOUND if deleted since the door found it
        for name, value in changes.items():
            setattr(current, name, value)
        validate_chunk_settings(
            max_tokens=current.chunk_max_tokens,
            min_tokens=current.chunk_min_tokens,
            overlap_tokens=current.chunk_overlap_tokens,
        )
        current.save(update_fields=[*changes, "updated_at"])
        if embedding_provider or embedding_model:
            collection_switch_model(collection=current, provider=embedding_provider, model_name=embedding_model)
    try:
        collection.refresh_from_db()
    except Collection.DoesNotExist:  # deleted as soon as the change committed
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection.name}") from None
    return collection


def source_rows_lock(sources: QuerySet[Source]) -> None:
    """Lock sources about to be deleted, so that a running sync's record of a document it brought
    (which needs the source's row) waits for the deletion and then finds the source gone, instead of
    committing between the deletion's look for such records and its removal of the source (a
    foreign-key violation: DELETE answered 500 in 2 of 4 tries during a sync)."""
    list(sources.select_for_update().values_list("pk", flat=True))


def collection_delete(*, name: str, confirm: bool, how_to_confirm: str = "confirm: true") -> CollectionDeletion:
    """Delete a collection with its documents, chunks and embeddings (cascaded by the database).

    An unknown collection is COLLECTION_NOT_FOUND, confirmed or not; without ``confirm`` nothing
    is deleted (INVALID_ARGUMENT). ``how_to_confirm`` is the door's word for it (``--yes``)."""
    with transaction.atomic():
        found = Collection.objects.filter(name=name).first()
        if found is None:
            raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {name}")
        collection = collection_lock(collection=found)
        if not confirm:
            raise KBError(
                ErrorCode.INVALID_ARGUMENT,
                f"Deleting collection {name!r} deletes all its documents: repeat with {how_to_confirm}",
            )
        source_rows_lock(Source.objects.filter(collection=collection))  # cascaded: as source_delete
        deletion = CollectionDeletion(
            name=collection.name,
            documents=Document.objects.filter(collection=collection).count(),
            chunks=Chunk.objects.filter(collection=collection).count(),
        )
        collection.delete()
    return deletion
