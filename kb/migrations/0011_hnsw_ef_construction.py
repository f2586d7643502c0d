"""Existing HNSW indexes insert new vectors with ef_construction 200, as new indexes are built
(kb/vector_index.py). Vectors already in a graph keep its old links until the index is rebuilt
(``REINDEX INDEX CONCURRENTLY kb_embedding_hnsw_model_<id>``, README)."""

from django.db import migrations

SET_EF_CONSTRUCTION = """
DO $$
DECLARE index_name text;
BEGIN
    FOR index_name IN
        SELECT indexname FROM pg_indexes WHERE tablename = 'kb_embedding' AND indexname LIKE 'kb_embedding_hnsw_model_%%'
    LOOP
        EXECUTE format('ALTER INDEX %%I SET (ef_construction = %s)', index_name);
    END LOOP;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("kb", "0010_sources")]

    operations = [
        migrations.RunSQL(SET_EF_CONSTRUCTION % 200, reverse_sql=SET_EF_CONSTRUCTION % 64),
    ]
