"""The admin index as the knowledge base's dashboard."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from kb.errors import ErrorCode
from kb.models import Document, IngestRefusal
from tests.support.admin_data import (
    add_text,
    fail,
    fast_password_hashing,  # noqa: F401 - an autouse fixture
    give_vectors,
    make_collection,
    many_documents,
    staff_client,
)

pytestmark = pytest.mark.django_db

INDEX = reverse("admin:index")


def figure(page: str, label: str) -> str:
    """The value shown after a <dt>label</dt> of the dashboard."""
    return re.search(rf"<dt>{label}</dt><dd>(?:<a[^>]*>)?([^<]+)", page).group(1)


@pytest.fixture
def one_of_each(admin_client):
    """A ready, a pending and a failed document; returns the ready one and the dashboard."""
    collection = make_collection("handbook")
    ready = add_text(collection, "note://ready")
    give_vectors(ready)
    add_text(collection, "note://pending")
    fail(add_text(collection, "note://broken"), ErrorCode.LOAD_FAILED, "The file is empty")
    return ready, admin_client.get(INDEX).content.decode()


def test_it_shows_the_totals(one_of_each):
    ready, page = one_of_each
    chunks = sum(Document.objects.values_list("chunk_count", flat=True))
    assert (figure(page, "Collections"), figure(page, "Documents"), figure(page, "Chunks")) == ("1", "3", str(chunks))
    assert figure(page, "Embeddings") == str(ready.chunk_count)
    assert figure(page, "Storage").endswith(("KB", "MB"))


def test_it_shows_the_ingestion_queue(one_of_each):
    _, page = one_of_each
    assert (figure(page, "Pending"), figure(page, "Processing"), figure(page, "Failed")) == ("1", "0", "1")
    assert 'data-kb-queue="failed"' in page and "?status__exact=failed" in page


@pytest.fixture
def fine_beside_broken(admin_client):
    """A fine and a failed document; returns the failed one and the dashboard."""
    collection = make_collection("handbook")
    add_text(collection, "note://fine", title="Fine one")
    broken = fail(add_text(collection, "note://broken", title="Broken one"), ErrorCode.LOAD_FAILED, "The file is empty")
    return broken, admin_client.get(INDEX).content.decode()


def test_recent_ingestions_list_every_document(fine_beside_broken):
    _, page = fine_beside_broken
    recent = page.split("<caption>Recent ingestions</caption>")[1].split("</table>")[0]
    assert "Fine one" in recent and "Broken one" in recent


def test_failed_ingestions_link_to_their_documents_with_the_reason(fine_beside_broken):
    broken, page = fine_beside_broken
    failed = page.split("<caption>Failed ingestions</caption>")[1].split("</table>")[0]
    assert reverse("admin:kb_document_change", args=[broken.pk]) in failed
    assert "LOAD_FAILED" in failed and "The file is empty" in failed and "Fine one" not in failed


def test_the_chart_has_a_bar_per_day_with_its_count(admin_client):
    collection = make_collection("handbook")
    many_documents(collection, 3)
    two_days_ago = timezone.now() - timedelta(days=2)
    Document.objects.filter(pk__in=list(Document.objects.values_list("pk", flat=True)[:1])).update(
        created_at=two_days_ago
    )
    page = admin_client.get(INDEX).content.decode()
    assert page.count("<rect ") == 14
    today = timezone.localdate()
    assert f"{today:%a} {today.day} {today:%b}: 2 documents</title>" in page
    earlier = timezone.localdate(two_days_ago)
    assert f"{earlier:%a} {earlier.day} {earlier:%b}: 1 document</title>" in page
    assert "busiest day: 2 documents" in page


def test_the_dashboard_costs_the_same_queries_however_many_documents(admin_client, django_assert_max_num_queries):
    many_documents(make_collection("small"), 3)
    with django_assert_max_num_queries(20) as few:
        admin_client.get(INDEX)
    many_documents(make_collection("large"), 300, chunks_each=2)
    with django_assert_max_num_queries(len(few.captured_queries)) as many:
        admin_client.get(INDEX)
    assert not any("raw_content" in query["sql"] for query in many.captured_queries)


def test_staff_without_knowledge_base_permissions_see_no_dashboard(db):
    page = staff_client("stranger", []).get(INDEX).content.decode()
    assert "kb-dashboard" not in page
    page = staff_client("reader", ["view_document"]).get(INDEX).content.decode()
    assert "kb-dashboard" in page and "Search playground</a>" not in page


def test_files_not_ingested_show_only_to_those_who_may_open_their_list(db):
    collection = make_collection("handbook")
    add_text(collection, "note://plans")
    IngestRefusal.objects.create(collection=collection, source_uri="upload://payroll.xlsx", error_code="LOAD_FAILED")
    reader = staff_client("reader", ["view_document"]).get(INDEX).content.decode()
    assert "note://plans" in reader and "payroll" not in reader and "Files not ingested" not in reader
    both = staff_client("both", ["view_document", "view_ingestrefusal"]).get(INDEX).content.decode()
    assert "note://plans" in both and "upload://payroll.xlsx" in both
