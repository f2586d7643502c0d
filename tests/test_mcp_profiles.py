"""Each seed's profile, in memory: exactly its tools, argument names, defaults, result shapes and error
behaviour, on the same services as the canonical server."""

import json
import uuid
from unittest.mock import ANY

import pytest

from kb.access import Access
from kb.models import Chunk, Collection, Document
from kb.selectors.ingestion import STILL_EMBEDDING
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.ingest import upload_uri
from mcp_endpoint.servers import build_server
from mcp_endpoint.servers.prompts import GROUNDED_QA
from mcp_endpoint.servers.rag_shapes import file_name
from tests.support.http_server import serve, text
from tests.support.mcp_client import (  # noqa: F401
    call,
    call_ok,
    call_text,
    committed_db,
    in_memory,
    tool_threads,
    tools_of,
)
from tests.support.worker import embed_pending

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]

SCIRAG = build_server("scirag", read_only=False)
HYBRID = build_server("hybrid", read_only=False)
SYNTHESIS = build_server("synthesis", read_only=False)
RAGMCPSERVER = build_server("ragmcpserver", read_only=False)
CANONICAL = build_server("canonical", read_only=False)

ENZYMES = "Enzyme activity rises with pH up to an optimum, then falls as the active site denatures."
TEMPERATURE = "Reaction rates roughly double for every ten degrees of temperature increase."
LEAVE = "Employees are entitled to twenty-five days of annual leave per year."


def schemas(server) -> dict:
    return {tool.name: tool for tool in in_memory(server, lambda client: client.list_tools()).tools}


def paper_chunks() -> list[dict]:
    metadata = {"page_count": 5, "author": "Smith et al.", "title": "Enzymes and heat", "file_size": 12345}
    second = {key: value for key, value in metadata.items() if key != "page_count"}  # each chunk its own
    return [
        {"text": ENZYMES, "source_filename": "paper.pdf", "chunk_index": 0, "metadata": metadata},
        {"text": TEMPERATURE, "source_filename": "paper.pdf", "chunk_index": 1, "metadata": second},
    ]


# Each profile with the tools of its seed that write and those that only read.
PROFILE_TOOLS = [
    ("scirag", ["store_document_chunks"], ["list_collections", "retrieve_document_chunks"]),
    ("hybrid", [], ["search_documents"]),
    ("synthesis", ["create_collection", "delete_collection", "delete_document", "fetch_and_add_document_from_url"],
     ["list_collections", "list_documents", "search_rag"]),
    ("ragmcpserver", ["Inject"], ["Query"]),
]  # fmt: skip


@pytest.mark.parametrize(("profile", "writing", "reading"), PROFILE_TOOLS)
def test_each_profile_offers_exactly_its_seeds_tools(profile, writing, reading):
    assert sorted(schemas(build_server(profile, read_only=False))) == sorted(writing + reading)


@pytest.mark.parametrize(("profile", "reading"), [(profile, reading) for profile, _, reading in PROFILE_TOOLS])
def test_read_only_hides_each_profile_s_writers(profile, reading):
    assert sorted(schemas(build_server(profile, read_only=True))) == sorted(reading)


def test_scirag_keeps_its_seed_s_argument_signature():
    tools = schemas(SCIRAG)
    retrieve = tools["retrieve_document_chunks"].input_schema
    assert retrieve["required"] == ["query"]
    assert (retrieve["properties"]["top_k"]["default"], retrieve["properties"]["collection"]["default"]) == (5, None)
    store = tools["store_document_chunks"].input_schema
    assert store["required"] == ["chunks"]
    assert store["properties"]["collection"]["default"] == "DocumentChunks"
    assert tools["list_collections"].input_schema["properties"] == {}


