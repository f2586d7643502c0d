"""A process of `make run` that dies on its own is started again (kb.launcher): SIGKILL the worker,
then the web server, while the launcher runs; each comes back by itself, saying so, and the system
works again: a note written without waiting is embedded by the new worker, the new web server
answers. (Before, the first child to die stopped everything: seen when a worker died on a broken
broker message under 50 MCP clients.)"""

import json
import os
import signal
import time
import urllib.request

import psutil
import pytest

from kb.launcher import RESTART_AFTER_SECONDS
from tests.conftest import free_port, wait_for
from tests.test_launcher import answers, start_launcher


def call(method: str, url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def children_with(launcher_pid: int, *words: str, without: str | None = None) -> list[psutil.Process]:
    """The launcher's direct children whose command lines hold every word (not their pool processes).
    A child between its fork and its exec still has the launcher's command line: not counted yet."""
    found = []
    for child in psutil.Process(launcher_pid).children():
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:  # gone, or a zombie, while we looked
            continue
        if all(word in command for word in words) and (without is None or without not in command):
            found.append(child)
    return found


def leader(launcher_pid: int, *words: str, without: str | None = None) -> psutil.Process:
    found = children_with(launcher_pid, *words, without=without)
    assert len(found) == 1, [" ".join(child.cmdline()) for child in found]
    return found[0]


@pytest.mark.timeout(400)
def test_a_killed_worker_and_web_server_are_started_again(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    launcher = start_launcher(tmp_path, port)
    try:
        wait_for(lambda: answers(f"{base}/health/ready") or not launcher.alive(), timeout=180, what="make run")
        assert launcher.alive(), launcher.log()
        call("POST", f"{base}/api/collections", {"name": "notes"})
        time.sleep(RESTART_AFTER_SECONDS + 1)  # a child that dies sooner would stop everything

        worker = leader(launcher.process.pid, "celery", "worker", without="interactive")
        pool = worker.children()
        assert pool, "the worker has no pool process"
        worker.kill()
        wait_for(
            lambda: "The worker process exited with status -9; starting it again." in launcher.log(),
            timeout=30,
            what="the launcher to start the worker again",
        )
        # What the dead worker left (its pool process) is ended, not left to run on its own.
        wait_for(
            lambda: not any(process.is_running() and process.status() != psutil.STATUS_ZOMBIE for process in pool),
            timeout=10,
            what="the dead worker's pool process to go",
        )
        wait_for(
            lambda: len(children_with(launcher.process.pid, "celery", "worker", without="interactive")) == 1,
            timeout=30,
            what="the new worker's process",
        )
        new_worker = leader(launcher.process.pid, "celery", "worker", without="interactive")
        assert new_worker.pid != worker.pid
        answer = call("POST", f"{base}/api/collections/notes/documents", {"uri": "data:text/plain,after the crash"})
        doc_id = answer["items"][0]["doc_id"]
        wait_for(
            lambda: call("GET", f"{base}/api/documents/{doc_id}")["status"] == "ready",
            timeout=120,
            what="the new worker to embed a note",
        )

        web = leader(launcher.process.pid, "uvicorn")
        web.kill()
        wait_for(
            lambda: "The web process exited with status -9; starting it again." in launcher.log(),
            timeout=30,
            what="the launcher to start the web server again",
        )
        wait_for(lambda: answers(f"{base}/health/ready"), timeout=120, what="the new web server")
        assert leader(launcher.process.pid, "uvicorn").pid != web.pid
        assert launcher.alive(), launcher.log()[-3000:]
    finally:
        if launcher.alive():
            os.kill(launcher.process.pid, signal.SIGINT)
            launcher.process.wait(timeout=60)
        launcher.stop()
    assert "Embedded Postgres stopped." in launcher.log()
