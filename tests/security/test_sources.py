"""Ingestion sources that cannot be turned against the server (issue 11): malformed URIs get clear
codes, addresses that carry an IPv4 address are judged by it, FIFOs and devices are never opened,
paths outside the roots all get one answer, the stdio server reads no files unless told where, and
one deadline bounds a whole fetch. Each refusal stores nothing."""

import contextlib
import ipaddress
import os
import socket
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from kb.errors import ErrorCode, KBError
from kb.ingestion.sources import is_public_address
from kb.models import Document
from kb.services.collections import collection_create
from kb.services.ingest import command_line_file_roots, document_ingest, stdio_server_file_roots
from tests.conftest import ROOT, child_env
from tests.support.http_server import redirect, serve, text
from tests.support.mcp_client import committed_db, error_of, structured, tool_threads  # noqa: F401


@pytest.fixture
def collection(db):
    return collection_create(name="guarded")


@pytest.fixture
def loopback_allowed(settings):
    """The fake HTTP servers listen on loopback, which the guard refuses unless allowed."""
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]


def ingest(collection, uri: str, roots: list[Path] | None = None):
    return document_ingest(collection=collection, uri=uri, file_roots=roots or [])


def refused(collection, uri: str, code: ErrorCode, roots: list[Path] | None = None) -> KBError:
    """The error ingesting ``uri`` raises; it must carry ``code`` and leave no document behind."""
    before = Document.objects.count()
    with pytest.raises(KBError) as error:
        ingest(collection, uri, roots)
    assert error.value.code == code, error.value
    assert Document.objects.count() == before
    return error.value


# --- malformed URIs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        "http://[::1",
        "https://[64:ff9b::1/x",
        "http://exa\x00mple.org/",
        "http://127.0.0.1:9/a\x7fb",
        "http://[::1]:1:2/",
        "http://a..b/x",  # host names IDNA cannot encode: an empty label, one over 63 characters
        f"http://{'a' * 64}.org/x",
        "http://exa mple.com/x",  # characters no host name holds, before any DNS look-up
        "http://exa%20mple.com/x",
        "https://a_b!.example/x",
    ],
)
def test_a_malformed_url_is_invalid_uri(collection, loopback_allowed, uri):
    refused(collection, uri, ErrorCode.INVALID_URI)


def test_a_nul_in_a_file_path_is_invalid_uri(collection, tmp_path):
    (tmp_path / "a").write_text("a")
    for uri in (f"{tmp_path.as_uri()}/a%00b", f"{tmp_path}/a\x00b"):
        refused(collection, uri, ErrorCode.INVALID_URI, roots=[tmp_path])


@pytest.mark.parametrize(
    "location",
    # httpx refuses some itself; these it lets through to the guard's own parsing.
    [
        "http://[::1",
        "http://ex]ample/",
        "http://a[b/x",
        "http://127.0.0.1:99999/x",
        "http://127.0.0.1:-1/",
        "http://a..b/",
    ],
)
def test_a_redirect_to_a_malformed_url_is_load_failed(collection, loopback_allowed, location):
    with serve({"/go": redirect(location)}) as base:
        refused(collection, f"{base}/go", ErrorCode.LOAD_FAILED)


# --- addresses that embed an IPv4 address ---------------------------------------------------

TEREDO_SERVER = "4136:e378"  # 65.54.227.120
TEREDO_CLIENT_8_8_8_8 = "f7f7:f7f7"  # Teredo stores the client address inverted
TEREDO_CLIENT_192_168_1_1 = "3f57:fefe"


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "2606:4700:4700::1111",
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8
        "2002:808:808::1",  # 6to4 of 8.8.8.8
        "::8.8.8.8",  # IPv4-compatible
        "::ffff:8.8.8.8",  # IPv4-mapped
        f"2001:0:{TEREDO_SERVER}:8000:63bf:{TEREDO_CLIENT_8_8_8_8}",
    ],
)
def test_a_public_address_is_allowed_however_it_is_written(address):
    assert is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "10.0.0.1", "169.254.169.254", "100.64.0.1", "224.0.0.1", "0.0.0.0",
        "::1", "::", "fe80::1", "fc00::1", "ff0e::1",
        "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1",  # NAT64 of loopback, metadata, private
        "64:ff9b:1::808:808", "64:ff9b:1:ffff::1",  # local-use NAT64: refused outright
        "2002:7f00:1::1", "2002:a9fe:a9fe::1", "2002:c0a8:101::1",  # 6to4 of loopback, metadata, private
        "::127.0.0.1", "::10.0.0.1", "::169.254.169.254",  # IPv4-compatible
        "::ffff:127.0.0.1", "::ffff:192.168.1.1",  # IPv4-mapped
        f"2001:0:{TEREDO_SERVER}:8000:63bf:{TEREDO_CLIENT_192_168_1_1}",  # Teredo, private client
        f"2001:0:a00:1:8000:63bf:{TEREDO_CLIENT_8_8_8_8}",  # Teredo, private server
    ],
)  # fmt: skip
def test_private_addresses_are_refused_in_every_ipv6_disguise(address):
    assert not is_public_address(ipaddress.ip_address(address))


