"""Per-model HNSW indexes over the one embeddings table.

pgvector indexes need a fixed dimension, while the table holds vectors of every model. Each
model gets a partial expression index, ``(vector::vector(D)) WHERE model_id = M``, and
searches use the same expression and predicate so the planner picks it.
"""

from django.db import connection

from kb.models import EmbeddingModel

HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64


def hnsw_index_name(model: EmbeddingModel) -> str:
    return f"kb_embedding_hnsw_model_{model.pk}"


def vector_expression(model: EmbeddingModel, alias: str = "") -> str:
    """The SQL expression the model's index is built on; queries must use the same one."""
    column = f"{alias}.vector" if alias else "vector"
    return f"({column}::vector({int(model.dimensions or 0)}))"


def ensure_hnsw_index(model: EmbeddingModel) -> None:
    if not model.dimensions:
        raise ValueError(f"{model} has no known dimensions yet")
    with connection.cursor() as cursor:
        # CREATE INDEX refuses to run while the transaction has deferred foreign-key checks
        # pending on the table: run them now, then defer again (every deferrable constraint
        # of ours is initially deferred, so this restores the default).
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {hnsw_index_name(model)} ON kb_embedding "
            f"USING hnsw ({vector_expression(model)} vector_cosine_ops) "
            f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION}) "
            f"WHERE model_id = {int(model.pk)}"
        )
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def drop_hnsw_index(model: EmbeddingModel) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {hnsw_index_name(model)}")
