"""The REST API served by the real ASGI host under uvicorn: Schemathesis over its OpenAPI
document, and the walk-through a new user does with curl and /api/docs."""

import socket
import sys

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, strategies
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.tokens import token_create
from tests.conftest import ChildProcess, child_env, free_port, wait_for
from tests.support.documents import MARKDOWN

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES_PER_OPERATION = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def api_url(django_db_setup, tmp_path_factory):
    """uvicorn serving config.asgi on a free port, shared by the tests of this module."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    server = ChildProcess(command, child_env(), tmp_path_factory.mktemp("uvicorn") / "uvicorn.log")
    wait_for(lambda: _listening(port) or not server.alive(), timeout=60, what="uvicorn to listen")
    assert server.alive(), server.log()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_api_answers_as_its_openapi_document_says(api_url):
    """No 500s, and every status, content type and body as documented, for generated requests."""
    docs = collection_create(name="docs")
    document = document_create_from_text(collection=docs, source_uri="note://guide", text=MARKDOWN).document
    known = {"name": "docs", "doc_id": document.pk}
    schema = schemathesis.openapi.from_url(f"{api_url}/api/openapi.json")
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()
        fixed = {name: value for name, value in known.items() if name in operation.path_parameters}
        cases = strategies.one_of(operation.as_strategy(), operation.as_strategy(path_parameters=fixed))
        try:
            _check_operation(cases, api_url)
        except Exception as failure:  # noqa: BLE001 - collected, so that one run reports every operation
            failures.append(f"{operation.label}: {failure}")
    assert not failures, "\n\n".join(failures)


def _check_operation(cases: strategies.SearchStrategy, base_url: str) -> None:
    @given(case=cases)
    @hypothesis_settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=60)

    check()


def test_a_new_user_follows_api_docs_with_curl(api_url, celery_worker):
    """Create a collection, upload a file, wait for the worker, search, clean up: as documented."""
    with httpx.Client(base_url=api_url, timeout=60) as http:
        assert "swagger" in http.get("/api/docs").text.lower()
        paths = http.get("/api/openapi.json").json()["paths"]
        assert {"/api/collections", "/api/collections/{name}/uploads", "/api/search"} <= set(paths)

        assert http.post("/api/collections", json={"name": "docs"}).status_code == 201
        upload = http.post("/api/collections/docs/uploads", files={"files": ("guide.md", MARKDOWN.encode())})
        doc_id = upload.json()["items"][0]["doc_id"]

        def ready() -> bool:
            return http.get(f"/api/documents/{doc_id}").json()["status"] == "ready"

        wait_for(ready, timeout=180, interval=0.5, what="the worker to embed the upload")
        found = http.post("/api/search", json={"query": "How do I upgrade the replicas?", "collections": ["docs"]})
        best = found.json()["results"][0]
        assert "Upgrade one replica at a time" in best["content"]
        assert best["similarity"] is not None and best["source_uri"] == "upload://guide.md"
        assert http.get("/api/stats").json()["embeddings"] > 0
        assert http.get("/api/health").json()["status"] == "ok"
        assert http.delete("/api/collections/docs", params={"confirm": "true"}).json()["success"] is True


# --- Request bodies are held to their limit before Django reads them ------------------------------

BODY_LIMIT = 10 * 1024 * 1024  # KB_UPLOAD_MAX_MEMORY_BYTES' default


def _raw_request(api_url: str, head: str) -> socket.socket:
    port = int(api_url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head.encode() + b"\r\n")
    return sock


def _response(sock: socket.socket) -> tuple[int, bytes]:
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < 2:
        piece = sock.recv(65536)
        if not piece:
            break
        answer += piece
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


def test_a_body_declared_past_the_limit_is_refused_before_it_is_sent(api_url):
    """Django had read a declared gigabyte to a temporary file, and only then checked the token."""
    with _raw_request(
        api_url,
        "POST /api/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer kb_made_up\r\nContent-Length: {1024**3}\r\n",
    ) as sock:
        status, body = _response(sock)
    assert status == 413
    assert b'"INVALID_ARGUMENT"' in body and b"KB_UPLOAD_MAX_MEMORY_BYTES" in body


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(api_url):
    """The answer comes while the client is still sending, not after 200 MB were read."""
    block = b"a" * 1024 * 1024
    sent = 0
    with _raw_request(
        api_url,
        "POST /api/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Authorization: Bearer kb_made_up\r\nTransfer-Encoding: chunked\r\n",
    ) as sock:
        try:
            while sent < 200 * len(block):
                sock.sendall(b"%x\r\n" % len(block) + block + b"\r\n")
                sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed the connection
        status, body = _response(sock)
    assert status == 413 and b"KB_UPLOAD_MAX_MEMORY_BYTES" in body
    assert sent < BODY_LIMIT + 64 * len(block)  # what the sockets' buffers can hold on top


BOUNDARY = "kb-test-boundary"
ELEVEN_MB_OF_FILES = (
    (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="big.txt"\r\n'
        "Content-Type: text/plain\r\n\r\n"
    ).encode()
    + b"word " * (11 * 1024 * 1024 // 5)
    + f"\r\n--{BOUNDARY}--\r\n".encode()
)


def _post_11_mb_of_files(url: str, token: str | None = "kb_made_up") -> httpx.Response:
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url, content=ELEVEN_MB_OF_FILES, headers=headers, timeout=60)


def test_an_upload_may_be_larger_than_other_bodies(api_url):
    """Files go up to KB_UPLOAD_MAX_BYTES: 11 MB of upload reaches the view (which finds no such collection)."""
    response = _post_11_mb_of_files(f"{api_url}/api/collections/no-such/uploads", token=None)  # loopback: allowed
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "COLLECTION_NOT_FOUND"


@pytest.mark.parametrize(("token", "code"), [("kb_made_up", "UNAUTHORIZED"), ("reader", "PERMISSION_DENIED")])
def test_an_upload_the_caller_may_not_make_is_refused_before_its_body_is_read(api_url, token, code):
    """A made-up token's 401 had come after the whole body (up to 256 MB) was written to disk."""
    if token == "reader":
        token = token_create(name="reader", scope="read")[1]
    with _raw_request(
        api_url,
        "POST /api/collections/docs/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {200 * 1024 * 1024}\r\n",
    ) as sock:
        status, body = _response(sock)  # no byte of the body was sent
    assert status in (401, 403) and f'"{code}"'.encode() in body