def test_an_allowed_network_also_allows_its_addresses_in_ipv6_form():
    loopback = [ipaddress.ip_network("127.0.0.0/8")]
    assert is_public_address(ipaddress.ip_address("::ffff:127.0.0.1"), allowed_networks=loopback)
    assert is_public_address(ipaddress.ip_address("64:ff9b::7f00:1"), allowed_networks=loopback)
    assert not is_public_address(ipaddress.ip_address("64:ff9b::a00:1"), allowed_networks=loopback)


@pytest.mark.parametrize(
    "host",
    ["64:ff9b::7f00:1", "64:ff9b:1::a00:1", "2002:7f00:1::1", "::127.0.0.1", "::ffff:127.0.0.1",
     f"2001:0:{TEREDO_SERVER}:8000:63bf:{TEREDO_CLIENT_192_168_1_1}"],
)  # fmt: skip
def test_a_fetch_of_an_embedded_private_address_is_refused_before_connecting(collection, host):
    error = refused(collection, f"http://[{host}]:9/x", ErrorCode.INVALID_URI)
    assert "not a public address" in error.message


# --- FIFOs, devices, sockets ----------------------------------------------------------------


@pytest.mark.timeout(20)
def fifo_folder(folder: Path) -> None:
    """A FIFO, a link to it and a regular file."""
    os.mkfifo(folder / "pipe.md")
    (folder / "link.md").symlink_to(folder / "pipe.md")
    (folder / "notes.md").write_text("# Notes\n\nRegular files are read.\n")


@pytest.mark.timeout(20)
def test_a_fifo_is_refused_not_waited_on(collection, tmp_path):
    fifo_folder(tmp_path)
    for name in ("pipe.md", "link.md"):
        error = refused(collection, (tmp_path / name).as_uri(), ErrorCode.LOAD_FAILED, roots=[tmp_path])
        assert "not a regular file" in error.message


@pytest.mark.timeout(20)
def test_a_folder_walk_skips_a_fifo_with_a_reason(collection, tmp_path):
    fifo_folder(tmp_path)
    report = ingest(collection, tmp_path.as_uri(), [tmp_path])
    outcomes = {Path(item.source_uri).name: item for item in report.items}
    assert outcomes["notes.md"].outcome == "created"
    assert outcomes["pipe.md"].outcome == outcomes["link.md"].outcome == "failed"
    assert outcomes["pipe.md"].error.code == ErrorCode.LOAD_FAILED
    assert "not a regular file" in outcomes["pipe.md"].error.message
    assert Document.objects.count() == 1


@pytest.mark.timeout(20)
def test_a_path_swapped_for_a_fifo_after_the_check_is_caught_on_the_open_descriptor(collection, tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "pipe.md")
    (tmp_path / "regular.md").write_text("# Regular")
    real_lstat = os.lstat

    def lstat_before_the_swap(path, *args, **kwargs):  # the check sees a regular file, the open a FIFO
        return (
            real_lstat(tmp_path / "regular.md") if Path(path).name == "pipe.md" else real_lstat(path, *args, **kwargs)
        )

    monkeypatch.setattr(os, "lstat", lstat_before_the_swap)
    error = refused(collection, str(tmp_path / "pipe.md"), ErrorCode.LOAD_FAILED, roots=[tmp_path])
    assert "not a regular file" in error.message


def test_devices_are_refused(collection):
    error = refused(collection, "/dev/null", ErrorCode.LOAD_FAILED, roots=[Path("/dev")])
    assert "not a regular file" in error.message


# --- no existence oracle outside the roots --------------------------------------------------


