"""Hostile values get the same clear code at every door (REST, MCP, admin, services), cost a
bounded amount, and write nothing: NUL, lone surrogates, NaN/Infinity, integers past 64 bits,
deep nesting, huge queries, offsets past bigint, names with a trailing newline, model names
that point at server folders, dates no calendar holds."""

import importlib.util
import json
import logging
import urllib.parse
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse

from config.env import env_float
from kb.embedding_providers import EmbeddingError, local_model_path
from kb.errors import ErrorCode, KBError
from kb.models import Collection, Document
from kb.search import search
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.ingest import document_ingest
from mcp_endpoint.servers import build_server
from tests.support.admin_data import fast_password_hashing, make_collection  # noqa: F401 - an autouse fixture
from tests.support.api_helpers import error_of as api_error
from tests.support.api_helpers import get, post
from tests.support.mcp_client import call, committed_db, error_of, tool_threads  # noqa: F401

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]

CANONICAL = build_server("canonical")
SCIRAG = build_server("scirag")
DATA = "data:text/plain,harmless text"

# Python values as a JSON client could send them (json.dumps writes NaN and Infinity literally).
UNSTORABLE_METADATA = {
    "NUL": {"note": "a\x00b"},
    "lone surrogate": {"note": "a\ud800b"},
    "NaN": {"score": float("nan")},
    "Infinity": {"score": float("inf")},
    "integer past 64 bits": {"offset": 10**30},
    # Postgres keeps 1e19 as a 20-digit integer: stored, it could never be re-ingested.
    "float past 64 bits": {"size": 1e19},
    "negative float past 64 bits": {"size": -1e308},
    "deep nesting": json.loads("[" * 40 + "]" * 40) and {"deep": json.loads("[" * 40 + "]" * 40)},
}


# The in-memory MCP client serialises NaN and Infinity as null (pydantic); over the wire they arrive
# as parsed numbers and meet the same service check as REST's (tests/security/test_access.py).
NOT_SENT_IN_MEMORY = {"NaN", "Infinity"}


def counts() -> tuple[int, int]:
    return Collection.objects.count(), Document.objects.count()


@pytest.mark.parametrize("case", sorted(UNSTORABLE_METADATA))
def test_unstorable_metadata_is_the_same_invalid_argument_at_every_door(client, case):
    collection_create(name="c")
    metadata = UNSTORABLE_METADATA[case]
    before = counts()
    body = json.dumps({"uri": DATA, "metadata": metadata})
    rest = client.post("/api/collections/c/documents", body, content_type="application/json")
    assert api_error(rest) == (400, "INVALID_ARGUMENT")
    if case not in NOT_SENT_IN_MEMORY:
        mcp = error_of(call(CANONICAL, "rag_ingest", {"uri": DATA, "collection": "c", "metadata": metadata}))
        assert mcp["code"] == "INVALID_ARGUMENT"
        assert rest.json()["error"]["message"] == mcp["message"]
        scirag_chunk = {"text": "t", "source_filename": "f.txt", "chunk_index": 0, "metadata": metadata}
        stored = json.loads(call(SCIRAG, "store_document_chunks", {"chunks": [scirag_chunk]}).content[0].text)
        assert stored["success"] is False and stored["message"].startswith("Validation error")
    assert counts() == before


def test_text_postgres_cannot_store_is_refused_by_the_service_whoever_calls_it():
    collection = collection_create(name="c")
    for bad in ("a\x00b", "a\udfffb"):
        with pytest.raises(KBError) as raised:
            document_create_from_text(collection=collection, source_uri="s.txt", text=f"fine {bad}")
        assert raised.value.code == ErrorCode.INVALID_ARGUMENT
        with pytest.raises(KBError) as raised:
            collection_create(name="d", description=bad)
        assert raised.value.code == ErrorCode.INVALID_ARGUMENT
    assert counts() == (1, 0)