def test_scirag_retrieves_the_chunks_it_stored_with_similarity_scores():
    stored = call_ok(SCIRAG, "store_document_chunks", {"chunks": paper_chunks(), "collection": "research-papers"})
    # No worker here and no wait (KB_WRITE_WAIT_SECONDS=0): the message says embedding continues.
    assert stored == {
        "success": True, "chunks_stored": 2, "collection": "research-papers",
        "message": f"Successfully stored 2 chunks. {STILL_EMBEDDING}",
    }  # fmt: skip
    default = call_ok(SCIRAG, "store_document_chunks", {"chunks": paper_chunks()[:1]})
    assert default["collection"] == "DocumentChunks"
    assert call_ok(SCIRAG, "list_collections") == ["DocumentChunks", "research-papers"]
    document = Document.objects.get(collection__name="research-papers")
    assert (document.source_uri, document.chunk_count, document.title) == ("paper.pdf", 2, "Enzymes and heat")
    embed_pending()

    query = {"query": "How does enzyme activity change with pH?", "top_k": 5, "collection": "research-papers"}
    chunks = call_ok(SCIRAG, "retrieve_document_chunks", query)
    assert [chunk["chunk_index"] for chunk in chunks] == [0, 1]
    best = chunks[0]
    assert best == {"text": ENZYMES, "source_filename": "paper.pdf", "chunk_index": 0, "score": ANY, "metadata": ANY}
    assert 0.0 <= chunks[1]["score"] < best["score"] <= 1.0
    assert best["metadata"] | {} == best["metadata"] | {
        "file_size": 12345, "page_count": 5, "creation_date": None, "modification_date": None,
        "ingestion_date": ANY, "title": "Enzymes and heat", "author": "Smith et al.",
    }  # fmt: skip
    assert (chunks[1]["metadata"]["page_count"], chunks[1]["metadata"]["file_size"]) == (None, 12345)
    everywhere = call_ok(SCIRAG, "retrieve_document_chunks", {"query": "enzyme pH"})
    assert len(everywhere) == 3  # both collections, top_k 5


def test_scirag_gives_back_each_chunk_s_own_name_and_metadata_as_stored():
    """An attack helper's SciRAG client got q1.pdf for reports/2024/q1.pdf and reports/2023/q1.pdf,
    and chunks showed other chunks' title, author and page count (their document's union)."""
    names = ["reports/2024/q1.pdf", "reports/2023/q1.pdf", "https://arxiv.org/pdf/2401.00001"]
    first = [
        {"text": f"{ENZYMES} ({number})", "source_filename": name, "chunk_index": 0, "metadata": own}
        for number, (name, own) in enumerate(
            zip(names, [{"title": "T1", "author": "Alice"}, {"author": "Bob"}, {}], strict=True)
        )
    ]
    assert call_ok(SCIRAG, "store_document_chunks", {"chunks": first, "collection": "reports"})["success"]
    later = {"text": TEMPERATURE, "source_filename": names[0], "chunk_index": 1, "metadata": {"page_count": 7}}
    assert call_ok(SCIRAG, "store_document_chunks", {"chunks": [later], "collection": "reports"})["success"]
    embed_pending()
    found = call_ok(SCIRAG, "retrieve_document_chunks", {"query": "enzyme", "top_k": 10, "collection": "reports"})
    by_name = {(chunk["source_filename"], chunk["chunk_index"]): chunk["metadata"] for chunk in found}
    assert sorted(by_name) == sorted([(name, 0) for name in names] + [(names[0], 1)])
    picked = {key: {field: value for field, value in metadata.items() if value is not None and field != "ingestion_date"}
              for key, metadata in by_name.items()}  # fmt: skip
    assert picked == {
        (names[0], 0): {"title": "T1", "author": "Alice"},
        (names[1], 0): {"author": "Bob"},
        (names[2], 0): {},
        (names[0], 1): {"page_count": 7},
    }
    assert by_name[(names[0], 0)]["ingestion_date"] < by_name[(names[0], 1)]["ingestion_date"]


