"""Search speed at 10,000, 100,000 and 1,000,000 chunks, through the real search service.

The corpus is real, varied text available offline: Python sources, documentation and C headers
found on this machine (the packages in .venv, the standard library, /usr/share/doc,
/usr/include, and any ``--text-root``), read in a fixed shuffled order without exact duplicates
and chunked by the real ingestion pipeline (128-token chunks). Each size is its own collection,
built once and kept in var/bench, and each is a prefix of the next in that order.

Chunk vectors (``--vectors``), one model row and HNSW index per corpus and kind:
- ``real``: the packaged all-MiniLM-L6-v2 (ONNX int8), as the worker computes them; slow to
  build once (about 45 chunks/s on 2 cores);
- ``hash``: a cheap deterministic embedder (words hashed into 384 random directions, summed):
  vectors whose cosine follows shared words, for speed at sizes where real ones would take days;
- ``random``: random unit vectors, the hard case for a graph index.
Query vectors come from the same embedder, computed before timing (the service's query cache
then serves them); the embedding time per query is reported separately.

Prints, per corpus size: build times and database sizes, p50/p95 latency per mode, HNSW
recall@10 against exact search, agreement of the keyword top 10 with an exact, unpruned BM25;
``--ef-search 100 200 400`` adds recall, semantic and hybrid latency, and how much of hybrid's top
10 hybrid over an exact vector scan also returns, at each ``KB_HNSW_EF_SEARCH`` (which semantic
search widens with the index's size). ``--plot FILE`` draws
p50/p95 against corpus size (log-log; needs matplotlib, which ``make bench-search`` installs).

    .venv/bin/python bench/search.py [--sizes 10000 100000] [--vectors real|hash|random] [--queries 200]
        [--text-root DIR ...] [--ef-search EF ...] [--plot docs/search-scaling.png] [--rebuild]
"""

import argparse
import hashlib
import json
import random
import re
import sysconfig
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from common import ROOT, Timer, percentile, setup_django

SITE_PACKAGES = ROOT / ".venv" / "lib" / "python3.11" / "site-packages"
DEFAULT_TEXT_ROOTS = [
    SITE_PACKAGES,
    Path(sysconfig.get_paths()["stdlib"]),
    Path("/usr/share/doc"),
    Path("/usr/include"),
]
SUFFIXES = {".py", ".md", ".rst", ".txt", ".h"}
MODES = ("semantic", "keyword", "hybrid", "hybrid-convex", "hybrid-rrf")
DIMENSIONS = 384


def corpus_files(roots: Sequence[Path]) -> list[Path]:
    files = {
        path
        for root in roots
        for path in root.rglob("*")
        if path.suffix in SUFFIXES and path.is_file() and 200 < path.stat().st_size < 200_000
    }
    ordered = sorted(files)
    random.Random(7).shuffle(ordered)  # mix sources so any prefix is varied text
    return ordered


def distinct_sources(roots: Sequence[Path]) -> Iterator[tuple[Path, bytes]]:
    """Each file's bytes, in corpus order, skipping exact copies (the same module in two places)."""
    seen: set[bytes] = set()
    for path in corpus_files(roots):
        data = path.read_bytes()
        digest = hashlib.sha1(data).digest()
        if digest not in seen:
            seen.add(digest)
            yield path, data


