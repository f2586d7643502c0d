"""The canonical MCP server, in memory: rag-mcp's tools (seed 001) with their shapes, the curator's
extras, resources, prompts, read-only mode, the response budget, access rules and every error code."""

import base64
import json
import time
from unittest.mock import ANY

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from kb.access import FULL_ACCESS, Access
from kb.models import Collection
from kb.selectors.ingestion import STILL_EMBEDDING
from kb.services.collections import collection_create, collection_update
from kb.services.documents import document_create_from_text
from mcp_endpoint.caller import Caller, calling_as
from mcp_endpoint.servers import build_server, canonical
from mcp_endpoint.servers.prompts import GROUNDED_QA
from tests.conftest import free_port
from tests.support.fake_providers import remote_collection
from tests.support.mcp_client import (  # noqa: F401
    call,
    call_ok,
    committed_db,
    error_of,
    in_memory,
    tool_threads,
    tools_of,
)
from tests.support.worker import embed_pending, embed_pending_soon

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]

SERVER = canonical.build(read_only=False)
READ_TOOLS = ["rag_search", "rag_list_collections", "rag_list_documents", "rag_stats", "rag_get_document",
              "rag_read_neighbors", "rag_ingestion_status", "rag_list_sources", "rag_sync_status"]  # fmt: skip
WRITE_TOOLS = ["rag_ingest", "rag_delete", "rag_create_collection", "rag_delete_collection", "rag_create_source", "rag_update_source",
               "rag_sync_start"]  # fmt: skip
AERO = "Wings generate lift because air flows faster over the curved upper surface than below it."
COOKING = "Knead the dough for ten minutes, then let it rise in a warm place until doubled."


def data_uri(text: str, mime: str = "text/plain") -> str:
    return f"data:{mime};base64,{base64.b64encode(text.encode()).decode()}"


def ingest(collection: str, text: str, **arguments) -> dict:
    return call_ok(SERVER, "rag_ingest", {"uri": data_uri(text), "collection": collection, **arguments})


def compact_size(result: dict) -> int:
    """What MCP_MAX_RESPONSE_CHARS counts: the structured result as compact JSON."""
    return len(json.dumps(result, ensure_ascii=False, separators=(",", ":")))


def now_ms() -> int:
    return int(time.time() * 1000)


def test_it_offers_rag_mcps_tools():
    assert sorted(tools_of(SERVER)) == sorted(READ_TOOLS + WRITE_TOOLS)


def test_its_tools_carry_rag_mcps_annotations():
    tools = tools_of(SERVER)
    for name in READ_TOOLS:
        assert tools[name].annotations.read_only_hint is True, name
    for name in ("rag_delete", "rag_delete_collection"):
        assert tools[name].annotations.destructive_hint is True
    assert tools["rag_ingest"].annotations.idempotent_hint is True
    assert tools["rag_ingest"].annotations.open_world_hint is True


def test_its_input_schemas_are_rag_mcps():
    tools = tools_of(SERVER)
    search = tools["rag_search"].input_schema
    assert search["required"] == ["query"]
    # As the seed advertises them; left out, the collection's own settings apply (10 and true unless changed).
    top_k, hybrid = search["properties"]["top_k"], search["properties"]["hybrid"]
    assert (top_k["type"], top_k["minimum"], top_k["maximum"], top_k["default"]) == ("integer", 1, 100, 10)
    assert (hybrid["type"], hybrid["default"]) == ("boolean", True)
    assert sorted(tools["rag_ingest"].input_schema["required"]) == ["collection", "uri"]
    assert "rust" in tools["rag_ingest"].input_schema["properties"]["content_type"]["enum"]
    assert tools["rag_create_collection"].input_schema["properties"]["name"]["pattern"] == "^[a-zA-Z0-9_-]+$"


def test_its_output_schemas_are_flat_objects():
    tools = tools_of(SERVER)
    for tool in tools.values():
        assert tool.output_schema["type"] == "object", tool.name
        assert "$ref" not in json.dumps(tool.output_schema), tool.name  # flattened: clients validate faster
    listed = tools["rag_list_documents"].output_schema["properties"]["documents"]["items"]
    assert listed["properties"]["title"] == {"type": "string"} and "title" in listed["required"]
    assert tools["rag_search"].output_schema["properties"]["results"]["items"]["properties"]["similarity"] == {
        "type": ["number", "null"]
    }
    assert {"query", "total_results", "results"} <= set(tools["rag_search"].output_schema["properties"])


