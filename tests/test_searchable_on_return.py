"""Agents see what they write: every write tool of every profile answers once its chunks are
searchable by meaning, on every transport (SSE, Streamable HTTP, stdio), while the main worker is
busy with a bulk import.

As `make run`: a worker that takes both lanes (here slowed down: its embedding server answers
after a delay, so the bulk import is still running when the test ends) and a worker that takes
only the interactive lane. Writes answer within KB_WRITE_WAIT_SECONDS; each write is searched for
by meaning at once, and must be found every time.
"""

import base64
import itertools
from dataclasses import dataclass

import anyio
import httpx
import pytest

from kb.models import Document, DocumentStatus
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.work_lanes import INTERACTIVE_QUEUE, bulk_work
from tests.conftest import start_worker
from tests.support.fake_providers import fake_ollama
from tests.support.http_server import serve
from tests.support.mcp_client import (  # noqa: F401
    committed_db,
    http_session,
    sse_session,
    stdio_session,
    structured,
    tool_threads,
)
from tests.support.mcp_server import FAKE_MODEL, uvicorn_server

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads"), pytest.mark.worker]

BULK_DOCUMENTS = 60
ROUNDS = 3  # writes per tool and transport
TOPICS = ["glaciers carve valleys", "pulsars spin fast", "mangroves shelter fish", "volcanoes vent ash"]
TRANSPORTS = ("sse", "http", "stdio")


@pytest.fixture(scope="module")
def deployment(django_db_setup, tmp_path_factory):
    """The server, a slowed main worker busy with a bulk import, and an interactive worker."""
    tmp = tmp_path_factory.mktemp("searchable")
    pages = {f"/page/{n}": _page(n) for n in range(len(TRANSPORTS) * ROUNDS)}
    with fake_ollama() as fast, fake_ollama(delay=0.5) as slow, serve(pages) as site:
        env = {"EMBEDDING_PROVIDER": "ollama", "EMBEDDING_MODEL": FAKE_MODEL, "OLLAMA_HOST": fast}
        server_env = {**env, "KB_WRITE_WAIT_SECONDS": "60", "KB_FETCH_ALLOWED_PRIVATE_HOSTS": "127.0.0.1"}
        main = start_worker(tmp, extra_env={**env, "OLLAMA_HOST": slow}, name="main")
        interactive = start_worker(tmp, extra_env=env, name="interactive", queues=INTERACTIVE_QUEUE)
        try:
            with uvicorn_server(tmp, server_env) as url:
                yield Deployment(url=url, site=site, ollama=fast, server_env=server_env)
        finally:
            main.stop()
            interactive.stop()


@dataclass(frozen=True)
class Deployment:
    url: str
    site: str
    ollama: str  # the fast embedding server: this process checks models with it
    server_env: dict[str, str]  # a stdio server is spawned with the web server's settings

    def session(self, transport: str, profile: str):
        if transport == "stdio":
            return stdio_session("--profile", profile, env=self.server_env)
        if transport == "sse":
            return sse_session(f"{self.url}/profiles/{profile}/sse")
        return http_session(f"{self.url}/profiles/{profile}/mcp")


def _page(n: int):
    return lambda handler, body: (200, {"content-type": "text/plain"}, f"Field report {n}: {TOPICS[n % 4]}.".encode())


def start_bulk_import(settings) -> str:
    collection = collection_create(name="bulk-import", embedding_provider="ollama", embedding_model=FAKE_MODEL)
    with bulk_work():
        for n in range(BULK_DOCUMENTS):
            document_create_from_text(collection=collection, source_uri=f"bulk-{n}.txt", text=f"Archive page {n}.")
    return collection.name


def still_importing(collection: str) -> int:
    return Document.objects.filter(collection__name=collection).exclude(status=DocumentStatus.READY).count()


async def call(session, tool: str, arguments: dict):
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result


@pytest.fixture
def ollama_settings(deployment, settings):
    settings.EMBEDDING_PROVIDER, settings.EMBEDDING_MODEL, settings.OLLAMA_HOST = (
        "ollama",
        FAKE_MODEL,
        deployment.ollama,
    )


