from django.conf import settings
from django.core.management.base import CommandParser

from kb.launcher import Launcher
from kb.management.base import ExamplesInHelp


class Command(ExamplesInHelp):
    help = (
        "Start the whole knowledge base: embedded Postgres (unless DATABASE_URL is set), migrations, "
        "a Celery worker and the web server (admin, API, MCP). Ctrl-C stops everything.\n"
        "Example: .venv/bin/python manage.py kb_run --port 8001"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.KB_HOST, help="address to listen on (KB_HOST)")
        parser.add_argument("--port", type=int, default=settings.KB_PORT, help="port to listen on (KB_PORT)")
        parser.add_argument("--worker-concurrency", type=int, default=1, help="Celery worker processes")

    def handle(self, *args: object, host: str, port: int, worker_concurrency: int, **options: object) -> None:
        launcher = Launcher(host=host, port=port, worker_concurrency=worker_concurrency, say=self._say)
        code = launcher.run()
        if code:
            raise SystemExit(code)

    def _say(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()
