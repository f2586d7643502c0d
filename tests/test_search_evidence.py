"""Evidence fusion, hybrid search's default order: the cosine's surprise against the collection's
background plus BM25 on its log-odds scale, checked against a brute-force ranking of every chunk."""

import math
import random

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from kb.embedding_providers import embed_query
from kb.models import Collection, Embedding
from kb.search import background, fusion, search, service
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from tests.support.worker import embed_now
from tests.test_search import (  # noqa: F401 (corpus: the fixture of a small collection)
    assert_looking_up_contenders_is_looking_up_all,
    corpus,
    reference_bm25,
)

WORDS = {
    "flight": "wing lift drag airfoil stall thrust rudder aileron fuselage propeller turbine glide altitude",
    "kitchen": "dough bread oven flour yeast butter sugar knead bake crust simmer garlic onion",
    "money": "bond equity dividend interest loan credit bank inflation market broker yield asset ledger",
    "music": "violin chord melody rhythm tempo piano orchestra harmony scale sonata drum choir lyric",
    "health": "fever vaccine virus cell blood heart doctor clinic therapy dose patient tissue nerve",
    "sport": "goal referee striker keeper match league tennis racket sprint marathon coach stadium trophy",
}
QUERIES = [
    "propeller thrust at low altitude",
    "bake bread with yeast",
    "bank loan interest",
    "violin melody",
    "vaccine dose for a patient",
    "marathon coach",
    "stall",
    "a warm loaf from the oven",
]


@pytest.fixture
def wide(db):
    """Six documents of many short paragraphs: more chunks than MIN_BACKGROUND_CHUNKS."""
    chosen = random.Random(7)
    collection = collection_create(name="wide", chunk_max_tokens=24, chunk_min_tokens=4)
    for topic, words in WORDS.items():
        vocabulary = words.split()
        paragraphs = [" ".join(chosen.choices(vocabulary, k=12)) + "." for _ in range(40)]
        stored = document_create_from_text(
            collection=collection, source_uri=f"note://{topic}", text="\n\n".join(paragraphs), title=topic
        )
        embed_now(stored.document.pk)
    return collection


def brute_force_top(collection: Collection, query: str, weight: float, top_k: int) -> list[int]:
    """Every chunk of the collection by evidence, from its stored vector and a naive BM25."""
    rows = Embedding.objects.filter(collection=collection, model=collection.embedding_model)
    chunk_ids = list(rows.values_list("chunk_id", flat=True))
    vectors = np.array(list(rows.values_list("vector", flat=True)), dtype=np.float64)
    units = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    model = collection.embedding_model
    vector = np.array(embed_query(model.provider, model.name, query), dtype=np.float64)
    vector /= np.linalg.norm(vector)
    mean = float(vector @ units.mean(axis=0))
    deviation = math.sqrt(float(vector @ np.cov(units.T, bias=True) @ vector))
    bm25 = reference_bm25(query, collection.pk)
    k1 = django_settings.KB_BM25_K1

    def evidence(position: int) -> float:
        z = (float(units[position] @ vector) - mean) / deviation
        surprise = -math.log(0.5 * math.erfc(z / math.sqrt(2)))
        return weight * surprise + (1 - weight) * (1 + k1) * bm25.get(chunk_ids[position], 0.0)

    ranked = sorted(range(len(chunk_ids)), key=lambda position: -evidence(position))
    return [chunk_ids[position] for position in ranked[:top_k]]


def test_hybrid_ranks_a_collection_with_a_background_by_evidence_in_nats(wide):
    assert Embedding.objects.filter(collection=wide).count() >= background.MIN_BACKGROUND_CHUNKS
    differs_from_convex = 0
    for query in QUERIES:
        response = search(query=query, collections=["wide"], top_k=8)
        expected = brute_force_top(wide, query, response.semantic_weight, 8)
        assert [result.chunk_id for result in response.results] == expected, query
        scores = [result.score for result in response.results]
        assert scores == sorted(scores, reverse=True) and all(0.0 <= score <= 1.0 for score in scores)
        convex = search(query=query, collections=["wide"], top_k=8, fusion="convex")
        differs_from_convex += [r.chunk_id for r in convex.results] != expected
    assert differs_from_convex >= 1  # the two orders are not the same rule