def test_the_search_tool_describes_the_existing_collections():
    assert "There are no collections yet." in tools_of(SERVER)["rag_search"].description
    collection_create(name="papers")
    collection_create(name="code")
    assert (
        "Existing collections: code (0 documents), papers (0 documents)." in tools_of(SERVER)["rag_search"].description
    )


def test_read_only_mode_leaves_out_every_tool_that_writes(settings):
    settings.MCP_READ_ONLY = True
    assert sorted(tools_of(build_server("canonical"))) == sorted(READ_TOOLS)


def test_a_document_s_whole_life_through_the_tools():
    created = call_ok(SERVER, "rag_create_collection", {"name": "code", "description": "Source code files"})
    assert created == {"success": True, "name": "code", "description": "Source code files", "uuid": ANY}
    source = 'fn main() {\n    println!("Hello");\n}\n'
    ingested = ingest("code", source, content_type="rust")
    assert ingested == {
        "success": True, "doc_id": ANY, "collection": "code", "source_uri": ANY, "content_type": "rust",
        "chunks_created": 1, "outcome": "created", "status": "pending", "documents": [ANY], "failed": 0, "skipped": 0,
        "note": STILL_EMBEDDING,  # no worker here, and no wait (KB_WRITE_WAIT_SECONDS=0)
    }  # fmt: skip
    doc_id = ingested["doc_id"]
    again = ingest("code", source, content_type="rust")
    assert (again["doc_id"], again["outcome"], again["chunks_created"]) == (doc_id, "unchanged", 0)

    collections = call_ok(SERVER, "rag_list_collections")
    assert collections["total"] == 1
    listed = collections["collections"][0]
    assert (listed["name"], listed["description"], listed["documents"], listed["chunks"]) == (
        "code", "Source code files", 1, 1
    )  # fmt: skip
    assert now_ms() - 60_000 < listed["created_at"] <= now_ms()

    documents = call_ok(SERVER, "rag_list_documents", {"collection": "code"})
    assert (documents["count"], documents["offset"], documents["limit"]) == (1, 0, 100)
    assert documents["documents"][0] == {
        "id": doc_id, "source_uri": ingested["source_uri"], "content_type": "rust", "title": "", "status": "pending",
        "chunk_count": 1, "created_at": ANY, "updated_at": ANY,
    }  # fmt: skip

    found = call_ok(SERVER, "rag_search", {"query": "println", "collection": "code", "hybrid": False})
    assert (found["query"], found["mode"], found["total_results"]) == ("println", "keyword", 1)
    hit = found["results"][0]
    assert (hit["rank"], hit["source"], hit["collection"], hit["content"]) == (1, doc_id, "code", source.strip())
    assert hit["metadata"] == {
        "lines": "1-3", "tokens": ANY, "chunk_index": 0, "page": None, "heading_path": [], "content_type": "rust",
        "title": "", "document": ANY,
    }  # fmt: skip

    stats = call_ok(SERVER, "rag_stats")
    assert (stats["collections"], stats["documents"], stats["chunks"], stats["pending"]) == (1, 1, 1, 1)
    assert "filter" not in stats and stats["storage_bytes"] > 0  # rag-mcp types it a string, if any
    assert call_ok(SERVER, "rag_stats", {"collection": "code"})["filter"] == "code"

    deleted = call_ok(SERVER, "rag_delete", {"doc_id": doc_id})
    assert deleted == {
        "success": True, "deleted_doc_id": doc_id, "source_uri": ingested["source_uri"], "collection": "code"
    }  # fmt: skip
    assert call_ok(SERVER, "rag_search", {"query": "println"})["total_results"] == 0


@pytest.fixture
def two_notes() -> str:
    """An embedded note on aerodynamics and one on cooking; returns the first's id."""
    collection_create(name="notes")
    aero = ingest("notes", AERO, metadata={"year": 2021, "topic": "aero"})["doc_id"]
    ingest("notes", COOKING, metadata={"year": 2019, "topic": "food"})
    assert embed_pending() == 2
    return aero


