"""Loading the bytes behind a URI: ``file://`` (or a bare path), ``http(s)://`` and ``data:``.

Files are confined to configured roots: paths are resolved (symlinks and ``..`` included)
before they are compared, component by component, so neither a link nor a sibling directory
that shares a prefix (``/data`` and ``/data2``) escapes. Outside the roots every path gets the
same answer, existing or not, and only regular files are opened (a FIFO would block forever).

URLs are fetched without trusting DNS twice: the host is resolved once, every address must be
public (an IPv6 address that carries an IPv4 address is judged by that one), unless the host or
network is explicitly allowed for intranet use; the connection goes to the address that was
checked (TLS still verifies the real host name), and each redirect is checked again. One
deadline bounds the whole fetch, every redirect and byte included, and one limit its size.
"""

import base64
import binascii
import hashlib
import ipaddress
import os
import re
import socket
import ssl
import stat
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, unquote, unquote_to_bytes, urljoin, urlsplit, urlunsplit

from django.conf import settings

from kb.access import FETCHED_FOR_A_CALLER
from kb.errors import ErrorCode, KBError
from kb.ingestion.formats import supported_extension
from kb.models import SOURCE_URI_MAX_LENGTH
from kb.storable import storable_text

if TYPE_CHECKING:
    import httpx

# The longest file name (in bytes) the usual file systems allow.
NAME_MAX = 255
# Extension-less files worth ingesting from a directory.
KNOWN_TEXT_FILENAMES = {"README", "LICENSE", "CHANGELOG", "Makefile", "Dockerfile", "NOTICE", "AUTHORS"}


@dataclass(frozen=True)
class LoadedSource:
    source_uri: str
    data: bytes
    filename: str = ""
    mime_type: str = ""
    metadata: dict[str, float] = field(default_factory=dict)
    # An http(s) response's validators, for the next conditional GET (sources that sync).
    etag: str = ""
    last_modified: str = ""


@dataclass(frozen=True)
class SkippedSource:
    """A file of a folder that was not read: ``unsupported`` (its type) or refused (``error``)."""

    source_uri: str
    error: KBError
    unsupported: bool = False


# URIs without "//" that name no file: they had been looked for as file names. A bare relative
# path may hold a colon ("meeting:notes.md"), so only these schemes are told apart.
_NOT_A_PATH = re.compile(r"(?i)(data|javascript|vbscript|mailto|urn|tel|sms|about|blob|news|cid|mid):")


def is_local_path_uri(uri: str) -> bool:
    """A file:// URI or a bare path."""
    return uri.startswith("file://") or ("://" not in uri and not _NOT_A_PATH.match(uri))


# --- files ----------------------------------------------------------------------------------


def file_path_of(uri: str) -> Path:
    """The path a ``file://`` URI or a bare path names (not yet resolved or checked)."""
    if uri.startswith("file://"):
        try:
            parts = urlsplit(uri)
        except ValueError:  # "file://[::1/x": a bracket that never closes
            raise KBError(ErrorCode.INVALID_URI, f"Not a valid file URI: {uri}") from None
        if parts.netloc not in ("", "localhost"):
            raise KBError(ErrorCode.INVALID_URI, f"file:// URIs must not name a remote host: {uri}")
        path = unquote(parts.path)
        if not path:
            raise KBError(ErrorCode.INVALID_URI, f"The file URI has no path: {uri}")
    else:
        path = uri
    if "\0" in path:  # no file name holds one; the OS would refuse it with an exception of its own
        raise KBError(ErrorCode.INVALID_URI, "A file path cannot contain a NUL character")
    return Path(path).expanduser()


def confine(path: Path, roots: Sequence[Path]) -> Path:
    """Resolve ``path`` and make sure it lies inside one of ``roots``.

    Every path outside the roots gets the same answer, whether it exists or not and whatever it
    is, so the error tells nothing about the rest of the disk: it is resolved without requiring
    it to exist, and only inside the roots may "not found" be said.
    """
    if not roots:
        raise KBError(
            ErrorCode.INVALID_URI,
            "file:// ingestion is disabled here: set KB_FILE_ROOTS to the directories it may read "
            "(or start mcp_stdio with --file-root PATH)",
        )
    real = _real_path(path)
    if not any(real.is_relative_to(os.path.realpath(root)) for root in roots):
        raise KBError(ErrorCode.INVALID_URI, f"{path} is outside the directories ingestion may read (KB_FILE_ROOTS)")
    try:
        real.stat()
    except FileNotFoundError:
        raise KBError(ErrorCode.LOAD_FAILED, f"No such file or directory: {path}") from None
    except OSError as exc:  # symlink loops, permissions
        raise KBError(ErrorCode.LOAD_FAILED, f"Cannot open {path}: {exc.strerror}") from None
    return real


