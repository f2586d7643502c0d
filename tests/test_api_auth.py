"""REST API: bearer tokens, scopes and collection limits."""

from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from kb.models import ApiToken, Collection, Document
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.tokens import token_create, token_revoke
from tests.support.api_helpers import delete, error_of, get, headers_for, patch, post

pytestmark = pytest.mark.django_db

SOME_ID = "01HRE4KXQN8Z3J2X5Y7A9B4C6D"
# Every endpoint but health, with a request body that would be valid.
ENDPOINTS = [
    ("get", "/api/collections", None),
    ("post", "/api/collections", {"name": "new"}),
    ("get", "/api/collections/docs", None),
    ("patch", "/api/collections/docs", {"description": "x"}),
    ("delete", "/api/collections/docs?confirm=true", None),
    ("get", "/api/collections/docs/documents", None),
    ("post", "/api/collections/docs/documents", {"uri": "data:,Some text"}),
    ("upload", "/api/collections/docs/uploads", None),
    ("get", f"/api/documents/{SOME_ID}", None),
    ("post", f"/api/documents/{SOME_ID}/reingest", None),
    ("post", f"/api/documents/{SOME_ID}/reembed", None),
    ("delete", f"/api/documents/{SOME_ID}", None),
    ("post", "/api/search", {"query": "text"}),
    ("get", "/api/stats", None),
]
WRITES = [endpoint for endpoint in ENDPOINTS if endpoint[0] != "get" and endpoint[1] != "/api/search"]


def call(client, method, path, body, token):
    if method == "get":
        return get(client, path, token)
    if method == "post":
        return post(client, path, body, token)
    if method == "patch":
        return patch(client, path, body, token)
    if method == "delete":
        return delete(client, path, token)
    files = {"files": [SimpleUploadedFile("note.txt", b"Some text")]}
    return client.post(path, files, headers=headers_for(token))


@pytest.fixture
def two_collections():
    docs = collection_create(name="docs")
    code = collection_create(name="code")
    return {
        "docs": document_create_from_text(
            collection=docs, source_uri="note://docs", text="Shared words here."
        ).document,
        "code": document_create_from_text(collection=code, source_uri="note://code", text="Shared words too.").document,
    }


def token(scope, *collections):
    return token_create(name=f"{scope} token", scope=scope, collections=collections)[1]


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_without_a_token_every_endpoint_is_401_when_tokens_are_required(client, settings, method, path, body):
    settings.KB_REQUIRE_AUTH = True
    collection_create(name="docs")
    assert error_of(call(client, method, path, body, None)) == (401, "UNAUTHORIZED")
    assert Collection.objects.count() == 1


def test_on_the_loopback_default_no_token_is_needed(client, settings):
    settings.KB_REQUIRE_AUTH = False
    assert get(client, "/api/collections").status_code == 200
    assert post(client, "/api/collections", {"name": "docs"}).status_code == 201


def test_a_request_from_another_machine_needs_a_token_even_on_the_default(client, settings):
    # As when uvicorn listens on 0.0.0.0 without KB_HOST saying so.
    settings.KB_REQUIRE_AUTH = False
    assert error_of(client.get("/api/collections", REMOTE_ADDR="192.0.2.10")) == (401, "UNAUTHORIZED")
    raw = token("read")
    response = client.get("/api/collections", REMOTE_ADDR="192.0.2.10", headers=headers_for(raw))
    assert response.status_code == 200
    assert client.get("/api/collections", REMOTE_ADDR="::1").status_code == 200


@pytest.mark.parametrize(
    "header",
    ["Bearer kb_0000_nonsense", "Token abc", "Bearer ", "Basic dXNlcjpwYXNz"],
)
def test_a_wrong_or_malformed_token_is_401_even_on_loopback(client, settings, header):
    settings.KB_REQUIRE_AUTH = False
    assert error_of(client.get("/api/collections", headers={"Authorization": header})) == (401, "UNAUTHORIZED")


def test_a_revoked_token_is_401(client, settings):
    settings.KB_REQUIRE_AUTH = True
    revoked = token("read")
    token_revoke(prefix=revoked.split("_")[1])
    assert error_of(get(client, "/api/collections", revoked)) == (401, "UNAUTHORIZED")


def test_an_expired_token_is_401(client, settings):
    settings.KB_REQUIRE_AUTH = True
    made, raw = token_create(name="old", expires_at=timezone.now() + timedelta(minutes=1))
    ApiToken.objects.filter(pk=made.pk).update(expires_at=timezone.now() - timedelta(seconds=1))  # time passes
    assert error_of(get(client, "/api/collections", raw)) == (401, "UNAUTHORIZED")


