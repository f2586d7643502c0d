"""A task goes through a real broker to a real worker process and its result comes back.

The default broker needs no server (messages are files under var/test/celery). The Redis and
RabbitMQ variants need those servers on loopback: CI machines run them, and `.ci/run` sets
KB_TEST_REDIS_URL and KB_TEST_RABBITMQ_URL (tests.support.services: elsewhere they use the usual
loopback ports, or are skipped with a reason when nothing listens there).
"""

import pytest
from celery import Celery

from tests.conftest import start_worker
from tests.support.services import service_url


def round_trip(app: Celery, worker, value: str) -> str:
    result = app.send_task("kb.tasks.ping", args=[value])
    try:
        return result.get(timeout=90)
    except Exception as exc:
        raise AssertionError(f"no answer from the worker: {exc}\n--- worker log ---\n{worker.log()}") from exc


def broker_app(broker_url: str, backend_url: str) -> Celery:
    # Not the current app: shared tasks sent later in this process must still use the project's.
    app = Celery("round-trip", broker=broker_url, backend=backend_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    return app


@pytest.mark.worker
def test_a_task_round_trips_on_the_default_file_system_broker(celery_worker):
    from config.celery import app

    assert app.conf.broker_url == "filesystem://"
    assert round_trip(app, celery_worker, "files") == "pong:files"


@pytest.mark.worker
@pytest.mark.parametrize("variable", ["KB_TEST_REDIS_URL", "KB_TEST_RABBITMQ_URL"])
def test_a_task_round_trips_on_a_server_broker(tmp_path, transactional_db, variable):
    url = service_url(variable, "that broker on loopback (.ci/run sets it)")
    backend = url if url.startswith("redis") else "rpc://"
    worker = start_worker(
        tmp_path, extra_env={"CELERY_BROKER_URL": url, "CELERY_RESULT_BACKEND": backend}, name=variable.lower()
    )
    try:
        assert round_trip(broker_app(url, backend), worker, "server") == "pong:server"
    finally:
        worker.stop()