def _real_path(path: Path) -> Path:
    try:
        return Path(os.path.realpath(path))
    except (OSError, RecursionError):  # a link changed while it was read; a chain of a thousand links
        raise KBError(ErrorCode.LOAD_FAILED, f"Cannot resolve the symbolic links of {path}") from None


def resolved_path(path: Path) -> Path | None:
    """The file ``path`` leads to (its document's URI is this one's), None if its links cannot be resolved."""
    try:
        return _real_path(path)
    except KBError:
        return None


def iter_files(folder: Path, *, roots: Sequence[Path], recursive: bool) -> Iterator[LoadedSource | SkippedSource]:
    """Every supported file in ``folder`` (already confined: ``confine``), each one confined too."""
    for candidate in walk_folder(folder, recursive=recursive):
        yield load_candidate(candidate, roots=roots)


def walk_folder(folder: Path, *, recursive: bool, on_error: Callable[[OSError], None] | None = None) -> Iterator[Path]:
    """The files of ``folder`` in a stable order (a folder's files, then its subfolders'), hidden
    ones (.DS_Store, .git) and links to folders left out. ``on_error`` hears of every folder that
    could not be listed, which is skipped. A loop, not os.walk: Python 3.11's recurses, and a
    folder 1,000 deep raised RecursionError."""
    pending = [folder]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted((entry for entry in listing if not entry.name.startswith(".")), key=lambda e: e.name)
        except OSError as error:
            if on_error:
                on_error(error)
            continue
        subfolders = []
        for entry in entries:
            if not _is_folder(entry):
                yield Path(entry.path)
            elif not entry.is_symlink():
                subfolders.append(Path(entry.path))
        if recursive:
            pending.extend(reversed(subfolders))


