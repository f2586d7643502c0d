"""What a person meets at the server's root: the admin, a favicon, and a liveness check."""

import pytest

pytestmark = pytest.mark.django_db


def test_the_root_leads_to_the_admin(client):
    response = client.get("/")
    assert response.status_code == 302 and response.headers["Location"] == "/admin/"


def test_there_is_a_favicon(client):
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["Content-Type"] == "image/svg+xml"
    assert icon.content.startswith(b"<svg")


def test_the_admin_links_the_favicon(admin_client):
    assert '<link rel="icon" href="/favicon.ico"' in admin_client.get("/admin/").content.decode()


def test_liveness_answers_without_asking_any_dependency(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/health/live")
    assert response.json() == {"status": "ok"}
