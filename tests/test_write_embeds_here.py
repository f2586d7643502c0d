"""A writer who waits embeds its own small note (kb.services.embedding_pipeline.documents_embed_for_writer).

No worker runs in these tests: a note found by meaning on return was embedded by the writer's own
thread. What it cannot embed (a provider error, a document too large for the interactive lane)
stays pending, with its queued message, for the worker.
"""

import base64

import pytest
from django.db import connection, connections

from kb.models import Document, DocumentStatus
from kb.selectors.ingestion import STILL_EMBEDDING
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.embedding_pipeline import documents_embed_for_writer
from mcp_endpoint.servers import canonical
from tests.support.fake_providers import fake_ollama, remote_collection
from tests.support.mcp_client import call_ok, committed_db, tool_threads  # noqa: F401
from tests.support.worker import embed_pending

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]

SERVER = canonical.build(read_only=False)
NOTE = "Glaciers carve U-shaped valleys as they grind slowly downhill over thousands of years."


def ingest(collection: str, text: str) -> dict:
    uri = "data:text/plain;base64," + base64.b64encode(text.encode()).decode()
    return call_ok(SERVER, "rag_ingest", {"uri": uri, "collection": collection})


def found_by_meaning(collection: str, query: str) -> list[str]:
    answer = call_ok(SERVER, "rag_search", {"query": query, "collection": collection, "mode": "semantic"})
    return [hit["source"] for hit in answer["results"]]


def test_a_waiting_writer_embeds_its_note_itself_when_no_worker_runs(settings):
    settings.KB_WRITE_WAIT_SECONDS = 20
    collection_create(name="notes")
    answer = ingest("notes", NOTE)
    assert (answer["note"], answer["status"]) == (None, "ready"), answer
    document = Document.objects.get(pk=answer["doc_id"])
    assert document.status == DocumentStatus.READY
    assert document.embedded_count == document.chunk_count == 1
    assert found_by_meaning("notes", "how ice shapes mountain valleys") == [answer["doc_id"]]


def test_a_writer_who_does_not_wait_leaves_the_note_to_the_worker(settings):
    settings.KB_WRITE_WAIT_SECONDS = 0
    collection_create(name="notes")
    answer = ingest("notes", NOTE)
    assert answer["note"] == STILL_EMBEDDING
    assert Document.objects.get(pk=answer["doc_id"]).status == DocumentStatus.PENDING


def test_a_document_beyond_the_interactive_lane_is_left_to_the_worker(settings):
    settings.KB_WRITE_WAIT_SECONDS = 0.5
    settings.KB_INTERACTIVE_MAX_CHUNKS = 1
    collection_create(name="notes", chunk_max_tokens=20, chunk_min_tokens=1)
    answer = ingest("notes", "\n\n".join(f"Paragraph {n}: {NOTE}" for n in range(3)))
    assert answer["chunks_created"] > 1 and answer["note"] == STILL_EMBEDDING
    assert Document.objects.get(pk=answer["doc_id"]).status == DocumentStatus.PENDING


def test_a_provider_error_leaves_the_note_pending_for_the_worker(settings):
    settings.KB_WRITE_WAIT_SECONDS = 0.5
    remote_collection(settings, name="remote")  # its provider's address no longer answers
    answer = ingest("remote", NOTE)
    assert answer["note"] == STILL_EMBEDDING
    document = Document.objects.get(pk=answer["doc_id"])
    assert (document.status, document.error_code) == (DocumentStatus.PENDING, "EMBEDDING_ERROR")
    assert document.error.endswith("(will retry)")
    with fake_ollama() as base:  # the provider is back: the worker embeds it
        settings.OLLAMA_HOST = base
        assert embed_pending() == 1
    assert Document.objects.get(pk=answer["doc_id"]).status == DocumentStatus.READY


def test_the_writer_embeds_only_what_its_wait_leaves_time_for():
    """Many small files of one upload: the wait bounds the writer's own embedding too."""
    collection = collection_create(name="notes")
    documents = [
        document_create_from_text(collection=collection, text=f"{n}: {NOTE}", source_uri=f"note-{n}").document
        for n in range(4)
    ]
    assert documents_embed_for_writer(documents=documents, timeout=0.001) is False
    statuses = [Document.objects.get(pk=document.pk).status for document in documents]
    assert statuses.count(DocumentStatus.PENDING) >= 3, statuses


def test_a_database_error_in_the_writer_s_claim_leaves_the_note_to_the_worker():
    """The note has committed when its writer claims it: a database error there (here the claim
    waits on a row another connection holds, past lock_timeout) must not reach the writer, who
    would report the stored note as failed (SciRAG's store_document_chunks said success: false)."""
    collection = collection_create(name="held")
    stored = document_create_from_text(collection=collection, source_uri="note://held", text=NOTE).document
    holder = connections.create_connection("default")  # another session, as a worker would be
    holder.set_autocommit(False)
    try:
        holder.cursor().execute("SELECT 1 FROM kb_document WHERE id = %s FOR UPDATE", [stored.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        try:
            assert documents_embed_for_writer(documents=[stored], timeout=0.5) is False
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
    finally:
        holder.rollback()
        holder.close()
    assert Document.objects.get(pk=stored.pk).status == DocumentStatus.PENDING
