from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from kb.errors import ErrorCode, KBError
from kb.models import Chunk, Document, DocumentStatus, Embedding
from kb.services.collections import collection_create, collection_delete
from kb.services.documents import document_create_from_text, document_delete
from kb.services.embedding_pipeline import document_claim, documents_needing_embedding

TEXT = "# Wings\n\nLift comes from pressure differences.\n\n## Drag\n\nDrag grows with speed.\n"


def add_vectors(document: Document) -> None:
    """Give every chunk a vector of the collection's model directly, as the embedding task would."""
    model = document.collection.embedding_model
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO kb_embedding (chunk_id, model_id, collection_id, vector, created_at) "
            "SELECT c.id, %s, c.collection_id, array_fill(0.1, ARRAY[%s])::vector, now() "
            "FROM kb_chunk c WHERE c.document_id = %s",
            [model.pk, model.dimensions, document.pk],
        )


def test_it_stores_a_document_with_its_chunks_in_one_go(db):
    collection = collection_create(name="docs")
    stored = document_create_from_text(
        collection=collection, source_uri="note://wings", text=TEXT, content_type="markdown"
    )
    document = stored.document
    assert stored.outcome == "created"
    assert len(document.pk) == 26  # a ULID
    assert document.status == DocumentStatus.PENDING
    chunks = list(document.chunks.order_by("index"))
    assert document.chunk_count == len(chunks) >= 1
    assert chunks[0].line_start == 1 and chunks[-1].line_end == TEXT.count("\n")
    assert "".join(chunk.content for chunk in chunks).replace("\n", "") == TEXT.replace("\n", "")


def test_a_stored_document_s_embedding_task_is_sent_after_commit(db, django_capture_on_commit_callbacks):
    collection = collection_create(name="docs")
    with django_capture_on_commit_callbacks() as callbacks:
        document_create_from_text(collection=collection, source_uri="note://wings", text=TEXT, content_type="markdown")
    assert len(callbacks) == 1


def test_identical_text_again_is_a_no_op(db):
    collection = collection_create(name="docs")
    first = document_create_from_text(collection=collection, source_uri="note://wings", text=TEXT)
    again = document_create_from_text(collection=collection, source_uri="note://wings", text=TEXT)
    assert again.outcome == "unchanged"
    assert again.document.pk == first.document.pk
    assert Document.objects.count() == 1


def test_deleting_a_document_removes_everything_stored_under_it(db):
    collection = collection_create(name="docs")
    document = document_create_from_text(collection=collection, source_uri="note://wings", text=TEXT).document
    add_vectors(document)
    assert Embedding.objects.filter(chunk__document=document).exists()
    deleted = document_delete(doc_id=document.pk)
    assert deleted.source_uri == "note://wings"
    assert not Chunk.objects.filter(document_id=document.pk).exists()
    assert not Embedding.objects.exists()


def test_deleting_a_collection_removes_everything_in_it(db):
    collection = collection_create(name="docs")
    other = collection_create(name="other")
    document = document_create_from_text(collection=collection, source_uri="note://a", text=TEXT).document
    add_vectors(document)
    kept = document_create_from_text(collection=other, source_uri="note://b", text=TEXT).document
    deletion = collection_delete(name="docs", confirm=True)
    assert (deletion.documents, deletion.chunks) == (1, document.chunk_count)
    assert list(Document.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not Embedding.objects.exists()
    assert Chunk.objects.filter(document=kept).count() == kept.chunk_count


def test_a_write_into_a_collection_deleted_meanwhile_is_collection_not_found(db):
    # The caller found the collection, then it was deleted before the write: the foreign key
    # (checked at commit) had made this a database error, a 500 at every door.
    collection = collection_create(name="going")
    collection_delete(name="going", confirm=True)
    with pytest.raises(KBError) as error:
        document_create_from_text(collection=collection, source_uri="note://late", text="Too late.")
    assert error.value.code == ErrorCode.COLLECTION_NOT_FOUND
    assert not Document.objects.exists()


def test_an_unknown_document_is_document_not_found(db):
    with pytest.raises(KBError) as error:
        document_delete(doc_id="01HRE4KXQN8Z3J2X5Y7A9B4C6D")
    assert error.value.code == ErrorCode.DOCUMENT_NOT_FOUND
    assert error.value.as_dict() == {
        "error": {"code": "DOCUMENT_NOT_FOUND", "message": "Document not found: 01HRE4KXQN8Z3J2X5Y7A9B4C6D"}
    }


def test_empty_text_is_an_invalid_argument(db):
    collection = collection_create(name="docs")
    with pytest.raises(KBError) as error:
        document_create_from_text(collection=collection, source_uri="note://empty", text="  \n ")
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert not Document.objects.exists()


@pytest.mark.parametrize("lease", [timedelta(seconds=-1), None], ids=["expired", "none"])
def test_a_dead_worker_s_document_is_sent_again_once_and_claimable_at_once(db, lease):
    """Its document had been sent again by every sweep (every 4 s, by every worker) until a message
    was consumed, and one left processing without a lease by every sweep forever."""
    stored = document_create_from_text(collection=collection_create(name="docs"), source_uri="note://a", text=TEXT)
    doc_id = stored.document.pk
    expires = None if lease is None else timezone.now() + lease
    Document.objects.filter(pk=doc_id).update(status=DocumentStatus.PROCESSING, lease_expires_at=expires)
    assert documents_needing_embedding() == [doc_id]
    assert documents_needing_embedding() == []  # the message just sent is enough
    assert Document.objects.get(pk=doc_id).status == DocumentStatus.PENDING
    assert document_claim(doc_id=doc_id)
    assert Document.objects.get(pk=doc_id).status == DocumentStatus.PROCESSING