def test_search_finds_by_meaning_on_one_score_scale(two_notes):
    aero = two_notes
    semantic = call_ok(SERVER, "rag_search", {"query": "how do airplanes stay up", "mode": "semantic"})
    assert semantic["results"][0]["source"] == aero
    assert 0.0 < semantic["results"][0]["similarity"] <= 1.0
    hybrid = call_ok(SERVER, "rag_search", {"query": "air flows over wings", "semantic_weight": 0.5})
    best = hybrid["results"][0]
    assert (best["source"], best["vector_rank"], best["keyword_rank"]) == (aero, 1, 1)
    assert hybrid["semantic_weight"] == 0.5
    # One score scale in every mode, the raw values beside it.
    assert 0.0 < best["fused_score"] < 0.04 and best["keyword_score"] > 0.0 and 0.0 < best["similarity"] < 1.0
    for mode in ("hybrid", "semantic", "keyword"):
        found = call_ok(SERVER, "rag_search", {"query": "air flows over wings", "mode": mode})["results"]
        scores = [hit["score"] for hit in found]
        assert found and scores == sorted(scores, reverse=True) and 0.3 < scores[0] <= 1.0, (mode, scores)
        assert (found[0]["fused_score"] is None) == (mode != "hybrid"), mode


def test_search_filters_narrow_the_results(two_notes):
    aero = two_notes
    recent = call_ok(SERVER, "rag_search", {"query": "dough or wings", "metadata_filter": {"year": {"$gte": 2020}}})
    assert {hit["source"] for hit in recent["results"]} == {aero}
    assert call_ok(SERVER, "rag_search", {"query": "wings", "metadata_filter": {"topic": "none"}})["results"] == []
    only = call_ok(
        SERVER, "rag_search", {"query": "dough wings", "document_ids": [aero], "content_types": ["plain_text"]}
    )
    assert {hit["source"] for hit in only["results"]} == {aero}


def test_search_of_one_collection_takes_its_search_settings():
    notes = collection_create(name="notes")
    ingest("notes", AERO)
    ingest("notes", COOKING)
    assert embed_pending() == 2
    assert call_ok(SERVER, "rag_search", {"query": "wings dough", "collection": "notes"})["total_results"] == 2
    collection_update(collection=notes, search_top_k=1, search_hybrid=False)
    own = call_ok(SERVER, "rag_search", {"query": "wings dough", "collection": "notes"})
    assert (own["total_results"], own["mode"]) == (1, "keyword")
    chosen = call_ok(SERVER, "rag_search", {"query": "wings dough", "collection": "notes", "top_k": 5, "hybrid": True})
    assert (chosen["total_results"], chosen["mode"]) == (2, "hybrid")


def test_ingestion_status_waits_until_the_document_is_embedded():
    collection_create(name="notes")
    doc_id = ingest("notes", AERO)["doc_id"]
    before = call_ok(SERVER, "rag_ingestion_status", {"doc_ids": [doc_id]})
    assert before["done"] is False and before["counts"]["pending"] == 1
    assert before["documents"][0] == {
        "id": doc_id, "collection": "notes", "source_uri": ANY, "status": "pending", "chunk_count": 1,
        "embedded_count": 0, "error_code": "", "error": "",
    }  # fmt: skip
    worker = embed_pending_soon(0.5)
    after = call_ok(SERVER, "rag_ingestion_status", {"doc_ids": [doc_id], "wait_seconds": 60})
    worker.join()
    assert after["done"] is True
    assert (after["documents"][0]["status"], after["documents"][0]["embedded_count"]) == ("ready", 1)
    whole = call_ok(SERVER, "rag_ingestion_status", {"collection": "notes"})
    assert (whole["done"], whole["counts"]["ready"], whole["documents"]) == (True, 1, [])


def test_ingestion_status_follows_each_document_once_and_a_bounded_number_of_them():
    collection_create(name="notes")
    doc_id = ingest("notes", AERO)["doc_id"]
    # The tool's own code, in this thread so its statements are counted: one access check per
    # document, not one per id given.
    with calling_as(Caller(access=FULL_ACCESS)), CaptureQueriesContext(connection) as statements:
        repeated = canonical._ingestion_progress.__wrapped__([doc_id] * 5000, None)
    assert [document["id"] for document in repeated["documents"]] == [doc_id]
    assert len(statements) <= 5, [statement["sql"] for statement in statements]
    too_many = error_of(call(SERVER, "rag_ingestion_status", {"doc_ids": [str(n) for n in range(1001)]}))
    assert too_many["code"] == "INVALID_ARGUMENT" and "1000" in too_many["message"]


