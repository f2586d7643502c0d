"""`make run`'s launcher, started as a user would, on a data directory of its own."""

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import psutil
import pytest

from kb.launcher import Launcher
from tests.conftest import ChildProcess, free_port, wait_for


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


# An error line in either format the launcher's log holds: Django's ("2026-... ERROR name: ...")
# and Celery's and billiard's own ("[2026-...: ERROR/MainProcess] Process 'ForkPoolWorker-1' ...").
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback")


def assert_clean(log: str) -> None:
    lines = [line for line in log.splitlines() if ERROR_LINE.search(line)]
    assert not lines, "\n".join(lines)


def start_launcher(tmp_path, port: int) -> ChildProcess:
    # Its own database in its own KB_VAR_DIR, whichever the tests themselves were given.
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KB_EMBEDDED_DATABASE", "KB_PGDATA")}
    env.update(
        KB_VAR_DIR=str(tmp_path / "var"),
        DJANGO_SUPERUSER_USERNAME="curator",
        DJANGO_SUPERUSER_PASSWORD="a-long-test-password",
        PYTHONUNBUFFERED="1",
    )
    command = [sys.executable, "manage.py", "kb_run", "--port", str(port)]
    return ChildProcess(command, env, tmp_path / f"launcher-{port}.log")


def run_once_and_stop(tmp_path) -> str:
    port = free_port()
    launcher = start_launcher(tmp_path, port)
    try:
        wait_for(
            lambda: answers(f"http://127.0.0.1:{port}/admin/login/") or not launcher.alive(),
            timeout=180,
            what="the admin login page",
        )
        assert launcher.alive(), launcher.log()
        children = descendants(launcher.process.pid)
        names = " ".join(" ".join(child.cmdline()) for child in children)
        assert "celery" in names and "uvicorn" in names
        postgres = [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(tmp_path / "var" / "pgdata") in " ".join(p.info["cmdline"] or [])
        ]
        assert postgres, "the embedded Postgres is not running"

        os.kill(launcher.process.pid, signal.SIGINT)  # what Ctrl-C sends
        launcher.process.wait(timeout=60)
        wait_for(
            lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in children + postgres),
            timeout=30,
            what="every child process to exit",
        )
        return launcher.log()
    finally:
        launcher.stop()


@pytest.mark.timeout(600)
def test_it_serves_the_admin_until_ctrl_c_stops_everything_cleanly(tmp_path):
    first = run_once_and_stop(tmp_path)
    assert "Created superuser 'curator'" in first
    assert "Embedded Postgres stopped." in first
    # A clean stop is quiet: no ERROR lines (a pool process killed under Celery's feet logs one),
    # and the MCP session managers announce themselves once, not once per profile.
    assert_clean(first)  # also billiard's "[…: ERROR/MainProcess] … exited with signal 15"
    assert first.count("session manager") == 1, first
    # A second run finds the same data: the superuser is not created again.
    second = run_once_and_stop(tmp_path)
    assert "Created superuser" not in second


def test_it_refuses_a_port_that_is_taken_before_starting_anything(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        launcher = start_launcher(tmp_path, port)
        try:
            assert launcher.process.wait(timeout=120) == 1
        finally:
            launcher.stop()
    log = launcher.log()
    assert f"Cannot listen on 127.0.0.1:{port}" in log and "KB_PORT" in log
    assert "running on" not in log and not (tmp_path / "var" / "pgdata").exists()


def test_a_bad_setting_stops_start_up_with_one_line_naming_it(tmp_path):
    env = {**os.environ, "KB_VAR_DIR": str(tmp_path / "var"), "KB_SEMANTIC_WEIGHT": "nan"}
    result = subprocess.run(
        [sys.executable, "manage.py", "kb_run"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "Configuration error: KB_SEMANTIC_WEIGHT='nan' is not a finite number"
    ]


def test_listening_beyond_loopback_with_the_default_allowed_hosts_says_what_to_set(monkeypatch):
    """Started on 0.0.0.0 alone, every request from another machine got a 400 that did not say why."""
    monkeypatch.delenv("DJANGO_ALLOWED_HOSTS", raising=False)
    said: list[str] = []
    Launcher(host="0.0.0.0", port=8001, say=said.append)._announce()
    assert "DJANGO_ALLOWED_HOSTS" in said[0]
    said.clear()
    Launcher(host="127.0.0.1", port=8001, say=said.append)._announce()
    assert "DJANGO_ALLOWED_HOSTS" not in "".join(said)


@pytest.mark.django_db
def test_a_generated_first_password_is_said_again_once_everything_runs(monkeypatch):
    """It had scrolled away under the workers' start-up logs."""
    monkeypatch.delenv("DJANGO_SUPERUSER_USERNAME", raising=False)
    monkeypatch.delenv("DJANGO_SUPERUSER_PASSWORD", raising=False)
    said: list[str] = []
    launcher = Launcher(host="127.0.0.1", port=8001, say=said.append)
    launcher._ensure_superuser()
    password = said[-1].split("password: ")[1]
    said.clear()
    launcher._announce()
    assert f"admin / {password}" in said[-1]
