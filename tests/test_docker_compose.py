"""docker-compose.yml cannot be started here (no Docker engine); check it agrees with the settings."""

import re

import yaml

from tests.conftest import ROOT


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_every_variable_it_sets_is_a_setting_the_project_reads():
    example = (ROOT / ".env.example").read_text()
    known = set(re.findall(r"^#?\s*([A-Z0-9_]+)=", example, re.MULTILINE))
    for name, service in compose()["services"].items():
        if name in ("postgres", "postgres-replica", "redis", "ollama"):  # third-party images
            continue
        unknown = set(service["environment"]) - known
        assert not unknown, f"{name} sets variables no setting reads: {unknown}"


def test_every_service_has_a_health_check():
    services = compose()["services"]
    for name in ("postgres", "postgres-replica", "redis", "ollama", "web", "worker"):
        assert "healthcheck" in services[name], name


def test_the_data_lives_in_volumes():
    services = compose()["services"]
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert set(compose()["volumes"]) >= {"pgdata", "redisdata", "ollama"}


def test_the_database_is_postgres_with_pgvector():
    services = compose()["services"]
    assert services["postgres"]["image"].startswith("pgvector/pgvector")
    environment = services["web"]["environment"]
    assert environment["DATABASE_URL"].startswith("postgresql://") and "@postgres:5432/" in environment["DATABASE_URL"]


def test_the_broker_is_redis():
    assert compose()["services"]["web"]["environment"]["CELERY_BROKER_URL"] == "redis://redis:6379/0"


def test_the_worker_runs_with_the_web_environment():
    services = compose()["services"]
    assert services["worker"]["environment"] == services["web"]["environment"]


def test_the_optional_replica_is_a_standby_of_the_primary():
    services = compose()["services"]
    replica = services["postgres-replica"]
    assert replica["profiles"] == ["replica"]  # `docker compose up` alone does not start it
    assert replica["image"] == services["postgres"]["image"]
    script = "\n".join(replica["command"])
    assert "pg_basebackup -h postgres" in script
    assert " -R " in script  # writes standby.signal and primary_conninfo
    assert services["web"]["environment"]["DATABASE_REPLICA_URLS"] == "${DATABASE_REPLICA_URLS:-}"