def _is_folder(entry: os.DirEntry) -> bool:
    """A folder or a link to one (as os.walk sees them: neither is a file)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def load_candidate(
    candidate: Path, *, roots: Sequence[Path], within: Path | None = None
) -> LoadedSource | SkippedSource:
    """A file found in a folder: loaded when its type is supported and it lies inside ``roots``
    (and inside the folder ``within``, for a source that follows one). The place checked is the one
    read: the path is resolved once and opened without following a link, so a file swapped for a
    link meanwhile is not read where it now leads."""
    if not (supported_extension(candidate.name) or candidate.name in KNOWN_TEXT_FILENAMES):
        unsupported = KBError(ErrorCode.INVALID_ARGUMENT, f"{candidate.name}: not a supported file type")
        return SkippedSource(source_uri=candidate.as_uri(), error=unsupported, unsupported=True)
    try:
        path = confine(candidate, roots)
        if within is not None and not path.is_relative_to(within):
            raise KBError(ErrorCode.INVALID_URI, f"{candidate} is a link to a file outside the source's folder")
        return load_file(path)
    except KBError as error:
        return SkippedSource(source_uri=candidate.as_uri(), error=error)


def load_file(path: Path) -> LoadedSource:
    """The bytes of the regular file at ``path`` (resolved and confined), within the size limit.

    A FIFO would block the open or the read forever and a device may never end, so anything but
    a regular file is refused: before opening (``lstat``: ``path`` is resolved, so that is what
    ``open`` reaches) and again on the opened descriptor, in case the path was swapped in between;
    ``O_NONBLOCK`` keeps even that open from waiting for a FIFO's writer.
    """
    limit = settings.KB_MAX_DOCUMENT_BYTES
    try:
        _require_regular_file(os.lstat(path), path)
        with open(_open_following_no_link(path), "rb") as file:
            status = os.fstat(file.fileno())
            _require_regular_file(status, path)
            _require_within_limit(status.st_size, path)
            data = file.read(limit + 1)
    except OSError as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"Cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise KBError(
            ErrorCode.LOAD_FAILED, f"{path} grew past {limit} bytes while it was read (KB_MAX_DOCUMENT_BYTES)"
        )
    return LoadedSource(
        source_uri=path.as_uri(),
        data=data,
        filename=storable_text(path.name, limit=NAME_MAX),
        metadata={"modification_date": status.st_mtime, "creation_date": status.st_ctime},
    )


# A folder to look up names in needs no permission to list it (Linux's O_PATH), as a path's does not.
_FOLDER_ONLY = getattr(os, "O_PATH", os.O_RDONLY)


def _open_following_no_link(path: Path) -> int:
    """A descriptor of the resolved ``path``, opened one folder at a time from "/" without following
    any symbolic link. ``confine`` checked the resolved path; a folder on it swapped for a link
    since (to a folder outside the roots) now fails the open instead of being followed, which
    ``O_NOFOLLOW`` alone does only for the last name."""
    no_link = os.O_NOFOLLOW | os.O_CLOEXEC
    folder = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in path.parts[1:-1]:
            inner = os.open(name, _FOLDER_ONLY | os.O_DIRECTORY | no_link, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.open(path.name, os.O_RDONLY | os.O_NONBLOCK | no_link, dir_fd=folder)
    finally:
        os.close(folder)


def _require_regular_file(status: os.stat_result, path: Path) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise KBError(ErrorCode.LOAD_FAILED, f"{path} is not a regular file (FIFOs, devices and sockets are not read)")


def _require_within_limit(size: int, path: Path) -> None:
    if size > settings.KB_MAX_DOCUMENT_BYTES:
        raise KBError(
            ErrorCode.LOAD_FAILED,
            f"{path} is {size} bytes; the limit is {settings.KB_MAX_DOCUMENT_BYTES} (KB_MAX_DOCUMENT_BYTES)",
        )


# --- data: URIs -----------------------------------------------------------------------------


def load_data_uri(uri: str) -> LoadedSource:
    limit = settings.KB_DATA_URI_MAX_BYTES
    # Checked before decoding: base64 is 4/3 of the bytes, percent-encoding at most 3x.
    if len(uri) > limit * 3 + 256:
        raise KBError(ErrorCode.LOAD_FAILED, f"The data: URI is larger than {limit} bytes (KB_DATA_URI_MAX_BYTES)")
    header, separator, payload = uri[len("data:") :].partition(",")
    if not separator:
        raise KBError(ErrorCode.INVALID_URI, "A data: URI needs a comma before its content (data:[<type>][;base64],…)")
    parameters = [part.strip() for part in header.split(";")]
    is_base64 = parameters[-1].lower() == "base64"
    mime_type = parameters[0] if parameters[0] and "=" not in parameters[0] else "text/plain"
    if is_base64:
        try:
            data = base64.b64decode(unquote(payload), validate=True)
        except (binascii.Error, ValueError):
            raise KBError(ErrorCode.INVALID_URI, "The data: URI says base64 but its content is not base64") from None
    else:
        data = unquote_to_bytes(payload)
    if len(data) > limit:
        raise KBError(ErrorCode.LOAD_FAILED, f"The data: URI is larger than {limit} bytes (KB_DATA_URI_MAX_BYTES)")
    return LoadedSource(source_uri=f"data:sha256,{hashlib.sha256(data).hexdigest()}", data=data, mime_type=mime_type)


# --- http(s) --------------------------------------------------------------------------------


# Embedded IPv4 addresses that ``ipaddress`` has no property for (it has ipv4_mapped, sixtofour, teredo).
NAT64_WELL_KNOWN_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the last 32 bits
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d, also :: and ::1
# RFC 8215, for NAT64 inside one network: where the IPv4 address sits depends on the prefix length the
# operator chose, so it cannot be read back; never public anyway.
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def fetch_url(url: str) -> LoadedSource:
    """GET ``url``, following checked redirects; one deadline bounds the whole fetch and one limit its size."""
    fetched = fetch_url_if_changed(url)
    assert fetched is not None  # only a conditional request is answered with None
    return fetched


def fetch_url_if_changed(url: str, *, etag: str = "", last_modified: str = "") -> LoadedSource | None:
    """``fetch_url`` as a conditional GET: None when the server says the content has not changed
    since the response that carried ``etag`` / ``last_modified`` (304 Not Modified)."""
    import httpx

    conditions = {"If-None-Match": etag, "If-Modified-Since": last_modified}
    conditions = {name: value for name, value in conditions.items() if value}

    deadline = _Deadline(time.monotonic() + settings.KB_FETCH_TIMEOUT_SECONDS)
    current = url
    malformed = ErrorCode.INVALID_URI  # the caller's own URL; a server's bad redirect is a failed load
    with httpx.Client(
        transport=_deadline_transport(deadline),
        timeout=settings.KB_FETCH_TIMEOUT_SECONDS,
        follow_redirects=False,
        trust_env=False,
    ) as client:
        for _ in range(settings.KB_FETCH_MAX_REDIRECTS + 1):
            target = _checked_target(current, malformed=malformed)
            try:
                response = _fetch_once(client, current, target, deadline, conditions)
            except httpx.TimeoutException:
                raise KBError(ErrorCode.LOAD_FAILED, f"{current} did not answer in time") from None
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise KBError(ErrorCode.LOAD_FAILED, f"Could not fetch {current}: {exc}") from None
            if isinstance(response, str):  # a redirect
                current = _redirect_target(current, response)
                malformed = ErrorCode.LOAD_FAILED
                continue
            if response is None:
                return None
            data, headers = response
            name = Path(unquote(urlsplit(current).path)).name
            return LoadedSource(
                source_uri=url,
                data=data,
                filename=name,
                mime_type=headers.get("content-type", ""),
                etag=_validator(headers.get("etag")),
                last_modified=_validator(headers.get("last-modified")),
            )
    raise KBError(ErrorCode.LOAD_FAILED, f"{url} redirected more than {settings.KB_FETCH_MAX_REDIRECTS} times")


def check_url(url: str) -> None:
    """Refuse now, without asking DNS, what fetching ``url`` would surely refuse: a malformed URL, a
    scheme other than http(s), a private IP literal or ``localhost``. A host name is judged when a
    fetch resolves it (DNS answers change), so saving a list of URLs costs no lookups."""
    if len(url) > SOURCE_URI_MAX_LENGTH:
        raise KBError(ErrorCode.INVALID_URI, f"A URL is at most {SOURCE_URI_MAX_LENGTH} characters long")
    host, _port = _parsed_host(url, malformed=ErrorCode.INVALID_URI)
    name = host.lower().rstrip(".")
    literal = "127.0.0.1" if name == "localhost" or name.endswith(".localhost") else name
    try:
        address = ipaddress.ip_address(literal)
    except ValueError:
        address = _legacy_ipv4(literal)
        if address is None:
            return
    if not _address_allowed(host, address):
        raise KBError(
            ErrorCode.INVALID_URI,
            f"{host} is not a public address; refusing to fetch it "
            "(allow intranet hosts with KB_FETCH_ALLOWED_PRIVATE_HOSTS)",
        )


def _legacy_ipv4(name: str) -> ipaddress.IPv4Address | None:
    """The address of an IPv4 literal in a form ip_address refuses but the resolver takes:
    127.1, 2130706433, 0x7f000001, 0177.0.0.1."""
    if not re.fullmatch(r"[0-9a-fx.]+", name):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except OSError:
        return None


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    address: str


def _redirect_target(url: str, location: str) -> str:
    try:
        return urljoin(url, location)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        raise KBError(ErrorCode.LOAD_FAILED, f"{url} redirected to a malformed URL: {location[:200]!r}") from None


def _checked_target(url: str, *, malformed: ErrorCode) -> _Target:
    """Where ``url`` may be fetched from; ``malformed`` is the code for a URL that cannot be parsed."""
    host, port = _parsed_host(url, malformed=malformed)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"Cannot resolve {host}: {exc.strerror}") from None
    addresses = [info[4][0] for info in infos]
    for address in addresses:
        if not _address_allowed(host, ipaddress.ip_address(address.split("%")[0])):
            # The address a name resolves to is not said: that would map the intranet for a caller.
            raise KBError(
                ErrorCode.INVALID_URI,
                f"{host} is not a public address; refusing to fetch it "
                "(allow intranet hosts with KB_FETCH_ALLOWED_PRIVATE_HOSTS)",
            )
    return _Target(host=host, port=port, address=addresses[0])


def _parsed_host(url: str, *, malformed: ErrorCode) -> tuple[str, int]:
    """The host (as DNS, the Host header and TLS see it) and port of an http(s) URL."""
    try:
        parts = _split_url(url)
    except ValueError:
        raise KBError(malformed, f"Not a valid URL: {url[:200]!r}") from None
    if parts.scheme not in ("http", "https"):
        raise KBError(ErrorCode.INVALID_URI, f"Only http and https URLs can be fetched: {url}")
    if not parts.hostname:
        raise KBError(malformed, f"The URL has no host: {url}")
    if parts.username is not None or parts.password is not None:
        # A document's URL is shown to everyone who may read its collection, a source's to every
        # reader too: credentials in it would be handed out with every search result.
        raise KBError(ErrorCode.INVALID_URI, "A URL with a user name or password is refused: every reader would see it")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname.encode("idna").decode("ascii")  # the name DNS, the Host header and TLS see
        if not _HOST_NAME.fullmatch(host):
            ipaddress.ip_address(host)  # an IP literal is the one other form a host may take
    except ValueError:  # UnicodeError included
        raise KBError(malformed, f"The URL has an invalid port or host name: {url}") from None
    return host, port


# DNS labels (letters, digits, hyphens; underscores as some intranets use them), dot-separated.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}\.?")


def _split_url(url: str) -> SplitResult:
    """``urlsplit``, which also raises ValueError for control characters (it would keep them)."""
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in url):
        raise ValueError("control character in URL")
    return urlsplit(url)


def _address_allowed(host: str, address: IPAddress) -> bool:
    allowed = settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS
    if any(entry.lower() == host.lower() for entry in allowed):
        return True
    return is_public_address(address, allowed_networks=_networks(allowed))


def _networks(entries: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:  # a host name
            continue
    return networks


def is_public_address(
    address: IPAddress, *, allowed_networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] = ()
) -> bool:
    """Whether a fetch may connect to ``address``: a public unicast address, or one in ``allowed_networks``.

    An IPv6 address that carries an IPv4 address (IPv4-mapped or -compatible, NAT64, 6to4, Teredo)
    reaches that IPv4 host in the end, so it is judged by that address: ``64:ff9b::7f00:1`` is
    127.0.0.1, whatever ``is_global`` says of the IPv6 form.
    """
    if any(address in network for network in allowed_networks):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        if address in NAT64_LOCAL_USE:
            return False
        embedded = embedded_ipv4_addresses(address)
        if embedded:
            return all(is_public_address(inner, allowed_networks=allowed_networks) for inner in embedded)
    return address.is_global and not address.is_multicast


def embedded_ipv4_addresses(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses packets to ``address`` end up at (Teredo: the relay server and the client)."""
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    if address in NAT64_WELL_KNOWN_PREFIX or address in IPV4_COMPATIBLE:
        return [ipaddress.IPv4Address(address.packed[-4:])]
    return []