def test_scirag_store_reports_validation_errors_without_raising():
    chunks = [*paper_chunks(), {"source_filename": "paper.pdf", "chunk_index": 2}]
    chunks.insert(0, paper_chunks()[0] | {"chunk_index": 7})
    result = call_ok(SCIRAG, "store_document_chunks", {"chunks": chunks, "collection": "research-papers"})
    assert result == {
        "success": False,
        "chunks_stored": 0,
        "collection": "research-papers",
        "message": "Validation error: Chunk 3 missing required field 'text'",
    }
    bad_index = [paper_chunks()[0] | {"chunk_index": "one"}]
    assert call_ok(SCIRAG, "store_document_chunks", {"chunks": bad_index})["message"] == (
        "Validation error: Chunk 0: 'chunk_index' must be an integer"
    )
    for index in (-1, 2**31):  # Chunk.index is a Postgres integer: 2**31 was a database error
        out_of_range = [paper_chunks()[0] | {"chunk_index": index}]
        assert call_ok(SCIRAG, "store_document_chunks", {"chunks": out_of_range})["message"] == (
            f"Validation error: Chunk index {index} must be between 0 and 2147483647"
        )
    bad_name = call_ok(SCIRAG, "store_document_chunks", {"chunks": paper_chunks(), "collection": "no spaces"})
    assert bad_name["success"] is False and bad_name["message"].startswith("Validation error: Invalid collection name")
    for arguments in ({"collection": "a\x00b"}, {"chunks": [paper_chunks()[0] | {"source_filename": "f\x00"}]}):
        nul = call_ok(SCIRAG, "store_document_chunks", {"chunks": paper_chunks(), **arguments})
        assert nul["success"] is False and nul["message"].startswith("Validation error: collection and source names")
    assert not Document.objects.exists()


def test_scirag_retrieve_raises_on_error():
    missing = call(SCIRAG, "retrieve_document_chunks", {"query": "x", "collection": "nope"})
    assert missing.is_error
    assert missing.content[0].text == (
        "Error executing tool retrieve_document_chunks: COLLECTION_NOT_FOUND: Collection not found: nope"
    )


# FastMCP (the Python seeds) puts "Error executing tool X: " before a failed tool's message; the
# TypeScript SDK (Synthesis) and C#'s (RagMcpServer) answer with the message alone.
FASTMCP = "Error executing tool {tool}: "


@pytest.mark.parametrize(
    ("server", "tool", "arguments", "prefix"),
    [
        (SCIRAG, "retrieve_document_chunks", {"query": "x", "top_k": {"many": 1}}, FASTMCP),
        (HYBRID, "search_documents", {"query": ["x"]}, FASTMCP),
        (SYNTHESIS, "search_rag", {"query": "x", "collectionId": "c", "top_k": "five"}, ""),
        (RAGMCPSERVER, "Query", {}, ""),
    ],
)
def test_the_raising_profiles_name_bad_arguments_briefly_with_their_code(server, tool, arguments, prefix):
    refused = call(server, tool, arguments)
    assert refused.is_error
    text = refused.content[0].text
    assert text.startswith(f"{prefix.format(tool=tool)}INVALID_ARGUMENT: "), text
    assert "pydantic" not in text and len(text) < 300, text


def test_the_typescript_and_csharp_profiles_fail_with_the_message_alone():
    missing = call(SYNTHESIS, "search_rag", {"query": "x", "collectionId": str(uuid.uuid4())})
    assert missing.is_error and missing.content[0].text.startswith("COLLECTION_NOT_FOUND: "), missing
    refused = call(RAGMCPSERVER, "Inject", {"text": "  "})
    assert refused.is_error and refused.content[0].text.startswith("INVALID_ARGUMENT: "), refused


def test_scirag_list_collections_gives_an_empty_list_on_error():
    collection_create(name="exists")
    assert call_ok(SCIRAG, "list_collections", access=None) == []  # a request without credentials


