"""kb_search, kb_collections, kb_stats, kb_reembed, kb_delete and kb_token through call_command."""

import io
import json

import pytest
from django.core.management import CommandError, call_command, load_command_class

from kb.models import ApiToken, Collection, Document
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.model_switch import collection_reembed_failed, collection_switch_model
from kb.services.tokens import token_authenticate
from tests.support.documents import MARKDOWN, PYTHON
from tests.support.worker import embed_now

pytestmark = pytest.mark.django_db

COMMANDS = ["kb_ingest", "kb_search", "kb_collections", "kb_stats", "kb_reembed", "kb_delete", "kb_token", "kb_sync"]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def library():
    docs = collection_create(name="docs", description="Guides")
    code = collection_create(name="code")
    guide = document_create_from_text(
        collection=docs, source_uri="file:///guide.md", text=MARKDOWN, content_type="markdown"
    )
    retry = document_create_from_text(
        collection=code, source_uri="file:///retry.py", text=PYTHON, content_type="python"
    )
    return {"guide": embed_now(guide.document.pk), "retry": embed_now(retry.document.pk)}


@pytest.mark.parametrize("name", [*COMMANDS, "kb_run", "mcp_stdio"])
def test_the_help_of_each_command_explains_it_with_an_example(name):
    command = load_command_class("mcp_endpoint" if name == "mcp_stdio" else "kb", name)
    text = command.create_parser("manage.py", name).format_help()
    assert "\nExample" in text  # on a line of its own, as written
    assert f"python manage.py {name} " in command.help


def test_kb_search_prints_each_ranked_result_with_its_score_source_lines(library):
    out = run("kb_search", "upgrade one replica at a time", "--collection", "docs", "--top-k", "2")
    first = out.splitlines()[0]
    assert first.startswith(" 1. score ")
    assert "[docs] file:///guide.md  lines " in first
    assert "Upgrade one replica at a time" in out


def test_kb_search_shows_control_characters_of_stored_text_as_escapes():
    """A note holding ESC sequences had retitled, cleared and hidden the operator's terminal."""
    notes = collection_create(name="notes")
    hostile = "Harbour note \x1b]0;PWNED\x07\x1b[2J\x1b[8mhidden words\r\x9b31m end"
    document_create_from_text(collection=notes, source_uri="note://x\x1b[31m", text=hostile)
    out = run("kb_search", "harbour note", "--collection", "notes", "--mode", "keyword")
    assert "Harbour note" in out
    assert not any(character in out for character in "\x1b\x07\r\x9b")
    assert "\\x1b]0;PWNED\\x07\\x1b[2J" in out


def test_kb_search_json_is_the_apis_search_response(library, client):
    out = run("kb_search", "Backoff delay", "--mode", "keyword", "--json")
    body = json.loads(out)
    assert body["results"][0]["source_uri"] == "file:///retry.py"
    api = client.post(
        "/api/search", {"query": "Backoff delay", "mode": "keyword"}, content_type="application/json"
    ).json()
    assert body == api


def test_kb_search_json_answers_an_error_with_the_apis_error_body(library, client):
    out = io.StringIO()
    with pytest.raises(CommandError, match="COLLECTION_NOT_FOUND"):
        call_command("kb_search", "x", "--collection", "nope", "--json", stdout=out)
    api = client.post("/api/search", {"query": "x", "collections": ["nope"]}, content_type="application/json")
    assert json.loads(out.getvalue()) == api.json()


def test_kb_search_errors_exit_non_zero(library):
    with pytest.raises(CommandError, match="COLLECTION_NOT_FOUND"):
        run("kb_search", "x", "--collection", "nope")
    assert "No results." in run("kb_search", "zzzqqq", "--mode", "keyword")


def test_kb_collections_lists_collections_as_a_table(library):
    table = run("kb_collections", "list")
    header, _, docs_row = table.splitlines()
    assert header.split()[:3] == ["NAME", "DOCS", "READY"]
    assert docs_row.split()[:3] == ["docs", "1", "1"]


def test_kb_collections_lists_collections_as_json(library):
    listed = json.loads(run("kb_collections", "list", "--json"))
    assert [c["name"] for c in listed["collections"]] == ["code", "docs"]


def test_kb_collections_creates_a_collection(library):
    assert "Created collection notes" in run(
        "kb_collections", "create", "notes", "--description", "N", "--chunk-max-tokens", "256"
    )
    assert Collection.objects.get(name="notes").chunk_max_tokens == 256


def test_kb_collections_refuses_to_create_an_existing_name(library):
    with pytest.raises(CommandError, match="COLLECTION_EXISTS"):
        run("kb_collections", "create", "docs")


def test_kb_collections_deletes_only_with_yes(library):
    with pytest.raises(CommandError, match="--yes"):
        run("kb_collections", "delete", "docs")
    assert Collection.objects.filter(name="docs").exists()


def test_kb_collections_deletes_a_collection(library):
    assert "Deleted collection docs with 1 documents" in run("kb_collections", "delete", "docs", "--yes")
    assert not Collection.objects.filter(name="docs").exists()


def test_kb_stats_prints_counts_or_json(library):
    text = run("kb_stats")
    assert "All collections" in text
    assert any(line.split() == ["documents", "2"] for line in text.splitlines())
    one = json.loads(run("kb_stats", "--collection", "code", "--json"))
    assert (one["documents"], one["filter"]) == (1, "code")
    with pytest.raises(CommandError, match="COLLECTION_NOT_FOUND"):
        run("kb_stats", "--collection", "nope")