def test_a_huge_query_is_refused_at_every_door_before_any_work(client, settings):
    collection_create(name="c")
    query = "turbulence " * 2000  # 22,000 characters
    with pytest.raises(KBError) as raised:
        search(query=query)
    assert raised.value.code == ErrorCode.INVALID_ARGUMENT and "KB_MAX_QUERY_CHARS" in raised.value.message
    assert error_of(call(CANONICAL, "rag_search", {"query": query}))["code"] == "INVALID_ARGUMENT"
    assert api_error(post(client, "/api/search", {"query": query})) == (400, "INVALID_ARGUMENT")
    scirag = call(SCIRAG, "retrieve_document_chunks", {"query": query})
    assert scirag.is_error and "KB_MAX_QUERY_CHARS" in scirag.content[0].text
    settings.KB_MAX_QUERY_CHARS = 30_000
    assert search(query=query).results == []  # the limit is the setting, not a constant


def test_offsets_past_bigint_are_invalid_arguments_not_database_errors(client):
    collection_create(name="c")
    offset = 10**20
    mcp = error_of(call(CANONICAL, "rag_list_documents", {"collection": "c", "offset": offset}))
    assert mcp["code"] == "INVALID_ARGUMENT"
    assert api_error(get(client, "/api/collections/c/documents", offset=offset)) == (400, "INVALID_ARGUMENT")
    document = document_create_from_text(collection=collection_create(name="d"), source_uri="x://y", text="z").document
    mcp = error_of(call(CANONICAL, "rag_read_neighbors", {"doc_id": document.pk, "chunk_index": offset}))
    assert mcp["code"] == "INVALID_ARGUMENT"
    path = f"/api/documents/{document.pk}/chunks/{offset}/neighbors"
    assert api_error(get(client, path)) == (400, "INVALID_ARGUMENT")


NUL_LOOKUPS = {
    "rag_delete": {"doc_id": "01HRE4KXQN8Z3J2X5Y7A9B4C6\x00"},
    "rag_list_documents": {"collection": "a\x00b"},
    "rag_stats": {"collection": "a\x00b"},
    "rag_ingest": {"uri": "data:,hello", "collection": "a\x00b"},
    "rag_get_document": {"doc_id": "nul\x00"},
    "rag_read_neighbors": {"doc_id": "nul\x00", "chunk_index": 0},
}


@pytest.mark.parametrize("tool", sorted(NUL_LOOKUPS))
def test_a_nul_in_an_id_or_a_collection_name_is_invalid_argument_not_a_database_error(client, tool, caplog):
    collection_create(name="c")
    before = counts()
    mcp = error_of(call(CANONICAL, tool, NUL_LOOKUPS[tool]))
    assert mcp == {"code": "INVALID_ARGUMENT", "message": "Text values cannot contain NUL (0x00) characters"}
    assert counts() == before
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]  # the caller's mistake


def test_a_nul_in_a_rest_path_is_invalid_argument(client):
    collection_create(name="c")
    for path in (
        "/api/collections/a%00b/documents",
        "/api/documents/nul%00",
        "/api/documents/nul%00/chunks/0/neighbors",
    ):
        assert api_error(get(client, path)) == (400, "INVALID_ARGUMENT"), path


@pytest.mark.parametrize("name", ["a b", "x" * 101, "Прото", "a%2Fb"])
def test_a_name_that_is_no_collection_s_is_not_found_at_every_door(client, name):
    """REST had judged the name's form (400 INVALID_ARGUMENT) where MCP looked it up (not found)."""
    collection_create(name="c")
    quoted = urllib.parse.quote(name, safe="")
    for path in (
        f"/api/collections/{quoted}/documents",
        f"/api/collections/{quoted}",
        f"/api/stats?collection={quoted}",
    ):
        assert api_error(get(client, path)) == (404, "COLLECTION_NOT_FOUND"), path
    for tool in ("rag_list_documents", "rag_stats"):
        assert error_of(call(CANONICAL, tool, {"collection": name}))["code"] == "COLLECTION_NOT_FOUND"


