"""Evidence fusion, hybrid search's default order: the cosine's surprise against the collection's
background plus BM25 on its log-odds scale, checked against a brute-force ranking of every chunk."""

import math
import random
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from kb.embedding_providers import embed_query
from kb.models import Collection, CollectionStats, Embedding, EmbeddingModel
from kb.search import background, fusion, search, service
from kb.search.background import Background
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


def test_a_background_is_sampled_once_and_again_when_the_collection_has_grown_by_a_tenth_or_aged(wide, monkeypatch):
    model, ids = wide.embedding_model, [wide.pk]
    cache = background.Backgrounds(background.CACHE_BYTES)

    def statements_of_a_search() -> int:
        chunks = CollectionStats.objects.get(collection=wide).chunk_count  # as KeywordQuery reads it
        with CaptureQueriesContext(connection) as statements:
            assert cache.of(model, ids, float(chunks)) is not None
        return len(statements)

    counts = [statements_of_a_search(), statements_of_a_search()]
    paragraphs = [" ".join(random.Random(n).choices(WORDS["music"].split(), k=12)) + "." for n in range(40)]
    stored = document_create_from_text(collection=wide, source_uri="note://more", text="\n\n".join(paragraphs))
    embed_now(stored.document.pk)
    counts += [statements_of_a_search(), statements_of_a_search()]
    monkeypatch.setattr(background, "MAX_AGE_SECONDS", 0.0)
    counts.append(statements_of_a_search())
    assert [count > 0 for count in counts] == [True, False, True, False, True]


class SlowSampling:
    """The real sampled_vectors, counted, held until ``release`` is set; the first call fails
    with ``first_fails``."""

    def __init__(self, *, first_fails: bool = False) -> None:
        self.calls = 0
        self.first_fails = first_fails
        self.started, self.release = threading.Event(), threading.Event()
        self._real = background.sampled_vectors

    def __call__(self, model: EmbeddingModel, collection_id: int) -> tuple[float, np.ndarray]:
        self.calls += 1
        self.started.set()
        assert self.release.wait(30)
        if self.first_fails and self.calls == 1:
            raise OperationalError("the sample's statement failed")
        return self._real(model, collection_id)


class Searches:
    """Backgrounds looked up in threads, each on a database connection of its own (closed after)."""

    def __init__(self, count: int, work: Callable[[], Background | None]) -> None:
        self.results: list[Background | Exception | None] = [None] * count
        self.threads = [threading.Thread(target=self._run, args=(work, n)) for n in range(count)]
        for thread in self.threads:
            thread.start()

    def _run(self, work: Callable[[], Background | None], position: int) -> None:
        try:
            self.results[position] = work()
        except Exception as error:  # noqa: BLE001 - kept for the test to see
            self.results[position] = error
        finally:
            connection.close()

    def finished(self) -> list[Background | Exception | None]:
        for thread in self.threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in self.threads)
        return self.results


def test_searches_that_find_no_background_wait_for_one_sample_of_it(wide, transactional_db, monkeypatch):
    sampling = SlowSampling()
    monkeypatch.setattr(background, "sampled_vectors", sampling)
    cache, chunks = background.Backgrounds(background.CACHE_BYTES), float(Embedding.objects.count())
    searches = Searches(6, lambda: cache.of(wide.embedding_model, [wide.pk], chunks))
    assert sampling.started.wait(30)
    time.sleep(0.3)  # the other five reach the cache meanwhile
    sampling.release.set()
    found = searches.finished()
    assert sampling.calls == 1 and len({id(background.parts[0]) for background in found}) == 1


