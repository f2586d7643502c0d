"""What `make run` starts: the database, migrations, a Celery worker and the web server.

The launcher owns every process it starts. Children run in their own sessions so that a
Ctrl-C reaches only the launcher, which then stops them in order (web, worker, database)
and waits for each. A child that dies on its own after running a while (killed, out of memory, a
crash) is started again; one that dies soon after its start (a bad setting, a broken install)
would only die again, so it brings the rest down with it.
"""

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

from config import embedded_postgres
from kb.work_lanes import INTERACTIVE_QUEUE

# Ctrl-C first asks the worker to finish its task (warm shutdown), then, past this, stops it at
# once (cold shutdown: the task is acknowledged late, so the next start embeds that document, from
# where it stopped). Short, because billiard's own stop takes 1.5 to 3 s more either way, and a
# task that ends within it is rare next to a long document that will not.
WARM_STOP_SECONDS = 1.5
STOP_TIMEOUT_SECONDS = 9.0
# A worker whose pool processes have all exited finishes in well under this, unless it hangs.
HUNG_WORKER_SECONDS = 3.5
# A child that ran at least this long before it died is started again.
RESTART_AFTER_SECONDS = 10.0
START_TIMEOUT_SECONDS = 60.0


@dataclass
class Launcher:
    host: str
    port: int
    worker_concurrency: int = 1
    say: Callable[[str], None] = print
    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    commands: dict[str, list[str]] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)
    owns_database: bool = False
    first_login: str = ""
    stopping: bool = False

    def run(self) -> int:
        signal.signal(signal.SIGINT, self._request_stop)
        signal.signal(signal.SIGTERM, self._request_stop)
        try:
            refusal = self._port_refusal()
            if refusal:
                self.say(refusal)
                return 1
            self._prepare()
            self._start_children()
            if not self._wait_until_listening():
                return self._supervise()  # a child that died says why
            self._announce()
            return self._supervise()
        finally:
            self._stop_children()
            if self.owns_database:
                embedded_postgres.stop(settings.KB_PGDATA)
                self.say("Embedded Postgres stopped.")

    def _port_refusal(self) -> str | None:
        """Before anything starts: is the address ours to take?"""
        try:
            with socket.create_server((self.host, self.port)):
                return None
        except OSError as error:
            return (
                f"Cannot listen on {self.host}:{self.port}: {error.strerror}. Another server (another "
                "`make run`?) may be using it: stop it, or choose another port with KB_PORT."
            )

    def _wait_until_listening(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline and not self.stopping:
            if any(process.poll() is not None for _name, process in self.children):
                return False
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                return True
            time.sleep(0.2)
        return False

    def _request_stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _prepare(self) -> None:
        if not settings.DATABASE_URL:
            server = embedded_postgres.ensure_running(settings.KB_PGDATA, stop_at_exit=False)
            self.owns_database = server.started_here
            self.say(f"Embedded Postgres + pgvector: {server.data_dir}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        self._ensure_superuser()

    def _ensure_superuser(self) -> None:
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME")
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        if username and password:
            users.objects.create_superuser(username, os.environ.get("DJANGO_SUPERUSER_EMAIL", ""), password)
            self.say(f"Created superuser {username!r} from DJANGO_SUPERUSER_USERNAME/PASSWORD.")
            return
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser("admin", os.environ.get("DJANGO_SUPERUSER_EMAIL", ""), password)
        # Said again once everything runs: the workers' start-up logs would scroll it away.
        self.first_login = (
            f"  login:  admin / {password} (the first superuser: shown only now; change it in the admin)\n"
        )
        self.say("Created the first superuser. It is shown only this once; change it in the admin:")
        self.say(f"    username: admin\n    password: {password}")

    def _start_children(self) -> None:
        python = sys.executable
        celery = [
            python,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
        ]
        worker = [*celery, f"--concurrency={self.worker_concurrency}"]
        # Its own process for the interactive lane: a note an agent waits for never queues
        # behind a folder import (the main worker takes both lanes).
        interactive = [*celery, "--concurrency=1", "-Q", INTERACTIVE_QUEUE, "--hostname", "interactive@%h"]
        web = [
            python, "-m", "uvicorn", "config.asgi:application", "--host", self.host, "--port", str(self.port),
            "--lifespan", "on", "--no-access-log",
        ]  # fmt: skip
        self.commands = {"worker": worker, "interactive worker": interactive, "web": web}
        self.children = [(name, self._spawn(name)) for name in self.commands]

    def _spawn(self, name: str) -> subprocess.Popen[bytes]:
        # The children read the address too: listening beyond loopback makes API tokens required.
        env = {**os.environ, "KB_HOST": self.host, "KB_PORT": str(self.port)}
        self.started_at[name] = time.monotonic()
        return subprocess.Popen(self.commands[name], cwd=settings.BASE_DIR, env=env, start_new_session=True)

    def _announce(self) -> None:
        base = f"http://{self.host}:{self.port}"
        if self.host not in ("127.0.0.1", "localhost", "::1") and os.environ.get("DJANGO_ALLOWED_HOSTS") is None:
            self.say(
                f"Listening on {self.host}, but DJANGO_ALLOWED_HOSTS is left at {','.join(settings.ALLOWED_HOSTS)}: "
                "requests naming this machine by another name or address are refused (400). "
                "Set DJANGO_ALLOWED_HOSTS to the names clients use."
            )
        self.say(
            f"\nKnowledge base running on {base}\n"
            f"  admin:  {base}/admin/\n  API:    {base}/api/docs\n  MCP:    {base}/sse  and  {base}/mcp\n"
            f"  health: {base}/health\n{self.first_login}Press Ctrl-C to stop everything.\n"
        )

    def _supervise(self) -> int:
        while not self.stopping:
            for index, (name, process) in enumerate(self.children):
                if process.poll() is None or self.stopping:
                    continue
                if time.monotonic() - self.started_at[name] < RESTART_AFTER_SECONDS:
                    self.say(f"The {name} process exited with status {process.returncode}; stopping.")
                    return process.returncode or 1
                self.say(f"The {name} process exited with status {process.returncode}; starting it again.")
                self._signal_group(process, signal.SIGKILL)  # what it left behind (a pool process)
                self.children[index] = (name, self._spawn(name))
            if self.owns_database:
                self._restart_database_if_stopped()
            time.sleep(0.2)
        return 0

    def _restart_database_if_stopped(self) -> None:
        """The embedded Postgres died (killed, out of memory): start it again. Web and worker
        reconnect by themselves; meanwhile their callers get DATABASE_ERROR at once."""
        if embedded_postgres.is_running(settings.KB_PGDATA):
            return
        self.say("The embedded Postgres stopped unexpectedly; starting it again.")
        try:
            embedded_postgres.start_again_if_stopped(settings.KB_PGDATA)
        except Exception as error:  # noqa: BLE001 - whatever pg_ctl says, the next pass tries again
            self.say(f"The embedded Postgres did not start again ({error}); trying again.")
            time.sleep(1.0)
            return
        self.say("The embedded Postgres is running again.")

    def _stop_children(self) -> None:
        # Only the leaders: they stop their own children (a pool process killed under Celery's
        # feet is reported as an ERROR "exited with signal 15").
        for _name, process in reversed(self.children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        self._cold_stop_worker(time.monotonic() + WARM_STOP_SECONDS)
        for name, process in reversed(self.children):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"The {name} process did not stop in time; killing it.")
            # Whatever the leader did, nothing of its group may outlive the launcher.
            self._signal_group(process, signal.SIGKILL)
            process.wait()
        self.children.clear()

    def _cold_stop_worker(self, deadline: float) -> None:
        busy = []
        for name, process in self.children:
            if "worker" in name:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    busy.append(process)
        if busy:
            self.say("The worker has not stopped yet; stopping it now (the next start finishes any document it had).")
        for process in busy:
            process.send_signal(signal.SIGQUIT)
        for process in busy:
            self._end_hung_worker(process)

    def _end_hung_worker(self, process: subprocess.Popen[bytes]) -> None:
        """A cold stop may leave billiard's main process waiting forever on a lock that its pool
        process held when it died. With its pool gone it has nothing left to do (an interrupted
        document is found again by the next start's sweep), so it is ended rather than waited for."""
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS - WARM_STOP_SECONDS
        pool_gone_at = None
        while process.poll() is None and time.monotonic() < deadline:
            try:
                pool = psutil.Process(process.pid).children()
            except psutil.NoSuchProcess:
                return
            if pool:
                pool_gone_at = None
            elif pool_gone_at is None:
                pool_gone_at = time.monotonic()
            elif time.monotonic() - pool_gone_at > HUNG_WORKER_SECONDS:
                self.say("The worker's pool has stopped but the worker has not; ending it.")
                self._signal_group(process, signal.SIGKILL)
                return
            time.sleep(0.1)

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