INGEST_ARGUMENTS = {
    "title of 501 characters": ({"title": "t" * 501}, "INVALID_ARGUMENT"),
    "title with a NUL": ({"title": "a\x00b"}, "INVALID_ARGUMENT"),
    "unknown content type": ({"content_type": "spreadsheet"}, "INVALID_ARGUMENT"),
    "empty URI": ({"uri": ""}, "INVALID_URI"),
}


@pytest.mark.parametrize("case", sorted(INGEST_ARGUMENTS))
def test_an_ingest_argument_gets_the_same_answer_at_both_doors(client, case):
    """REST had refused a 501-character title or a NUL in it, where MCP cut it to 500 or stored
    U+FFFD; an empty URI was INVALID_ARGUMENT at one door and INVALID_URI at the other."""
    collection_create(name="c")
    arguments, code = INGEST_ARGUMENTS[case]
    body = {"uri": DATA} | arguments
    before = counts()
    rest = client.post("/api/collections/c/documents", json.dumps(body), content_type="application/json")
    assert api_error(rest)[1] == code
    mcp = error_of(call(CANONICAL, "rag_ingest", body | {"collection": "c"}))
    assert (mcp["code"], mcp["message"]) == (code, rest.json()["error"]["message"])
    assert counts() == before


def test_a_content_type_alias_and_an_empty_override_are_taken_at_both_doors(client):
    collection_create(name="c")
    for value, stored in (("Markdown", "markdown"), ("md", "markdown"), ("", "plain_text")):
        body = {"uri": f"data:text/plain,{value or 'none'}", "content_type": value}
        rest = client.post("/api/collections/c/documents", json.dumps(body), content_type="application/json")
        assert rest.status_code == 200, rest.content
        assert Document.objects.get(pk=rest.json()["items"][0]["doc_id"]).content_type == stored
        assert not call(CANONICAL, "rag_ingest", body | {"collection": "c"}).is_error


def test_a_nul_in_a_source_s_collection_is_the_caller_s_error_without_an_error_logged(
    client, caplog, tmp_path, settings
):
    """It reached Postgres: the caller got a 400, but each request logged an ERROR with a traceback."""
    collection_create(name="c")
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    body = {"name": "s", "collection": "a\x00b", "folder": str(tmp_path)}
    assert api_error(post(client, "/api/sources", body)) == (400, "INVALID_ARGUMENT")
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.mark.parametrize("name", ["t1\n", "t1\r\n", "\nt1", "t 1", "t1\x00"])
def test_a_collection_name_must_be_the_whole_name(client, name):
    before = counts()
    with pytest.raises(KBError) as raised:
        collection_create(name=name)
    assert raised.value.code == ErrorCode.INVALID_ARGUMENT
    assert error_of(call(CANONICAL, "rag_create_collection", {"name": name}))["code"] == "INVALID_ARGUMENT"
    assert api_error(post(client, "/api/collections", {"name": name})) == (400, "INVALID_ARGUMENT")
    assert counts() == before


def test_the_local_provider_loads_only_packaged_models_or_the_models_folder(settings, tmp_path):
    models = tmp_path / "models"
    (models / "my-model").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    for name in (str(tmp_path / "outside"), "/etc", "../outside", "my-model"):
        with pytest.raises(EmbeddingError):
            local_model_path(name)  # no models folder configured: nothing but the packaged model
    settings.KB_LOCAL_MODELS_DIR = models
    if importlib.util.find_spec("torch"):
        assert local_model_path("my-model") == (models / "my-model").resolve()
    else:  # accepted as a model folder; it only lacks the optional PyTorch stack to run
        with pytest.raises(EmbeddingError, match="PyTorch"):
            local_model_path("my-model")
    for name in (str(tmp_path / "outside"), "../outside", "/etc", ".", "missing"):
        with pytest.raises(EmbeddingError) as raised:
            local_model_path(name)
        assert str(tmp_path) not in raised.value.message or name.startswith(str(tmp_path))
    with pytest.raises(KBError) as refused:
        collection_create(name="c", embedding_provider="local", embedding_model="/etc")
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert counts() == (0, 0)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-Infinity"])
def test_settings_refuse_numbers_that_are_not_finite(monkeypatch, value):
    monkeypatch.setenv("KB_TEST_NUMBER", value)
    with pytest.raises(ImproperlyConfigured, match="KB_TEST_NUMBER"):
        env_float("KB_TEST_NUMBER", 0.5, minimum=0.0, maximum=1.0)


