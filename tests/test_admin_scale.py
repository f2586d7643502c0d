"""List pages at 100,000 chunks: a fixed number of queries, and plans that read one page of rows
through an index (never a sort or a scan of the whole chunk table per page, let alone per row).
Plans, not timings: timing belongs to bench/."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from kb.models import Chunk, Document
from tests.support.admin_data import (
    fast_password_hashing,  # noqa: F401 - an autouse fixture
    make_collection,
    many_chunks,
)

pytestmark = pytest.mark.django_db

CHUNKS = 100_000
CHUNK_LIST = reverse("admin:kb_chunk_changelist")


@pytest.fixture
def big_collection(db):
    collection = make_collection("big")
    many_chunks(collection, documents=100, per_document=CHUNKS // 100)
    assert Chunk.objects.count() == CHUNKS
    return collection


def plan_of(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


def chunk_page_plan(client, **params: str) -> str:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(CHUNK_LIST, params)
    assert response.status_code == 200
    assert len(captured.captured_queries) <= 8, [q["sql"] for q in captured.captured_queries]
    page = next(q["sql"] for q in captured.captured_queries if 'FROM "kb_chunk"' in q["sql"] and "ORDER BY" in q["sql"])
    return plan_of(page)


def test_the_chunk_list_reads_one_page_through_an_index_at_100000_chunks(admin_client, big_collection):
    plan = chunk_page_plan(admin_client)
    assert "kb_chunk_position_unique" in plan and "Seq Scan on kb_chunk" not in plan and "Sort" not in plan, plan
    plan = chunk_page_plan(admin_client, q="500")  # a rare word: "Chunk 500" of each document
    assert "kb_chunk_search_vector_gin" in plan, plan
    document = Document.objects.filter(collection=big_collection).first()
    plan = chunk_page_plan(admin_client, document__id__exact=document.pk)
    assert "Seq Scan on kb_chunk" not in plan, plan


def test_the_overview_pages_never_read_chunks(admin_client, big_collection):
    for page in ("admin:kb_collection_changelist", "admin:kb_document_changelist", "admin:index"):
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(reverse(page)).status_code == 200
        assert len(captured.captured_queries) <= 20, page
        assert not [q["sql"] for q in captured.captured_queries if '"kb_chunk"' in q["sql"]], page
