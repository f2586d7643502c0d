"""Rules the collection services own for every door: settings at creation, model switching,
delete confirmation, and the services never importing the Celery tasks."""

import subprocess
import sys

import pytest

from kb.errors import ErrorCode, KBError
from kb.models import MAX_TOP_K, Collection, Document
from kb.search import search
from kb.services.collections import collection_create, collection_delete, collection_update
from kb.services.documents import document_create_from_text
from kb.services.model_switch import collection_switch_model
from tests.conftest import ROOT
from tests.support.api_helpers import error_of, post


def test_search_settings_are_taken_at_creation(db):
    collection = collection_create(name="notes", search_top_k=7, search_hybrid=False)
    collection.refresh_from_db()
    assert (collection.search_top_k, collection.search_hybrid) == (7, False)


@pytest.mark.parametrize("top_k", [0, MAX_TOP_K + 1])
def test_a_search_top_k_out_of_bounds_is_refused_at_creation(db, top_k):
    with pytest.raises(KBError) as error:
        collection_create(name="notes", search_top_k=top_k)
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert not Collection.objects.exists()


def test_the_highest_top_k_is_accepted_by_search(db):
    collection_create(name="notes")
    assert search(query="anything", collections=["notes"], top_k=MAX_TOP_K).results == []


@pytest.mark.parametrize("depth", [0, 10_001])
def test_a_candidate_depth_out_of_bounds_is_refused_by_search(db, depth):
    collection_create(name="notes")
    with pytest.raises(KBError) as error:
        search(query="anything", collections=["notes"], candidate_depth=depth)
    assert error.value.code == ErrorCode.INVALID_ARGUMENT


def test_asking_for_the_model_being_switched_to_changes_nothing(db, remote_providers):
    collection = collection_create(name="notes")
    switching = collection_switch_model(collection=collection, provider="ollama", model_name="nomic-embed-text")
    switching.reembed_error = "provider busy"
    switching.save(update_fields=["reembed_error"])
    again = collection_switch_model(collection=collection, provider="ollama", model_name="nomic-embed-text")
    assert (again.next_embedding_model.provider, again.next_embedding_model.name) == ("ollama", "nomic-embed-text")
    assert Collection.objects.get(pk=collection.pk).reembed_error == "provider busy"  # not restarted


def test_asking_for_the_current_model_cancels_a_switch(db, remote_providers):
    collection = collection_create(name="notes")
    collection_switch_model(collection=collection, provider="ollama", model_name="nomic-embed-text")
    back = collection_switch_model(collection=collection, provider="local", model_name="all-MiniLM-L6-v2")
    assert back.next_embedding_model_id is None


def test_an_update_with_a_model_starts_the_switch(db, remote_providers):
    collection = collection_create(name="notes")
    updated = collection_update(collection=collection, search_top_k=5, embedding_provider="ollama")
    assert updated.search_top_k == 5
    assert (updated.next_embedding_model.provider, updated.next_embedding_model.name) == ("ollama", "nomic-embed-text")


def test_an_update_with_a_refused_model_keeps_the_old_settings(db):
    collection = collection_create(name="notes")
    with pytest.raises(KBError) as error:
        collection_update(collection=collection, search_top_k=5, embedding_model="no-such-local-model")
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert Collection.objects.get(pk=collection.pk).search_top_k == 10


def test_an_unconfirmed_delete_deletes_nothing(db):
    collection = collection_create(name="notes")
    document_create_from_text(collection=collection, text="Keep me.", source_uri="text://keep")
    with pytest.raises(KBError) as error:
        collection_delete(name="notes", confirm=False, how_to_confirm="--yes")
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert "--yes" in error.value.message
    assert Document.objects.filter(collection=collection).count() == 1


def test_an_unknown_collection_is_not_found_before_confirmation_is_asked(db):
    with pytest.raises(KBError) as error:
        collection_delete(name="missing", confirm=False)
    assert error.value.code == ErrorCode.COLLECTION_NOT_FOUND


def test_the_services_never_import_the_celery_tasks():
    """Services queue tasks by name (kb.task_queue); importing kb.tasks from them was a cycle."""
    code = (
        "import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); django.setup(); "
        "import kb.services.collections, kb.services.documents, kb.services.ingest, kb.services.model_switch, "
        "kb.services.embedding_pipeline, kb.services.uploads; print('kb.tasks' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_the_api_takes_search_settings_at_creation(db, client):
    response = post(client, "/api/collections", {"name": "notes", "search_top_k": 3, "search_hybrid": False})
    assert response.status_code == 201
    assert response.json()["settings"]["search"] == {"top_k": 3, "hybrid": False, "semantic_weight": None}


def test_the_api_refuses_a_top_k_above_the_maximum_at_creation(db, client):
    response = post(client, "/api/collections", {"name": "notes", "search_top_k": MAX_TOP_K + 1})
    assert error_of(response)[1] == "INVALID_ARGUMENT"
    assert not Collection.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_model_is_asked_of_its_provider_before_the_collection_is_locked(settings):
    """A PATCH had locked the collection, then asked the provider: every writer of the collection
    waited for as long as the provider took to answer."""
    from django.db import OperationalError, connection, transaction

    from tests.support.fake_providers import _ollama_embed, remote_collection
    from tests.support.http_server import serve

    collection = remote_collection(settings, name="probed", model="model-a")
    locked_while_asked = []

    def answer(handler, body):
        try:  # what a writer would wait for, taken at once or not at all
            with transaction.atomic():
                Collection.objects.select_for_update(nowait=True).get(pk=collection.pk)
            locked_while_asked.append(False)
        except OperationalError:  # could not obtain lock
            locked_while_asked.append(True)
        finally:
            connection.close()  # this server thread's
        return _ollama_embed(handler, body)

    with serve({"/api/embed": answer}) as ollama:
        settings.OLLAMA_HOST = ollama
        updated = collection_update(collection=collection, embedding_model="model-b", search_top_k=5)
    assert locked_while_asked == [False]
    assert (updated.next_embedding_model.name, updated.search_top_k) == ("model-b", 5)