def _deadline_transport(deadline: "_Deadline") -> "httpx.HTTPTransport":
    """httpx's transport, over a connection pool whose sockets never wait past ``deadline``.

    httpx's own timeouts bound each socket operation, not their sum: a server that answers one
    byte of headers or body per interval, or redirects slowly, could hold a thread for hours.
    httpx takes no network backend, but the httpcore pool it wraps does, so the pool is replaced.
    """
    import httpcore
    import httpx

    transport = httpx.HTTPTransport(trust_env=False)
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False), network_backend=_DeadlineBackend(deadline)
    )
    return transport


@dataclass(frozen=True)
class _Deadline:
    at: float  # time.monotonic()

    def clamp(self, timeout: float | None) -> float:
        """``timeout`` cut to the time left; never 0, which would make a socket non-blocking
        rather than time out, so past the deadline every wait times out at once."""
        left = max(self.at - time.monotonic(), 0.001)
        return left if timeout is None else min(timeout, left)


class _DeadlineBackend:
    """httpcore's synchronous network backend with every timeout clamped to the fetch's deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        import httpcore

        self._backend = httpcore.SyncBackend()
        self._deadline = deadline

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, **options: Any) -> "_DeadlineStream":
        stream = self._backend.connect_tcp(host, port, self._deadline.clamp(timeout), **options)
        return _DeadlineStream(stream, self._deadline)


class _DeadlineStream:
    """An httpcore network stream whose reads, writes and TLS handshake end by the deadline."""

    def __init__(self, stream: Any, deadline: _Deadline) -> None:
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.clamp(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.clamp(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> "_DeadlineStream":
        stream = self._stream.start_tls(ssl_context, server_hostname, self._deadline.clamp(timeout))
        return _DeadlineStream(stream, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


def _validator(value: str | None) -> str:
    """An ETag or Last-Modified worth sending back: printable ASCII of a sane length, else none."""
    if not value or len(value) > 500 or not value.isascii() or not value.isprintable():
        return ""
    return value


def _fetch_once(
    client: "httpx.Client", url: str, target: _Target, deadline: "_Deadline", conditions: dict[str, str]
) -> "str | tuple[bytes, httpx.Headers] | None":
    """A redirect's Location, the body and headers, or None for 304 Not Modified."""
    parts = urlsplit(url)
    literal = f"[{target.address}]" if ":" in target.address else target.address
    pinned = urlunsplit(parts._replace(netloc=f"{literal}:{target.port}"))
    default_port = 443 if parts.scheme == "https" else 80
    host = f"[{target.host}]" if ":" in target.host else target.host  # an IPv6 literal keeps its brackets
    host_header = host if target.port == default_port else f"{host}:{target.port}"
    request = client.build_request(
        "GET", pinned,
        headers={
            "Host": host_header, "User-Agent": "kb-ingest/1.0", "Accept-Encoding": ENCODINGS,
            FETCHED_FOR_A_CALLER: "1", **conditions,
        },
        extensions={"sni_hostname": target.host},
    )  # fmt: skip
    response = client.send(request, stream=True)
    try:
        if response.status_code == 304 and conditions:
            return None
        if response.status_code in REDIRECTS:
            location = response.headers.get("location")
            if not location:
                raise KBError(ErrorCode.LOAD_FAILED, f"{url} redirected without a Location header")
            return location
        if not 200 <= response.status_code < 300:  # an error, or a 304 or 300 that answers no question asked
            raise KBError(ErrorCode.LOAD_FAILED, f"{url} answered HTTP {response.status_code}")
        return _read_limited(response, url, deadline), response.headers
    finally:
        response.close()