def test_a_document_can_be_fetched_with_its_content_on_request():
    collection_create(name="notes")
    doc_id = ingest("notes", f"{AERO}\n\n{COOKING}", title="Two notes", metadata={"author": "Smith"})["doc_id"]
    plain = call_ok(SERVER, "rag_get_document", {"doc_id": doc_id})
    assert (plain["title"], plain["metadata"]["author"], plain["chunk_count"]) == ("Two notes", "Smith", 1)
    assert plain["raw_content"] is None and plain["chunks"] is None
    full = call_ok(SERVER, "rag_get_document", {"doc_id": doc_id, "include_content": True, "include_chunks": True})
    assert full["raw_content"].startswith("Wings generate lift")
    assert full["chunks"] == [
        {"index": 0, "content": ANY, "tokens": ANY, "lines": "1-3", "page": None, "heading_path": []}
    ]


def test_a_collection_is_deleted_only_with_confirmation():
    collection_create(name="notes")
    ingest("notes", f"{AERO}\n\n{COOKING}", title="Two notes", metadata={"author": "Smith"})
    refused = error_of(call(SERVER, "rag_delete_collection", {"name": "notes"}))
    assert refused["code"] == "INVALID_ARGUMENT" and "confirm: true" in refused["message"]
    deleted = call_ok(SERVER, "rag_delete_collection", {"name": "notes", "confirm": True})
    assert deleted == {"success": True, "name": "notes", "documents_deleted": 1, "chunks_deleted": 1}
    assert call_ok(SERVER, "rag_list_collections")["total"] == 0


@pytest.fixture
def glider_manual() -> tuple[str, str]:
    """A manual in sections, one chunk each, and a document in a collection "secret"; their ids."""
    collection_create(name="manual", chunk_max_tokens=24, chunk_min_tokens=0)
    collection_create(name="secret")
    sections = ["Rigging", "Launch", "Thermals", "Landing"]
    text = "# Glider manual\n\n" + "\n\n".join(
        f"## {name}\n\nThe {name.lower()} steps of the glider come in this order." for name in sections
    )
    return ingest("manual", text, content_type="markdown")["doc_id"], ingest("secret", COOKING)["doc_id"]


def thermals_hit() -> dict:
    return call_ok(SERVER, "rag_search", {"query": "thermals steps", "collection": "manual", "hybrid": False})[
        "results"
    ][0]


def test_a_hit_says_where_it_sits(glider_manual):
    assert thermals_hit()["metadata"]["heading_path"] == ["Glider manual", "Thermals"]


def test_a_hit_s_neighbours_can_be_read(glider_manual):
    doc_id, _ = glider_manual
    hit = thermals_hit()
    index = hit["metadata"]["chunk_index"]
    around = call_ok(SERVER, "rag_read_neighbors", {"doc_id": hit["source"], "chunk_index": index, "after": 2})
    assert (around["source"], around["collection"], around["truncated"]) == (doc_id, "manual", False)
    assert [chunk["index"] for chunk in around["chunks"]] == [index - 1, index, index + 1]  # the last chunk is next
    assert [chunk["heading_path"][-1] for chunk in around["chunks"]] == ["Launch", "Thermals", "Landing"]
    alone = call_ok(SERVER, "rag_read_neighbors", {"doc_id": doc_id, "chunk_index": index, "before": 0, "after": 0})
    assert [chunk["content"] for chunk in alone["chunks"]] == [hit["content"]]


def test_neighbours_are_read_within_the_caller_s_access(glider_manual):
    doc_id, hidden = glider_manual
    reader = Access(scope="read", collections=frozenset({"manual"}))
    assert call_ok(SERVER, "rag_read_neighbors", {"doc_id": doc_id, "chunk_index": 0}, access=reader)["chunks"]
    refused = error_of(call(SERVER, "rag_read_neighbors", {"doc_id": hidden, "chunk_index": 0}, access=reader))
    assert refused["code"] == "DOCUMENT_NOT_FOUND"
    # A malformed id (here of 10,000 characters, not sent back) is not found, as over REST.
    for malformed in ("A" * 10_000, "not-a-ulid", "A" * 25):
        error = error_of(call(SERVER, "rag_read_neighbors", {"doc_id": malformed, "chunk_index": 0}))
        assert error["code"] == "DOCUMENT_NOT_FOUND" and len(error["message"]) < 100