class HashEmbedder:
    """Words hashed into 384 fixed random directions and summed, then normalised: the cosine of two
    vectors follows the words two texts share, as a bag-of-words model's does. Deterministic and
    thousands of times cheaper than MiniLM; for speed figures only, never for quality."""

    BUCKETS = 1 << 16
    WORD = re.compile(r"\w+")

    def __init__(self) -> None:
        import numpy as np

        self.table = np.random.default_rng(42).standard_normal((self.BUCKETS, DIMENSIONS), dtype=np.float32)

    def embed(self, texts: Sequence[str]):
        import numpy as np

        ids, lengths = [], []
        for text in texts:
            words = [zlib.crc32(word.encode()) & (self.BUCKETS - 1) for word in self.WORD.findall(text.lower())]
            ids.extend(words)
            lengths.append(len(words))
        lengths = np.array(lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        sums = np.repeat(self.table[:1], len(texts), axis=0)  # a text without words: one fixed direction
        if ids:
            sums[lengths > 0] = np.add.reduceat(self.table[ids], starts[lengths > 0])
        return sums / np.linalg.norm(sums, axis=1, keepdims=True)


def embedder(kind: str):
    from kb.embedding_providers import PACKAGED_MODEL, OnnxMiniLMEmbedder

    return HashEmbedder() if kind == "hash" else OnnxMiniLMEmbedder(PACKAGED_MODEL)


def builds_file() -> Path:
    """Build timings, kept with the corpora they describe."""
    from django.conf import settings

    return Path(settings.VAR_DIR) / "search-builds.json"


def load_builds() -> dict[str, dict[str, float]]:
    return json.loads(builds_file().read_text()) if builds_file().exists() else {}


def record_build(key: str, label: str, value: float) -> None:
    builds = load_builds()
    builds.setdefault(key, {})[label] = value
    builds_file().write_text(json.dumps(builds, indent=1))


def build(size: int, kind: str, roots: Sequence[Path], rebuild: bool) -> str:
    """The corpus of ``size`` chunks, its collection searching with vectors of ``kind``."""
    from kb.models import Collection, EmbeddingModel
    from kb.services.collections import collection_create, collection_delete
    from kb.services.embedding_models import embedding_model_record_dimensions

    name = f"speed-{size}"
    # A corpus whose ingest never finished (interrupted) has no build record: made again.
    unfinished = "chunks" not in load_builds().get(name, {})
    if (rebuild or unfinished) and Collection.objects.filter(name=name).exists():
        collection_delete(name=name, confirm=True)
        kept = {key: figures for key, figures in load_builds().items() if not key.endswith(f"-{size}")}
        builds_file().write_text(json.dumps(kept, indent=1))
    collection = Collection.objects.filter(name=name).first()
    if collection is None:
        collection = collection_create(name=name, chunk_max_tokens=128, chunk_min_tokens=32)
        _ingest(collection, size, roots)
    # A model row of its own per corpus and kind, so that each has its own HNSW index. Made
    # here, not by the service, which would refuse a local model it cannot run: the bench gives
    # it every vector, queries' included.
    model, _ = EmbeddingModel.objects.get_or_create(provider="local", name=f"bench-{kind}-{size}")
    collection.embedding_model = embedding_model_record_dimensions(model=model, dimensions=DIMENSIONS)
    collection.save(update_fields=["embedding_model"])
    if _add_vectors(collection, kind):
        _build_index(collection)
    return name


def _ingest(collection, size: int, roots: Sequence[Path]) -> None:
    from django.db import connection

    from kb.ingestion.sources import LoadedSource
    from kb.services.ingest import ingest_loaded

    chunks = text_bytes = 0
    with Timer() as timer:
        for path, data in distinct_sources(roots):
            source = LoadedSource(source_uri=path.as_uri(), data=data, filename=path.name)
            try:
                chunks += ingest_loaded(collection=collection, source=source).document.chunk_count
            except Exception:  # noqa: BLE001 - unreadable files are simply not part of the corpus
                continue
            text_bytes += len(data)
            if chunks >= size:
                break
    if chunks < size:
        print(f"  the text ran out at {chunks} chunks: add --text-root folders")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM kb_posting WHERE collection_id = %s", [collection.pk])
        postings = cursor.fetchone()[0]
    for label, value in (
        ("chunks", chunks),
        ("text (MB)", text_bytes / 1e6),
        ("BM25 postings", postings),
        ("ingest: parse, chunk, store, BM25 postings (s)", timer.seconds),
        ("ingest (chunks/s)", chunks / timer.seconds),
    ):
        record_build(collection.name, label, value)


def _add_vectors(collection, kind: str) -> bool:
    """Give every chunk a vector of the corpus's model (resumable); True when any was added."""
    from django.conf import settings
    from django.db import connection
    from tqdm import tqdm

    from kb.models import Chunk
    from kb.services.embedding_pipeline import insert_vectors, unembedded_batch
    from kb.vector_index import drop_hnsw_index

    model = collection.embedding_model
    chunks = Chunk.objects.filter(collection=collection).order_by("id")
    total = chunks.count() - model.embeddings.filter(collection=collection).count()
    if not total:
        return False
    drop_hnsw_index(model)  # built afterwards in one go, far faster than vector by vector
    with Timer() as timer:
        if kind == "random":
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
            embed = embedder(kind).embed if kind == "hash" else embedder(kind).embed_array
            settings.EMBEDDING_BATCH_SIZE = 2048 if kind == "hash" else 256
            last = 0
            with tqdm(total=total, desc=f"{kind} vectors", unit="chunk", mininterval=30) as progress:
                while batch := unembedded_batch(chunks.filter(id__gt=last), model):  # by id: no rescans
                    insert_vectors(model, [chunk_id for chunk_id, _ in batch], embed([text for _, text in batch]))
                    last = batch[-1][0]
                    progress.update(len(batch))
    record_build(model.name, f"{kind} vectors for {total} chunks (s)", timer.seconds)
    return True


def _build_index(collection) -> None:
    from django.db import connection

    from kb.vector_index import drop_hnsw_index, ensure_hnsw_index

    model = collection.embedding_model
    drop_hnsw_index(model)
    with connection.cursor() as cursor:
        # A graph that does not fit in maintenance_work_mem is built far more slowly.
        cursor.execute("SET maintenance_work_mem = '4GB'")
        with Timer() as timer:
            ensure_hnsw_index(model)
        cursor.execute("RESET maintenance_work_mem")
        for table in ("kb_posting", "kb_embedding", "kb_chunk"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    record_build(model.name, "HNSW index build (s)", timer.seconds)


def database_sizes(collection: str) -> dict[str, float]:
    """MB on disk: the whole database, the three big tables with their indexes, and the HNSW index."""
    from django.db import connection

    from kb.models import Collection
    from kb.vector_index import hnsw_index_name

    target = Collection.objects.select_related("embedding_model").get(name=collection)
    model = target.embedding_model
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_database_size(current_database()), pg_total_relation_size('kb_posting'), "
            "pg_total_relation_size('kb_chunk'), pg_total_relation_size('kb_embedding'), "
            "pg_relation_size(to_regclass(%s))",
            [hnsw_index_name(model)],
        )
        sizes = cursor.fetchone()
    labels = ("database", "kb_posting", "kb_chunk", "kb_embedding", "this corpus's HNSW index")
    return {label: (size or 0) / 1e6 for label, size in zip(labels, sizes, strict=True)}


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
    """p50 and p95 in ms; ``hybrid`` ranks by the default evidence fusion, ``hybrid-convex`` and
    ``hybrid-rrf`` by the fusions before it, as references."""
    from kb.search import search

    mode, _, fusion = mode.partition("-")
    seconds = []
    for query in queries:
        started = time.perf_counter()
        search(query=query, collections=[collection], top_k=10, mode=mode, fusion=fusion or "evidence")
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
        vector = query_embeddings.vector(model, query, [target.pk])
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


def hybrid_exact_overlap(collection: str, queries: list[str]) -> float:
    """Mean share of hybrid's top 10 that hybrid over an exact vector scan also returns.

    The exact scan is had by dropping the corpus's HNSW index inside a transaction rolled back
    afterwards. Chunks, not scores, are compared: the scores of both lists are normalised over
    their candidates, which an approximate scan changes slightly."""
    from django.db import transaction

    from kb.models import Collection
    from kb.search import search
    from kb.vector_index import drop_hnsw_index

    def top(query: str) -> set[int]:
        return {result.chunk_id for result in search(query=query, collections=[collection], top_k=10).results}

    approximate = [top(query) for query in queries]
    with transaction.atomic():
        drop_hnsw_index(Collection.objects.select_related("embedding_model").get(name=collection).embedding_model)
        exact = [top(query) for query in queries]
        transaction.set_rollback(True)
    return sum(len(found & best) / max(len(best), 1) for found, best in zip(approximate, exact, strict=True)) / len(
        queries
    )


def semantic_breadth(collection: str) -> int:
    """The hnsw.ef_search a semantic top 10 of this corpus gets (it grows with the index)."""
    from django.db import connection

    from kb.models import Collection
    from kb.vector_index import ef_search

    target = Collection.objects.select_related("embedding_model").get(name=collection)
    model = target.embedding_model
    with connection.cursor() as cursor:
        return ef_search(model, 10, cursor, ranked=True)


def embed_queries(collection: str, queries: list[str], kind: str) -> float:
    """Put the queries' vectors in the service's cache; ms per query."""
    from kb.models import Collection
    from kb.search import query_embeddings

    target = Collection.objects.select_related("embedding_model").get(name=collection)
    model = target.embedding_model
    embed = embedder(kind).embed
    embed(["warm up: load the model"])
    with Timer() as timer:
        vectors = [embed([query])[0] for query in queries]
    for query, vector in zip(queries, vectors, strict=True):
        query_embeddings.remember(model, query, [target.pk], vector)
    return timer.seconds / len(queries) * 1000


def plot(rows: list[dict], kind: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    sizes = [row["chunks"] for row in rows]
    for mode, colour in zip(MODES, ("C0", "C1", "C2", "C3", "C4"), strict=True):
        for index, (label, style) in enumerate((("p50", "-o"), ("p95", "--s"))):
            values = [row["latency"][mode][index] for row in rows]
            axes.plot(sizes, values, style, color=colour, label=f"{mode} {label}")
    axes.set(xscale="log", yscale="log", xlabel="chunks", ylabel="ms per search (query embedding excluded)")
    axes.set_title(f"Search latency against corpus size ({kind} vectors, 2 cores)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot written to {path}")


def measure(size: int, args: argparse.Namespace) -> dict:
    from django.conf import settings

    collection = build(size, args.vectors, args.text_roots, args.rebuild)
    builds = load_builds()
    figures = {**builds.get(collection, {}), **builds.get(f"bench-{args.vectors}-{size}", {})}
    print(f"corpus {collection} ({args.vectors} vectors):")
    for label, value in {**figures, **{f"{k} (MB)": v for k, v in database_sizes(collection).items()}}.items():
        print(f"  {label}: {value:,.1f}")
    queries = sample_queries(collection, args.queries)
    embed_ms = embed_queries(collection, queries, "hash" if args.vectors == "hash" else "real")
    print(f"  query embedding ({'hash' if args.vectors == 'hash' else 'MiniLM'}, excluded below): {embed_ms:.1f} ms")
    latencies = {mode: latency(collection, queries, mode) for mode in MODES}
    recall = hnsw_recall(collection, queries[:100])
    agreement = bm25_agreement(collection, queries[:100])
    for mode, (p50, p95) in latencies.items():
        print(f"  {mode:<10} p50 {p50:6.1f} ms   p95 {p95:6.1f} ms")
    print(f"  HNSW recall@10 vs exact: {recall:.3f}   keyword top-10 equal to exact BM25: {agreement:.1%}")
    for ef_search in args.ef_search or []:
        default, settings.KB_HNSW_EF_SEARCH = settings.KB_HNSW_EF_SEARCH, ef_search
        semantic, hybrid = latency(collection, queries, "semantic"), latency(collection, queries, "hybrid")
        print(
            f"  KB_HNSW_EF_SEARCH {ef_search:4d} (semantic searches {semantic_breadth(collection)} wide): recall@10 {hnsw_recall(collection, queries[:100]):.3f}   "
            f"semantic p50/p95 {semantic[0]:.1f} / {semantic[1]:.1f} ms   hybrid {hybrid[0]:.1f} / {hybrid[1]:.1f} ms   "
            f"hybrid top 10 also with exact vectors: {hybrid_exact_overlap(collection, queries[:100]):.3f}"
        )
        settings.KB_HNSW_EF_SEARCH = default
    chunks = int(figures.get("chunks", size))
    return {"chunks": chunks, "latency": latencies, "recall": recall, "agreement": agreement, "embed_ms": embed_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)  # fmt: skip
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--vectors", choices=["real", "hash", "random"], default="real", help="chunk vectors")
    parser.add_argument(
        "--text-root",
        dest="text_roots",
        type=Path,
        action="append",
        default=list(DEFAULT_TEXT_ROOTS),
        help="another folder of text for the corpus (when the default ones do not hold enough)",
    )
    parser.add_argument(
        "--ef-search",
        nargs="+",
        type=int,
        metavar="EF",
        help="also measure semantic and hybrid at these KB_HNSW_EF_SEARCH",
    )
    parser.add_argument("--plot", type=Path, help="draw p50/p95 against corpus size into this image")
    parser.add_argument("--build-only", action="store_true", help="build the corpora, measure nothing")
    args = parser.parse_args()
    setup_django()
    from django.conf import settings

    if args.build_only:
        for size in args.sizes:
            build(size, args.vectors, args.text_roots, args.rebuild)
        return

    rows = [measure(size, args) for size in args.sizes]
    print(f"\nchunk vectors: {args.vectors}; KB_HNSW_EF_SEARCH={settings.KB_HNSW_EF_SEARCH}")
    print(
        "\n| chunks | semantic p50/p95 | keyword p50/p95 | hybrid p50/p95 | hybrid, convex p50/p95 "
        "| hybrid, RRF p50/p95 | HNSW recall@10 | BM25 top-10 exact | query embedding |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        cells = " | ".join(f"{row['latency'][m][0]:.1f} / {row['latency'][m][1]:.1f} ms" for m in MODES)
        print(
            f"| {row['chunks']:,} | {cells} | {row['recall']:.3f} | {row['agreement']:.0%} | {row['embed_ms']:.1f} ms |"
        )
    if args.plot:
        plot(rows, args.vectors, args.plot)


if __name__ == "__main__":
    main()