def test_the_hybrid_profile_fuses_ranks_at_semantic_weight_0_7():
    collection = collection_create(name="policies")
    for name, body in (
        ("1 - Remote Working.txt", "Employees may work remotely up to 3 days per week."),
        ("2 - Annual Leave.txt", LEAVE),
        ("3 - Expenses.txt", "Expenses are reimbursed monthly."),
    ):
        uri = upload_uri(name) if name.startswith("3") else f"file:///policies/{name}"  # uploaded, or read
        document_create_from_text(collection=collection, source_uri=uri, text=body)
    embed_pending()
    tool = schemas(HYBRID)["search_documents"].input_schema
    assert (tool["required"], tool["properties"]["top_k"]["default"]) == (["query"], 3)

    hits = call_ok(HYBRID, "search_documents", {"query": "annual leave days per year"})
    assert len(hits) == 3
    best = hits[0]
    assert best == {"file_name": "2 - Annual Leave.txt", "content": LEAVE, "rrf_score": ANY, "vector_rank": 1,
                    "text_rank": 1, "score": ANY}  # fmt: skip
    assert 0.0 < best["score"] <= 1.0 and [hit["score"] for hit in hits] == sorted(
        (hit["score"] for hit in hits), reverse=True
    )
    for hit in hits:  # weighted RRF: 2w/(60 + vector rank) + 2(1 - w)/(60 + text rank), w = 0.7
        expected = sum(
            2 * weight / (60 + rank) for weight, rank in ((0.7, hit["vector_rank"]), (0.3, hit["text_rank"])) if rank
        )
        assert hit["rrf_score"] == pytest.approx(expected, rel=1e-4)
    assert len(call_ok(HYBRID, "search_documents", {"query": "work", "top_k": 1})) == 1
    # The seeds set no maximum: a large top_k gets what there is (at most 100), not an error.
    assert len(call_ok(HYBRID, "search_documents", {"query": "work", "top_k": 100_000})) == 3
    assert len(call_ok(SCIRAG, "retrieve_document_chunks", {"query": "work", "top_k": 101})) == 3
    expenses = {"query": "expenses reimbursed monthly", "top_k": 1}
    assert call_ok(HYBRID, "search_documents", expenses)[0]["file_name"] == "3 - Expenses.txt"
    assert call_ok(SCIRAG, "retrieve_document_chunks", expenses)[0]["source_filename"] == "3 - Expenses.txt"


def test_the_hybrid_profile_offers_the_grounded_qa_prompt():
    async def prompt(client):
        return await client.list_prompts(), await client.get_prompt("grounded_qa_prompt")

    listed, grounded = in_memory(HYBRID, prompt)
    assert [p.name for p in listed.prompts] == ["grounded_qa_prompt"]
    assert grounded.messages[0].content.text == GROUNDED_QA
    failed = call(HYBRID, "search_documents", {"query": "   "})
    assert failed.is_error and failed.content[0].text.endswith("The query is empty")


def test_synthesis_manages_collections_by_uuid():
    created = json.loads(call_text(SYNTHESIS, "create_collection", {"name": "handbook", "description": "HR"}))
    collection_id = created["collection"]["id"]
    assert created["collection"] == {"id": collection_id, "name": "handbook", "description": "HR",
                                     "document_count": 0, "created_at": ANY}  # fmt: skip
    assert str(Collection.objects.get(name="handbook").uuid) == collection_id
    listed = json.loads(call_text(SYNTHESIS, "list_collections"))
    assert [c["id"] for c in listed["collections"]] == [collection_id]


def test_synthesis_listings_fit_the_response_budget(settings):
    settings.MCP_MAX_RESPONSE_CHARS = 3000
    for n in range(40):
        collection = collection_create(name=f"shelf-{n:02}", description="A shelf of handbooks. " * 90)
    for n in range(30):
        document_create_from_text(collection=collection, source_uri=f"{'deep/' * 30}hr-{n}.txt", text=LEAVE)

    listed_text = call_text(SYNTHESIS, "list_collections")  # the text sent is what the budget counts
    listed = json.loads(listed_text)
    assert len(listed_text) <= 3000 and listed["truncated"] is True and 0 < len(listed["collections"]) < 40
    assert all(c["description"].endswith("more characters truncated]") for c in listed["collections"])
    documents_text = call_text(SYNTHESIS, "list_documents", {"collection_id": str(collection.uuid)})
    documents = json.loads(documents_text)
    assert len(documents_text) <= 3000 and documents["truncated"] is True and 0 < len(documents["documents"]) < 30

    settings.MCP_MAX_RESPONSE_CHARS = 1_000_000
    assert json.loads(call_text(SYNTHESIS, "list_collections"))["truncated"] is False


@pytest.fixture
def handbook() -> str:
    """An embedded collection of two documents, one on annual leave; the collection's uuid."""
    collection = collection_create(name="handbook", description="HR")
    document_create_from_text(collection=collection, source_uri="hr.txt", text=LEAVE)
    document_create_from_text(collection=collection, source_uri="tax.txt", text="Quarterly VAT returns.")
    embed_pending()
    return str(collection.uuid)


def test_synthesis_lists_a_collection_s_documents(handbook):
    collection_id = handbook
    documents = json.loads(call_text(SYNTHESIS, "list_documents", {"collection_id": collection_id}))["documents"]
    assert sorted(d["source_url"] for d in documents) == ["hr.txt", "tax.txt"]