def test_neighbours_outside_the_document_are_refused(glider_manual):
    doc_id, _ = glider_manual
    for arguments in ({"chunk_index": 99}, {"chunk_index": -1}, {"chunk_index": 0, "before": 11}):
        refused = error_of(call(SERVER, "rag_read_neighbors", {"doc_id": doc_id, **arguments}))
        assert refused["code"] == "INVALID_ARGUMENT", arguments


def test_a_search_grouped_by_document_shows_each_document_once_with_its_matches_counted():
    collection_create(name="grouped", chunk_max_tokens=24, chunk_min_tokens=0)
    many = ingest("grouped", "\n\n".join(f"Lift and drag of wing section {n} in steady flight." for n in range(5)))
    ingest("grouped", "Lift and drag of a kite.")
    plain = call_ok(SERVER, "rag_search", {"query": "lift drag", "hybrid": False})
    grouped = call_ok(SERVER, "rag_search", {"query": "lift drag", "hybrid": False, "group_by_document": True})
    assert len(plain["results"]) > 2 and all(hit["document_hits"] is None for hit in plain["results"])
    counts = {hit["source"]: hit["document_hits"] for hit in grouped["results"]}
    assert len(grouped["results"]) == 2 and counts[many["doc_id"]] == len(plain["results"]) - 1


def test_long_results_are_cut_visibly_to_the_response_budget(settings):
    collection_create(name="long", chunk_max_tokens=200)
    paragraphs = [
        f"Paragraph {n} about turbulence. " + "Eddies cascade energy to smaller scales. " * 30 for n in range(6)
    ]
    doc_id = ingest("long", "\n\n".join(paragraphs))["doc_id"]
    settings.MCP_MAX_RESPONSE_CHARS = 2500

    found = call(SERVER, "rag_search", {"query": "turbulence eddies", "top_k": 6})
    assert compact_size(found.structured_content) <= 2500
    output = found.structured_content
    assert output["truncated"] is True and output["total_results"] == len(output["results"]) > 1
    cut = [hit for hit in output["results"] if hit["content_truncated"]]
    assert cut and all(hit["content"].endswith("more characters truncated]") for hit in cut)

    document = call_ok(SERVER, "rag_get_document", {"doc_id": doc_id, "include_content": True})
    assert document["truncated"] is True and document["raw_content"].endswith("more characters truncated]")


def test_listings_fit_the_response_budget_and_say_so(settings):
    settings.MCP_MAX_RESPONSE_CHARS = 3000
    shelves = [
        collection_create(name=f"shelf-{n:02}", description=f"Shelf {n}: " + "catalogue of aerofoil data. " * 70)
        for n in range(40)
    ]
    for n in range(30):
        document_create_from_text(collection=shelves[0], source_uri=f"{'deep/' * 30}note-{n}", text=f"Note {n}.")

    listed = call(SERVER, "rag_list_collections")
    output = listed.structured_content
    assert compact_size(output) <= 3000
    assert (output["truncated"], output["total"]) == (True, 40) and 0 < len(output["collections"]) < 40
    assert [c["name"] for c in output["collections"]] == [f"shelf-{n:02}" for n in range(len(output["collections"]))]
    assert all(c["description"].endswith("more characters truncated]") for c in output["collections"])

    # A resource in rag-mcp's shape has no room to say some were left out: every collection stays.
    resource = json.loads(in_memory(SERVER, lambda client: client.read_resource("rag://collections")).contents[0].text)
    assert [c["name"] for c in resource] == [f"shelf-{n:02}" for n in range(40)]
    assert all(c["description"].endswith("more characters truncated]") for c in resource)

    page = call(SERVER, "rag_list_documents", {"collection": "shelf-00"}).structured_content
    assert compact_size(page) <= 3000
    assert page["truncated"] is True and page["count"] == len(page["documents"]) and 0 < page["count"] < 30
    following = call_ok(SERVER, "rag_list_documents", {"collection": "shelf-00", "offset": page["count"]})
    assert following["documents"][0]["source_uri"].endswith(f"note-{page['count']}")

    settings.MCP_MAX_RESPONSE_CHARS = 1_000_000
    whole = call_ok(SERVER, "rag_list_collections")
    assert (whole["truncated"], len(whole["collections"])) == (False, 40)
    assert call_ok(SERVER, "rag_list_documents", {"collection": "shelf-00"})["truncated"] is False


