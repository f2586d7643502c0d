"""API tokens in the admin: made by the token service, shown once, revoked by action."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from kb.errors import KBError
from kb.models import ApiToken
from kb.services.tokens import token_authenticate, token_create
from tests.support.admin_data import (
    fast_password_hashing,  # noqa: F401 - an autouse fixture
    make_collection,
    staff_client,
)

pytestmark = pytest.mark.django_db

LIST = reverse("admin:kb_apitoken_changelist")
ADD = reverse("admin:kb_apitoken_add")


def test_creating_a_token_shows_its_plaintext_once(admin_client, admin_user):
    collection = make_collection("handbook")
    response = admin_client.post(ADD, {"name": "ci", "scope": "write", "collections": [collection.pk]})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    plaintext = response.context["plaintext"]
    assert plaintext.startswith("kb_") and plaintext in response.content.decode()
    token = token_authenticate(raw=plaintext)
    assert (token.name, token.scope, token.created_by) == ("ci", "write", admin_user)
    assert [c.name for c in token.collections.all()] == ["handbook"]
    assert plaintext not in admin_client.get(LIST).content.decode()
    detail = admin_client.get(reverse("admin:kb_apitoken_change", args=[token.pk])).content.decode()
    assert plaintext not in detail and token.prefix in detail and token.key_hash not in detail


def test_a_token_needs_a_name(admin_client):
    response = admin_client.post(ADD, {"name": "", "scope": "read"})
    assert "This field is required." in response.content.decode()
    assert not ApiToken.objects.exists()


def test_the_revoke_action_revokes_through_the_service(admin_client):
    token, plaintext = token_create(name="old", scope="read")
    response = admin_client.post(LIST, {"action": "revoke", "_selected_action": [token.pk]}, follow=True)
    assert "Revoked 1 token." in [str(m) for m in response.context["messages"]]
    with pytest.raises(KBError, match="revoked"):
        token_authenticate(raw=plaintext)
    assert "revoked" in admin_client.get(LIST).content.decode()


def test_the_list_prefetches_collections(admin_client, django_assert_max_num_queries):
    collection = make_collection("handbook")
    token_create(name="t0", collections=["handbook"])
    with django_assert_max_num_queries(10) as few:
        admin_client.get(LIST)
    for n in range(1, 30):
        token_create(name=f"t{n}", collections=[collection.name])
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = admin_client.get(LIST).content.decode()
    assert page.count(">handbook<") == 30


def test_only_users_allowed_to_change_tokens_may_revoke(db):
    token, plaintext = token_create(name="kept")
    client = staff_client("viewer", ["view_apitoken"])
    assert client.get(LIST).status_code == 200
    client.post(LIST, {"action": "revoke", "_selected_action": [token.pk]})
    assert token_authenticate(raw=plaintext).pk == token.pk
    assert client.get(ADD).status_code == 403


READER = ["view_collection", "view_document", "view_chunk", "view_source", "view_syncrun"]


def test_a_curator_hands_out_no_scope_beyond_their_own_permissions(db):
    """A staff user allowed only to add tokens had minted admin tokens, which delete collections."""
    make_collection("handbook")
    only_tokens = staff_client("tokens", ["add_apitoken"])
    assert 'value="admin"' not in only_tokens.get(ADD).content.decode()
    refused = only_tokens.post(ADD, {"name": "escalate", "scope": "admin"})
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()

    reader = staff_client("reader", ["add_apitoken", *READER])
    page = reader.get(ADD).content.decode()
    assert 'value="read"' in page and 'value="write"' not in page
    assert reader.post(ADD, {"name": "mine", "scope": "write"}).status_code == 200
    assert "plaintext" in reader.post(ADD, {"name": "mine", "scope": "read"}).context
    assert list(ApiToken.objects.values_list("name", "scope")) == [("mine", "read")]

    user = User.objects.get(username="tokens")
    with pytest.raises(KBError) as refused_by_service:
        token_create(name="escalate", scope="admin", created_by=user)
    assert refused_by_service.value.code == "PERMISSION_DENIED"


def test_reading_chunks_takes_the_permission_to_view_them(db):
    """A curator without view_chunk had minted a read token, whose searches answer with chunks' text."""
    no_chunks = staff_client("no-chunks", ["add_apitoken", *(p for p in READER if p != "view_chunk")])
    assert 'value="read"' not in no_chunks.get(ADD).content.decode()
    assert no_chunks.post(ADD, {"name": "mine", "scope": "read"}).status_code == 200
    assert not ApiToken.objects.exists()


def test_collections_are_named_only_to_who_may_view_them(db):
    make_collection("secret-plans")
    token_create(name="limited", collections=["secret-plans"])
    token = ApiToken.objects.get()
    pages = (ADD, LIST, reverse("admin:kb_apitoken_change", args=[token.pk]))
    only_tokens = staff_client("tokens", ["add_apitoken", "view_apitoken", "change_apitoken"])
    for page in pages:
        response = only_tokens.get(page)
        assert response.status_code == 200 and "secret-plans" not in response.content.decode(), page
    viewer = staff_client("viewer", ["add_apitoken", "view_apitoken", "change_apitoken", "view_collection"])
    for page in pages:
        assert "secret-plans" in viewer.get(page).content.decode(), page


def test_a_token_cannot_expire_before_it_is_made(admin_client):
    response = admin_client.post(
        ADD, {"name": "old", "scope": "read", "expires_at_0": "2000-01-01", "expires_at_1": "00:00:00"}
    )
    assert "A token&#x27;s expiry must be in the future" in response.content.decode()
    assert not ApiToken.objects.exists()


def test_a_token_made_in_a_popup_still_shows_its_plaintext(admin_client):
    response = admin_client.post(ADD + "?_popup=1", {"name": "popup", "scope": "read", "_popup": "1"})
    plaintext = response.context["plaintext"]
    assert token_authenticate(raw=plaintext).name == "popup"