def test_kb_reembed_switches_the_model_in_the_background(library, remote_providers):
    out = run("kb_reembed", "--collection", "docs", "--provider", "ollama", "--model", "nomic-embed-text")
    assert "Collection docs: re-embedding with ollama:nomic-embed-text, 16d: 0 of " in out
    assert Collection.objects.get(name="docs").next_embedding_model.name == "nomic-embed-text"
    back = run("kb_reembed", "--collection", "docs", "--model", "all-MiniLM-L6-v2")
    assert "uses local:all-MiniLM-L6-v2, 384d: nothing to re-embed" in back
    with pytest.raises(CommandError, match="INVALID_ARGUMENT"):
        run("kb_reembed", "--collection", "docs", "--model", "no-such-model")


@pytest.fixture
def stopped_switch(library, remote_providers):
    """The "docs" collection's switch to another model, stopped."""
    docs = Collection.objects.get(name="docs")
    collection_switch_model(collection=docs, provider="ollama", model_name="fake-embed")
    collection_reembed_failed(collection_id=docs.pk, reason="Ollama refused the request: gone", stopped=True)


def test_kb_reembed_status_reports_a_stopped_switch(stopped_switch):
    status = run("kb_reembed", "--collection", "docs", "--status")
    assert "stopped: Ollama refused the request: gone (retry or cancel it" in status


def test_kb_reembed_waiting_on_a_stopped_switch_fails(stopped_switch):
    with pytest.raises(CommandError, match="stopped: Ollama refused the request: gone"):
        run("kb_reembed", "--collection", "docs", "--status", "--wait")


def test_kb_reembed_retries_a_stopped_switch(stopped_switch):
    assert "re-embedding with ollama:fake-embed, 16d: 0 of" in run("kb_reembed", "--collection", "docs", "--retry")
    assert Collection.objects.get(name="docs").reembed_stopped_at is None


def test_kb_reembed_cancels_a_stopped_switch(stopped_switch):
    cancelled = run("kb_reembed", "--collection", "docs", "--cancel")
    assert cancelled.strip() == "Re-embedding cancelled: docs stays on local:all-MiniLM-L6-v2, 384d."


def test_kb_reembed_refuses_to_retry_what_is_not_being_re_embedded(library):
    with pytest.raises(CommandError, match=r"INVALID_ARGUMENT.*not being re-embedded"):
        run("kb_reembed", "--collection", "docs", "--retry")


def test_kb_delete_deletes_a_document(library):
    guide = library["guide"]
    assert f"Deleted {guide.pk} (file:///guide.md) from docs." in run("kb_delete", guide.pk)
    assert not Document.objects.filter(pk=guide.pk).exists()


def test_kb_delete_of_an_unknown_id_exits_1_deleting_the_known_ones(library):
    with pytest.raises(CommandError) as failed:
        run("kb_delete", "01HRE4KXQN8Z3J2X5Y7A9B4C6D", library["guide"].pk, library["retry"].pk)
    assert failed.value.returncode == 1
    assert not Document.objects.exists()


def create_ci_token() -> str:
    return run("kb_token", "create", "ci", "--scope", "write", "--collection", "docs", "--expires-days", "30").strip()


def test_kb_token_creates_a_token(library):
    token = token_authenticate(raw=create_ci_token())
    assert (token.name, token.scope, [c.name for c in token.collections.all()]) == ("ci", "write", ["docs"])
    assert token.expires_at is not None


def test_kb_token_lists_tokens_without_their_secret(library):
    raw = create_ci_token()
    token = token_authenticate(raw=raw)
    table = run("kb_token", "list")
    assert token.prefix in table and "docs" in table and "active" in table
    assert raw not in table


def test_kb_token_revokes_a_token(library):
    token = token_authenticate(raw=create_ci_token())
    assert f"Revoked token {token.prefix}" in run("kb_token", "revoke", token.prefix)
    assert ApiToken.objects.get().revoked_at is not None
    assert "revoked" in run("kb_token", "list")


def test_kb_token_refuses_a_token_for_an_unknown_collection(library):
    with pytest.raises(CommandError, match="COLLECTION_NOT_FOUND"):
        run("kb_token", "create", "bad", "--collection", "nope")


@pytest.mark.parametrize("name", ["a\x00b", "n" * 101])
def test_kb_token_refuses_a_name_the_database_cannot_hold(library, name):
    with pytest.raises(CommandError, match="INVALID_ARGUMENT"):
        run("kb_token", "create", name)
    assert not ApiToken.objects.exists()


def test_kb_token_refuses_to_revoke_an_unknown_prefix(library):
    with pytest.raises(CommandError, match="INVALID_ARGUMENT"):
        run("kb_token", "revoke", "00000000")


@pytest.mark.parametrize(("command", "first"), [(("kb_collections", "list"), "NAME"), (("kb_token", "list"), "PREFIX")])
def test_an_empty_listing_is_its_header(command, first):
    """A fresh install's first listing had raised TypeError (max() of one number)."""
    lines = run(*command).splitlines()
    assert len(lines) == 1 and lines[0].split()[0] == first


def test_kb_token_refuses_an_expiry_past_a_century(library):
    """A date past year 9999 had been an OverflowError traceback."""
    with pytest.raises(CommandError, match="--expires-days must be between 1 and 36500"):
        run("kb_token", "create", "far", "--expires-days", "99999999")
    assert not ApiToken.objects.exists()