def test_synthesis_searches_with_min_similarity(handbook):
    collection_id = handbook
    found = json.loads(call_text(SYNTHESIS, "search_rag", {"collectionId": collection_id, "query": "annual leave"}))
    assert [r["source_url"] for r in found["results"]] == ["hr.txt"]  # min_similarity 0.5 by default
    assert found["results"][0]["similarity"] >= 0.5
    assert found["results"][0]["citation"] == {"title": "hr.txt", "url": "hr.txt", "lines": "1-1"}
    everything = {"collectionId": collection_id, "query": "annual leave", "min_similarity": 0.0, "top_k": 50}
    assert len(json.loads(call_text(SYNTHESIS, "search_rag", everything))["results"]) == 2


def test_synthesis_refuses_bad_search_arguments(handbook):
    collection_id = handbook
    for arguments in ({"collectionId": "handbook", "query": "x"}, {"collectionId": collection_id, "query": ""},
                      {"collectionId": collection_id, "query": "x", "top_k": 51},
                      {"collectionId": collection_id, "query": "x", "min_similarity": 1.5},
                      {"collectionId": str(uuid.uuid4()), "query": "x"}):  # fmt: skip
        assert call(SYNTHESIS, "search_rag", arguments).is_error, arguments


def test_synthesis_deletes_only_with_confirm_true():
    collection = collection_create(name="handbook")
    doc_id = document_create_from_text(collection=collection, source_uri="hr.txt", text=LEAVE).document.pk
    refused = call(SYNTHESIS, "delete_document", {"doc_id": doc_id, "confirm": False})
    assert refused.is_error and "confirm: true" in refused.content[0].text
    assert call(SYNTHESIS, "delete_document", {"doc_id": doc_id}).is_error  # confirm is required
    deleted = json.loads(call_text(SYNTHESIS, "delete_document", {"doc_id": doc_id, "confirm": True}))
    assert deleted == {"success": True, "deleted": {"id": doc_id, "title": ""}}

    collection_id = str(collection.uuid)
    assert call(SYNTHESIS, "delete_collection", {"collection_id": collection_id, "confirm": False}).is_error
    assert Collection.objects.filter(name="handbook").exists()
    gone = json.loads(call_text(SYNTHESIS, "delete_collection", {"collection_id": collection_id, "confirm": True}))
    assert gone == {"success": True, "deleted": {"id": collection_id, "name": "handbook", "documents": 0}}


def test_synthesis_fetches_a_document_from_a_url(settings):
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    collection_id = str(collection_create(name="web").uuid)
    with serve(
        {"/policy.html": text("<html><title>Leave</title><body><p>" + LEAVE + "</p></body></html>", "text/html")}
    ) as base:
        added = json.loads(call_text(SYNTHESIS, "fetch_and_add_document_from_url",
                                     {"url": f"{base}/policy.html", "collection_id": collection_id}))  # fmt: skip
    assert added["outcome"] == "created"
    assert added["document"] | {} == added["document"] | {"title": "Leave", "content_type": "html", "status": "pending"}
    not_http = call(
        SYNTHESIS, "fetch_and_add_document_from_url", {"url": "file:///etc/passwd", "collection_id": collection_id}
    )
    assert not_http.is_error and "Not an http(s) URL" in not_http.content[0].text


def inject_leave_and_notes() -> str:
    """Inject the annual-leave text, then six short notes; what the first injection answered."""
    first = call_text(RAGMCPSERVER, "Inject", {"text": LEAVE, "metadata": '{"source": "handbook.md"}'})
    for n in range(6):
        call_text(
            RAGMCPSERVER, "Inject", {"text": f"Note {n}: the cafeteria opens at {n + 7} o'clock.", "metadata": {"n": n}}
        )
    return first


