from importlib import import_module

from django.db import connection

from kb.embedding_providers import MINILM_DIMENSIONS
from kb.models import EmbeddingModel
from kb.services.embedding_models import embedding_model_record_dimensions
from kb.vector_index import HNSW_EF_CONSTRUCTION, HNSW_M, hnsw_index_name


def indexdefs() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename LIKE 'kb_%'")
        return dict(cursor.fetchall())


def test_it_creates_the_vector_extension(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        version = cursor.fetchone()[0]
    assert tuple(int(part) for part in version.split(".")[:2]) >= (0, 8)


def test_it_indexes_chunk_text_with_gin(db):
    definition = indexdefs()["kb_chunk_search_vector_gin"]
    assert "USING gin (search_vector)" in definition


def test_it_has_an_hnsw_index_for_the_default_local_model(db):
    model = EmbeddingModel.objects.get(provider="local", name="all-MiniLM-L6-v2")
    definition = indexdefs()[hnsw_index_name(model)]
    assert "USING hnsw" in definition
    assert f"vector({MINILM_DIMENSIONS})" in definition
    assert f"model_id = {model.pk}" in definition


def test_it_indexes_models_of_different_dimensions_in_one_table(db):
    small = EmbeddingModel.objects.create(provider="ollama", name="tiny-3d")
    embedding_model_record_dimensions(model=small, dimensions=3)
    definition = indexdefs()[hnsw_index_name(small)]
    assert "vector(3)" in definition and f"model_id = {small.pk}" in definition
    packaged = EmbeddingModel.objects.get(provider="local", name="all-MiniLM-L6-v2")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO kb_collection (name, description, uuid, embedding_model_id, chunk_max_tokens, "
            "chunk_min_tokens, chunk_overlap_tokens, search_top_k, search_hybrid, reembed_error, created_at, updated_at) "
            "VALUES ('c', '', gen_random_uuid(), %s, 512, 50, 0, 10, true, '', now(), now()) RETURNING id",
            [small.pk],
        )
        collection_id = cursor.fetchone()[0]
        # Vectors of both dimensions side by side in the one table (no chunk rows are needed
        # for the index question, so the foreign keys are checked against nothing here).
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            "INSERT INTO kb_embedding (chunk_id, model_id, collection_id, vector, created_at) "
            "SELECT g, %s, %s, ARRAY[random(), random(), random()]::vector, now() FROM generate_series(1, 3000) g",
            [small.pk, collection_id],
        )
        cursor.execute(
            "INSERT INTO kb_embedding (chunk_id, model_id, collection_id, vector, created_at) "
            "SELECT g, %s, %s, array_fill(0.5, ARRAY[%s])::vector, now() FROM generate_series(1, 50) g",
            [packaged.pk, collection_id, packaged.dimensions],
        )
        cursor.execute("SET LOCAL session_replication_role = DEFAULT")
        cursor.execute("ANALYZE kb_embedding")
        cursor.execute(
            f"EXPLAIN SELECT id FROM kb_embedding WHERE model_id = {small.pk} "
            "ORDER BY (vector::vector(3)) <=> '[1,0,0]' LIMIT 5"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert hnsw_index_name(small) in plan


def test_child_rows_are_removed_by_database_cascades(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text, confdeltype FROM pg_constraint "
            "WHERE contype = 'f' AND conname LIKE '%%_cascade_fk'"
        )
        cascades = cursor.fetchall()
    tables = sorted(table for table, action in cascades if action == "c")
    assert tables == ["kb_chunk", "kb_chunk", "kb_document", "kb_embedding", "kb_embedding", "kb_sourceitem"]


def reloptions(index: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [index])
        return cursor.fetchone()[0]


def test_vector_indexes_are_built_with_a_well_connected_graph(db):
    model = EmbeddingModel.objects.create(provider="ollama", name="tiny-3d")
    embedding_model_record_dimensions(model=model, dimensions=3)
    assert reloptions(hnsw_index_name(model)) == [f"m={HNSW_M}", f"ef_construction={HNSW_EF_CONSTRUCTION}"]


def test_an_index_built_before_inserts_with_the_new_ef_construction_after_migration_0011(db):
    model = EmbeddingModel.objects.create(provider="ollama", name="tiny-3d", dimensions=3)
    index = hnsw_index_name(model)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE INDEX {index} ON kb_embedding USING hnsw ((vector::vector(3)) vector_cosine_ops) "
            f"WITH (m = 16, ef_construction = 64) WHERE model_id = {model.pk}"
        )
        cursor.execute(import_module("kb.migrations.0011_hnsw_ef_construction").SET_EF_CONSTRUCTION % 200)
    assert reloptions(index) == ["m=16", "ef_construction=200"]
