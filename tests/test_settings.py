import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured

from config import env
from tests.conftest import ROOT
from tests.support.services import missing_on_this_machine, service_url


@pytest.mark.parametrize(
    ("reader", "value", "message"),
    [
        (lambda: env.env_bool("KB_X", False), "maybe", "not a boolean"),
        (lambda: env.env_int("KB_X", 1), "1.5", "not an integer"),
        (lambda: env.env_int("KB_X", 1, minimum=2), "1", "below the minimum"),
        (lambda: env.env_float("KB_X", 1.0, maximum=1.0), "1.2", "above the maximum"),
        (lambda: env.env_float("KB_X", 1.0), "1,2", "not a number"),
        (lambda: env.env_choice("KB_X", "a", ["a", "b"]), "c", "must be one of"),
        (lambda: env.env_nonempty_list("KB_X", ["a"]), " , ", "names nothing"),
        (lambda: env.env_time_zone("KB_X", "UTC"), "Mars/Base", "not a time zone"),
        (lambda: env.env_url_scheme("KB_X", "redis://", ["redis"]), "ftp://x", "must start with one of"),
    ],
)
def test_bad_values_fail_loudly_naming_the_variable(monkeypatch, reader, value, message):
    monkeypatch.setenv("KB_X", value)
    with pytest.raises(ImproperlyConfigured, match=f"KB_X.*{message}"):
        reader()


def test_good_values_are_parsed(monkeypatch):
    monkeypatch.setenv("KB_X", " yes ")
    assert env.env_bool("KB_X", False) is True
    monkeypatch.setenv("KB_X", "a, b ,,c")
    assert env.env_list("KB_X") == ["a", "b", "c"]


def manage(*args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **overrides}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )


def test_a_database_url_that_is_not_postgres_is_refused():
    result = manage("check", DATABASE_URL="mysql://root@127.0.0.1/test")
    assert result.returncode != 0
    assert "DATABASE_URL must point to PostgreSQL" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LOG_LEVEL", "LOUD"),
        ("DJANGO_TIME_ZONE", "Mars/Base"),
        ("KB_VAR_DIR", "/proc/no/such/folder"),
        ("CELERY_BROKER_URL", "ftp://x"),
        ("DJANGO_ALLOWED_HOSTS", ""),
    ],
)
def test_a_bad_setting_stops_start_up_with_one_line_naming_it(variable, value):
    """These had ended in a traceback, or passed the check and failed later without naming the variable."""
    result = manage("check", **{variable: value})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"{variable}=" in result.stderr or f"{variable} is set" in result.stderr


def test_a_replica_url_that_is_not_postgres_is_refused():
    result = manage("check", DATABASE_REPLICA_URLS="postgresql://postgres@127.0.0.1/kb,sqlite:///x.db")
    assert result.returncode != 0
    assert "DATABASE_REPLICA_URLS must point to PostgreSQL" in result.stderr


def test_every_setting_is_listed_in_the_example_env_file():
    settings_text = (ROOT / "config" / "settings.py").read_text()
    example = (ROOT / ".env.example").read_text()
    import re

    read = set(re.findall(r'env_\w+\(\s*"([A-Z0-9_]+)"', settings_text))
    listed = set(re.findall(r"^#?\s*([A-Z0-9_]+)=", example, re.MULTILINE))
    assert read - listed == set()


def test_migrating_a_postgres_without_pgvector_says_so_clearly():
    """Needs a PostgreSQL without pgvector: CI machines run one on 127.0.0.1:5432 (.ci/run sets the URL)."""
    server_url = service_url("KB_TEST_PLAIN_POSTGRES_URL", "a PostgreSQL without pgvector")
    name = f"kb_no_pgvector_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        if admin.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
            missing_on_this_machine(
                "KB_TEST_PLAIN_POSTGRES_URL",
                f"{server_url} has pgvector; point KB_TEST_PLAIN_POSTGRES_URL at a server without it",
            )
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = server_url.rsplit("/", 1)[0]
        result = manage("migrate", "--noinput", DATABASE_URL=f"{base}/{name}")
        assert result.returncode != 0
        assert "does not have the pgvector extension" in result.stderr
        assert "unset DATABASE_URL to use the embedded PostgreSQL" in result.stderr
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_database_that_does_not_answer_fails_within_the_connect_timeout(silent_server):
    port, accepted = silent_server
    started = time.monotonic()
    result = manage(
        "shell",
        "-c",
        "from django.db import connection; connection.ensure_connection()",
        DATABASE_URL=f"postgresql://kb@127.0.0.1:{port}/kb",
        DATABASE_CONNECT_TIMEOUT="2",
    )
    assert result.returncode != 0 and accepted
    assert "timeout expired" in result.stderr, result.stderr[-2000:]
    assert time.monotonic() - started < 60  # without the timeout, it hangs until manage()'s 120 s