def test_when_the_first_sample_fails_one_of_the_searches_waiting_takes_it_for_all(wide, transactional_db, monkeypatch):
    sampling = SlowSampling(first_fails=True)
    monkeypatch.setattr(background, "sampled_vectors", sampling)
    cache, chunks = background.Backgrounds(background.CACHE_BYTES), float(Embedding.objects.count())
    searches = Searches(4, lambda: cache.of(wide.embedding_model, [wide.pk], chunks))
    assert sampling.started.wait(30)
    time.sleep(0.3)
    sampling.release.set()
    found = searches.finished()
    failed = [result for result in found if isinstance(result, OperationalError)]
    served = [result.parts[0] for result in found if isinstance(result, Background)]
    assert sampling.calls == 2 and len(failed) == 1 and len(served) == 3 and len({id(part) for part in served}) == 1


def test_a_search_ranks_by_the_aged_background_while_another_samples_it_again(wide, transactional_db, monkeypatch):
    model, chunks = wide.embedding_model, float(Embedding.objects.count())
    assert chunks < background.SAMPLE_SIZE  # a whole sample: aged after MAX_AGE_SECONDS, not sooner
    cache = background.Backgrounds(background.CACHE_BYTES)
    aged = cache.of(model, [wide.pk], chunks).parts[0]
    monkeypatch.setattr(background, "MAX_AGE_SECONDS", 0.0)
    sampling = SlowSampling()
    monkeypatch.setattr(background, "sampled_vectors", sampling)
    searches = Searches(1, lambda: cache.of(model, [wide.pk], chunks))
    assert sampling.started.wait(30)
    with CaptureQueriesContext(connection) as statements:
        meanwhile = cache.of(model, [wide.pk], chunks)
    sampling.release.set()
    [sampled] = searches.finished()
    assert meanwhile.parts[0] is aged and len(statements) == 0 and sampling.calls == 1
    assert sampled.parts[0] is not aged


def test_a_search_waits_for_another_ones_first_sample_only_so_long(wide, transactional_db, monkeypatch):
    monkeypatch.setattr(background, "SAMPLE_WAIT_SECONDS", 0.2)
    sampling = SlowSampling()
    monkeypatch.setattr(background, "sampled_vectors", sampling)
    cache, chunks = background.Backgrounds(background.CACHE_BYTES), float(Embedding.objects.count())
    searches = Searches(1, lambda: cache.of(wide.embedding_model, [wide.pk], chunks))
    assert sampling.started.wait(30)
    waiting = cache.of(wide.embedding_model, [wide.pk], chunks)
    sampling.release.set()
    [sampled] = searches.finished()
    assert waiting is None and isinstance(sampled, Background) and sampling.calls == 1


def unit_vectors(*collections: Collection) -> np.ndarray:
    rows = Embedding.objects.filter(collection__in=collections)
    vectors = np.array(list(rows.values_list("vector", flat=True)), dtype=np.float64)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_the_background_of_collections_of_fewer_chunks_than_the_sample_is_exact_alone_and_together(
    wide,
    corpus,  # noqa: F811
):
    aero = corpus[0]
    query = np.random.default_rng(3).standard_normal(384)
    query /= np.linalg.norm(query)
    cache = background.Backgrounds(background.CACHE_BYTES)
    for members in ([wide], [wide, aero]):
        units = unit_vectors(*members)  # one chunk, one vector: the chunk counts weigh as the vectors do
        found = cache.of(wide.embedding_model, [c.pk for c in members], float(len(units)))
        mean, deviation = found.spread(query * 5.0)  # any length: the query's direction counts
        cosines = units @ query
        assert (mean, deviation) == (pytest.approx(cosines.mean(), abs=1e-9), pytest.approx(cosines.std(), rel=1e-4))


