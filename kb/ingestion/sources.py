"""Loading the bytes behind a URI: ``file://`` (or a bare path), ``http(s)://`` and ``data:``.

Files are confined to configured roots: paths are resolved (symlinks and ``..`` included)
before they are compared, component by component, so neither a link nor a sibling directory
that shares a prefix (``/data`` and ``/data2``) escapes.

URLs are fetched without trusting DNS twice: the host is resolved once, every address must be
public (unless the host or network is explicitly allowed for intranet use), the connection
goes to the address that was checked (TLS still verifies the real host name), and each
redirect is checked again, with limits on redirects, time and size.
"""

import base64
import binascii
import hashlib
import ipaddress
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urljoin, urlsplit, urlunsplit

from django.conf import settings

from kb.errors import ErrorCode, KBError
from kb.ingestion.formats import supported_extension

# Extension-less files worth ingesting from a directory.
KNOWN_TEXT_FILENAMES = {"README", "LICENSE", "CHANGELOG", "Makefile", "Dockerfile", "NOTICE", "AUTHORS"}


@dataclass(frozen=True)
class LoadedSource:
    source_uri: str
    data: bytes
    filename: str = ""
    mime_type: str = ""
    metadata: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SkippedSource:
    source_uri: str
    error: KBError


def is_local_path_uri(uri: str) -> bool:
    return uri.startswith("file://") or ("://" not in uri and not uri.startswith("data:"))


# --- files ----------------------------------------------------------------------------------


def file_path_of(uri: str) -> Path:
    """The path a ``file://`` URI or a bare path names (not yet resolved or checked)."""
    if uri.startswith("file://"):
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise KBError(ErrorCode.INVALID_URI, f"file:// URIs must not name a remote host: {uri}")
        path = unquote(parts.path)
        if not path:
            raise KBError(ErrorCode.INVALID_URI, f"The file URI has no path: {uri}")
        return Path(path)
    return Path(uri).expanduser()


def confine(path: Path, roots: Sequence[Path]) -> Path:
    """Resolve ``path`` and make sure it lies inside one of ``roots``."""
    if not roots:
        raise KBError(
            ErrorCode.INVALID_URI,
            "file:// ingestion is disabled here: set KB_FILE_ROOTS to the directories it may read",
        )
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        raise KBError(ErrorCode.LOAD_FAILED, f"No such file or directory: {path}") from None
    except (OSError, RuntimeError) as exc:  # symlink loops, permissions
        raise KBError(ErrorCode.LOAD_FAILED, f"Cannot open {path}: {exc}") from None
    for root in roots:
        if real.is_relative_to(Path(root).resolve()):
            return real
    allowed = ", ".join(str(root) for root in roots)
    raise KBError(ErrorCode.INVALID_URI, f"{path} is outside the directories ingestion may read ({allowed})")


def iter_files(uri: str, *, roots: Sequence[Path], recursive: bool) -> Iterator[LoadedSource | SkippedSource]:
    """The file named by ``uri``, or every supported file in the directory it names."""
    real = confine(file_path_of(uri), roots)
    if real.is_file():
        yield _load_file(real)
        return
    for directory, subdirectories, filenames in os.walk(real):
        subdirectories[:] = sorted(name for name in subdirectories if not name.startswith(".")) if recursive else []
        for name in sorted(filenames):
            if name.startswith(".") or not (supported_extension(name) or name in KNOWN_TEXT_FILENAMES):
                continue
            candidate = Path(directory) / name
            try:
                yield _load_file(confine(candidate, roots))
            except KBError as error:
                yield SkippedSource(source_uri=candidate.as_uri(), error=error)


