"""The BM25 index: postings and statistics kept by the database in the chunks' transaction.

Terms are the lexemes of each chunk's ``search_vector`` (Postgres' English configuration:
Snowball stemming, stop words removed). Statement-level triggers with transition tables
maintain, for every chunk inserted or deleted:

- ``kb_posting``: one row per (collection, term, chunk) with the term frequency and the chunk's
  length in terms, so a query reads only index entries (covering index);
- ``kb_term_stats``: document frequency per (collection, term);
- ``kb_collection_stats``: chunk count and total length per collection (for the average).

Every process reads the same index; a deleted chunk's postings go with it (cascade).
Counters are updated in (collection, term) order so concurrent ingests cannot deadlock.
"""

from django.db import migrations

CREATE = r"""
CREATE TABLE kb_posting (
    collection_id bigint NOT NULL,
    term text NOT NULL,
    chunk_id bigint NOT NULL REFERENCES kb_chunk(id) ON DELETE CASCADE,
    tf integer NOT NULL,
    chunk_length integer NOT NULL
);
CREATE UNIQUE INDEX kb_posting_term_chunk ON kb_posting (collection_id, term, chunk_id) INCLUDE (tf, chunk_length);
CREATE INDEX kb_posting_chunk ON kb_posting (chunk_id);

CREATE TABLE kb_term_stats (
    collection_id bigint NOT NULL REFERENCES kb_collection(id) ON DELETE CASCADE,
    term text NOT NULL,
    df integer NOT NULL,
    PRIMARY KEY (collection_id, term)
);

CREATE TABLE kb_collection_stats (
    collection_id bigint PRIMARY KEY REFERENCES kb_collection(id) ON DELETE CASCADE,
    chunk_count bigint NOT NULL,
    total_length bigint NOT NULL
);

CREATE FUNCTION kb_chunks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH terms AS (
        SELECT c.id, c.collection_id, t.lexeme, coalesce(array_length(t.positions, 1), 1) AS tf
        FROM new_chunks c, unnest(c.search_vector) AS t
    ), lengths AS (
        SELECT id, sum(tf) AS chunk_length FROM terms GROUP BY id
    )
    INSERT INTO kb_posting (collection_id, term, chunk_id, tf, chunk_length)
    SELECT t.collection_id, t.lexeme, t.id, t.tf, l.chunk_length
    FROM terms t JOIN lengths l USING (id);

    INSERT INTO kb_term_stats AS s (collection_id, term, df)
    SELECT c.collection_id, t.lexeme, count(*)
    FROM new_chunks c, unnest(c.search_vector) AS t
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (collection_id, term) DO UPDATE SET df = s.df + excluded.df;

    INSERT INTO kb_collection_stats AS s (collection_id, chunk_count, total_length)
    SELECT c.collection_id, count(*),
           coalesce(sum((SELECT sum(coalesce(array_length(t.positions, 1), 1)) FROM unnest(c.search_vector) t)), 0)
    FROM new_chunks c
    GROUP BY 1 ORDER BY 1
    ON CONFLICT (collection_id) DO UPDATE
        SET chunk_count = s.chunk_count + excluded.chunk_count, total_length = s.total_length + excluded.total_length;
    RETURN NULL;
END $$;

CREATE FUNCTION kb_chunks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Lock the counters in a fixed order, then decrement; rows of a collection being deleted
    -- are already gone (cascade) and are simply not found.
    PERFORM 1 FROM kb_term_stats s
    WHERE (s.collection_id, s.term) IN (
        SELECT c.collection_id, t.lexeme FROM old_chunks c, unnest(c.search_vector) AS t
    )
    ORDER BY s.collection_id, s.term FOR UPDATE;

    UPDATE kb_term_stats s SET df = s.df - d.n
    FROM (
        SELECT c.collection_id, t.lexeme AS term, count(*) AS n
        FROM old_chunks c, unnest(c.search_vector) AS t GROUP BY 1, 2
    ) d
    WHERE s.collection_id = d.collection_id AND s.term = d.term;

    DELETE FROM kb_term_stats s
    WHERE s.df <= 0 AND s.collection_id IN (SELECT DISTINCT collection_id FROM old_chunks);

    UPDATE kb_collection_stats s
    SET chunk_count = s.chunk_count - d.n, total_length = s.total_length - d.total
    FROM (
        SELECT c.collection_id, count(*) AS n,
               coalesce(sum((SELECT sum(coalesce(array_length(t.positions, 1), 1)) FROM unnest(c.search_vector) t)), 0) AS total
        FROM old_chunks c GROUP BY 1
    ) d
    WHERE s.collection_id = d.collection_id;
    RETURN NULL;
END $$;

CREATE TRIGGER kb_chunks_inserted AFTER INSERT ON kb_chunk
    REFERENCING NEW TABLE AS new_chunks FOR EACH STATEMENT EXECUTE FUNCTION kb_chunks_inserted();
CREATE TRIGGER kb_chunks_deleted AFTER DELETE ON kb_chunk
    REFERENCING OLD TABLE AS old_chunks FOR EACH STATEMENT EXECUTE FUNCTION kb_chunks_deleted();

-- Chunks are replaced, never edited: an UPDATE of their text would bypass the index.
CREATE FUNCTION kb_chunk_text_is_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'chunk text is immutable; replace the chunk instead';
END $$;
CREATE TRIGGER kb_chunk_text_is_immutable BEFORE UPDATE OF content ON kb_chunk
    FOR EACH ROW WHEN (OLD.content IS DISTINCT FROM NEW.content) EXECUTE FUNCTION kb_chunk_text_is_immutable();
"""

DROP = """
DROP TRIGGER kb_chunk_text_is_immutable ON kb_chunk;
DROP FUNCTION kb_chunk_text_is_immutable();
DROP TRIGGER kb_chunks_deleted ON kb_chunk;
DROP TRIGGER kb_chunks_inserted ON kb_chunk;
DROP FUNCTION kb_chunks_deleted();
DROP FUNCTION kb_chunks_inserted();
DROP TABLE kb_collection_stats;
DROP TABLE kb_term_stats;
DROP TABLE kb_posting;
"""


class Migration(migrations.Migration):
    dependencies = [("kb", "0001_initial")]

    operations = [migrations.RunSQL(CREATE, DROP)]
