"""Data and users for the admin tests, made through the services wherever a service exists."""

from collections.abc import Iterable

import pytest
from django.contrib.auth.models import Permission, User
from django.db import DatabaseError, connection, transaction
from django.test import Client

from kb.errors import ErrorCode, KBError
from kb.models import Chunk, Collection, Document, DocumentStatus
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.embedding_pipeline import document_fail


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    """Users are created in most tests; the production hasher would spend a second on each."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


WINGS = "# Wings\n\nLift comes from pressure differences over the wing.\n\n## Drag\n\nDrag grows with speed.\n"


def add_text(collection: Collection, uri: str, text: str = WINGS, *, title: str = "") -> Document:
    return document_create_from_text(
        collection=collection, source_uri=uri, text=text, content_type="markdown", title=title
    ).document


def give_vectors(document: Document) -> None:
    """Give every chunk a vector of the collection's model and mark it ready, as the worker would."""
    model = document.collection.embedding_model
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO kb_embedding (chunk_id, model_id, collection_id, vector, created_at) "
            "SELECT c.id, %s, c.collection_id, array_fill(0.1, ARRAY[%s])::vector, now() "
            "FROM kb_chunk c WHERE c.document_id = %s",
            [model.pk, model.dimensions, document.pk],
        )
    Document.objects.filter(pk=document.pk).update(
        status=DocumentStatus.READY, embedded_count=document.chunk_count, lease_expires_at=None
    )
    document.refresh_from_db()


def fail(document: Document, code: ErrorCode, message: str) -> Document:
    document_fail(doc_id=document.pk, error=KBError(code, message))
    document.refresh_from_db()
    return document


def many_documents(collection: Collection, count: int, *, chunks_each: int = 0) -> None:
    """Rows in bulk for the query-count tests: what matters is how many, not how they were ingested."""
    documents = Document.objects.bulk_create(
        [
            Document(
                collection=collection,
                source_uri=f"bulk://{collection.name}/{n}",
                content_type=("markdown", "python", "plain_text")[n % 3],
                title=f"Bulk document {n}",
                raw_content="x" * 1000,
                content_hash=f"{n:064d}",
                size_bytes=1000,
                status=(DocumentStatus.READY, DocumentStatus.PENDING, DocumentStatus.FAILED)[n % 3],
                chunk_count=chunks_each,
            )
            for n in range(count)
        ]
    )
    if chunks_each:
        Chunk.objects.bulk_create(
            [
                Chunk(
                    document=document,
                    collection=collection,
                    index=index,
                    content=f"Bulk chunk {index} of {document.title} about turbulence and lift",
                    token_count=12,
                    line_start=index + 1,
                    line_end=index + 1,
                    content_hash=f"{index:064d}",
                )
                for document in documents
                for index in range(chunks_each)
            ],
            batch_size=2000,
        )


def many_chunks(collection: Collection, *, documents: int, per_document: int) -> None:
    """Documents with chunks inserted in one statement, for the scale tests. The BM25 posting
    triggers are skipped when the database role may (they would take most of the time, and list
    pages do not read postings); the generated full-text column and every index are maintained."""
    many_documents(collection, documents)
    with connection.cursor() as cursor:
        try:
            with transaction.atomic():
                cursor.execute("SET LOCAL session_replication_role = replica")
        except DatabaseError:
            pass  # not a superuser: insert with the triggers, only slower
        cursor.execute(
            "INSERT INTO kb_chunk (document_id, collection_id, index, content, token_count, line_start, line_end, "
            "content_hash, metadata, heading_path) "
            "SELECT d.id, d.collection_id, g, 'Chunk ' || g || ' on turbulence, lift and drag, part ' || (g %% 97), "
            "12, g + 1, g + 1, md5(d.id || g), '{}', '{}' "
            "FROM kb_document d CROSS JOIN generate_series(0, %s - 1) AS g WHERE d.collection_id = %s",
            [per_document, collection.pk],
        )
        cursor.execute("SET LOCAL session_replication_role = origin")
        cursor.execute(
            "UPDATE kb_document SET chunk_count = %s WHERE collection_id = %s", [per_document, collection.pk]
        )
        cursor.execute("ANALYZE kb_chunk")
        cursor.execute("ANALYZE kb_document")


def staff_client(username: str, permissions: Iterable[str]) -> Client:
    """A logged-in staff user holding exactly the given ``kb`` permissions (codenames)."""
    user = User.objects.create_user(username=username, password="pw-not-used", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="kb", codename__in=list(permissions)))
    client = Client()
    client.force_login(user)
    return client


def make_collection(name: str = "docs", **settings: object) -> Collection:
    return collection_create(name=name, **settings)