def test_every_write_tool_is_searchable_by_meaning_when_it_answers(deployment, settings, ollama_settings):
    site = deployment.site
    bulk = start_bulk_import(settings)
    for name in ("notes", "DocumentChunks", "fetched"):
        collection_create(name=name, embedding_provider="ollama", embedding_model=FAKE_MODEL)
    synthesis_collection = str(Document._meta.apps.get_model("kb", "Collection").objects.get(name="fetched").uuid)
    found: dict[str, list[bool]] = {}
    pages = itertools.count()

    async def canonical(session, n: int) -> bool:
        text = f"Lab note {n}: {TOPICS[n % 4]}."
        uri = "data:text/plain;base64," + base64.b64encode(text.encode()).decode()
        ingested = structured(await call(session, "rag_ingest", {"uri": uri, "collection": "notes"}))
        assert ingested["status"] == "ready" and ingested["note"] is None, ingested
        hits = structured(await call(session, "rag_search", {"query": text, "collection": "notes", "mode": "semantic"}))
        return hits["results"][0]["source"] == ingested["doc_id"]

    async def scirag(session, n: int) -> bool:
        text = f"Observation {n}: {TOPICS[n % 4]}."
        chunk = {"text": text, "source_filename": f"obs-{n}.txt", "chunk_index": 0}
        stored = structured(await call(session, "store_document_chunks", {"chunks": [chunk]}))
        assert stored["message"] == "Successfully stored 1 chunks", stored
        hits = structured(await call(session, "retrieve_document_chunks", {"query": text, "top_k": 1}))
        return bool(hits) and hits[0]["text"] == text

    async def ragmcpserver(session, n: int) -> bool:
        text = f"Memo {n}: {TOPICS[n % 4]} this season."
        answer = (await call(session, "Inject", {"text": text})).content[0].text
        assert answer.endswith("created)."), answer
        return text in (await call(session, "Query", {"query": text})).content[0].text

    async def synthesis(session, n: int) -> bool:
        page = next(pages)
        arguments = {"url": f"{site}/page/{page}", "collection_id": synthesis_collection}
        added = (await call(session, "fetch_and_add_document_from_url", arguments)).content[0].text
        assert '"note"' not in added, added
        query = {"query": f"Field report {page}: {TOPICS[page % 4]}.", "collectionId": synthesis_collection}
        return f"Field report {page}:" in (await call(session, "search_rag", query)).content[0].text

    writers = {"canonical": canonical, "scirag": scirag, "ragmcpserver": ragmcpserver, "synthesis": synthesis}

    async def run() -> None:
        serial = itertools.count()
        for transport in TRANSPORTS:
            for profile, write_then_search in writers.items():
                async with deployment.session(transport, profile) as session:
                    for _ in range(ROUNDS):
                        hit = await write_then_search(session, next(serial))
                        found.setdefault(f"{profile} over {transport}", []).append(hit)

    anyio.run(run)
    assert found == {key: [True] * ROUNDS for key in found} and len(found) == len(writers) * len(TRANSPORTS)
    assert still_importing(bulk) > 0, "the bulk import finished: the test did not write while it ran"


def test_the_rest_api_waits_when_asked(deployment, ollama_settings):
    url = deployment.url
    collection_create(name="rest-notes", embedding_provider="ollama", embedding_model=FAKE_MODEL)
    text = "Bench note: mangroves shelter fish at high tide."
    with httpx.Client(base_url=url, timeout=90) as client:
        body = {"uri": f"data:,{text}", "wait": True}
        ingested = client.post("/api/collections/rest-notes/documents", json=body).json()
        assert ingested["searchable"] is True and ingested["items"][0]["status"] == "ready", ingested
        upload = client.post(
            "/api/collections/rest-notes/uploads", data={"wait": "true"}, files={"files": ("tide.txt", b"Tide tables.")}
        ).json()
        assert upload["searchable"] is True and upload["items"][0]["status"] == "ready", upload
        search = {"query": text, "collections": ["rest-notes"], "mode": "semantic", "top_k": 1}
        assert client.post("/api/search", json=search).json()["results"][0]["content"] == text
        unasked = client.post("/api/collections/rest-notes/documents", json={"uri": "data:,Later."}).json()
        assert unasked["searchable"] is None
        # ?wait=true on the address means the same, for a curl user who wrote it there
        addressed = client.post(
            "/api/collections/rest-notes/uploads?wait=true", files={"files": ("tide2.txt", b"Tide charts.")}
        ).json()
        assert addressed["searchable"] is True and addressed["items"][0]["status"] == "ready", addressed
        addressed = client.post("/api/collections/rest-notes/documents?wait=1", json={"uri": "data:,Neap tide."}).json()
        assert addressed["searchable"] is True and addressed["items"][0]["status"] == "ready", addressed
