"""REST API: every failure is {"error": {"code", "message"}} with the HTTP status of the seed's table."""

import io
import json
import logging
from collections.abc import Callable

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse
from starlette.requests import ClientDisconnect

from kb.errors import HTTP_STATUS, ErrorCode, KBError
from kb.models import Collection, Document
from kb.services.collections import collection_create
from kb.services.uploads import document_ingest_uploads
from tests.support.admin_data import staff_client
from tests.support.api_helpers import error_of, post

pytestmark = pytest.mark.django_db


def test_the_status_of_each_code_is_the_seeds():
    assert {code: HTTP_STATUS[code] for code in ErrorCode} == {
        "DOCUMENT_NOT_FOUND": 404,
        "COLLECTION_NOT_FOUND": 404,
        "COLLECTION_EXISTS": 409,
        "INVALID_ARGUMENT": 400,
        "INVALID_URI": 400,
        "LOAD_FAILED": 502,
        "TEXT_TOO_LONG": 400,
        "DATABASE_ERROR": 500,
        "EMBEDDING_ERROR": 500,
        "UNAUTHORIZED": 401,
        "PERMISSION_DENIED": 403,
        "NOT_FOUND": 404,
        "METHOD_NOT_ALLOWED": 405,
    }


@pytest.mark.parametrize("path", ["/api/nothing-here", "/api/collections/docs/extra/parts", "/api/"])
def test_a_path_that_names_no_endpoint_is_a_json_404(client, path):
    response = client.get(path)
    assert response["Content-Type"] == "application/json"
    assert error_of(response) == (404, "NOT_FOUND")


@pytest.mark.parametrize("method", ["post", "put", "delete"])
@pytest.mark.parametrize("path", ["/api/nothing-here", "/api/collections/c%2Fa", "/api/%0A"])
def test_a_write_to_a_path_that_names_no_endpoint_is_a_json_404(method, path):
    # With CSRF checked, as a browser's request is: Django's HTML 403 page had answered it.
    response = getattr(Client(enforce_csrf_checks=True), method)(path)
    assert response["Content-Type"] == "application/json"
    assert error_of(response) == (404, "NOT_FOUND")


@pytest.mark.parametrize("method", ["post", "put", "delete", "trace", "options"])
@pytest.mark.parametrize("path", ["/api/openapi.json", "/api/docs"])
def test_the_api_s_own_pages_take_only_reads(path, method):
    # With CSRF checked, as a browser's request is: a PUT had been a 403, TRACE the whole schema.
    response = getattr(Client(enforce_csrf_checks=True), method)(path)
    assert response["Content-Type"] == "application/json"
    assert error_of(response) == (405, "METHOD_NOT_ALLOWED")
    assert response["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("path", ["/api/openapi.json", "/api/docs"])
def test_the_api_s_own_pages_answer_reads(client, path):
    assert client.get(path).status_code == 200 and client.head(path).status_code == 200


def test_a_refused_cross_site_form_elsewhere_keeps_django_s_page():
    response = Client(enforce_csrf_checks=True).post("/admin/login/", {"username": "x"})
    assert response.status_code == 403 and response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("delete", "/api/collections", "GET, POST"), ("put", "/api/search", "POST"), ("patch", "/api/health", "GET")],
)
def test_a_method_a_path_does_not_take_is_a_json_405(client, method, path, allowed):
    response = getattr(client, method)(path)
    assert response["Content-Type"] == "application/json"
    assert error_of(response) == (405, "METHOD_NOT_ALLOWED")
    assert response["Allow"] == allowed and allowed in response.json()["error"]["message"]


def test_a_database_failure_is_500_database_error(client):
    # A real failure of Postgres: the (test) transaction the request runs in refuses writes.
    with connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION READ ONLY")
    assert error_of(post(client, "/api/collections", {"name": "docs"})) == (500, "DATABASE_ERROR")


def test_a_body_that_is_not_json_is_400(client):
    response = client.post("/api/collections", "{not json", content_type="application/json")
    assert error_of(response) == (400, "INVALID_ARGUMENT")


@pytest.mark.parametrize(
    "body",
    [
        {"name": "docs", "description": "nul \x00 byte"},
        {"name": "docs", "description": "lone \ud800 surrogate"},
    ],
)
def test_text_postgres_cannot_store_is_400_not_500(client, body):
    response = client.post("/api/collections", body, content_type="application/json")
    assert error_of(response) == (400, "INVALID_ARGUMENT")
    assert not Collection.objects.exists()


def test_nul_characters_in_metadata_or_file_names_are_400(client):
    docs = collection_create(name="docs")
    nested = post(client, "/api/collections/docs/documents", {"uri": "data:,x", "metadata": {"k\x00": ["v"]}})
    assert error_of(nested) == (400, "INVALID_ARGUMENT")
    # Django's multipart parser drops NUL characters from file names; the service refuses them from anyone else.
    upload = SimpleUploadedFile("a\x00b.txt", b"text")
    assert client.post("/api/collections/docs/uploads", {"files": [upload]}).json()["items"][0]["source_uri"] == (
        "upload://ab.txt"
    )
    with pytest.raises(KBError) as refused:
        document_ingest_uploads(collection=docs, uploads=[SimpleUploadedFile("a\x00b.txt", b"text")])
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT


