def test_health_reports_the_database_with_its_pgvector_version(client, db, live_worker):
    response = client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["database"]["pgvector"].startswith("0.8")
