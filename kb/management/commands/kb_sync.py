import argparse
import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from kb.errors import KBError
from kb.management.base import KBCommand, positive_seconds
from kb.management.progress import Progress
from kb.selectors.collections import collection_get
from kb.selectors.sources import SourceOut, SyncRunOut, source_get, source_list, sync_run_get, sync_run_latest
from kb.services.sources import source_changes, source_create, source_delete, source_update, sync_start

POLL_SECONDS = 0.5


class Command(KBCommand):
    help = (
        "Keep a collection in sync with a folder (under KB_FILE_ROOTS) or a list of URLs. A sync ingests new and "
        "changed files, leaves unchanged ones alone and removes documents whose file is gone; the Celery worker "
        "runs it, and `run` shows its progress. With --every, workers also sync the source on that schedule.\n"
        "Examples: .venv/bin/python manage.py kb_sync add handbook --collection docs --folder /srv/handbook "
        "--include '*.md'\n"
        "          .venv/bin/python manage.py kb_sync add blog --collection web "
        "--sitemap https://example.org/sitemap.xml --every 60\n"
        "          .venv/bin/python manage.py kb_sync edit handbook --include '*.md' --include '*.txt' --every 30\n"
        "          .venv/bin/python manage.py kb_sync run handbook\n"
        "          .venv/bin/python manage.py kb_sync list"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{add,edit,list,run,status,remove}")
        add = actions.add_parser("add", help="create a source")
        add.add_argument("name", help="letters, digits, '-' and '_'")
        add.add_argument("--collection", required=True)
        add.add_argument("--folder", default="", help="a folder under KB_FILE_ROOTS")
        add.add_argument("--url", action="append", default=[], dest="urls", help="an http(s) URL (repeat)")
        add.add_argument("--sitemap", default="", help="a sitemap whose page URLs are followed")
        add.add_argument("--include", action="append", default=[], help="glob a file must match (repeat)")
        add.add_argument("--exclude", action="append", default=[], help="glob of files to leave out (repeat)")
        add.add_argument("--no-recursive", action="store_true", help="leave subfolders out")
        add.add_argument("--every", type=int, metavar="MINUTES", help="sync on this schedule")
        edit = actions.add_parser(
            "edit", help="change a source (only what is given; a list given replaces the old one)"
        )
        edit.add_argument("name")
        edit.add_argument("--collection", help="move it to another collection")
        edit.add_argument("--folder", help="a folder under KB_FILE_ROOTS")
        edit.add_argument("--url", action="append", dest="urls", help="an http(s) URL (repeat)")
        edit.add_argument("--sitemap", help="a sitemap whose page URLs are followed")
        edit.add_argument("--include", action="append", help="glob a file must match (repeat)")
        edit.add_argument("--exclude", action="append", help="glob of files to leave out (repeat)")
        edit.add_argument("--no-include", action="store_const", const=[], dest="include", help="every file")
        edit.add_argument("--no-exclude", action="store_const", const=[], dest="exclude", help="leave none out")
        edit.add_argument("--recursive", action=argparse.BooleanOptionalAction, help="include subfolders")
        schedule = edit.add_mutually_exclusive_group()
        schedule.add_argument("--every", type=int, metavar="MINUTES", help="sync on this schedule")
        schedule.add_argument("--on-demand", action="store_true", help="sync only when asked")
        listing = actions.add_parser("list", help="sources with their last sync")
        listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
        run = actions.add_parser("run", help="sync a source now, with a progress bar")
        run.add_argument("name")
        run.add_argument("--no-wait", action="store_true", help="start it and print its job id")
        run.add_argument("--timeout", type=positive_seconds, default=3600.0, help="seconds to wait for it at most")
        run.add_argument("--json", action="store_true", help="print the finished run as JSON")
        status = actions.add_parser("status", help="a sync run (by job id) or a source's latest run")
        status.add_argument("name_or_job_id")
        status.add_argument("--json", action="store_true")
        remove = actions.add_parser("remove", help="stop following a source (its documents stay)")
        remove.add_argument("name")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        actions = {"add": self._add, "edit": self._edit, "list": self._list, "run": self._run, "status": self._status}
        actions.get(action, self._remove)(**options)

    def _add(self, name: str, collection: str, **options: Any) -> None:
        source = source_create(
            collection=collection_get(name=collection),
            name=name,
            folder=options["folder"],
            urls=options["urls"],
            sitemap_url=options["sitemap"],
            include=options["include"],
            exclude=options["exclude"],
            recursive=not options["no_recursive"],
            interval_minutes=options["every"],
        )
        schedule = f"every {source.interval_minutes} minutes" if source.interval_minutes else "on demand"
        self.stdout.write(f"Created source {source.name} for collection {collection} ({schedule}).")

    def _edit(self, name: str, **options: Any) -> None:
        collection = options["collection"]
        changes = source_changes(
            on_demand=options["on_demand"],
            collection=None if collection is None else collection_get(name=collection),
            folder=options["folder"],
            urls=options["urls"],
            sitemap_url=options["sitemap"],
            include=options["include"],
            exclude=options["exclude"],
            recursive=options["recursive"],
            interval_minutes=options["every"],
        )
        if not changes:
            raise CommandError("Nothing to change: give at least one option (see kb_sync edit --help)")
        source = source_update(source=source_get(name=name), **changes)
        self.stdout.write(f"Changed {', '.join(sorted(changes))} of source {source.name}; its next sync follows them.")

    def _list(self, json: bool, **options: Any) -> None:
        sources = [SourceOut.of(source) for source in source_list()]
        if json:
            self.write_json([source.model_dump(mode="json") for source in sources])
            return
        rows = [
            (s.name, s.collection, s.folder or s.sitemap_url or f"{len(s.urls)} URLs",
             f"{s.interval_minutes} min" if s.interval_minutes else "on demand", s.documents,
             s.last_run.status if s.last_run else "-", s.last_run.finished_at if s.last_run else None)
            for s in sources
        ]  # fmt: skip
        self.write_table(("NAME", "COLLECTION", "FOLLOWS", "SCHEDULE", "DOCS", "LAST RUN", "FINISHED"), rows)

    def _run(self, name: str, no_wait: bool, timeout: float, json: bool, **options: Any) -> None:
        start = sync_start(source=source_get(name=name))
        if not start.started:
            self.stdout.write(f"A sync of {name} is already {start.run.status}; following it.")
        if no_wait:
            self.stdout.write(f"Sync of {name} queued: job {start.run.pk}")
            return
        run = self._follow(start.run.pk, timeout)
        self._report(run, json)

    def _follow(self, run_id: str, timeout: float) -> SyncRunOut:
        deadline = time.monotonic() + timeout
        with Progress(self.stderr, description="syncing", unit="files") as progress:
            while True:
                run = SyncRunOut.of(sync_run_get(run_id=run_id))
                if run.status != "queued":
                    progress.update_to(run.processed, run.total or None)
                if run.done:
                    return run
                if time.monotonic() > deadline:
                    waiting = "no worker took it yet" if run.status == "queued" else "it is still running"
                    raise CommandError(
                        f"Gave up waiting after {timeout:g} s: {waiting}; it goes on without this command "
                        f"(kb_sync status {run_id})"
                    )
                time.sleep(POLL_SECONDS)

    def _status(self, name_or_job_id: str, json: bool, **options: Any) -> None:
        try:
            run = sync_run_get(run_id=name_or_job_id)
        except KBError:  # not a job id: a source's name
            try:
                source = source_get(name=name_or_job_id)
            except KBError as error:
                raise KBError(error.code, f"No sync run or source is called {name_or_job_id}") from None
            run = sync_run_latest(source=source)
        self._report(SyncRunOut.of(run), json, fail=False)

    def _report(self, run: SyncRunOut, json: bool, *, fail: bool = True) -> None:
        if json:
            self.write_json(run)
        else:
            took = f" in {run.duration_seconds:.1f} s" if run.duration_seconds is not None else ""
            self.stdout.write(f"Sync of {run.source} {run.status}{took}: {run.summary}")
            for failure in run.failures:
                self.stdout.write(f"  failed: {failure.uri}: {failure.code}: {failure.message}")
        if fail and run.status == "failed":
            raise CommandError(f"the sync of {run.source} failed: {run.error}", returncode=1)
        if fail and run.failed:
            raise CommandError(f"the sync of {run.source} finished with {run.failed} failed item(s)", returncode=1)

    def _remove(self, name: str, **options: Any) -> None:
        source_delete(source=source_get(name=name))
        self.stdout.write(f"Removed source {name}; its documents stay in the collection.")
