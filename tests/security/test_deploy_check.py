"""`manage.py check --deploy` stays clean under production settings (TLS on, a real secret key)."""

import secrets
import subprocess
import sys

from tests.conftest import ROOT, child_env


def test_the_deploy_check_is_clean_under_production_settings(db):
    env = {**child_env(), "DJANGO_SECURE_SSL": "1", "DJANGO_SECRET_KEY": secrets.token_urlsafe(60), "DJANGO_DEBUG": "0"}
    checked = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no issues" in checked.stdout
