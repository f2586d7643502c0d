"""What a search is restricted to: the collections named, and filters on their documents.

Filters fail closed: an unknown collection is an error, an empty list of documents matches
nothing, an unknown operator is INVALID_ARGUMENT.
"""

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db import connections
from django.db.models.expressions import Col

from kb.errors import ErrorCode, KBError
from kb.ingestion.formats import CONTENT_TYPES
from kb.models import Collection, EmbeddingModel
from kb.replicas import read_connection

METADATA_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in")
MAX_FILTER_CONDITIONS = 32
MAX_FILTER_VALUES = 1000
# Document ids a search may be limited to (each is a value of one ANY(...) array).
MAX_FILTER_DOCUMENTS = 10_000


@dataclass(frozen=True)
class Filters:
    """Restrictions on the chunks searched; every one narrows, none widens."""

    collection_ids: tuple[int, ...]
    document_ids: tuple[str, ...] | None = None
    content_types: tuple[str, ...] | None = None
    metadata: tuple[tuple[str, str, Any], ...] = ()

    def within(self, collection_ids: Sequence[int]) -> "Filters":
        """The same document filters over some of the collections (those of one embedding model)."""
        return replace(self, collection_ids=tuple(collection_ids))

    @property
    def narrows_documents(self) -> bool:
        return self.document_ids is not None or self.content_types is not None or bool(self.metadata)

    def sql(self, document_alias: str) -> tuple[str, list[Any]]:
        """A WHERE fragment over kb_document (aliased) for the document-level filters."""
        clauses, params = ["TRUE"], []
        if self.document_ids is not None:
            clauses.append(f"{document_alias}.id = ANY(%s)")
            params.append(list(self.document_ids))
        if self.content_types is not None:
            clauses.append(f"{document_alias}.content_type = ANY(%s)")
            params.append(list(self.content_types))
        for key, operator, value in self.metadata:
            clause, clause_params = _metadata_clause(f"{document_alias}.metadata", key, operator, value)
            clauses.append(clause)
            params.extend(clause_params)
        return " AND ".join(clauses), params


def target_collections(names: Sequence[str] | None) -> list[Collection]:
    if names is None:
        return list(Collection.objects.select_related("embedding_model").order_by("pk"))
    names = [names] if isinstance(names, str) else list(names)
    found = {collection.name: collection for collection in _named_collections(names)}
    missing = [name for name in names if name not in found]
    if missing:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {', '.join(missing)}")
    return [found[name] for name in dict.fromkeys(names)]


def _named_collections(names: list[str]) -> list[Collection]:
    """The named collections, each with its embedding model, by a statement written once: the ORM
    compiled this query anew for every search, about 1.5 ms of CPU (README, Many clients at once)."""
    connection = read_connection()
    statement, converters = _named_collections_statement(connection.alias)
    with connection.cursor() as cursor:
        cursor.execute(statement, [names])
        rows = cursor.fetchall()
    own = len(Collection._meta.concrete_fields)
    found = []
    for row in rows:
        values = list(row)
        for position, column, column_converters in converters:  # as the ORM converts what it reads
            for converter in column_converters:
                values[position] = converter(values[position], column, connection)
        collection = Collection.from_db(connection.alias, None, values[:own])
        collection.embedding_model = EmbeddingModel.from_db(connection.alias, None, values[own:])
        found.append(collection)
    return found


