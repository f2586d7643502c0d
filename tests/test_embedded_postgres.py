"""The embedded PostgreSQL is tuned for a knowledge base when it is first started."""

import psutil
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
