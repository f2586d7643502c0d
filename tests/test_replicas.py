"""Search reads on a streaming replica (DATABASE_REPLICA_URLS), for real: a standby of the suite's
embedded Postgres made by pg_basebackup, and a process configured with it that writes and then
reads at once."""

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import ROOT, child_env, free_port
from tests.support.standby import Standby, streaming_standby

pytestmark = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "config.embedded_postgres",
    reason="the standby is a base backup of the embedded server; DATABASE_URL points the suite elsewhere",
)


@pytest.fixture
def standby(transactional_db: None) -> Iterator[Standby]:
    with streaming_standby(Path(settings.DATABASES["default"]["HOST"]).resolve(), free_port()) as server:
        yield server


def probe(word: str, replica_urls: list[str], **env: str) -> dict[str, Any]:
    """Write a note holding ``word`` and read it back in a process whose replicas are ``replica_urls``."""
    environment = {**child_env(), "DATABASE_REPLICA_URLS": ",".join(replica_urls), **env}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.replica_probe", word],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_search_right_after_a_write_reads_from_the_standby(standby):
    seen = probe("zephyrine", [standby.url(connection.settings_dict["NAME"])])
    assert seen["recovery"] == {"default": False, "replica_1": True}
    assert seen["found"] == ["note://zephyrine"]
    assert seen["documents"] == 1
    assert seen["statements"]["replica_1"] > 0
    assert "default" not in seen["statements"]  # the primary only said how far it had written


def test_a_search_inside_a_transaction_reads_from_the_primary(standby):
    seen = probe("sandpiper", [standby.url(connection.settings_dict["NAME"])])
    assert seen["in_transaction"]["default"] > 0
    assert "replica_1" not in seen["in_transaction"]


def test_health_reports_a_standby_that_has_caught_up(standby):
    seen = probe("ptarmigan", [standby.url(connection.settings_dict["NAME"])])
    replica = seen["health"]["replicas"]["replica_1"]
    assert replica["ok"] is True
    # Caught up to the write; background WAL (autovacuum, checkpoints) may have moved on since.
    assert 0 <= replica["behind_bytes"] < 1_000_000


def test_a_write_is_found_while_the_standby_lags(standby):
    standby.execute("SELECT pg_wal_replay_pause()")
    seen = probe("quillwort", [standby.url(connection.settings_dict["NAME"])], KB_REPLICA_MAX_WAIT_MS="100")
    assert seen["found"] == ["note://quillwort"]
    assert seen["documents"] == 1
    assert seen["statements"]["default"] > 0
    assert "replica_1" not in seen["statements"]  # passed over: it had not replayed the write
    assert seen["health"]["replicas"]["replica_1"]["behind_bytes"] > 0


def test_a_replica_that_does_not_answer_is_passed_over(transactional_db):
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/{connection.settings_dict['NAME']}"
    seen = probe("bladderwrack", [unreachable])
    assert seen["found"] == ["note://bladderwrack"]
    assert seen["recovery"]["replica_1"] is None
    assert seen["health"]["ok"] is False


def test_a_replica_that_hangs_is_tried_once_not_by_every_read(transactional_db, silent_server):
    port, accepted = silent_server
    seen = probe("sandwort", [f"postgresql://postgres@127.0.0.1:{port}/{connection.settings_dict['NAME']}"])
    assert seen["found"] == ["note://sandwort"]
    assert seen["documents"] == 1
    # The search tried it and waited; the statistics read after it did not. The probe's own
    # recovery question and /health's check ask it directly, once each.
    assert len(accepted) == 3