def _read_limited(response, url: str, deadline: "_Deadline") -> bytes:  # noqa: ANN001
    """The body, decoded, at most KB_FETCH_MAX_BYTES of it. The raw bytes are decompressed here,
    never more than the limit at a time: a few kilobytes of gzip can inflate to gigabytes."""
    limit = settings.KB_FETCH_MAX_BYTES
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise KBError(ErrorCode.LOAD_FAILED, f"{url} is {declared} bytes; the limit is {limit} (KB_FETCH_MAX_BYTES)")
    decoder = _Decoder(response.headers.get("content-encoding", ""), url)
    received = bytearray()
    for piece in response.iter_raw():
        received.extend(decoder.decode(piece, limit + 1 - len(received)))
        if len(received) > limit:
            raise KBError(ErrorCode.LOAD_FAILED, f"{url} is larger than {limit} bytes (KB_FETCH_MAX_BYTES)")
        if time.monotonic() > deadline.at:
            raise KBError(ErrorCode.LOAD_FAILED, f"{url} took longer than {settings.KB_FETCH_TIMEOUT_SECONDS}s")
    decoder.finish()
    return bytes(received)


# What fetches accept, and decode themselves with a bound on the output.
ENCODINGS = "gzip, deflate"
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class _Decoder:
    """A response's body decoded piece by piece: at most ``room`` bytes (plus one, to notice an
    overflow) of each, and ``finish`` says whether a compressed body ended where its stream does."""

    def __init__(self, content_encoding: str, url: str) -> None:
        self.url = url
        encodings = [part.strip().lower() for part in content_encoding.split(",") if part.strip()]
        encodings = [encoding for encoding in encodings if encoding != "identity"]
        if len(encodings) > 1 or (encodings and encodings[0] not in ("gzip", "x-gzip", "deflate")):
            raise KBError(ErrorCode.LOAD_FAILED, f"{url} came with Content-Encoding {content_encoding[:100]!r}; "
                          f"only one of {ENCODINGS} is accepted")  # fmt: skip
        # wbits 47: a gzip or a zlib header, whichever the body has (headerless deflate is refused as corrupt).
        self.inflater = zlib.decompressobj(47) if encodings else None

    def decode(self, piece: bytes, room: int) -> bytes:
        if self.inflater is None:
            return piece
        try:
            decoded = self.inflater.decompress(piece, max(room, 1))
        except zlib.error:
            raise KBError(ErrorCode.LOAD_FAILED, f"{self.url}: the compressed body is corrupt") from None
        if self.inflater.eof and self.inflater.unused_data:
            # A second gzip member, or junk: only the first member had been kept, half a document.
            raise KBError(
                ErrorCode.LOAD_FAILED, f"{self.url}: the compressed body goes on after its end (several gzip members?)"
            )
        return decoded

    def finish(self) -> None:
        # A compressed body cut short inflates without an error to what arrived: half a document.
        if self.inflater is not None and not self.inflater.eof:
            raise KBError(ErrorCode.LOAD_FAILED, f"{self.url}: the compressed body ends before its end (truncated)")


def source_hash(data: bytes, content_type: str) -> str:
    """Identity of a source's content: the same bytes read as the same type are a no-op."""
    digest = hashlib.sha256(content_type.encode() + b"\n")
    digest.update(data)
    return digest.hexdigest()
