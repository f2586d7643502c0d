"""The embedded PostgreSQL is tuned for a knowledge base when it is first started."""

import pytest
from django.conf import settings
from django.db import connection

from config.embedded_postgres import shared_buffers_mb

pytestmark = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "config.embedded_postgres",
    reason="DATABASE_URL names another PostgreSQL, whose settings are its operator's",
)


def test_the_embedded_server_keeps_a_quarter_of_memory_up_to_4_gb_in_shared_buffers(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'")
        megabytes = cursor.fetchone()[0]
    assert megabytes == shared_buffers_mb()
    assert 128 <= megabytes <= 4096