def test_the_admin_shows_a_date_no_calendar_holds_as_the_number(admin_client):
    document = document_create_from_text(
        collection=make_collection("c"), source_uri="s.txt", text="Some text.", metadata={"release_date": 1e18}
    ).document
    response = admin_client.get(reverse("admin:kb_document_change", args=[document.pk]))
    assert response.status_code == 200
    assert '<th scope="row">release_date</th><td>1000000000000000000</td>' in response.content.decode()


def test_deep_json_bodies_are_refused_by_the_api_without_a_server_error(client):
    collection_create(name="c")
    deep = '{"uri": "' + DATA + '", "metadata": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    response = client.post("/api/collections/c/documents", deep, content_type="application/json")
    assert api_error(response) == (400, "INVALID_ARGUMENT")
    assert counts() == (1, 0)


def test_a_models_folder_path_is_never_shown_to_callers(settings, tmp_path: Path):
    settings.KB_LOCAL_MODELS_DIR = tmp_path
    with pytest.raises(EmbeddingError) as raised:
        local_model_path("nope")
    assert str(tmp_path) not in raised.value.message


def test_a_search_filter_too_large_for_the_database_is_refused_at_every_door(client):
    collection_create(name="c")
    many_keys = {f"k{n}": n for n in range(1000)}
    huge_in = {"lang": {"$in": [f"l{n}" for n in range(5000)]}}
    for metadata in (many_keys, huge_in):
        with pytest.raises(KBError) as raised:
            search(query="lift", metadata=metadata)
        assert raised.value.code == ErrorCode.INVALID_ARGUMENT and "too large" in raised.value.message
        assert error_of(call(CANONICAL, "rag_search", {"query": "lift", "metadata_filter": metadata}))["code"] == (
            "INVALID_ARGUMENT"
        )
        assert api_error(post(client, "/api/search", {"query": "lift", "metadata": metadata})) == (
            400,
            "INVALID_ARGUMENT",
        )
    with pytest.raises(KBError):
        search(query="lift", document_ids=[f"01H{n:023d}" for n in range(10_001)])
    many_types = ["markdown"] * 1001
    with pytest.raises(KBError) as raised:
        search(query="lift", content_types=many_types)
    assert "At most 1000 content types" in raised.value.message
    assert error_of(call(CANONICAL, "rag_search", {"query": "lift", "content_types": many_types}))["code"] == (
        "INVALID_ARGUMENT"
    )
    assert api_error(post(client, "/api/search", {"query": "lift", "content_types": many_types})) == (
        400,
        "INVALID_ARGUMENT",
    )
    assert search(query="lift", content_types=many_types[:1000]).results == []
    assert search(query="lift", metadata={f"k{n}": n for n in range(32)}).results == []


@pytest.mark.parametrize(
    "uri", ["data:,a\udfffb", "http://example.org/\ud800", "file:///tmp/\udcff.txt", "/tmp/\udcff.txt", "\ud800"]
)
def test_a_uri_holding_a_lone_surrogate_is_an_invalid_uri_at_every_door(client, uri, settings, tmp_path):
    """Each kind of URI had reached the URL quoting or the file system's encoding: an HTML 500."""
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    collection = collection_create(name="c")
    before = counts()
    with pytest.raises(KBError) as raised:
        document_ingest(collection=collection, uri=uri, file_roots=[tmp_path])
    assert raised.value.code == ErrorCode.INVALID_URI and "lone surrogates" in raised.value.message
    body = json.dumps({"uri": uri})  # "\udfff" escaped, as a JSON client sends it
    rest = client.post("/api/collections/c/documents", body, content_type="application/json")
    assert api_error(rest) == (400, "INVALID_URI")
    assert counts() == before