@pytest.mark.timeout(20)
def test_outside_the_roots_a_path_gets_the_same_answer_whether_it_exists_or_not(collection, tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "exists.txt").write_text("secret")
    (outside / "folder").mkdir()
    (outside / "link.txt").symlink_to(outside / "exists.txt")
    (outside / "dangling.txt").symlink_to(outside / "nothing")
    (outside / "loop").symlink_to(outside / "loop")
    os.mkfifo(outside / "pipe")
    (root / "escape.txt").symlink_to(outside / "missing.txt")
    attempts = [
        outside / "exists.txt", outside / "folder", outside / "link.txt", outside / "dangling.txt",
        outside / "loop", outside / "pipe", outside / "missing.txt", outside / "no" / "such" / "dir.txt",
        root / "escape.txt", root / ".." / "outside" / "missing.txt",
    ]  # fmt: skip
    answers = set()
    for path in attempts:
        for uri in (str(path), path.as_uri()):
            error = refused(collection, uri, ErrorCode.INVALID_URI, roots=[root])
            answers.add((error.code, error.message.replace(str(path), "<path>")))
    assert len(answers) == 1, answers
    assert "outside" in answers.pop()[1]
    # Inside the roots "not found" may be said.
    missing = refused(collection, str(root / "missing.txt"), ErrorCode.LOAD_FAILED, roots=[root])
    assert "No such file" in missing.message


# --- the stdio server reads no files unless told where --------------------------------------


def test_the_stdio_server_has_no_file_roots_unless_given(settings):
    settings.KB_FILE_ROOTS = []
    assert stdio_server_file_roots() == []
    assert stdio_server_file_roots([Path("/srv/notes")]) == [Path("/srv/notes")]
    settings.KB_FILE_ROOTS = ["/srv/docs"]
    assert stdio_server_file_roots([Path("/srv/notes")]) == [Path("/srv/docs"), Path("/srv/notes")]
    settings.KB_FILE_ROOTS = []
    assert command_line_file_roots() == [Path.cwd()]  # kb_ingest: the operator typed the path


@committed_db
@pytest.mark.usefixtures("tool_threads")
def test_the_stdio_server_reads_file_uris_only_under_a_file_root(tmp_path):
    (tmp_path / "guide.md").write_text("# Guide\n\nThe turbine blades are inspected every spring.\n")
    uri = (tmp_path / "guide.md").as_uri()
    env = {key: value for key, value in child_env().items() if key != "KB_FILE_ROOTS"}

    def started_in(directory: Path, *options: str) -> StdioServerParameters:
        # Started from the folder that holds the file, as a desktop client may start it from /.
        args = [str(ROOT / "manage.py"), "mcp_stdio", *options]
        return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=directory)

    async def with_session(parameters: StdioServerParameters, action):
        async with stdio_client(parameters) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await action(session)

    async def ingest_guide(session):
        await session.call_tool("rag_create_collection", {"name": "local"})
        return await session.call_tool("rag_ingest", {"uri": uri, "collection": "local"})

    without_roots = error_of(anyio.run(with_session, started_in(tmp_path), ingest_guide))
    assert without_roots["code"] == "INVALID_URI"
    assert "--file-root" in without_roots["message"] and "KB_FILE_ROOTS" in without_roots["message"]
    assert Document.objects.count() == 0
    with_root = structured(anyio.run(with_session, started_in(tmp_path, "--file-root", str(tmp_path)), ingest_guide))
    assert with_root["outcome"] == "created"
    assert Document.objects.count() == 1


# --- one deadline and one size limit per fetch ----------------------------------------------


@contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback server that reads one request per connection and lets ``answer`` write anything."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)  # to notice the end of the test
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.recv(65536)
                with contextlib.suppress(OSError):  # the client gave up
                    answer(connection)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def drip_headers(connection: socket.socket) -> None:
    """Headers one byte at a time, each well within the per-read timeout, for much longer than the deadline."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    for _ in range(300):
        connection.sendall(b"a")
        time.sleep(0.1)


@pytest.mark.timeout(20)
def test_headers_sent_one_byte_at_a_time_cannot_outlast_the_deadline(collection, loopback_allowed, settings):
    settings.KB_FETCH_TIMEOUT_SECONDS = 1
    with raw_server(drip_headers) as base:
        refused(collection, f"{base}/slow", ErrorCode.LOAD_FAILED)


@pytest.mark.timeout(20)
def test_a_chain_of_slow_redirects_cannot_outlast_the_deadline(collection, loopback_allowed, settings):
    def slow_redirect(to: str):
        def route(handler, body):
            time.sleep(0.8)  # within the per-read timeout; thirty of them outlast the test's own timeout
            return redirect(to)(handler, body)

        return route

    hops = 30
    routes = {f"/{hop}": slow_redirect(f"/{hop + 1}") for hop in range(hops)} | {f"/{hops}": text("")}
    settings.KB_FETCH_TIMEOUT_SECONDS = 1
    settings.KB_FETCH_MAX_REDIRECTS = hops
    with serve(routes) as base:
        refused(collection, f"{base}/0", ErrorCode.LOAD_FAILED)


def test_a_body_without_a_length_stops_at_the_size_limit(collection, loopback_allowed, settings):
    def endless(connection: socket.socket) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        for _ in range(1000):
            connection.sendall(b"word " * 200)

    settings.KB_FETCH_MAX_BYTES = 4096
    with raw_server(endless) as base:
        error = refused(collection, f"{base}/big", ErrorCode.LOAD_FAILED)
    assert "KB_FETCH_MAX_BYTES" in error.message


# --- compressed bodies (added with the gzip-bomb fix) -------------------------------------------------


def _gzip_bomb(layers: int, inflated: int) -> bytes:
    import gzip

    data = b"\0" * inflated
    for _ in range(layers):
        data = gzip.compress(data, compresslevel=9)
    return data


@pytest.mark.parametrize(("encoding", "layers"), [("gzip", 1), ("gzip, gzip", 2), ("deflate, gzip", 2), ("br", 1)])
def test_a_compressed_body_never_inflates_past_the_fetch_limit(db, settings, encoding, layers):
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    settings.KB_FETCH_MAX_BYTES = 1024 * 1024
    collection = collection_create(name="gz")
    body = _gzip_bomb(layers, 64 * 1024 * 1024)  # 64 MiB of zeros in a few dozen kilobytes

    def route(handler, request):
        return 200, {"content-type": "text/plain", "content-encoding": encoding}, body

    before = Document.objects.count()
    with serve({"/bomb": route}) as base:
        tracemalloc.start()
        try:
            with pytest.raises(KBError) as raised:
                document_ingest(collection=collection, uri=f"{base}/bomb", file_roots=[])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # Memory is the point: the limit is 1 MiB, and never more than a few of it may be held.
    assert peak < 8 * 1024 * 1024, peak
    assert raised.value.code == ErrorCode.LOAD_FAILED
    assert "KB_FETCH_MAX_BYTES" in raised.value.message or "Content-Encoding" in raised.value.message
    assert Document.objects.count() == before


def test_a_gzipped_page_within_the_limit_is_read_decoded(db, settings):
    import gzip

    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    collection = collection_create(name="gz-ok")
    page = b"Gliders ride thermals over the ridge.\n" * 50

    def route(handler, request):
        return 200, {"content-type": "text/plain", "content-encoding": "gzip"}, gzip.compress(page)

    with serve({"/page": route}) as base:
        report = document_ingest(collection=collection, uri=f"{base}/page", file_roots=[])
    assert report.documents[0].raw_content == page.decode()


@pytest.mark.parametrize("after", ["a second member", "junk"])
def test_a_compressed_body_that_goes_on_after_its_end_is_refused_not_stored_in_part(db, settings, after):
    """Two gzip members: only the first had been kept, stored as the whole document."""
    import gzip

    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    collection = collection_create(name="gz-more")
    tail = gzip.compress(b"the second half of the text") if after == "a second member" else b"\x00junk"

    def route(handler, request):
        body = gzip.compress(b"the first half of the text. ") + tail
        return 200, {"content-type": "text/plain", "content-encoding": "gzip"}, body

    with serve({"/page": route}) as base, pytest.raises(KBError) as raised:
        document_ingest(collection=collection, uri=f"{base}/page", file_roots=[])
    assert raised.value.code == ErrorCode.LOAD_FAILED and "goes on after its end" in raised.value.message
    assert not Document.objects.exists()


@pytest.mark.parametrize("kept", [0.5, 0.1])
def test_a_compressed_body_cut_short_is_refused_not_stored_in_part(db, settings, kept):
    """Cut in half, a gzipped page inflated without an error to what had arrived: stored as a
    shorter document, ending mid-word."""
    import gzip
    import random

    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    collection = collection_create(name="gz-cut")
    words = random.Random(7).choices(["glider", "thermal", "ridge", "lift", "sink", "wing"], k=20_000)
    whole = gzip.compress(" ".join(words).encode())

    def route(handler, request):
        return 200, {"content-type": "text/plain", "content-encoding": "gzip"}, whole[: int(len(whole) * kept)]

    with serve({"/page": route}) as base, pytest.raises(KBError) as raised:
        document_ingest(collection=collection, uri=f"{base}/page", file_roots=[])
    assert raised.value.code == ErrorCode.LOAD_FAILED and "truncated" in raised.value.message
    assert not Document.objects.exists()