@functools.cache
def _named_collections_statement(alias: str) -> tuple[str, list[tuple[int, Col, list[Callable]]]]:
    """The statement, and each column's converters (none for today's fields, but a field added
    later gets its own, as the ORM would apply them)."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    fields = [*Collection._meta.concrete_fields, *EmbeddingModel._meta.concrete_fields]
    columns = [field.get_col(field.model._meta.db_table) for field in fields]
    converters = [
        (position, column, found)
        for position, column in enumerate(columns)
        if (found := [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)])
    ]
    collections, models = quote(Collection._meta.db_table), quote(EmbeddingModel._meta.db_table)
    key = quote(Collection._meta.get_field("embedding_model").column)
    statement = (
        f"SELECT {', '.join(f'{quote(c.alias)}.{quote(c.target.column)}' for c in columns)} "
        f"FROM {collections} JOIN {models} ON {models}.id = {collections}.{key} WHERE {collections}.name = ANY(%s)"
    )
    return statement, converters


def checked_content_types(content_types: Sequence[str]) -> list[str]:
    unknown = [kind for kind in content_types if kind not in CONTENT_TYPES]
    if unknown:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Unknown content type(s) in filter: {', '.join(unknown)}")
    return list(dict.fromkeys(content_types))  # each once: the SQL compares every chunk with the list


def parse_metadata_filter(metadata: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """``{"author": "Smith", "year": {"$gte": 2020}, "lang": {"$in": ["en", "de"]}}``."""
    if not isinstance(metadata, dict):
        raise KBError(ErrorCode.INVALID_ARGUMENT, "The metadata filter must be an object")
    conditions = []
    for key, condition in metadata.items():
        if not isinstance(key, str) or not key:
            raise KBError(ErrorCode.INVALID_ARGUMENT, "Metadata filter keys must be non-empty strings")
        if key.startswith("$"):  # $or, $and, $not... read as a field name, they had matched nothing
            raise KBError(
                ErrorCode.INVALID_ARGUMENT,
                f"{key!r} is not a field: a filter's fields all hold together (AND), and operators "
                f"({', '.join(METADATA_OPERATORS)}) go inside a field's condition",
            )
        operators = condition if isinstance(condition, dict) else {"$eq": condition}
        if not operators:
            raise KBError(ErrorCode.INVALID_ARGUMENT, f"The filter on {key!r} has no condition")
        for operator, value in operators.items():
            if operator not in METADATA_OPERATORS:
                raise KBError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Unknown filter operator {operator!r} on {key!r}; use one of {', '.join(METADATA_OPERATORS)}",
                )
            if operator == "$in" and not isinstance(value, list):
                raise KBError(ErrorCode.INVALID_ARGUMENT, f"$in on {key!r} needs a list")
            if operator in ("$gt", "$gte", "$lt", "$lte") and (
                isinstance(value, bool) or not isinstance(value, int | float | str)
            ):
                raise KBError(ErrorCode.INVALID_ARGUMENT, f"{operator} on {key!r} needs a number or a string")
            conditions.append((key, operator, value))
    if len(conditions) > MAX_FILTER_CONDITIONS or sum(_values(value) for *_, value in conditions) > MAX_FILTER_VALUES:
        # Each condition is a clause of the vector scan's filter: thousands of them cost Postgres
        # gigabytes of memory per query.
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"The metadata filter is too large: at most {MAX_FILTER_CONDITIONS} conditions "
            f"and {MAX_FILTER_VALUES} values in all",
        )
    return conditions


def _values(value: Any) -> int:
    return len(value) if isinstance(value, list) else 1


def _metadata_clause(column: str, key: str, operator: str, value: Any) -> tuple[str, list[Any]]:
    field = f"({column} -> %s)"
    if operator == "$eq":
        return f"{field} = %s::jsonb", [key, json.dumps(value)]
    if operator == "$ne":
        return f"({field} IS NOT NULL AND {field} <> %s::jsonb)", [key, key, json.dumps(value)]
    if operator == "$in":
        return f"{field} = ANY(%s::jsonb[])", [key, [json.dumps(item) for item in value]]
    comparison = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}[operator]
    if isinstance(value, str):  # strings (ISO dates too) compare as text, and only with strings
        return (
            f"(jsonb_typeof({field}) = 'string' AND ({column} ->> %s) {comparison} %s)",
            [key, key, value],
        )
    return (
        f"(jsonb_typeof({field}) = 'number' AND ({column} ->> %s)::numeric {comparison} %s)",
        [key, key, value],
    )
