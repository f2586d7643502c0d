"""A curator's first session, in a real browser against the real server and a real worker:
log in, create a collection, upload three files, watch them turn ready without reloading,
and find the right document first in the search playground.

Debian's Chromium (package ``chromium``) is driven by Playwright; no browser is downloaded.
Screenshots go to test-output/screenshots/; with KB_UPDATE_DOCS_SCREENSHOTS=1 they are also
copied to docs/screenshots/ for the README.
"""

import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from tests.conftest import ROOT

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path(os.environ.get("KB_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = ROOT / "test-output" / "screenshots"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
PASSWORD = "a curator's long passphrase"
# How long the worker may take for three small files, loading the local model included.
READY_TIMEOUT_MS = 150_000

FILES = {
    "onboarding.md": "# Onboarding\n\nOn your first day you receive a laptop and a door badge.\n\n"
    "## Accounts\n\nIT creates your email account and adds you to the team calendar.\n",
    "travel-expenses.md": "# Travel expenses\n\nKeep every receipt. Submit hotel, train and taxi receipts within "
    "30 days of the trip to be reimbursed.\n\n## Per diem\n\nMeals on the road are covered by a daily allowance.\n",
    "security.txt": "Security rules\n\nUse a password manager, turn on two-factor authentication and lock "
    "your screen when you leave your desk.\n",
}
QUERY = "how do I get my train and hotel receipts reimbursed"
EXPECTED_FIRST = "Travel expenses"


@pytest.fixture
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: install Debian's browser with "
            "`apt-get install chromium` (`make test` does it when run as root), "
            "or point KB_TEST_CHROMIUM at a Chromium binary."
        )
    return CHROMIUM


@pytest.fixture
def static_files(settings) -> None:
    """The ASGI host serves /static/ from STATIC_ROOT: the admin's CSS and our status script."""
    call_command("collectstatic", "--noinput", verbosity=0)
    assert (Path(settings.STATIC_ROOT) / "kb" / "status.js").exists()


@pytest.fixture
def curator() -> User:
    return User.objects.create_superuser("curator", "curator@example.org", PASSWORD)


def test_a_curator_watches_uploaded_files_become_ready_then_finds_them(
    chromium_path, static_files, curator, celery_worker, live_server_url
):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Playwright's sync API runs an event loop in its thread; in a thread of its own it leaves
    # this one free of it, where Django's ORM (fixtures, database teardown) refuses to run.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(curator_session, chromium_path, live_server_url, celery_worker).result()
    if os.environ.get("KB_UPDATE_DOCS_SCREENSHOTS") == "1":
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for name in ("dashboard.png", "documents.png", "playground.png"):
            shutil.copyfile(SCREENSHOTS / name, DOCS_SCREENSHOTS / name)


@contextmanager
def browser_page(chromium_path: Path, *, failure_shot: str) -> Iterator[Any]:
    """A page of a headless Chromium; a screenshot named ``failure_shot`` if the block fails."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium_path), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        try:
            yield page
        except Exception:
            page.screenshot(path=SCREENSHOTS / failure_shot, full_page=True)
            raise
        finally:
            browser.close()


def curator_session(chromium_path: Path, base: str, worker) -> None:
    from playwright.sync_api import expect

    with browser_page(chromium_path, failure_shot="failure.png") as page:
        log_in(page, base)
        create_collection(page, base)
        upload_files(page, base)
        watch_documents_become_ready(page, expect, worker)
        page.screenshot(path=SCREENSHOTS / "documents.png", full_page=True)
        search_in_playground(page, base, expect)
        page.screenshot(path=SCREENSHOTS / "playground.png", full_page=True)
        page.goto(f"{base}/admin/")
        expect(page.locator("#kb-dashboard")).to_be_visible()
        expect(page.locator("[data-kb-queue=pending]")).to_have_text("0")
        page.screenshot(path=SCREENSHOTS / "dashboard.png", full_page=True)


def log_in(page, base: str) -> None:
    page.goto(f"{base}/admin/")
    page.fill("#id_username", "curator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#kb-dashboard")
    # The stylesheet came from /static/: the badges and cards are styled, not raw HTML.
    assert page.evaluate("getComputedStyle(document.querySelector('.kb-cards')).display") == "flex"


def create_collection(page, base: str) -> None:
    page.goto(f"{base}/admin/kb/collection/add/")
    page.fill("#id_name", "handbook")
    page.fill("#id_description", "The staff handbook")
    # The model field follows the provider's default (kb/collection_form.js), unless one was typed.
    model = page.locator("#id_embedding_model_name")
    assert model.input_value() == "all-MiniLM-L6-v2"
    page.select_option("#id_embedding_provider", "ollama")
    assert model.input_value() == "nomic-embed-text"
    page.select_option("#id_embedding_provider", "openai")
    assert model.input_value() == "text-embedding-3-small"
    model.fill("my-own-model")
    page.select_option("#id_embedding_provider", "ollama")
    assert model.input_value() == "my-own-model"
    model.fill("")
    page.select_option("#id_embedding_provider", "local")  # blank: the provider's default again
    assert model.input_value() == "all-MiniLM-L6-v2"
    page.click("input[name=_save]")
    page.wait_for_selector("text=was added successfully")


def upload_files(page, base: str) -> None:
    page.goto(f"{base}/admin/kb/document/add/")
    page.select_option("#id_upload-collection", label="handbook")
    page.set_input_files(
        "#id_upload-files",
        [{"name": name, "mimeType": "text/plain", "buffer": text.encode()} for name, text in FILES.items()],
    )
    page.click("#kb-upload-form input[type=submit]")
    page.wait_for_url("**/admin/kb/document/?collection__id__exact=*")
    for name in FILES:
        assert page.get_by_text(f"Created: {name}").is_visible()


def watch_documents_become_ready(page, expect, worker) -> None:
    badges = page.locator("#result_list [data-kb-doc]")
    expect(badges).to_have_count(3)
    initially_ready = page.locator('#result_list [data-kb-status="ready"]').count()
    assert initially_ready < 3, "the documents were ready before the page showed them: nothing to watch"
    # A marker on the window survives only if the page is never reloaded.
    page.evaluate("window.kbSamePage = true")
    try:
        expect(page.locator('#result_list [data-kb-status="ready"]')).to_have_count(3, timeout=READY_TIMEOUT_MS)
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- worker log ---\n{worker.log()[-4000:]}") from None
    assert page.evaluate("window.kbSamePage") is True
    expect(page.locator("#result_list .kb-status-ready").first).to_have_text("Ready")
    progress = page.locator("#result_list .kb-progress-text").all_inner_texts()
    assert all(text.split(" / ")[0] == text.split(" / ")[1] != "0" for text in progress), progress


def search_in_playground(page, base: str, expect) -> None:
    page.goto(f"{base}/admin/kb/chunk/playground/")
    page.fill("#id_q", QUERY)
    page.check("input[name=collections][value=handbook]")
    page.check("input[name=mode][value=hybrid]")
    page.click("#kb-playground-form input[type=submit]")
    first = page.locator(".kb-result").first
    expect(first).to_be_visible(timeout=60_000)
    expect(first.locator("h3 a").first).to_have_text(EXPECTED_FIRST)
    expect(first.locator("mark").first).to_be_visible()
    assert first.locator(".kb-scores dd").nth(3).inner_text() != "—"  # found by vector search too


@pytest.fixture
def followed_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder under KB_FILE_ROOTS for the server and the worker (set before they start)."""
    folder = tmp_path / "policies"
    (folder / "drafts").mkdir(parents=True)
    (folder / "leave.md").write_text("# Leave\n\nAsk your manager for leave two weeks ahead.\n")
    (folder / "remote.md").write_text("# Remote work\n\nRemote work is allowed two days a week.\n")
    (folder / "drafts" / "bonus.md").write_text("# Bonus\n\nNot decided yet.\n")
    monkeypatch.setenv("KB_FILE_ROOTS", str(tmp_path))
    return folder


def test_a_curator_makes_a_collection_follow_a_folder_and_syncs_it_now(
    chromium_path, static_files, curator, followed_folder, celery_worker, live_server_url
):
    from kb.models import Document
    from kb.services.collections import collection_create

    collection_create(name="policies")
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(follow_folder_session, chromium_path, live_server_url, followed_folder).result()
    uris = set(Document.objects.filter(collection__name="policies").values_list("source_uri", flat=True))
    assert uris == {(followed_folder / "leave.md").as_uri(), (followed_folder / "remote.md").as_uri()}


def follow_folder_session(chromium_path: Path, base: str, folder: Path) -> None:
    from playwright.sync_api import expect

    with browser_page(chromium_path, failure_shot="failure-source.png") as page:
        log_in(page, base)
        page.goto(f"{base}/admin/kb/source/add/")
        page.fill("#id_name", "policies-folder")
        page.select_option("#id_collection", label="policies")
        page.fill("#id_folder", str(folder))
        page.fill("#id_exclude", "drafts/*")
        page.click("input[name=_continue]")
        page.wait_for_selector("text=was added successfully")
        page.click("button:has-text('Sync now')")
        expect(page.get_by_text("Sync started for 1 source")).to_be_visible()
        for _ in range(60):  # the worker runs it; the runs table under the source shows how it went
            if page.locator("td.field-status", has_text="Succeeded").count():
                break
            page.wait_for_timeout(1000)
            page.reload()
        expect(page.locator("td.field-status").first).to_have_text("Succeeded")
        expect(page.locator("td.field-added").first).to_have_text("2")
        page.screenshot(path=SCREENSHOTS / "source.png", full_page=True)