@pytest.mark.parametrize("top_k", [1, 3, 8])
def test_evidence_looking_up_only_candidates_that_can_reach_the_top_ranks_as_if_it_looked_up_all(
    wide, monkeypatch, top_k
):
    monkeypatch.setattr(service, "MIN_CANDIDATE_DEPTH", 12)  # short, full lists: the bounds are used
    assert_looking_up_contenders_is_looking_up_all(monkeypatch, "wide", QUERIES, top_k)


def test_a_collection_too_small_for_a_background_ranks_by_the_convex_score(corpus):  # noqa: F811
    collection, _ = corpus
    with CaptureQueriesContext(connection) as statements:
        assert background.backgrounds.of(collection.embedding_model, [collection.pk], chunks=6) is None
    assert len(statements) == 0
    for query in [*QUERIES, "shock wave temperature of the flow"]:
        default = search(query=query, collections=["aero"], top_k=6)
        convex = search(query=query, collections=["aero"], top_k=6, fusion="convex")
        assert [(r.chunk_id, r.score) for r in default.results] == [(r.chunk_id, r.score) for r in convex.results]


def test_a_background_is_sampled_once_and_again_when_the_collection_has_grown_by_a_tenth(wide):
    model, ids = wide.embedding_model, [wide.pk]
    chunks = float(Embedding.objects.filter(collection=wide).count())
    cache = background.Backgrounds(4)
    with CaptureQueriesContext(connection) as first:
        sampled = cache.of(model, ids, chunks)
    with CaptureQueriesContext(connection) as again:
        assert cache.of(model, ids, chunks * 1.05) is sampled
    with CaptureQueriesContext(connection) as grown:
        assert cache.of(model, ids, chunks * 1.2) is not sampled
    assert (len(first) >= 1, len(again), len(grown) >= 1) == (True, 0, True)


def test_the_background_of_a_collection_of_fewer_chunks_than_the_sample_is_exact(wide):
    rows = Embedding.objects.filter(collection=wide, model=wide.embedding_model)
    vectors = np.array(list(rows.values_list("vector", flat=True)), dtype=np.float64)
    units = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    found = background.Backgrounds(1).of(wide.embedding_model, [wide.pk], float(len(units)))
    query = np.random.default_rng(3).standard_normal(units.shape[1])
    query /= np.linalg.norm(query)
    mean, deviation = found.spread(query * 5.0)  # any length: the query's direction counts
    cosines = units @ query
    assert (mean, deviation) == (pytest.approx(cosines.mean(), abs=1e-9), pytest.approx(cosines.std(), rel=1e-4))


def test_a_collection_that_is_a_large_part_of_the_table_is_sampled_by_blocks(wide, monkeypatch):
    monkeypatch.setattr(background, "SAMPLE_SIZE", 40)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE kb_embedding")  # reltuples known: the choice of the two reads needs it
    chunks = float(Embedding.objects.filter(collection=wide).count())
    with CaptureQueriesContext(connection) as statements:
        vectors = background.sampled_vectors(wide.embedding_model, [wide.pk], chunks)
    assert any("TABLESAMPLE SYSTEM" in statement["sql"] for statement in statements)
    stored = np.array(
        list(Embedding.objects.filter(collection=wide).values_list("vector", flat=True)), dtype=np.float64
    )
    nearest = [np.abs(stored - vector).max(axis=1).min() for vector in vectors]  # each is a stored vector, whole
    assert 0 < len(vectors) <= 40 and max(nearest) < 1e-7


def test_evidence_takes_each_missing_half_at_its_cap():
    evidence = fusion.Evidence(weight=0.7, mean=0.1, deviation=0.05)
    k1 = django_settings.KB_BM25_K1

    def expected(cosine: float, bm25: float) -> float:
        surprise = -math.log(0.5 * math.erfc((cosine - 0.1) / 0.05 / math.sqrt(2)))
        return 0.7 * surprise + 0.3 * (1 + k1) * bm25

    values = evidence.of_each([1, 2, 3], {1: 0.4, 2: 0.3}, {1: 2.0, 3: 1.5}, similarity_cap=0.35, bm25_cap=0.5)
    assert values == {
        1: pytest.approx(expected(0.4, 2.0)),
        2: pytest.approx(expected(0.3, 0.5)),
        3: pytest.approx(expected(0.35, 1.5)),
    }


def test_the_surprise_of_a_far_cosine_follows_its_asymptote_without_a_jump():
    below, above = fusion._surprise(24.999), fusion._surprise(25.0)
    assert 0 < above - below < 0.03 and fusion._surprise(60.0) > fusion._surprise(59.0) > above