def test_ragmcpserver_injects_text():
    first = inject_leave_and_notes()
    assert first.startswith("Injected document ") and first.endswith(f"(1 chunks, created). {STILL_EMBEDDING}")
    assert "(1 chunks, unchanged)." in call_text(RAGMCPSERVER, "Inject", {"text": LEAVE})
    document = Document.objects.get(source_uri__startswith="inject://", raw_content=LEAVE)
    assert (document.collection.name, document.metadata["source"]) == ("RagMcpServer", "handbook.md")
    # Made with the seed's text splitter settings: chunks of about 1,024 tokens sharing 128.
    assert (document.collection.chunk_max_tokens, document.collection.chunk_overlap_tokens) == (1024, 128)
    assert call(RAGMCPSERVER, "Inject", {"text": "  "}).is_error
    # Metadata that is not a JSON object is kept as text, even nested past the parser's stack;
    # past KB_MAX_METADATA_CHARS it is refused, saying why (it had been a bare "Error executing tool Inject").
    deep = "[" * 3000 + "]" * 3000
    call_text(RAGMCPSERVER, "Inject", {"text": "Deeply nested notes.", "metadata": deep})
    assert Document.objects.get(raw_content="Deeply nested notes.").metadata["metadata"] == deep
    refused = call(RAGMCPSERVER, "Inject", {"text": "More notes.", "metadata": "[" * 100_000 + "]" * 100_000})
    assert refused.is_error and "KB_MAX_METADATA_CHARS" in refused.content[0].text


def test_ragmcpserver_answers_queries_with_the_top_five():
    inject_leave_and_notes()
    embed_pending()

    answer = call_text(RAGMCPSERVER, "Query", {"query": "How many days of annual leave do I get?"})
    passages = answer.split("\n\n---\n\n")
    assert len(passages) == 5
    assert passages[0].startswith("[1] inject://") and passages[0].endswith(LEAVE)


def test_ragmcpserver_answers_fit_the_response_budget_headers_included(settings):
    inject_leave_and_notes()
    for n in range(5):  # long passages whose headers (title, similarity) count too
        call_text(RAGMCPSERVER, "Inject", {"text": f"Annual leave rule {n}: " + "days of leave " * 300})
    embed_pending()
    full = call_text(RAGMCPSERVER, "Query", {"query": "annual leave days"})
    settings.MCP_MAX_RESPONSE_CHARS = len(full) // 2
    answer = call_text(RAGMCPSERVER, "Query", {"query": "annual leave days"})
    assert len(answer) <= settings.MCP_MAX_RESPONSE_CHARS < len(full)
    assert "more characters truncated]" in answer and answer.startswith("[1] inject://")


def test_inject_is_listed_only_to_tokens_allowed_its_collection():
    for allowed, listed in (({"RagMcpServer"}, True), ({"other"}, False), (None, True)):
        writer = Access(scope="write", collections=None if allowed is None else frozenset(allowed))
        assert ("Inject" in tools_of(RAGMCPSERVER, writer)) is listed, allowed
        assert "Query" in tools_of(RAGMCPSERVER, writer)
    limited = Access(scope="write", collections=frozenset({"other"}))
    assert call(RAGMCPSERVER, "Inject", {"text": "hello"}, access=limited).is_error
    assert not Collection.objects.filter(name="RagMcpServer").exists()


def test_profiles_apply_the_callers_access():
    collection_create(name="open")
    hidden = collection_create(name="secret")
    reader = Access(scope="read", collections=frozenset({"open"}))
    assert call_ok(SCIRAG, "list_collections", access=reader) == ["open"]
    assert call(SYNTHESIS, "list_documents", {"collection_id": str(hidden.uuid)}, access=reader).is_error
    assert call(RAGMCPSERVER, "Inject", {"text": "hello"}, access=reader).is_error
    stored = call_ok(SCIRAG, "store_document_chunks", {"chunks": paper_chunks()}, access=reader)
    assert stored["success"] is False and "'write' is needed" in stored["message"]
    assert stored["collection"] == "DocumentChunks"  # the seed's default, as on every other refusal
    stored = call_ok(SCIRAG, "store_document_chunks", {"chunks": paper_chunks(), "collection": "open"}, access=reader)
    assert (stored["success"], stored["collection"]) == (False, "open")


@pytest.mark.parametrize("confirm", ["yes", "true", 1, "1"])
def test_synthesis_deletes_only_with_the_boolean_true(confirm):
    collection = collection_create(name="keep")
    document = document_create_from_text(collection=collection, source_uri="k.txt", text="Kept.").document
    result = call(SYNTHESIS, "delete_document", {"doc_id": document.pk, "confirm": confirm})
    assert result.is_error
    result = call(SYNTHESIS, "delete_collection", {"collection_id": str(collection.uuid), "confirm": confirm})
    assert result.is_error
    assert Document.objects.filter(pk=document.pk).exists()