def test_a_valid_token_works(client, settings):
    settings.KB_REQUIRE_AUTH = True
    raw = token("read")
    assert get(client, "/api/collections", raw).status_code == 200


def test_a_token_s_use_is_recorded(client, settings):
    settings.KB_REQUIRE_AUTH = True
    raw = token("read")
    assert ApiToken.objects.get().last_used_at is None
    get(client, "/api/collections", raw)
    assert ApiToken.objects.get().last_used_at is not None


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_a_read_token_cannot_write(client, settings, two_collections, method, path, body):
    settings.KB_REQUIRE_AUTH = True
    path = path.replace(SOME_ID, two_collections["docs"].pk)
    assert error_of(call(client, method, path, body, token("read"))) == (403, "PERMISSION_DENIED")
    assert Document.objects.count() == 2
    assert Collection.objects.count() == 2


def test_a_read_token_can_read(client, settings, two_collections):
    settings.KB_REQUIRE_AUTH = True
    raw = token("read")
    doc_id = two_collections["docs"].pk
    for path in ["/api/collections", "/api/collections/docs", "/api/collections/docs/documents", "/api/stats"]:
        assert get(client, path, raw).status_code == 200, path
    assert get(client, f"/api/documents/{doc_id}", raw).status_code == 200
    assert post(client, "/api/search", {"query": "shared", "mode": "keyword"}, raw).status_code == 200


def test_a_write_token_ingests_but_cannot_change_or_delete_collections(client, settings, two_collections):
    settings.KB_REQUIRE_AUTH = True
    raw = token("write")
    assert post(client, "/api/collections/docs/documents", {"uri": "data:,More text"}, raw).status_code == 200
    assert delete(client, f"/api/documents/{two_collections['docs'].pk}", raw).status_code == 200
    assert error_of(patch(client, "/api/collections/docs", {"description": "x"}, raw)) == (403, "PERMISSION_DENIED")
    assert error_of(delete(client, "/api/collections/docs?confirm=true", raw)) == (403, "PERMISSION_DENIED")
    admin = token("admin")
    assert patch(client, "/api/collections/docs", {"description": "x"}, admin).status_code == 200
    assert delete(client, "/api/collections/docs?confirm=true", admin).status_code == 200


def test_a_token_limited_to_a_collection_cannot_see_the_others(client, settings, two_collections):
    settings.KB_REQUIRE_AUTH = True
    raw = token("write", "docs")
    listed = get(client, "/api/collections", raw).json()
    assert [c["name"] for c in listed["collections"]] == ["docs"]
    assert error_of(get(client, "/api/collections/code", raw)) == (404, "COLLECTION_NOT_FOUND")
    assert error_of(get(client, "/api/collections/code/documents", raw)) == (404, "COLLECTION_NOT_FOUND")
    ingest = post(client, "/api/collections/code/documents", {"uri": "data:,x y z"}, raw)
    assert error_of(ingest) == (404, "COLLECTION_NOT_FOUND")
    code_doc = two_collections["code"].pk
    assert error_of(get(client, f"/api/documents/{code_doc}", raw)) == (404, "DOCUMENT_NOT_FOUND")
    assert error_of(delete(client, f"/api/documents/{code_doc}", raw)) == (404, "DOCUMENT_NOT_FOUND")
    assert get(client, f"/api/documents/{two_collections['docs'].pk}", raw).status_code == 200


def test_a_token_limited_to_a_collection_searches_only_that_collection(client, settings, two_collections):
    settings.KB_REQUIRE_AUTH = True
    raw = token("read", "docs")
    everything = post(client, "/api/search", {"query": "shared words", "mode": "keyword"}).status_code
    assert everything == 401
    results = post(client, "/api/search", {"query": "shared words", "mode": "keyword"}, raw).json()["results"]
    assert {r["collection"] for r in results} == {"docs"}
    other = post(client, "/api/search", {"query": "shared", "mode": "keyword", "collections": ["code"]}, raw)
    assert error_of(other) == (404, "COLLECTION_NOT_FOUND")


def test_a_token_limited_to_a_collection_has_no_server_wide_powers(client, settings, two_collections):
    settings.KB_REQUIRE_AUTH = True
    raw = token("admin", "docs")
    assert error_of(get(client, "/api/stats", raw)) == (403, "PERMISSION_DENIED")
    assert get(client, "/api/stats", raw, collection="docs").json()["documents"] == 1
    assert error_of(get(client, "/api/stats", raw, collection="code")) == (404, "COLLECTION_NOT_FOUND")
    assert error_of(post(client, "/api/collections", {"name": "mine"}, raw)) == (403, "PERMISSION_DENIED")
