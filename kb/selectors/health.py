"""Health checks behind ``/health`` and ``/api/health``: database, broker, workers, embedding
providers, and the streaming replicas when DATABASE_REPLICA_URLS names some.

``/health/live`` says only that the process answers; ``/health/ready`` is 503 unless the
database, the broker and a worker for every queue are there; ``/health`` reports everything and
is 503 only when the server cannot work at all (database or broker down).

Each check is cheap (one query, one broker connection, one small HTTP request with a short
timeout) and never loads an ML library, so load balancers may poll it. The embedding check
covers the default model and every model a collection uses or is switching to.
"""

import os
from typing import Any, Literal

from django.conf import settings
from django.db import DatabaseError, connection, connections

from kb.models import Collection
from kb.replicas import replica_aliases

# Seconds a broker connection or a provider request may take before the check reports it down.
CHECK_TIMEOUT_SECONDS = 2.0


def health_report(*, detailed: bool) -> dict[str, Any]:
    """``detailed`` (for admins only): versions, transports, paths, hosts and error texts. Others
    learn only what is up and what is down: details name server paths and internal addresses."""
    checks = {"database": database_check(), "broker": broker_check()}
    checks["worker"] = worker_check(database_ok=checks["database"]["ok"])
    checks["embedding"] = embedding_check(models=_models_in_use(database_ok=checks["database"]["ok"]))
    if replica_aliases():
        checks["replicas"] = replicas_check()
    if not detailed:
        checks = {name: {"ok": check["ok"]} for name, check in checks.items()}
    return {"status": readiness(checks), "checks": checks}


HealthStatus = Literal["ok", "degraded", "error"]


def readiness(checks: dict[str, dict[str, Any]]) -> HealthStatus:
    """ "error" (HTTP 503) only when the server cannot work: the database or the broker is down.
    No worker, one collection's unreachable embedding provider or a replica down makes it
    "degraded": search, ingestion and the other collections still work (embeddings wait, reads
    go to the primary), and the details say what."""
    if not (checks["database"]["ok"] and checks["broker"]["ok"]):
        return "error"
    others = ("embedding", "worker", "replicas")
    return "ok" if all(checks[name]["ok"] for name in others if name in checks) else "degraded"


def ready() -> bool:
    """Whether this server can take work now: database, broker and a worker on every queue."""
    checks = {"database": database_check(), "broker": broker_check()}
    checks["worker"] = worker_check(database_ok=checks["database"]["ok"])
    return all(check["ok"] for check in checks.values())


def worker_check(*, database_ok: bool) -> dict[str, Any]:
    """Workers whose heartbeat is recent, per queue; every queue needs one."""
    from datetime import timedelta

    from django.utils import timezone

    from kb.models import WorkerHeartbeat

    if not database_ok:
        return {"ok": False, "error": "unknown: the database is down"}
    recent = timezone.now() - timedelta(seconds=3 * settings.KB_WORKER_HEARTBEAT_SECONDS)
    consumers = dict.fromkeys(settings.CELERY_TASK_QUEUES, 0)
    live = list(WorkerHeartbeat.objects.filter(last_seen_at__gte=recent).values_list("queues", flat=True))
    for queues in live:
        for queue in queues:
            consumers[queue] = consumers.get(queue, 0) + 1
    idle = sorted(queue for queue, count in consumers.items() if not count)
    check: dict[str, Any] = {"ok": not idle, "workers": len(live), "queues": consumers}
    if idle:
        check["error"] = f"no live worker consumes {', '.join(idle)}: documents wait for embedding"
    return check


def database_check() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cursor.fetchone()
    except DatabaseError as exc:
        return {"ok": False, "error": str(exc).strip()}
    if row is None:
        return {"ok": False, "pgvector": None, "error": "the pgvector extension is not installed"}
    return {"ok": True, "pgvector": row[0]}


