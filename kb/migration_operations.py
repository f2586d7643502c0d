"""Migration operations that need more than Django's built-ins."""

from typing import Any

from django.db import migrations
from pgvector.django import VectorExtension


class CreatePgvectorExtension(VectorExtension):
    """``CREATE EXTENSION vector``, with a clear message when the server lacks pgvector."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
            available = cursor.fetchone() is not None
        if not available:
            settings_dict = schema_editor.connection.settings_dict
            where = f"{settings_dict.get('HOST') or 'localhost'}:{settings_dict.get('PORT') or 5432}"
            raise RuntimeError(
                f"The PostgreSQL server at {where} does not have the pgvector extension, which the knowledge "
                "base needs for embeddings. Install pgvector on that server (for example the "
                "pgvector/pgvector Docker image, or the postgresql-<version>-pgvector package), or unset "
                "DATABASE_URL to use the embedded PostgreSQL that ships with pgvector."
            )
        super().database_forwards(app_label, schema_editor, from_state, to_state)


def cascade_foreign_key(table: str, column: str, target: str) -> migrations.RunSQL:
    """A foreign key that the database enforces and cascades (Django's collector is bypassed)."""
    name = f"{table}_{column}_cascade_fk"
    return migrations.RunSQL(
        f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({column}) REFERENCES {target}(id) ON DELETE CASCADE",
        f"ALTER TABLE {table} DROP CONSTRAINT {name}",
    )
