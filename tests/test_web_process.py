"""How the web process (config.asgi) sets itself up for many callers at once, against a process
that only loads the settings (workers, commands)."""

import os
import subprocess
import sys

from kb.embedding_providers import onnx_threads, usable_cores
from tests.conftest import ROOT


def printed_after(importing: str, expression: str, **env: str) -> str:
    """What ``expression`` prints in a fresh interpreter that imported ``importing`` (Django set up)."""
    code = f"import {importing}, django; django.setup(); import kb.embedding_providers as e; print({expression})"
    clean = {key: value for key, value in os.environ.items() if key != "KB_ONNX_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_the_web_process_runs_the_model_on_one_thread_unless_told_otherwise(settings):
    assert printed_after("config.asgi", "e.onnx_threads()") == "1"
    assert printed_after("config.asgi", "e.onnx_threads()", KB_ONNX_THREADS="3") == "3"
    workers = printed_after("config.settings", "e.onnx_threads()", DJANGO_SETTINGS_MODULE="config.settings")
    assert workers == str(min(usable_cores(), 4))
    settings.KB_ONNX_THREADS = 2
    assert onnx_threads() == 2