def replicas_check() -> dict[str, Any]:
    """Each replica answers, is a standby, and how many bytes of the primary's WAL it has yet to replay."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_flush_lsn()::text")
        flushed = cursor.fetchone()[0]
    replicas: dict[str, dict[str, Any]] = {}
    for alias in replica_aliases():
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    "SELECT pg_is_in_recovery(), pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn())", [flushed]
                )
                standby, behind = cursor.fetchone()
        except DatabaseError as exc:
            connections[alias].close()
            replicas[alias] = {"ok": False, "error": str(exc).strip()}
            continue
        if not standby:
            replicas[alias] = {"ok": False, "error": "not a streaming replica (not in recovery)"}
        else:
            replicas[alias] = {"ok": True, "behind_bytes": max(0, int(behind))}
    return {"ok": all(replica["ok"] for replica in replicas.values()), "replicas": replicas}


def broker_check(*, url: str | None = None) -> dict[str, Any]:
    """Connect to the Celery broker (``url`` or the configured one) once, without retrying."""
    from config.celery import app

    url = url or app.conf.broker_url
    if url.startswith("filesystem://"):
        return _filesystem_broker_check(app.conf.broker_transport_options)
    try:
        with app.connection_for_write(url=url, connect_timeout=CHECK_TIMEOUT_SECONDS) as broker:
            broker.ensure_connection(max_retries=1, interval_start=0, timeout=CHECK_TIMEOUT_SECONDS)
            transport = broker.transport.driver_type
    except Exception as exc:  # noqa: BLE001 - kombu raises many types; any of them means "down"
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "transport": transport}


def _filesystem_broker_check(options: dict[str, Any]) -> dict[str, Any]:
    """The server-less broker is its folders: they must exist and be writable."""
    folders = {options.get(key) for key in ("data_folder_in", "data_folder_out", "control_folder")} - {None}
    unusable = sorted(folder for folder in folders if not os.access(folder, os.W_OK | os.X_OK))
    if unusable:
        return {"ok": False, "transport": "filesystem", "error": f"not writable: {', '.join(unusable)}"}
    return {"ok": True, "transport": "filesystem"}


def embedding_check(*, models: list[tuple[str, str]]) -> dict[str, Any]:
    results = {f"{provider}:{name}": _model_check(provider, name) for provider, name in models}
    return {"ok": all(result["ok"] for result in results.values()), "models": results}


def _models_in_use(*, database_ok: bool) -> list[tuple[str, str]]:
    models = {(settings.EMBEDDING_PROVIDER, settings.EMBEDDING_MODEL)}
    if database_ok:
        models |= set(Collection.objects.values_list("embedding_model__provider", "embedding_model__name"))
        models |= set(
            Collection.objects.filter(next_embedding_model__isnull=False).values_list(
                "next_embedding_model__provider", "next_embedding_model__name"
            )
        )
    return sorted(models)


def _model_check(provider: str, name: str) -> dict[str, Any]:
    if provider == "local":
        return _local_check(name)
    if provider == "ollama":
        return _ollama_check(name)
    if provider == "openai":
        return _openai_check()
    return {"ok": False, "error": f"unknown provider {provider!r}"}


def _local_check(name: str) -> dict[str, Any]:
    from kb.embedding_providers import EmbeddingError, local_model_path

    # local_model_path checks what the model needs without importing it: for the packaged model
    # onnxruntime, tokenizers, the ONNX file and the tokenizer file; for a model folder inside
    # KB_LOCAL_MODELS_DIR, sentence-transformers and torch. No ML library is loaded here.
    try:
        path = local_model_path(name)
    except EmbeddingError as error:
        return {"ok": False, "error": error.message}
    return {"ok": True, "path": str(path)}


def _ollama_check(name: str) -> dict[str, Any]:
    import httpx

    try:
        response = httpx.get(f"{settings.OLLAMA_HOST.rstrip('/')}/api/tags", timeout=CHECK_TIMEOUT_SECONDS)
        response.raise_for_status()
        pulled = {model.get("name", "") for model in response.json().get("models", [])}
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return {"ok": False, "error": f"Ollama at {settings.OLLAMA_HOST} is unreachable: {exc}"}
    if name not in pulled and f"{name}:latest" not in pulled:
        return {"ok": False, "error": f"Ollama has no model {name!r} (run `ollama pull {name}`)"}
    return {"ok": True, "host": settings.OLLAMA_HOST}


def _openai_check() -> dict[str, Any]:
    import httpx

    base = (settings.OPENAI_BASE_URL or "https://api.openai.com/v1").rstrip("/")
    headers = {"Authorization": f"Bearer {settings.OPENAI_API_KEY}"} if settings.OPENAI_API_KEY else {}
    try:
        response = httpx.get(f"{base}/models", headers=headers, timeout=CHECK_TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        return {"ok": False, "error": f"{base} is unreachable: {exc}"}
    if response.status_code != 200:
        return {"ok": False, "error": f"{base}/models answered HTTP {response.status_code}"}
    return {"ok": True, "base_url": base}