def test_short_texts_are_left_whole_and_no_page_is_empty(settings):
    """A cut note is longer than a short description: cutting those had made every one of them a
    note. A document whose summary alone passes the budget had made an empty page, and a client
    paging on from offset + count asked for the same page forever."""
    settings.MCP_MAX_RESPONSE_CHARS = 1000
    for n in range(40):
        collection_create(name=f"shelf-{n:02}", description=f"Shelf number {n}")
    listed = call_ok(SERVER, "rag_list_collections")
    assert listed["truncated"] is True and 0 < len(listed["collections"]) < 40
    assert [c["description"] for c in listed["collections"]] == [
        f"Shelf number {n}" for n in range(len(listed["collections"]))
    ]

    resource = json.loads(in_memory(SERVER, lambda client: client.read_resource("rag://collections")).contents[0].text)
    assert [c["description"] for c in resource] == [f"Shelf number {n}" for n in range(40)]  # still over budget

    notes = Collection.objects.get(name="shelf-01")
    for name in ("big.txt", "bigger.txt"):
        document_create_from_text(collection=notes, source_uri=name, text="Hinge moments.", metadata={"n": "m" * 5000})
    hits = call_ok(SERVER, "rag_search", {"query": "hinge moments", "collection": "shelf-01", "mode": "keyword"})
    assert (len(hits["results"]), hits["truncated"]) == (1, True)  # the best is over budget alone, but kept

    long_uri = "https://example.org/" + "x" * 4000
    for n in range(2):
        document_create_from_text(
            collection=Collection.objects.get(name="shelf-02"), source_uri=f"{long_uri}{n}", text="A note."
        )
    page = call_ok(SERVER, "rag_list_documents", {"collection": "shelf-02"})
    assert (page["count"], page["truncated"]) == (2, True)
    assert all(document["source_uri"].endswith("more characters truncated]") for document in page["documents"])


