"""Switching a collection to another embedding model: the next model's vectors are filled in the
background (``kb.tasks.reembed_collection``, one batch per step) while search keeps the current
model; when every chunk has one, the models are swapped under the collection's row lock. A switch
that cannot go on records why; a curator retries or cancels it.
"""

import logging
from functools import partial

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from kb.embedding_providers import embed_texts
from kb.errors import ErrorCode, KBError
from kb.models import Chunk, Collection, Document, DocumentStatus, Embedding
from kb.services.documents import collection_lock
from kb.services.embedding_models import embedding_model_choose, model_name_for
from kb.services.embedding_pipeline import insert_vectors, refresh_embedded_counts, unembedded_batch, vectors_prune
from kb.task_queue import enqueue_collection_reembed

logger = logging.getLogger(__name__)

REEMBED_STATE_FIELDS = ["next_embedding_model", "reembed_error", "reembed_stopped_at", "updated_at"]


def collection_switch_model(*, collection: Collection, provider: str | None, model_name: str | None) -> Collection:
    """Start re-embedding a collection with another model; search switches when it is complete.

    Left out, the provider is the collection's and the model that provider's default. The model
    must be one the provider can embed with (``embedding_model_choose``); its current model
    cancels a switch under way, and the model it already uses or is switching to changes nothing."""
    current = Collection.objects.select_related("embedding_model", "next_embedding_model").get(pk=collection.pk)
    provider = provider or current.embedding_model.provider
    shown = current.next_embedding_model or current.embedding_model
    if (provider, model_name_for(provider, model_name)) == (shown.provider, shown.name):
        return current
    model = embedding_model_choose(provider=provider, name=model_name)
    with transaction.atomic():
        collection = collection_lock(collection=collection)
        if model.pk == collection.embedding_model_id:
            _drop_next_model(collection)
        else:
            collection.next_embedding_model = model
            _start_reembed(collection)
    return collection


def collection_reembed_retry(*, collection: Collection) -> Collection:
    """Start a stopped (or retrying) re-embed again now."""
    with transaction.atomic():
        collection = _locked_reembedding(collection)
        _start_reembed(collection)
    return collection


def collection_reembed_cancel(*, collection: Collection) -> Collection:
    """Give up a switch: the collection stays on its model, the next model's vectors go."""
    with transaction.atomic():
        collection = _locked_reembedding(collection)
        _drop_next_model(collection)
    return collection


def _locked_reembedding(collection: Collection) -> Collection:
    """The collection, locked for the transaction; refused unless it is being re-embedded."""
    collection = collection_lock(collection=collection)
    if not collection.next_embedding_model_id:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Collection {collection.name} is not being re-embedded")
    return collection


def _start_reembed(collection: Collection) -> None:
    """Clear any stop reason and queue the re-embed task (sent when the transaction commits)."""
    collection.reembed_error, collection.reembed_stopped_at = "", None
    collection.save(update_fields=REEMBED_STATE_FIELDS)
    enqueue_collection_reembed(collection.pk)


def _drop_next_model(collection: Collection) -> None:
    collection.next_embedding_model = None
    collection.reembed_error, collection.reembed_stopped_at = "", None
    collection.save(update_fields=REEMBED_STATE_FIELDS)
    # Once committed: the row stays locked until then, and every writer of the collection waits.
    # A failure is logged; a later re-embed of the collection prunes again.
    transaction.on_commit(partial(vectors_prune, collection_id=collection.pk), robust=True)


def collection_reembed_failed(*, collection_id: int, reason: str, stopped: bool) -> None:
    """Record why re-embedding cannot go on; ``stopped``: it will not retry by itself."""
    Collection.objects.filter(pk=collection_id, next_embedding_model__isnull=False).update(
        reembed_error=reason, reembed_stopped_at=timezone.now() if stopped else None, updated_at=timezone.now()
    )


def collection_reembed_step(*, collection_id: int) -> bool:
    """Embed one batch of the collection's chunks with its next model; True when finished.

    When no chunk lacks a vector of the next model (but those of documents a worker is still to
    embed, _settled_chunks), the models are switched under the
    collection's row lock, so a concurrent ingest either sees the old pair or the new one. A
    finished re-embed (switched, cancelled or replaced by another switch) then deletes the vectors
    of the models the collection no longer uses (``vectors_prune``): the old model's after a switch,
    and any a step that raced a cancel wrote.
    """
    finished = _reembed_step(collection_id)
    if finished:
        pruned = vectors_prune(collection_id=collection_id)
        if pruned:
            logger.info("collection %s: %d vectors of models it no longer uses deleted", collection_id, pruned)
    return finished


def _reembed_step(collection_id: int) -> bool:
    try:
        collection = Collection.objects.select_related("next_embedding_model").get(pk=collection_id)
    except Collection.DoesNotExist:
        return True
    model = collection.next_embedding_model
    if model is None:
        return True
    batch = unembedded_batch(_settled_chunks(collection_id), model)
    if batch:
        vectors = embed_texts(model.provider, model.name, [text for _, text in batch])
        insert_vectors(model, [chunk_id for chunk_id, _ in batch], vectors, skip_locked=True)
        if collection.reembed_error:  # going again after a failure
            Collection.objects.filter(pk=collection_id).update(reembed_error="", reembed_stopped_at=None)
        return False
    with transaction.atomic():
        try:
            collection = collection_lock(collection=collection)
        except KBError:  # deleted meanwhile
            return True
        if collection.next_embedding_model_id != model.pk:
            return True
        missing = _settled_chunks(collection_id).exclude(
            Exists(Embedding.objects.filter(chunk=OuterRef("pk"), model=model))
        )
        if missing.exists():
            return False
        collection.embedding_model = model
        collection.next_embedding_model = None
        collection.reembed_error, collection.reembed_stopped_at = "", None
        collection.save(update_fields=["embedding_model", *REEMBED_STATE_FIELDS])
        refresh_embedded_counts(collection, Document.objects.filter(collection_id=collection_id))
    logger.info("collection %s now searches with %s", collection.name, model)
    return True


def _settled_chunks(collection_id: int) -> QuerySet[Chunk]:
    """The chunks a switch must give a vector of the next model before it switches: those of
    documents no worker is embedding or about to. A pending or processing document is embedded
    with both models by its own worker, and with the new one alone once the switch is made
    (``_finish`` notices and embeds again). Counted in, the documents that steady writes keep
    adding had kept a switch from ever finishing: at 35 writes/s, 0 of 2 switches in 90 s."""
    return Chunk.objects.filter(collection_id=collection_id).exclude(
        document__status__in=[DocumentStatus.PENDING, DocumentStatus.PROCESSING]
    )