@pytest.mark.parametrize("path", ["/api/search", "/api/collections/docs/documents", "/admin/login/"])
def test_files_sent_where_no_view_takes_them_are_held_to_the_limit_of_a_form(api_url, path):
    """Any multipart body had been allowed KB_UPLOAD_MAX_BYTES, read whole before the token was checked."""
    response = _post_11_mb_of_files(f"{api_url}{path}")
    assert response.status_code == 413, response.text
    assert "KB_UPLOAD_MAX_MEMORY_BYTES" in response.text


def test_a_body_too_large_for_an_admin_page_is_refused_with_a_page(api_url):
    """A curator who pasted a 12 MB data: URI into the admin sees a page, not the API's JSON."""
    form = {"form": "uri", "uri-uri": "data:," + "a" * (12 * 1024 * 1024)}
    response = httpx.post(f"{api_url}/admin/kb/document/add/", data=form, timeout=60)
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("text/html")
    assert "Not sent" in response.text and "KB_UPLOAD_MAX_MEMORY_BYTES" in response.text


@pytest.mark.parametrize("header", ["Authorization", "Origin"])
@pytest.mark.parametrize("path", ["/api/collections", "/mcp", "/sse", "/admin/login/"])
def test_an_access_header_given_twice_is_refused_at_every_door(api_url, path, header):
    """Django joined two Authorization headers and the MCP door took the first: one request, two
    judgements. Two Origins (the site's own, then another) passed the MCP door."""
    values = {"Authorization": ("Bearer kb_made_up", "Bearer kb_other"), "Origin": (api_url, "http://evil.example")}
    headers = [(header, value) for value in values[header]]
    response = httpx.get(f"{api_url}{path}", headers=headers, timeout=10)
    assert response.status_code == 400, response.text
    assert f"gives the {header.lower()} header more than once" in response.text


@pytest.mark.parametrize("path", ["/api/nothing%0A", "/api/nothing%0Ab", "/api/stats%0A", "/api/search%0A"])
def test_a_path_holding_a_newline_gets_the_api_s_json_404(api_url, path):
    """Starlette's Mount("/") did not match such paths: Django's HTML or Starlette's text 404."""
    response = httpx.get(f"{api_url}{path}", timeout=30)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"