def test_file_uris_are_read_under_the_configured_roots_only(settings, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Alpha\n\nFirst file.\n")
    (tmp_path / "docs" / "b.py").write_text("def beta():\n    return 2\n")
    (tmp_path / "secret.txt").write_text("outside the root")
    settings.KB_FILE_ROOTS = [str(tmp_path / "docs")]
    collection_create(name="files")

    folder = call_ok(SERVER, "rag_ingest", {"uri": f"file://{tmp_path}/docs", "collection": "files"})
    assert (folder["success"], folder["outcome"], folder["doc_id"], folder["failed"]) == (True, "directory", None, 0)
    assert sorted(document["content_type"] for document in folder["documents"]) == ["markdown", "python"]
    outside = error_of(call(SERVER, "rag_ingest", {"uri": f"file://{tmp_path}/secret.txt", "collection": "files"}))
    assert outside["code"] == "INVALID_URI"


def test_resources_show_the_knowledge_base_as_json():
    collection_create(name="code", description="Source code files")
    doc_id = ingest("code", "line one\nline two\n", title="Lines")["doc_id"]

    async def read(client):
        listed = await client.list_resources()
        templates = await client.list_resource_templates()
        contents = [
            await client.read_resource(uri) for uri in ("rag://collections", "rag://collections/code", f"rag://documents/{doc_id}")
        ]  # fmt: skip
        return listed, templates, contents

    listed, templates, contents = in_memory(SERVER, read)
    assert [str(resource.uri) for resource in listed.resources] == ["rag://collections"]
    assert sorted(t.uri_template for t in templates.resource_templates) == [
        "rag://collections/{name}",
        "rag://documents/{id}",
    ]
    everything, one, document = (json.loads(result.contents[0].text) for result in contents)
    assert contents[0].contents[0].mime_type == "application/json"
    assert everything == [
        {
            "name": "code",
            "description": "Source code files",
            "documents": 1,
            "chunks": 1,
            "created_at": ANY,
            "uuid": ANY,
        }
    ]
    assert one["settings"]["chunking"] == {"max_tokens": 512, "min_tokens": 50, "overlap_tokens": 0}
    assert one["settings"]["search"] == {"top_k": 10, "hybrid": True, "hybrid_alpha": ANY}
    assert one["documents"] == [{"id": doc_id, "source_uri": ANY, "content_type": "plain_text"}]
    assert (document["id"], document["collection"], document["raw_content"]) == (doc_id, "code", "line one\nline two\n")
    assert document["chunks"] == [
        {"id": ANY, "index": 0, "content": "line one\nline two", "tokens": ANY, "lines": "1-2"}
    ]
    assert isinstance(document["chunks"][0]["id"], str)  # as the seed shows ids
    assert isinstance(document["created_at"], int)


def resource_error(uri: str) -> dict[str, str]:
    async def read(client):
        try:
            await client.read_resource(uri)
        except MCPError as error:
            return error.error
        raise AssertionError(f"{uri} was found")

    error = in_memory(SERVER, read)
    return json.loads(error.message)["error"]


def test_a_missing_resource_is_an_error_with_the_seeds_code():
    assert resource_error("rag://documents/01HNOTTHERE")["code"] == "DOCUMENT_NOT_FOUND"
    assert resource_error("rag://collections/nope") == {
        "code": "COLLECTION_NOT_FOUND", "message": "Collection not found: nope"
    }  # fmt: skip


def test_it_offers_rag_mcps_two_prompts():
    async def prompts(client):
        listed = await client.list_prompts()
        return listed, await client.get_prompt("grounded_qa_prompt"), await client.get_prompt("citation_prompt")

    listed, grounded, citation = in_memory(SERVER, prompts)
    assert sorted(prompt.name for prompt in listed.prompts) == ["citation_prompt", "grounded_qa_prompt"]
    assert grounded.messages[0].content.text == GROUNDED_QA
    assert "[source_uri:lines]" in citation.messages[0].content.text


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("rag_answer", None, "Unknown prompt: rag_answer"),
        (
            "grounded_qa_prompt",
            {"topic": "x", "about": "y"},
            "Prompt grounded_qa_prompt takes no argument about, topic",
        ),
    ],
)
def test_an_unknown_prompt_or_argument_is_invalid_params_with_the_names(name, arguments, message):
    # The SDK answered error code 0 ("Error rendering prompt grounded_qa_prompt").
    async def get(client):
        with pytest.raises(MCPError) as error:
            await client.get_prompt(name, arguments)
        return error.value

    error = in_memory(SERVER, get)
    assert (error.code, error.message) == (INVALID_PARAMS, message)


def test_an_unknown_tool_is_invalid_params_not_a_tool_result():
    # MCP's spec: a protocol error. The SDK answered a tool result "Unknown tool: …" without a code.
    async def call_unknown(client):
        with pytest.raises(MCPError) as error:
            await client.call_tool("rag_nope", {})
        return error.value

    error = in_memory(SERVER, call_unknown)
    assert (error.code, error.message) == (INVALID_PARAMS, "Unknown tool: rag_nope")


def test_a_token_limited_to_a_collection_sees_nothing_else():
    collection_create(name="open")
    collection_create(name="secret")
    ingest("open", AERO)
    hidden = ingest("secret", COOKING)["doc_id"]
    reader = Access(scope="read", collections=frozenset({"open"}))

    listed = call_ok(SERVER, "rag_list_collections", access=reader)
    assert [collection["name"] for collection in listed["collections"]] == ["open"]
    assert "secret" not in tools_of(SERVER, access=reader)["rag_search"].description
    everywhere = call_ok(SERVER, "rag_search", {"query": "dough wings", "hybrid": False}, access=reader)
    assert {hit["collection"] for hit in everywhere["results"]} == {"open"}
    assert error_of(call(SERVER, "rag_search", {"query": "dough", "collection": "secret"}, access=reader)) == {
        "code": "COLLECTION_NOT_FOUND", "message": "Collection not found: secret"
    }  # fmt: skip
    assert error_of(call(SERVER, "rag_get_document", {"doc_id": hidden}, access=reader))["code"] == "DOCUMENT_NOT_FOUND"
    assert error_of(call(SERVER, "rag_stats", access=reader))["code"] == "PERMISSION_DENIED"
    assert error_of(call(SERVER, "rag_ingest", {"uri": data_uri("x"), "collection": "open"}, access=reader)) == {
        "code": "PERMISSION_DENIED", "message": "This token's scope is 'read'; 'write' is needed"
    }  # fmt: skip