def test_synthesis_coerces_no_types():
    collection = collection_create(name="typed")
    for arguments in ({"top_k": "5"}, {"min_similarity": "0.5"}, {"top_k": 2.5}):
        result = call(SYNTHESIS, "search_rag", {"collectionId": str(collection.uuid), "query": "x", **arguments})
        assert result.is_error, arguments
    assert not call(
        SYNTHESIS, "search_rag", {"collectionId": str(collection.uuid), "query": "x", "min_similarity": 1}
    ).is_error
    # As the seed's SDK checks arguments with the schema's shape (z.object(shape) drops other
    # names) and zod's int() takes 2.0: an attack helper's run of the seed's own server did so.
    stray = {"collectionId": str(collection.uuid), "query": "x", "topK": 3, "top_k": 2.0}
    assert not call(SYNTHESIS, "search_rag", stray).is_error
    fraction = call(SYNTHESIS, "search_rag", {"collectionId": str(collection.uuid), "query": "x", "top_k": 2.5})
    assert fraction.is_error and "top_k" in fraction.content[0].text


def test_synthesis_attaches_each_input_schema():
    tools = tools_of(SYNTHESIS)
    assert all(tool.meta["jsonSchema"] == tool.input_schema for tool in tools.values())
    schema = tools["search_rag"].meta["jsonSchema"]
    assert schema["properties"]["top_k"]["default"] == 5 and schema["additionalProperties"] is False
    assert "title" not in json.dumps(schema)


def test_file_names_are_shown_decoded_as_the_seeds_show_them():
    assert file_name("file:///srv/handbook/1%20-%20Remote%20Working.txt") == "1 - Remote Working.txt"
    assert file_name("https://example.org/docs/caf%C3%A9%20notes.md?x=1") == "café notes.md"
    assert file_name("plain name.txt") == "plain name.txt"


def test_a_token_limited_to_a_collection_never_creates_it_by_writing():
    """A deleted collection came back when a limited token stored chunks in it meanwhile (2 of 4
    rounds of stores racing the deletion): such a token may write to it, not create it."""
    limited = Access(scope="write", collections=frozenset({"papers", "RagMcpServer"}))
    stored = call_ok(
        SCIRAG, "store_document_chunks", {"chunks": paper_chunks(), "collection": "papers"}, access=limited
    )
    assert stored["success"] is False and "Collection not found: papers" in stored["message"]
    injected = call(RAGMCPSERVER, "Inject", {"text": "hello"}, access=limited)
    assert injected.is_error and "Collection not found: RagMcpServer" in injected.content[0].text
    assert not Collection.objects.filter(name__in=["papers", "RagMcpServer"]).exists()
    unlimited = Access(scope="write", collections=None)
    assert call_ok(
        SCIRAG, "store_document_chunks", {"chunks": paper_chunks(), "collection": "papers"}, access=unlimited
    )["success"]


def test_a_batch_giving_one_chunk_index_twice_is_refused_whole():
    """The last text had won and both had been counted stored."""
    twice = [*paper_chunks(), {"text": "Another text.", "source_filename": "paper.pdf", "chunk_index": 1}]
    stored = call_ok(SCIRAG, "store_document_chunks", {"chunks": twice})
    assert (stored["success"], stored["chunks_stored"]) == (False, 0)
    assert "Chunk index 1 is given twice for paper.pdf" in stored["message"]
    assert not Chunk.objects.exists()


def test_the_neighbours_of_any_stored_chunk_index_can_be_read():
    """A caller's chunk could be stored at index 2**31 - 1 but its neighbours were refused beyond 10**9."""
    last = {"text": "The last chunk.", "source_filename": "far.pdf", "chunk_index": 2**31 - 1}
    first = {"text": "The first chunk.", "source_filename": "far.pdf", "chunk_index": 0}
    assert call_ok(SCIRAG, "store_document_chunks", {"chunks": [first, last]})["success"]
    doc_id = Document.objects.get(source_uri="far.pdf").pk
    around = call_ok(CANONICAL, "rag_read_neighbors", {"doc_id": doc_id, "chunk_index": 2**31 - 1, "before": 1})
    assert [chunk["index"] for chunk in around["chunks"]] == [0, 2**31 - 1]
