"""``python -m tests.support.replica_probe WORD``, run with DATABASE_REPLICA_URLS set: writes a
document holding WORD through the document service, searches for it at once and counts the
statistics, then prints JSON: what the search found, how many SQL statements on our tables
each database alias ran for the reads (and for a search inside a transaction), which aliases are servers in recovery (standbys), and /health's
replica check."""

import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any


def main(word: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import DatabaseError, connections, transaction

    from kb.search import search
    from kb.selectors.health import health_report
    from kb.selectors.stats import kb_stats
    from kb.services.collections import collection_create
    from kb.services.documents import document_create_from_text

    collection = collection_create(name=f"replica-{word}")
    document_create_from_text(collection=collection, source_uri=f"note://{word}", text=f"The {word} note says hi.")
    statements: Counter[str] = Counter()
    with contextlib.ExitStack() as stack:
        for alias in settings.DATABASES:
            stack.enter_context(connections[alias].execute_wrapper(_counting(alias, statements)))
        found = [hit.source_uri for hit in search(query=word, collections=[collection.name], mode="keyword").results]
        documents = kb_stats(collection=collection.name).documents
    in_transaction: Counter[str] = Counter()  # a service that reads before it writes
    with contextlib.ExitStack() as stack, transaction.atomic():
        for alias in settings.DATABASES:
            stack.enter_context(connections[alias].execute_wrapper(_counting(alias, in_transaction)))
        search(query=word, collections=[collection.name], mode="keyword")
    recovery: dict[str, bool | None] = {}
    for alias in settings.DATABASES:
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT pg_is_in_recovery()")
                recovery[alias] = cursor.fetchone()[0]
        except DatabaseError:  # a replica that does not answer
            recovery[alias] = None
    replicas = health_report(detailed=True)["checks"]["replicas"]
    print(
        json.dumps(
            {
                "found": found,
                "documents": documents,
                "statements": statements,
                "in_transaction": in_transaction,
                "recovery": recovery,
                "health": replicas,
            }
        )
    )


def _counting(alias: str, statements: Counter[str]) -> Callable[..., Any]:
    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if "kb_" in sql:  # reads of our tables, not the routing's questions about WAL positions
            statements[alias] += 1
        return execute(sql, params, many, context)

    return wrapper


if __name__ == "__main__":
    main(sys.argv[1])