def _remote_embedding_collection(settings) -> None:
    settings.OLLAMA_HOST = f"http://127.0.0.1:{free_port()}"
    settings.EMBEDDING_TIMEOUT_SECONDS = 2
    remote_collection(settings, name="remote", model="nomic-embed-text")
    ingest("remote", AERO)


def _with_failing_inserts(action):
    """A real database error: Postgres itself refuses every new document while ``action`` runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION kb_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'documents are refused for this test'; END $$;"
            "CREATE TRIGGER kb_test_refuse BEFORE INSERT ON kb_document FOR EACH ROW EXECUTE FUNCTION kb_test_refuse()"
        )
    try:
        return action()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER kb_test_refuse ON kb_document; DROP FUNCTION kb_test_refuse()")


ERRORS = {
    "DOCUMENT_NOT_FOUND": lambda settings: call(SERVER, "rag_delete", {"doc_id": "01HNOTHERE"}),
    "COLLECTION_NOT_FOUND": lambda settings: call(SERVER, "rag_list_documents", {"collection": "nope"}),
    "COLLECTION_EXISTS": lambda settings: [call(SERVER, "rag_create_collection", {"name": "twice"}) for _ in "12"][-1],
    "INVALID_ARGUMENT": lambda settings: call(SERVER, "rag_search", {"query": "x", "top_k": 101}),
    "INVALID_URI": lambda settings: call(SERVER, "rag_ingest", {"uri": "ftp://example.com/a", "collection": "c"}),
    "LOAD_FAILED": lambda settings: call(SERVER, "rag_ingest", {"uri": "data:,", "collection": "c"}),
    "TEXT_TOO_LONG": lambda settings: (
        setattr(settings, "KB_MAX_CHUNK_TOKENS", 16),
        call(SERVER, "rag_ingest", {"uri": data_uri("word " * 200), "collection": "c"}),
    )[-1],
    "DATABASE_ERROR": lambda settings: _with_failing_inserts(
        lambda: call(SERVER, "rag_ingest", {"uri": data_uri("text"), "collection": "c"})
    ),
    "EMBEDDING_ERROR": lambda settings: (
        _remote_embedding_collection(settings),
        call(SERVER, "rag_search", {"query": "lift", "collection": "remote", "mode": "semantic"}),
    )[-1],
    "UNAUTHORIZED": lambda settings: call(SERVER, "rag_list_collections", access=None),
    "PERMISSION_DENIED": lambda settings: call(SERVER, "rag_create_collection", {"name": "x"}, access=Access("write", frozenset({"c"}))),
}  # fmt: skip


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_every_error_reaches_the_client_as_the_seeds_error_body(code, settings):
    collection_create(name="c")
    result = ERRORS[code](settings)
    error = error_of(result)
    assert error["code"] == code, error
    assert error["message"] and "Traceback" not in error["message"]
    if code == "DATABASE_ERROR":  # the driver's text may name paths and data: only its SQLSTATE
        assert "refused for this test" not in error["message"] and "SQLSTATE P0001" in error["message"]
    assert result.structured_content is None  # clients would check it against the output schema


def test_arguments_are_taken_as_the_schema_types_them_never_coerced():
    collection_create(name="typed")
    for tool, arguments in (
        ("rag_search", {"query": "x", "top_k": "5"}),
        ("rag_search", {"query": "x", "hybrid": "false"}),
        ("rag_search", {"query": "x", "hybrid": 1}),
        ("rag_list_documents", {"collection": "typed", "limit": "10"}),
        ("rag_get_document", {"doc_id": 5}),
    ):
        refused = error_of(call(SERVER, tool, arguments))
        assert refused["code"] == "INVALID_ARGUMENT", (tool, arguments, refused)
    assert call_ok(SERVER, "rag_search", {"query": "x", "top_k": 5, "semantic_weight": 1})["total_results"] == 0
