"""The commands as a new user runs them: real processes, a real Celery worker, output to pipes."""

import json
import subprocess
import sys

import pytest

from kb.models import Document, DocumentStatus
from tests.conftest import ROOT, child_env
from tests.support.documents import write_mixed_folder

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def manage(*args: str, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python manage.py ...`` in ``cwd`` with stdout and stderr on pipes (not a terminal)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_ingest_a_folder_wait_for_the_worker_then_find_the_passage(celery_worker, tmp_path):
    write_mixed_folder(tmp_path / "docs")
    ingest = manage("kb_ingest", "./docs", "--collection", "docs", "--create", "--wait", cwd=tmp_path)
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr + celery_worker.log()[-3000:]
    assert "Collection docs: 6 created\n" in ingest.stdout
    # Progress on a pipe: plain lines, no bar redrawn with carriage returns.
    assert "\r" not in ingest.stderr
    assert "Ingesting [6] created" in ingest.stderr
    chunks = sum(Document.objects.values_list("chunk_count", flat=True))
    assert f"Embedding: {chunks}/{chunks} chunks" in ingest.stderr
    assert set(Document.objects.values_list("status", flat=True)) == {DocumentStatus.READY}

    found = manage("kb_search", "How do I upgrade the replicas?", "--collection", "docs", "--json", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    best = json.loads(found.stdout)["results"][0]
    assert "Upgrade one replica at a time" in best["content"]
    assert best["source_uri"].endswith("/docs/guide.md")
    assert best["similarity"] is not None  # found by meaning too: the worker embedded it


def test_a_failing_command_exits_non_zero_with_the_reason_on_stderr(tmp_path):
    result = manage("kb_ingest", "missing.md", "--collection", "nope", cwd=tmp_path, timeout=120)
    assert result.returncode == 1
    assert "COLLECTION_NOT_FOUND: Collection not found: nope" in result.stderr


def test_python_m_kb_cli_runs_the_kb_command(tmp_path):
    """It had done nothing and exited 0, an unknown command too."""
    unknown = subprocess.run(
        [sys.executable, "-m", "kb.cli", "bogus"], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode != 0 and "kb: unknown command 'bogus'" in unknown.stderr


def test_kb_help_is_plain_text_and_a_reader_that_stops_early_gets_no_traceback():
    gone = subprocess.run(  # `true` reads nothing and is gone before kb writes
        f"{sys.executable} -m kb.cli help | true", shell=True, cwd=ROOT, env=child_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in gone.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "kb.cli", "help"], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60
    ).stdout
    assert "KB_PORT" in usage and "``" not in usage
