"""kb_ingest through call_command: progress, summary, failures and the exit status."""

import io

import pytest
from django.core.management import CommandError, call_command

from kb.models import Collection, Document, IngestRefusal
from kb.services.collections import collection_create
from tests.support.documents import write_mixed_folder

pytestmark = pytest.mark.django_db


class Terminal(io.StringIO):
    """What the command writes to when a person watches it."""

    def isatty(self) -> bool:
        return True


def ingest(*args: str, stderr: io.StringIO | None = None) -> tuple[str, str]:
    out, err = io.StringIO(), stderr or io.StringIO()
    try:
        call_command("kb_ingest", *args, stdout=out, stderr=err)
    except CommandError as error:
        error.output = (out.getvalue(), err.getvalue())  # type: ignore[attr-defined]
        raise
    return out.getvalue(), err.getvalue()


@pytest.fixture
def workdir(tmp_path, monkeypatch, settings):
    """The current directory, where the commands may read files (KB_FILE_ROOTS unset)."""
    settings.KB_FILE_ROOTS = []
    monkeypatch.chdir(tmp_path)
    write_mixed_folder(tmp_path / "docs")
    return tmp_path


def test_it_ingests_a_folder_of_mixed_files_with_a_summary(workdir, settings):
    settings.KB_INGEST_MAX_FILES = 1  # a request's limit: the operator's command reads every file
    out, _ = ingest("./docs", "--collection", "docs", "--create", "--recursive")
    assert "Collection docs: 8 created\n" in out
    assert Document.objects.filter(collection__name="docs").count() == 8


def test_without_a_terminal_progress_is_one_plain_line_per_file(workdir):
    _, err = ingest("./docs", "--collection", "docs", "--create", "--recursive")
    # No carriage returns redrawing a bar.
    assert "\r" not in err
    assert "Ingesting [8] created" in err
    assert "src/retry.py" in err


def test_a_folder_ingested_again_is_unchanged(workdir):
    ingest("./docs", "--collection", "docs", "--create", "--recursive")
    again, _ = ingest("./docs", "--collection", "docs", "--recursive")
    assert "Collection docs: 8 unchanged\n" in again


def test_folders_are_read_without_subfolders_unless_recursive(workdir):
    out, _ = ingest("docs", "--collection", "docs", "--create")
    assert "6 created" in out
    assert "add --recursive" in out


def test_a_terminal_gets_a_progress_bar(workdir):
    terminal = Terminal()
    ingest("docs", "--collection", "docs", "--create", "--recursive", stderr=terminal)
    drawn = terminal.getvalue()
    assert "\rIngesting: 8 files [" in drawn
    assert "files/s]" in drawn


@pytest.fixture
def failed_ingest(workdir) -> CommandError:
    """An ingest of a folder holding broken JSON and of a missing file."""
    (workdir / "docs" / "broken.json").write_text("{not json")
    with pytest.raises(CommandError) as failed:
        ingest("docs", "missing.md", "--collection", "docs", "--create")
    return failed.value


def test_an_ingest_with_failures_exits_with_status_1(failed_ingest):
    assert failed_ingest.returncode == 1


def test_failures_are_listed_with_their_reasons(failed_ingest):
    out, _ = failed_ingest.output
    assert "Collection docs: 6 created, 2 failed\n" in out
    assert "broken.json: LOAD_FAILED: The content is not valid JSON" in out
    assert "missing.md: LOAD_FAILED: No such file or directory" in out


@pytest.fixture
def skipped_unsupported(workdir) -> str:
    """An ingest of a folder holding three files of unsupported types and a hidden one; its output."""
    for name in ("photo.jpg", "archive.7z", "notes.xyz"):
        (workdir / "docs" / name).write_bytes(b"\x00\x01binary")
    (workdir / "docs" / ".hidden.md").write_text("# never read")
    out, _ = ingest("docs", "--collection", "docs", "--create")  # exit status 0: skipping is not failing
    return out


def test_unsupported_files_are_skipped_by_name(skipped_unsupported):
    out = skipped_unsupported
    assert "Collection docs: 6 created, 3 unsupported files skipped\n" in out
    assert "  skipped (type not supported): archive.7z, notes.xyz, photo.jpg\n" in out


def test_unsupported_files_are_recorded_as_skipped(skipped_unsupported):
    refused = IngestRefusal.objects.filter(collection__name="docs")
    assert sorted(uri.rsplit("/", 1)[-1] for uri in refused.values_list("source_uri", flat=True)) == [
        "archive.7z", "notes.xyz", "photo.jpg"
    ]  # fmt: skip
    assert all(refusal.skipped for refusal in refused)


def test_unsupported_files_are_kept_for_the_dashboard(skipped_unsupported, client, admin_user):
    client.force_login(admin_user)
    page = client.get("/admin/").content.decode()
    assert "Files not ingested" in page and "photo.jpg" in page and "type not supported" in page


def test_paths_outside_the_allowed_roots_fail(workdir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "secret.md").write_text("# Secret")
    with pytest.raises(CommandError) as failed:
        ingest(str(elsewhere / "secret.md"), "--collection", "docs", "--create")
    assert "INVALID_URI" in failed.value.output[0]


def test_an_unknown_collection_needs_create(workdir):
    with pytest.raises(CommandError, match="COLLECTION_NOT_FOUND: Collection not found: docs"):
        ingest("docs", "--collection", "docs")
    assert not Collection.objects.exists()


def test_a_content_type_override_applies_to_a_uri(workdir):
    collection_create(name="code")
    out, _ = ingest("data:,fn main() {}", "--collection", "code", "--content-type", "rust")
    assert "1 created" in out
    assert Document.objects.get().content_type == "rust"


def test_waiting_without_a_worker_gives_up_with_a_hint(workdir):
    with pytest.raises(CommandError, match="Is a Celery worker running"):
        ingest("docs/guide.md", "--collection", "docs", "--create", "--wait", "--timeout", "1")
