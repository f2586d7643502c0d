"""The REST API served by the real ASGI host under uvicorn: Schemathesis over its OpenAPI
document, and the walk-through a new user does with curl and /api/docs."""

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
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


def _uvicorn(log_folder: Path, **env: str) -> Iterator[str]:
    """uvicorn serving config.asgi on a free port, with ``env`` on top of the tests' environment."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    server = ChildProcess(command, {**child_env(), **env}, log_folder / "uvicorn.log")
    wait_for(lambda: _listening(port) or not server.alive(), timeout=60, what="uvicorn to listen")
    assert server.alive(), server.log()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="module")
def api_url(django_db_setup, tmp_path_factory):
    """The server shared by the tests of this module."""
    yield from _uvicorn(tmp_path_factory.mktemp("uvicorn"))


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
    """Files go up to KB_UPLOAD_MAX_BYTES: 11 MB of upload reaches the view, which reads the form
    (and refuses its content type)."""
    collection_create(name="docs")
    body = ELEVEN_MB_OF_FILES.replace(
        f"--{BOUNDARY}--".encode(),
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="content_type"\r\n\r\nno/such\r\n--{BOUNDARY}--'.encode(),
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}  # loopback: no token needed
    response = httpx.post(f"{api_url}/api/collections/docs/uploads", content=body, headers=headers, timeout=60)
    assert response.status_code == 400, response.text
    assert "no/such" in response.json()["error"]["message"]


def test_an_upload_to_a_collection_the_token_cannot_see_is_refused_before_its_body_is_read(api_url):
    """A token limited to one collection had sent 200 MB to another before hearing it is not found."""
    collection_create(name="docs")
    collection_create(name="hidden")
    limited = token_create(name="docs-writer", scope="write", collections=["docs"])[1]
    for collection, token in (("hidden", limited), ("no-such", limited), ("no-such", None)):
        authorization = f"Authorization: Bearer {token}\r\n" if token else ""  # none: loopback may do anything
        with _raw_request(
            api_url,
            f"POST /api/collections/{collection}/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
            f"{authorization}Content-Length: {200 * 1024 * 1024}\r\n",
        ) as sock:
            status, body = _response(sock)  # no byte of the body was sent
        assert status == 404 and b'"COLLECTION_NOT_FOUND"' in body


def _admin_session(**permissions: bool) -> str:
    """The session cookie of a staff user (with kb.add_document if ``add_document``)."""
    user = get_user_model().objects.create_user(f"staff-{len(permissions)}", password="x", is_staff=True)
    if permissions.get("add_document"):
        user.user_permissions.add(Permission.objects.get(codename="add_document"))
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def _admin_upload_refusal(api_url: str, headers: str) -> tuple[int, bytes]:
    """The answer to 200 MB of files declared to the admin's upload page, of which none is sent."""
    with _raw_request(
        api_url,
        f"POST /admin/kb/document/add/ HTTP/1.1\r\nHost: {api_url.removeprefix('http://')}\r\n{headers}"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {200 * 1024 * 1024}\r\n",
    ) as sock:
        return _response(sock)


@pytest.mark.parametrize("who", ["nobody", "staff without add_document", "a session cookie with a NUL"])
def test_files_for_the_admin_from_anyone_but_a_curator_are_refused_before_they_are_read(api_url, who):
    """The admin's upload page had taken 256 MB from anyone, to disk, before its login check."""
    # The last: quoted, with an escape that Django's cookie parser reads as a NUL character.
    session = {
        "nobody": "",
        "staff without add_document": _admin_session(),
        "a session cookie with a NUL": '"abcdefgh\\000x"',
    }
    status, body = _admin_upload_refusal(api_url, f"Cookie: {settings.SESSION_COOKIE_NAME}={session[who]}\r\n")
    assert status == 403 and b"Not sent" in body and b"curator who may add documents" in body


def test_files_for_the_admin_from_another_site_are_refused_before_they_are_read(api_url):
    """A page on another local port: the browser sends the curator's cookie (cookies ignore ports)."""
    cookie = f"{settings.SESSION_COOKIE_NAME}={_admin_session(add_document=True)}"
    status, body = _admin_upload_refusal(api_url, f"Cookie: {cookie}\r\nOrigin: http://127.0.0.1:1\r\n")
    assert status == 403 and b"Not sent" in body and b"another site" in body


def test_files_for_the_admin_from_a_curator_reach_it(api_url):
    cookie = _admin_session(add_document=True)
    response = httpx.post(
        f"{api_url}/admin/kb/document/add/",
        content=ELEVEN_MB_OF_FILES,
        headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
        cookies={settings.SESSION_COOKIE_NAME: cookie},
        timeout=60,
    )
    # Read, then refused by Django's own check: the request carries no CSRF token.
    assert response.status_code == 403 and "CSRF" in response.text and "Not sent" not in response.text


@pytest.fixture
def fetching_api_url(django_db_setup, tmp_path):
    """A server whose fetcher may reach loopback (KB_FETCH_ALLOWED_PRIVATE_HOSTS), itself included."""
    yield from _uvicorn(tmp_path, KB_FETCH_ALLOWED_PRIVATE_HOSTS="127.0.0.1")


def test_the_server_s_own_fetcher_lends_no_access_to_the_caller(fetching_api_url):
    """With loopback allowed to the fetcher, a token limited to one collection had read another by
    ingesting this server's own API: the fetch came from loopback, where no token is needed."""
    api_url = fetching_api_url
    team = collection_create(name="team")
    hr = collection_create(name="hr")
    document_create_from_text(collection=hr, source_uri="hr://salaries", text="Salary of Alice: 250000 EUR")
    token = token_create(name="team-writer", scope="write", collections=["team"])[1]
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        ingest = {"uri": f"{api_url}/api/collections/hr/documents", "content_type": "text"}
        response = http.post("/api/collections/team/documents", json=ingest)
        assert response.status_code == 502, response.text
        assert response.json()["error"]["code"] == "LOAD_FAILED" and "401" in response.json()["error"]["message"]
        assert not team.documents.exists()
        # /health answers anyone, its details (paths, versions) only an admin.
        response = http.post("/api/collections/team/documents", json={**ingest, "uri": f"{api_url}/health"})
        assert response.status_code == 200, response.text
    checks = json.loads(team.documents.get().raw_content)["checks"]
    assert checks and all(set(check) == {"ok"} for check in checks.values()), checks


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