def test_too_many_files_in_one_upload_is_400(client, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 1
    collection_create(name="docs")
    files = [SimpleUploadedFile(f"{n}.txt", b"text") for n in range(2)]
    assert error_of(client.post("/api/collections/docs/uploads", {"files": files})) == (400, "INVALID_ARGUMENT")


@pytest.mark.parametrize("files", [1, 2])
def test_an_escaped_nul_in_upload_metadata_is_400(client, files):
    # The request's metadata, refused once: with two files it had been a 200 with both failed.
    collection_create(name="docs")
    notes = [SimpleUploadedFile(f"note{n}.txt", b"text") for n in range(files)]
    response = client.post("/api/collections/docs/uploads", {"files": notes, "metadata": '{"k": "\\u0000"}'})
    assert error_of(response) == (400, "INVALID_ARGUMENT")
    assert not Document.objects.exists()


def server_log_of(request: Callable[[], HttpResponse]) -> tuple[HttpResponse, str]:
    """A request's answer and what the server's log handlers wrote meanwhile."""
    names = ("stderr", "callers_mistakes")
    loggers = [logging.getLogger(name) for name in ("", "django.security", "django.request", "mcp.server.sse")]
    server_log = {handler for logger in loggers for handler in logger.handlers if handler.get_name() in names}
    assert {handler.get_name() for handler in server_log} == set(names)
    written = {handler: io.StringIO() for handler in server_log}
    kept = {handler: handler.setStream(stream) for handler, stream in written.items()}
    try:
        response = request()
    finally:
        for handler, stream in kept.items():
            handler.setStream(stream)
    return response, "".join(stream.getvalue() for stream in written.values())


def test_a_host_the_server_does_not_serve_is_400_and_one_warning_line(client):
    """Django logs it at ERROR with a traceback: the caller's mistake, not the server's."""
    response, logged = server_log_of(lambda: client.get("/api/collections", HTTP_HOST="evil.example"))
    assert error_of(response) == (400, "INVALID_ARGUMENT")
    assert "evil.example" not in response.text and "ALLOWED_HOSTS" not in response.text  # that is the log's
    line = "WARNING django.security.DisallowedHost: Invalid HTTP_HOST header: 'evil.example'"
    assert logged.count(line) == 1 and logged.count("\n") == 1


def test_a_refused_admin_request_is_one_warning_line(db):
    """A 403 had written its PermissionDenied traceback, 51 lines, for every refused click."""
    viewer = staff_client("viewer", ["view_collection"])
    response, logged = server_log_of(lambda: viewer.get(reverse("admin:kb_collection_add")))
    assert response.status_code == 403
    assert logged.startswith("20") and "WARNING django.request: Forbidden (Permission denied)" in logged
    assert logged.count("\n") == 1


def test_a_file_that_cannot_be_read_is_502_and_one_warning_line(client):
    """LOAD_FAILED is 502 in rag-mcp's table, which Django logged at ERROR: the file was at fault."""
    collection_create(name="docs")
    body = {"uri": "data:application/json,{not json"}
    response, logged = server_log_of(lambda: post(client, "/api/collections/docs/documents", body))
    assert error_of(response) == (502, "LOAD_FAILED")
    assert "WARNING django.request: Bad Gateway: /api/collections/docs/documents" in logged
    assert logged.count("\n") == 1


def test_an_mcp_message_the_sdk_cannot_parse_is_one_warning_line():
    """The SDK's SSE transport logs each message it cannot parse (a lone surrogate's escape is
    one) at ERROR with the parser's traceback, though it answered 400: any client could fill the
    log with tracebacks. Logged as the SDK logs it (mcp/server/sse.py, handle_post_message)."""

    def sdk_refuses_a_message() -> None:
        try:
            json.loads('{"query": "\\ud800')
        except ValueError:
            logging.getLogger("mcp.server.sse").exception("Failed to parse message")

    _, logged = server_log_of(sdk_refuses_a_message)
    assert logged.endswith("WARNING mcp.server.sse: Failed to parse message\n")
    assert logged.count("\n") == 1


def test_a_client_gone_mid_request_is_one_warning_line_and_other_failures_keep_their_traceback():
    """The SDK's Streamable HTTP transport logs a client that hung up in the middle of its body at
    ERROR with a traceback (mcp/server/streamable_http.py, _handle_post_request)."""

    def sdk_fails_a_post(error: Exception) -> Callable[[], None]:
        def fail() -> None:
            try:
                raise error
            except Exception:
                logging.getLogger("mcp.server.streamable_http").exception("Error handling POST request")

        return fail

    _, logged = server_log_of(sdk_fails_a_post(ClientDisconnect()))
    assert logged.endswith("WARNING mcp.server.streamable_http: Error handling POST request\n")
    assert logged.count("\n") == 1
    _, logged = server_log_of(sdk_fails_a_post(RuntimeError("a fault of ours")))
    assert "ERROR mcp.server.streamable_http: Error handling POST request" in logged and "Traceback" in logged
