import pytest
from django.test import Client


def test_health_reports_the_database_with_its_pgvector_version(client, db, live_worker):
    response = client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["database"]["pgvector"].startswith("0.8")


@pytest.mark.parametrize("path", ["/health", "/health/live", "/health/ready"])
@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_a_probe_answers_any_other_method_with_a_json_405(db, path, method):
    """POST had been Django's HTML "403 Forbidden" CSRF page."""
    response = getattr(Client(enforce_csrf_checks=True), method)(path)
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"
    assert response.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert Client(enforce_csrf_checks=True).get("/health/live").json() == {"status": "ok"}
