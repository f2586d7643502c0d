"""Reads on streaming replicas (DATABASE_REPLICA_URLS), with every write already visible.

Search and the read-only selectors run inside ``replica_reads()``: the block reads from one replica,
chosen at its start, that has replayed everything the primary had flushed when the block began,
so a write that returned before a search is always found by it, whoever wrote it and whichever
web process serves the search. A replica that has not caught up within KB_REPLICA_MAX_WAIT_MS, or
does not answer, is passed over; one that did not answer is left alone for
RETRY_DOWN_REPLICA_SECONDS, so that reads do not each wait for its connect timeout. With none left
the block reads from the primary. Inside a transaction on the primary (a service that reads
before it writes) reads stay on the primary.

Everything else (services, the worker, the admin's writes, migrations) uses the primary only:
``ReplicaRouter`` sends an ORM read to a replica only inside ``replica_reads()``.
"""

import contextlib
import contextvars
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger(__name__)

REPLICA_ALIAS_PREFIX = "replica_"
# How often a replica's replay position is asked for while waiting for it to catch up.
CATCH_UP_POLL_SECONDS = 0.002
# A replica that failed is left alone this long, so that reads do not each wait for its connect timeout.
RETRY_DOWN_REPLICA_SECONDS = 10.0

_read_alias: contextvars.ContextVar[str | None] = contextvars.ContextVar("kb_read_alias", default=None)
_turns = itertools.count()
_down_until: dict[str, float] = {}  # per process: alias -> monotonic time to try it again

P = ParamSpec("P")
R = TypeVar("R")


def replica_aliases() -> list[str]:
    return [alias for alias in settings.DATABASES if alias.startswith(REPLICA_ALIAS_PREFIX)]


class ReplicaRouter:
    """ORM reads go where ``replica_reads()`` says; writes and migrations to the primary."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        return _read_alias.get()

    def db_for_write(self, model: type, **hints: Any) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True  # every alias holds the same database

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == DEFAULT_DB_ALIAS


@contextlib.contextmanager
def replica_reads() -> Iterator[str]:
    """Read from a caught-up replica (or the primary) until the block ends; yields the alias."""
    alias = _read_alias.get()
    if alias is not None:  # nested: keep the outer block's choice, one snapshot source
        yield alias
        return
    token = _read_alias.set(_choose())
    try:
        yield _read_alias.get() or DEFAULT_DB_ALIAS
    finally:
        _read_alias.reset(token)


def reads_from_replica(function: Callable[P, R]) -> Callable[P, R]:
    """Run a read-only selector inside ``replica_reads()``."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with replica_reads():
            return function(*args, **kwargs)

    return wrapper


def read_connection() -> BaseDatabaseWrapper:
    """The connection raw-SQL reads use: the block's replica, else the primary."""
    return connections[_read_alias.get() or DEFAULT_DB_ALIAS]


@contextlib.contextmanager
def read_snapshot() -> Iterator[BaseDatabaseWrapper]:
    """A transaction on the read connection in which every statement sees one snapshot (REPEATABLE
    READ), for reads made of several statements: a document replaced meanwhile is seen whole, as it
    was before or as it is after, never its old chunk ids ranked and then found gone. Under READ
    COMMITTED each statement would see the commits made since the one before. Inside a
    transaction already open (a service that reads before it writes) it joins that one."""
    connection = read_connection()
    outermost = not connection.in_atomic_block
    with transaction.atomic(using=connection.alias):
        if outermost:  # must be the transaction's first statement
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield connection


def _choose() -> str:
    replicas = replica_aliases()
    if not replicas or connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return DEFAULT_DB_ALIAS
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_flush_lsn()::text")
        flushed = cursor.fetchone()[0]
    start = next(_turns)
    deadline = time.monotonic() + settings.KB_REPLICA_MAX_WAIT_MS / 1000
    for offset in range(len(replicas)):  # round robin, so replicas share the reads
        alias = replicas[(start + offset) % len(replicas)]
        if _down_until.get(alias, 0.0) > time.monotonic():
            continue
        if _caught_up(alias, flushed, deadline):
            return alias
    return DEFAULT_DB_ALIAS


def _caught_up(alias: str, lsn: str, deadline: float) -> bool:
    """Whether replica ``alias`` has replayed up to ``lsn``, waiting for it until ``deadline``."""
    try:
        with connections[alias].cursor() as cursor:
            while True:
                cursor.execute("SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn])
                standby, caught_up = cursor.fetchone()
                if not standby:
                    logger.warning("%s is not a streaming replica (not in recovery); not reading from it", alias)
                    return False
                if caught_up:
                    return True
                if time.monotonic() >= deadline:
                    logger.info("replica %s is behind the primary; reading from the primary", alias)
                    return False
                time.sleep(CATCH_UP_POLL_SECONDS)
    except DatabaseError as error:
        logger.warning(
            "replica %s is unavailable (%s); reading elsewhere for %.0f s", alias, error, RETRY_DOWN_REPLICA_SECONDS
        )
        connections[alias].close()
        _down_until[alias] = time.monotonic() + RETRY_DOWN_REPLICA_SECONDS
        return False
