"""The embedded PostgreSQL is tuned for a knowledge base when it is first started."""

import subprocess
import sys
import threading

import psutil
import psycopg
import pytest
from django.conf import settings
from django.db import connection

from config import embedded_postgres
from config.embedded_postgres import shared_buffers_mb


@pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "config.embedded_postgres",
    reason="DATABASE_URL names another PostgreSQL, whose settings are its operator's",
)
def test_the_embedded_server_keeps_a_quarter_of_memory_up_to_4_gb_in_shared_buffers(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'")
        megabytes = cursor.fetchone()[0]
    assert megabytes == shared_buffers_mb()
    assert 128 <= megabytes <= 4096


def test_a_container_memory_limit_bounds_the_shared_buffers(tmp_path, monkeypatch):
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(embedded_postgres, "CGROUP_MEMORY_LIMIT", limit)
    limit.write_text("1073741824\n")  # a container limited to 1 GB
    assert shared_buffers_mb() == 256
    limit.write_text("268435456\n")
    assert shared_buffers_mb() == 128  # never below PostgreSQL's default
    limit.write_text("max\n")  # no limit: the machine's memory
    assert shared_buffers_mb() == min(4096, max(128, psutil.virtual_memory().total // (4 * 2**20)))


POSTMASTER_LINES = ["{pid}", "{pgdata}", "1795906156", "5432", "/tmp", "localhost", "  2859400     98304", "ready"]


def test_a_postmaster_pid_still_being_written_is_waited_for(tmp_path):
    """Postgres writes its postmaster.pid line by line as it starts; read half-written during a
    restart, it had failed a worker's task with an AssertionError instead of a database error."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lines = [line.format(pid=gone.pid, pgdata=tmp_path) for line in POSTMASTER_LINES]
    pid_file = tmp_path / "postmaster.pid"
    pid_file.write_text("\n".join(lines[:5]) + "\n")
    finished = threading.Timer(0.3, lambda: pid_file.write_text("\n".join(lines) + "\n"))
    finished.start()
    try:
        assert embedded_postgres.is_running(tmp_path) is False  # the whole file, naming a process gone
    finally:
        finished.join()


def test_a_postmaster_pid_that_stays_half_written_is_a_database_error(tmp_path):
    (tmp_path / "postmaster.pid").write_text("4242\n")
    with pytest.raises(psycopg.OperationalError, match="still starting"):
        embedded_postgres.is_running(tmp_path)