def _load_file(path: Path) -> LoadedSource:
    stat = path.stat()
    if stat.st_size > settings.KB_MAX_DOCUMENT_BYTES:
        raise KBError(
            ErrorCode.LOAD_FAILED,
            f"{path} is {stat.st_size} bytes; the limit is {settings.KB_MAX_DOCUMENT_BYTES} (KB_MAX_DOCUMENT_BYTES)",
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"Cannot read {path}: {exc}") from None
    return LoadedSource(
        source_uri=path.as_uri(),
        data=data,
        filename=path.name,
        metadata={"modification_date": stat.st_mtime, "creation_date": stat.st_ctime},
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


def fetch_url(url: str) -> LoadedSource:
    import httpx

    deadline = time.monotonic() + settings.KB_FETCH_TIMEOUT_SECONDS
    current = url
    with httpx.Client(timeout=settings.KB_FETCH_TIMEOUT_SECONDS, follow_redirects=False, trust_env=False) as client:
        for _ in range(settings.KB_FETCH_MAX_REDIRECTS + 1):
            target = _checked_target(current)
            try:
                response = _fetch_once(client, current, target, deadline)
            except httpx.TimeoutException:
                raise KBError(ErrorCode.LOAD_FAILED, f"{current} did not answer in time") from None
            except httpx.HTTPError as exc:
                raise KBError(ErrorCode.LOAD_FAILED, f"Could not fetch {current}: {exc}") from None
            if isinstance(response, str):  # a redirect
                current = urljoin(current, response)
                continue
            data, mime_type = response
            name = Path(unquote(urlsplit(current).path)).name
            return LoadedSource(source_uri=url, data=data, filename=name, mime_type=mime_type)
    raise KBError(ErrorCode.LOAD_FAILED, f"{url} redirected more than {settings.KB_FETCH_MAX_REDIRECTS} times")


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    address: str


def _checked_target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise KBError(ErrorCode.INVALID_URI, f"Only http and https URLs can be fetched: {url}")
    host = parts.hostname
    if not host:
        raise KBError(ErrorCode.INVALID_URI, f"The URL has no host: {url}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise KBError(ErrorCode.INVALID_URI, f"The URL has an invalid port: {url}") from None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"Cannot resolve {host}: {exc.strerror}") from None
    addresses = [info[4][0] for info in infos]
    for address in addresses:
        if not _address_allowed(host, ipaddress.ip_address(address.split("%")[0])):
            raise KBError(
                ErrorCode.INVALID_URI,
                f"{host} resolves to {address}, which is not a public address; refusing to fetch it "
                "(allow intranet hosts with KB_FETCH_ALLOWED_PRIVATE_HOSTS)",
            )
    return _Target(host=host, port=port, address=addresses[0])


def _address_allowed(host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for allowed in settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS:
        if allowed.lower() == host.lower():
            return True
        try:
            if address in ipaddress.ip_network(allowed, strict=False):
                return True
        except ValueError:
            continue
    return address.is_global and not address.is_multicast


def _fetch_once(client, url: str, target: _Target, deadline: float) -> str | tuple[bytes, str]:  # noqa: ANN001
    parts = urlsplit(url)
    literal = f"[{target.address}]" if ":" in target.address else target.address
    pinned = urlunsplit(parts._replace(netloc=f"{literal}:{target.port}"))
    default_port = 443 if parts.scheme == "https" else 80
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    request = client.build_request(
        "GET", pinned, headers={"Host": host_header, "User-Agent": "kb-ingest/1.0"},
        extensions={"sni_hostname": target.host},
    )  # fmt: skip
    response = client.send(request, stream=True)
    try:
        if response.is_redirect:
            location = response.headers.get("location")
            if not location:
                raise KBError(ErrorCode.LOAD_FAILED, f"{url} redirected without a Location header")
            return location
        if response.status_code >= 400:
            raise KBError(ErrorCode.LOAD_FAILED, f"{url} answered HTTP {response.status_code}")
        return _read_limited(response, url, deadline), response.headers.get("content-type", "")
    finally:
        response.close()


def _read_limited(response, url: str, deadline: float) -> bytes:  # noqa: ANN001
    limit = settings.KB_FETCH_MAX_BYTES
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise KBError(ErrorCode.LOAD_FAILED, f"{url} is {declared} bytes; the limit is {limit} (KB_FETCH_MAX_BYTES)")
    received = bytearray()
    for piece in response.iter_bytes():
        received.extend(piece)
        if len(received) > limit:
            raise KBError(ErrorCode.LOAD_FAILED, f"{url} is larger than {limit} bytes (KB_FETCH_MAX_BYTES)")
        if time.monotonic() > deadline:
            raise KBError(ErrorCode.LOAD_FAILED, f"{url} took longer than {settings.KB_FETCH_TIMEOUT_SECONDS}s")
    return bytes(received)


def source_hash(data: bytes, content_type: str) -> str:
    """Identity of a source's content: the same bytes read as the same type are a no-op."""
    digest = hashlib.sha256(content_type.encode() + b"\n")
    digest.update(data)
    return digest.hexdigest()
