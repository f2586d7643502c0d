"""`make run`'s launcher, started as a user would, on a data directory of its own."""

import os
import signal
import sys
import urllib.request

import psutil
import pytest

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


def start_launcher(tmp_path, port: int) -> ChildProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KB_EMBEDDED_DATABASE")}
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
def test_it_serves_the_admin_and_stops_everything_on_ctrl_c(tmp_path):
    first = run_once_and_stop(tmp_path)
    assert "Created superuser 'curator'" in first
    assert "Embedded Postgres stopped." in first
    # A second run finds the same data: the superuser is not created again.
    second = run_once_and_stop(tmp_path)
    assert "Created superuser" not in second
