"""http(s) ingestion against a real server on loopback, and the SSRF guard around it."""

import time

import pytest

from kb.errors import ErrorCode, KBError
from kb.models import Document
from kb.services.collections import collection_create
from kb.services.ingest import document_ingest
from tests.support.documents import HTML, MARKDOWN
from tests.support.http_server import redirect, serve, text


@pytest.fixture
def collection(db):
    return collection_create(name="web")


def ingest(collection, uri):
    return document_ingest(collection=collection, uri=uri, file_roots=[])


def fails_with(collection, uri, code, fragment):
    with pytest.raises(KBError) as error:
        ingest(collection, uri)
    assert error.value.code == code, error.value
    assert fragment in error.value.message
    assert not Document.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/x",
        "http://localhost:9/x",
        "http://10.1.2.3/x",
        "http://192.168.0.1/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://224.0.0.1/x",
        "http://[::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://[fe80::1]/x",
        "http://0.0.0.0/x",
    ],
)
def test_addresses_that_are_not_public_are_refused(collection, url):
    fails_with(collection, url, ErrorCode.INVALID_URI, "not a public address")


def test_a_refused_name_does_not_say_where_it_resolves(collection):
    """Saying it mapped the intranet's names to their addresses for any caller allowed to ingest."""
    fails_with(collection, "http://localhost/x", ErrorCode.INVALID_URI, "localhost is not a public address")
    with pytest.raises(KBError) as refused:
        ingest(collection, "http://localhost/x")
    assert "127.0.0.1" not in refused.value.message and "::1" not in refused.value.message


def test_an_allowed_intranet_host_is_fetched_with_its_type_detected(collection, settings):
    routes = {"/guide.md": text(MARKDOWN, "text/markdown"), "/notes": text(HTML, "text/html; charset=utf-8")}
    with serve(routes) as base:
        settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
        markdown = ingest(collection, f"{base}/guide.md").items[0].document
        html = ingest(collection, f"{base}/notes").items[0].document
    assert (markdown.content_type, markdown.source_uri) == ("markdown", f"{base}/guide.md")
    assert markdown.title == "Deployment guide"
    assert html.content_type == "html" and html.title == "Turbulence notes"


def test_allowed_networks_can_be_given_in_cidr_form(collection, settings):
    with serve({"/a.txt": text("plain words here")}) as base:
        settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.0/8"]
        assert ingest(collection, f"{base}/a.txt").items[0].outcome == "created"


def test_every_redirect_is_checked_again(collection, settings):
    other_server = serve({"/page.md": text(MARKDOWN)}, host="127.0.0.2")
    with other_server as other, serve({"/go": redirect(f"{other}/page.md")}) as base:
        settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]  # but not 127.0.0.2
        fails_with(collection, f"{base}/go", ErrorCode.INVALID_URI, "127.0.0.2")
        settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1", "127.0.0.2"]
        document = ingest(collection, f"{base}/go").items[0].document
    assert document.source_uri == f"{base}/go" and "Rolling upgrades" in document.raw_content


def test_redirect_loops_stop_after_the_limit(collection, settings):
    with serve({"/loop": redirect("/loop")}) as base:
        settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
        fails_with(collection, f"{base}/loop", ErrorCode.LOAD_FAILED, "redirected more than 5 times")


@pytest.mark.parametrize("status", [304, 300, 399])
def test_a_3xx_that_is_no_redirect_is_named_by_its_status(collection, settings, status):
    """A 304 to a question not asked, or a 300 or 399, had been "redirected without a Location header"."""
    with serve({"/odd": lambda handler, body: (status, {}, b"")}) as base:
        settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
        fails_with(collection, f"{base}/odd", ErrorCode.LOAD_FAILED, f"answered HTTP {status}")


def _slow(handler, body):
    time.sleep(2)
    return 200, {}, b"late"


@pytest.fixture
def limited_server(settings):
    """A loopback server that fetches may reach, with a 2048-byte limit and a half-second timeout."""
    routes = {"/big": text("x" * 5000), "/slow": _slow, "/missing": lambda h, b: (404, {}, b"no")}
    with serve(routes) as base:
        settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
        settings.KB_FETCH_MAX_BYTES = 2048
        settings.KB_FETCH_TIMEOUT_SECONDS = 0.5
        yield base


@pytest.mark.parametrize(
    ("path", "fragment"),
    [("/big", "KB_FETCH_MAX_BYTES"), ("/slow", "did not answer in time"), ("/missing", "HTTP 404")],
    ids=["size", "time", "status"],
)
def test_a_response_over_a_limit_gives_load_failed(collection, limited_server, path, fragment):
    fails_with(collection, f"{limited_server}{path}", ErrorCode.LOAD_FAILED, fragment)


@pytest.mark.parametrize(
    ("uri", "code", "fragment"),
    [
        ("http://no-such-host.invalid/x", ErrorCode.LOAD_FAILED, "Cannot resolve"),
        ("https:///nohost", ErrorCode.INVALID_URI, "no host"),
        ("http://example.org:99999/x", ErrorCode.INVALID_URI, "invalid port"),
    ],
)
def test_an_unusable_url_is_a_clear_error(collection, uri, code, fragment):
    fails_with(collection, uri, code, fragment)
