"""Servers some tests need beside the embedded ones (Redis, RabbitMQ, a Postgres without pgvector).

`.ci/run` names them with KB_TEST_*_URL and CI requires them. Elsewhere a test uses the usual
loopback address when something listens there, and is skipped, saying what it needs, when
nothing does: `make test` on a fresh machine with no services passes.
"""

import os
import socket
from urllib.parse import urlsplit

import pytest

LOOPBACK_DEFAULTS = {
    "KB_TEST_REDIS_URL": "redis://127.0.0.1:6379/15",
    "KB_TEST_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:5672//",
    "KB_TEST_PLAIN_POSTGRES_URL": "postgresql://postgres@127.0.0.1:5432/postgres",
}


# What each service test found, for the closing summary (tests/conftest.py).
USED: dict[str, str] = {}


def service_url(variable: str, what: str) -> str:
    url = os.environ.get(variable)
    if url:
        USED[variable] = f"used {_without_password(url)} ({variable})"
        return url
    default = LOOPBACK_DEFAULTS[variable]
    if _listening(default):
        USED[variable] = f"used {_without_password(default)} (found listening)"
        return default
    message = f"{variable} is not set and nothing listens at {urlsplit(default).netloc}: this test needs {what}"
    USED[variable] = f"SKIPPED: {message}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def missing_on_this_machine(variable: str, reason: str) -> None:
    """A server found at the usual address that is not what the test needs: skip, unless it was named."""
    if os.environ.get(variable) or os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    return url.replace(f":{parts.password}@", ":***@") if parts.password else url


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=0.5):
            return True
    except OSError:
        return False
