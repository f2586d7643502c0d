"""Reads made of several statements see one version of the data, whatever commits meanwhile.

Each test replaces or deletes a document from another connection at a chosen point between the
read's statements (Django's execute wrapper is the hook), then checks what the read answered. Under
READ COMMITTED every statement would see that commit: a search ranked the old chunks and found them
gone when it loaded them (0 results), a chunk's neighbours mixed two versions.
"""

import threading
from collections.abc import Callable

import pytest
from django.db import connection, connections

from kb.access import FULL_ACCESS
from kb.errors import ErrorCode, KBError
from kb.models import Collection, Document
from kb.search import search
from kb.selectors.documents import chunk_neighbors, document_with_chunks
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text, document_delete

pytestmark = pytest.mark.django_db(transaction=True)  # the read's transaction is the outermost one

SECTIONS = ("Rigging", "Launch", "Thermals", "Landing")


def manual(version: str) -> str:
    return "# Glider manual\n\n" + "\n\n".join(
        f"## {name}\n\nThe {name.lower()} steps of the glider, {version}, come in this order." for name in SECTIONS
    )


def store(collection: Collection, version: str) -> Document:
    return document_create_from_text(
        collection=collection, source_uri="file:///manual.md", text=manual(version), content_type="markdown"
    ).document


@pytest.fixture
def manual_v1() -> Document:
    collection = collection_create(name="manual", chunk_max_tokens=24, chunk_min_tokens=0)
    document = store(collection, "first edition")
    assert document.chunk_count == len(SECTIONS)  # one per section, the title with the first
    return document


def in_another_connection(write: Callable[[], object]) -> None:
    def run() -> None:
        try:
            write()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()


class CommitBetweenStatements:
    """Django execute wrapper: right after the first statement that ``picks`` chooses, run ``write``
    in another connection (it commits) and go on. ``fired`` says whether it ran."""

    def __init__(self, picks: Callable[[str], bool], write: Callable[[], object]) -> None:
        self.picks, self.write, self.fired = picks, write, False

    def __call__(self, execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not self.fired and self.picks(sql):
            self.fired = True
            in_another_connection(self.write)
        return result


def ranks(sql: str) -> bool:  # BM25's ranking statement: the chunks are loaded after it
    return "sum(q.weight" in sql


def reads_the_hit(sql: str) -> bool:  # the first statement about the document's chunks
    return '"kb_chunk"' in sql


def test_a_search_during_a_replacement_loads_what_it_ranked(manual_v1):
    replace = CommitBetweenStatements(ranks, lambda: store(manual_v1.collection, "second edition"))
    with connection.execute_wrapper(replace):
        response = search(query="glider steps order", collections=["manual"], mode="keyword")
    assert replace.fired
    assert len(response.results) == len(SECTIONS)
    assert all("first edition" in result.content for result in response.results)
    # The next search sees the new version, whole.
    after = search(query="glider steps order", collections=["manual"], mode="keyword")
    assert [("second edition" in result.content) for result in after.results] == [True] * len(SECTIONS)


def test_a_chunk_s_neighbours_come_from_one_version(manual_v1):
    replace = CommitBetweenStatements(reads_the_hit, lambda: store(manual_v1.collection, "second edition"))
    with connection.execute_wrapper(replace):
        chunks = chunk_neighbors(document=manual_v1, chunk_index=2, before=5, after=5)
    assert replace.fired
    assert [chunk.index for chunk in chunks] == list(range(len(SECTIONS)))
    assert sum("first edition" in chunk.content for chunk in chunks) == len(SECTIONS)
    assert not any("second edition" in chunk.content for chunk in chunks)


def test_neighbours_of_a_document_deleted_since_it_was_found_are_not_found(manual_v1):
    document_delete(doc_id=manual_v1.pk)  # after the caller looked it up, before its chunks are read
    with pytest.raises(KBError) as refused:
        chunk_neighbors(document=manual_v1, chunk_index=2)
    assert refused.value.code == ErrorCode.DOCUMENT_NOT_FOUND


def reads_the_document(sql: str) -> bool:
    return 'FROM "kb_document"' in sql


def test_a_document_and_its_chunks_come_from_one_version(manual_v1):
    replace = CommitBetweenStatements(reads_the_document, lambda: store(manual_v1.collection, "second edition"))
    with connection.execute_wrapper(replace):
        document, chunks = document_with_chunks(access=FULL_ACCESS, doc_id=manual_v1.pk)
    assert replace.fired
    assert "first edition" in document.raw_content
    assert len(chunks) == document.chunk_count and all("first edition" in chunk.content for chunk in chunks[1:])
