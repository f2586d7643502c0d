import pytest

from kb.errors import ErrorCode, KBError
from kb.models import Collection
from kb.services.collections import collection_create, collection_delete, collection_update
from kb.services.sources import source_create, source_delete, source_update, sync_start


def test_it_creates_a_collection_with_the_seed_defaults(db):
    collection = collection_create(name="code", description="Source code")
    assert (collection.chunk_max_tokens, collection.chunk_min_tokens, collection.chunk_overlap_tokens) == (512, 50, 0)
    assert collection.embedding_model.name == "all-MiniLM-L6-v2"
    assert collection.uuid is not None


@pytest.mark.parametrize("name", ["has space", "dots.not.allowed", "", "ünï", "a/b", "x" * 101])
def test_it_refuses_invalid_names(db, name):
    with pytest.raises(KBError) as error:
        collection_create(name=name)
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert not Collection.objects.exists()


def test_names_are_case_sensitive(db):
    collection_create(name="Docs")
    collection_create(name="docs")
    assert Collection.objects.count() == 2


def test_a_duplicate_name_is_collection_exists(db):
    collection_create(name="docs")
    with pytest.raises(KBError) as error:
        collection_create(name="docs")
    assert error.value.code == ErrorCode.COLLECTION_EXISTS
    assert error.value.http_status == 409


def test_deleting_an_unknown_collection_is_collection_not_found(db):
    with pytest.raises(KBError) as error:
        collection_delete(name="missing", confirm=True)
    assert error.value.code == ErrorCode.COLLECTION_NOT_FOUND


@pytest.mark.parametrize(
    "settings",
    [{"chunk_max_tokens": 8}, {"chunk_min_tokens": 600}, {"chunk_overlap_tokens": 400}, {"semantic_weight": 1.5}],
)
def test_it_refuses_inconsistent_settings(db, settings):
    with pytest.raises(KBError) as error:
        collection_create(name="docs", **settings)
    assert error.value.code == ErrorCode.INVALID_ARGUMENT


def test_it_updates_settings(db):
    collection = collection_create(name="docs")
    collection_update(collection=collection, chunk_max_tokens=256, semantic_weight=0.7, description="new")
    collection.refresh_from_db()
    assert (collection.chunk_max_tokens, collection.semantic_weight, collection.description) == (256, 0.7, "new")


def test_a_provider_switch_that_keeps_another_providers_default_takes_its_own(db, remote_providers):
    created = collection_create(name="switched", embedding_provider="ollama", embedding_model="all-MiniLM-L6-v2")
    assert (created.embedding_model.provider, created.embedding_model.name) == ("ollama", "nomic-embed-text")
    unnamed = collection_create(name="unnamed", embedding_provider="openai")
    assert unnamed.embedding_model.name == "text-embedding-3-small"
    named = collection_create(name="named", embedding_provider="ollama", embedding_model="mxbai-embed-large")
    assert named.embedding_model.name == "mxbai-embed-large"


def test_a_description_longer_than_the_limit_is_refused(db, settings):
    # Every listing carries every description: 3 MB ones made a listing 30 MB.
    settings.KB_MAX_DESCRIPTION_CHARS = 100
    with pytest.raises(KBError) as created:
        collection_create(name="long", description="d" * 101)
    assert created.value.code == ErrorCode.INVALID_ARGUMENT and "KB_MAX_DESCRIPTION_CHARS" in created.value.message
    collection = collection_create(name="short", description="d" * 100)
    with pytest.raises(KBError) as updated:
        collection_update(collection=collection, description="d" * 101)
    assert updated.value.code == ErrorCode.INVALID_ARGUMENT
    assert Collection.objects.get(name="short").description == "d" * 100
    assert not Collection.objects.filter(name="long").exists()


def test_changing_a_collection_deleted_since_it_was_found_is_collection_not_found(db):
    """A PATCH racing a DELETE had answered 500 with Django's HTML page (Collection.DoesNotExist)."""
    found = collection_create(name="brief")
    collection_delete(name="brief", confirm=True)
    with pytest.raises(KBError) as refused:
        collection_update(collection=found, search_top_k=5)
    assert refused.value.code == ErrorCode.COLLECTION_NOT_FOUND


def test_editing_or_syncing_a_source_deleted_since_it_was_found_is_not_found(db, tmp_path, settings):
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    found = source_create(collection=collection_create(name="followed"), name="docs", folder=str(tmp_path))
    source_delete(source=found)
    for change in (lambda: source_update(source=found, interval_minutes=5), lambda: sync_start(source=found)):
        with pytest.raises(KBError) as refused:
            change()
        assert refused.value.code == ErrorCode.NOT_FOUND