def test_a_collection_counts_in_the_background_by_its_chunks_that_have_a_vector(wide):
    waiting = collection_create(name="waiting", chunk_max_tokens=24, chunk_min_tokens=4)
    for name, count, embedded in (("few", 12, True), ("waiting", 300, False)):
        paragraphs = [" ".join(random.Random(n).choices(WORDS["sport"].split(), k=12)) + "." for n in range(count)]
        stored = document_create_from_text(
            collection=waiting, source_uri=f"note://{name}", text="\n\n".join(paragraphs)
        )
        if embedded:
            embed_now(stored.document.pk)
    stats = {s.collection_id: s.chunk_count for s in CollectionStats.objects.filter(collection__in=[wide, waiting])}
    assert stats[waiting.pk] > stats[wide.pk] > Embedding.objects.filter(collection=waiting).count() > 0
    cache = background.Backgrounds(background.CACHE_BYTES)
    together = cache.of(wide.embedding_model, [wide.pk, waiting.pk], float(sum(stats.values())))
    query = np.random.default_rng(5).standard_normal(384)
    cosines = unit_vectors(wide, waiting) @ (query / np.linalg.norm(query))  # every vector there is, once
    assert together.spread(query) == (pytest.approx(cosines.mean(), abs=1e-9), pytest.approx(cosines.std(), rel=1e-4))


def test_a_search_of_more_collections_than_the_cache_holds_ranks_by_the_convex_score(wide, corpus):  # noqa: F811
    one_entry = 384 * 384 * 4
    cache = background.Backgrounds(one_entry)
    with CaptureQueriesContext(connection) as statements:
        assert cache.of(wide.embedding_model, [wide.pk, corpus[0].pk], 1000.0) is None
    assert len(statements) == 0 and cache.of(wide.embedding_model, [wide.pk], 240.0) is not None


@pytest.mark.parametrize("by_blocks", [False, True])
def test_a_sample_is_of_whole_stored_vectors_and_the_same_in_every_process(wide, monkeypatch, by_blocks):
    monkeypatch.setattr(background, "SAMPLE_SIZE", 40)
    if by_blocks:  # reltuples known and the collection most of the table: blocks are sampled
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE kb_embedding")
    with CaptureQueriesContext(connection) as statements:
        chunks, vectors = background.sampled_vectors(wide.embedding_model, wide.pk)
    assert any("TABLESAMPLE SYSTEM" in statement["sql"] for statement in statements) == by_blocks
    stored = np.array(list(Embedding.objects.filter(collection=wide).values_list("vector", flat=True)))
    nearest = [np.abs(stored - vector).max(axis=1).min() for vector in vectors]  # each is a stored vector, whole
    assert chunks == len(stored) and 0 < len(vectors) <= 40 and max(nearest) < 1e-7
    again = background.sampled_vectors(wide.embedding_model, wide.pk)[1]
    assert np.array_equal(np.sort(again, axis=0), np.sort(vectors, axis=0))


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
    missing = evidence.of_each([4], {4: None}, {})[4]  # no vector: no semantic evidence, at cosine -1
    assert missing == pytest.approx(expected(-1.0, 0.0)) and missing < 1e-6 and values[2] > expected(0.0, 0.5)


def test_a_keyword_only_chunk_is_looked_up_when_the_vector_list_ends_below_cosine_0():
    # The full vector list's last cosine is -0.06, so chunk 5's is at most that. Counted at cosine
    # 0 so far, its value would be above its own upper bound and it would never be looked up.
    evidence = fusion.Evidence(weight=0.7, mean=0.0, deviation=0.05)
    cosine, bm25 = {1: 0.30, 2: 0.20, 3: 0.05, 4: -0.06}, {5: 12.0, 6: 0.9, 1: 0.5, 2: 0.5}
    ids = [1, 2, 3, 4, 5, 6]
    known = evidence.of_each(ids, cosine, bm25)
    assert 5 in fusion.contenders(ids, known, bm25, cosine, evidence, 2, 4, True)


def test_the_surprise_of_a_far_cosine_follows_its_asymptote_rising_without_a_jump():
    below, above = fusion._surprise(36.9999999), fusion._surprise(37.0)
    assert 0 < above - below < 1e-5 and fusion._surprise(60.0) > fusion._surprise(59.0) > above
