"""The search service: exact BM25, vector search with filters, weighted RRF, fail-closed filters."""

import math

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from kb import search as search_module
from kb import vector_index
from kb.errors import ErrorCode, KBError
from kb.models import Chunk, Collection
from kb.search import bm25, filters, fusion, search, service, vectors
from kb.services.collections import collection_create, collection_update
from kb.services.documents import document_create_from_text, document_delete
from tests.support.fake_providers import fake_ollama, remote_collection
from tests.support.worker import embed_now

TOPICS = {
    "wings": "Swept wings delay compressibility drag at high subsonic speeds; sweep reduces the normal Mach number.",
    "boundary": "The boundary layer thickens downstream; turbulent boundary layers resist separation better.",
    "heat": "Aerodynamic heating at hypersonic speeds raises skin temperature; heat transfer to the wall grows.",
    "flutter": "Flutter couples aerodynamic forces and structural vibration; aeroelastic models predict flutter speed.",
    "shock": "A normal shock wave raises pressure and temperature; oblique shocks turn the flow.",
    "cooking": "Knead the dough for ten minutes, let it rise, then bake the bread at a high temperature.",
}


@pytest.fixture
def corpus(db):
    collection = collection_create(name="aero")
    documents = {}
    for name, text in TOPICS.items():
        kind = "markdown" if name in ("wings", "heat") else "plain_text"
        stored = document_create_from_text(
            collection=collection,
            source_uri=f"note://{name}",
            text=text,
            content_type=kind,
            title=name,
            metadata={"topic": name, "year": 2000 + len(name), "lang": "en" if name != "cooking" else "fr"},
        )
        embed_now(stored.document.pk)
        documents[name] = stored.document
    return collection, documents


def names(response) -> list[str]:
    return [result.source_uri.removeprefix("note://") for result in response.results]


def reference_bm25(query: str, collection_id: int) -> dict[int, float]:
    """BM25 computed naively in Python from the chunks' own tsvectors, to check the pruned SQL."""
    k1, b = django_settings.KB_BM25_K1, django_settings.KB_BM25_B
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.id, t.lexeme, coalesce(array_length(t.positions, 1), 1) FROM kb_chunk c, unnest(c.search_vector) t "
            "WHERE c.collection_id = %s",
            [collection_id],
        )
        rows = cursor.fetchall()
    tf: dict[int, dict[str, int]] = {}
    for chunk_id, term, count in rows:
        tf.setdefault(chunk_id, {})[term] = count
    n, avgdl = len(tf), sum(sum(terms.values()) for terms in tf.values()) / len(tf)
    df = {}
    for terms in tf.values():
        for term in terms:
            df[term] = df.get(term, 0) + 1
    scores = {}
    for term, q_count in search_module.query_terms(query).items():
        if term not in df:
            continue
        idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
        for chunk_id, terms in tf.items():
            if term in terms:
                length = sum(terms.values())
                part = terms[term] / (terms[term] + k1 * (1 - b + b * length / avgdl))
                scores[chunk_id] = scores.get(chunk_id, 0.0) + q_count * idf * part
    return scores


@pytest.mark.parametrize("budget", [1, 20000])
def test_keyword_search_is_exact_bm25_even_when_pruned(db, monkeypatch, budget):
    collection = collection_create(name="many", chunk_max_tokens=32, chunk_min_tokens=0)
    words = ["wing", "drag", "lift", "shock", "heat", "flow", "layer", "mach", "speed", "vortex"]
    for n in range(60):
        text = " ".join(words[(n * 7 + i * 3) % len(words)] for i in range(5 + n % 9)) + f" item{n}."
        document_create_from_text(collection=collection, source_uri=f"note://{n}", text=text)
    monkeypatch.setattr(bm25, "POSTINGS_BUDGET", budget)  # 1: every common term is pruned first
    query = "wing drag drag shock vortex speed"
    expected = sorted(reference_bm25(query, collection.pk).items(), key=lambda item: (-item[1], item[0]))[:10]
    response = search(query=query, collections=["many"], mode="keyword", top_k=10)
    got = [(result.chunk_id, result.keyword_score) for result in response.results]
    assert [score for _, score in got] == pytest.approx([score for _, score in expected], rel=1e-6)
    # Chunks that tie with the tenth are interchangeable; every chunk scoring above it must be there.
    tenth = expected[-1][1]
    above = {chunk for chunk, score in expected if score > tenth * (1 + 1e-9)}
    assert len(above) >= 5 and {chunk for chunk, score in got if score > tenth * (1 + 1e-9)} == above


def test_a_query_of_many_common_words_costs_a_few_statements_and_scores_its_heaviest_terms(db, monkeypatch):
    """A 10,000-character query of 1,200 common words had taken 520 statements (one more term per
    pruning attempt) and over 500 s of a shared machine; nothing bounded its terms."""
    monkeypatch.setattr(bm25, "POSTINGS_BUDGET", 1)  # every common term pruned at first
    collection = collection_create(name="common", chunk_max_tokens=512, chunk_min_tokens=0)
    vocabulary = [f"word{letter}{other}" for letter in "abcdefghij" for other in "abcdefghij"]  # in every chunk
    for n in range(40):
        text = " ".join(vocabulary[n:] + vocabulary[:n]) + f" rare{n}."
        document_create_from_text(collection=collection, source_uri=f"note://{n}", text=text)
    query = " ".join(vocabulary) + " rare7"
    statements: list[str] = []
    with connection.execute_wrapper(lambda execute, sql, *args: (statements.append(sql), execute(sql, *args))[1]):
        results = search(query=query, collections=["common"], mode="keyword", top_k=5).results
    assert len(statements) <= 25 and len(results) == 5
    monkeypatch.setattr(bm25, "MAX_SCORED_TERMS", 1)  # the heaviest term alone: the rarest
    results = search(query=query, collections=["common"], mode="keyword", top_k=5).results
    assert [result.source_uri for result in results] == ["note://7"]


def test_bm25_sums_its_postings_in_double_precision(corpus):
    """Numbers bound untyped are numeric in Postgres: summing the postings in numeric arithmetic took
    three times as long as reading them (README, Search speed)."""
    collection, _ = corpus
    keyword = bm25.KeywordQuery.of("shock pressure flow", filters.Filters(collection_ids=(collection.pk,)))
    sql, params = keyword.scorer._sum_per_chunk(list(keyword.scorer.weights), None)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) {sql}", params)
        plan = str(cursor.fetchone()[0])
    assert "kb_posting.tf" in plan and "double precision" in plan
    assert "numeric" not in plan


def test_bm25_looks_up_each_term_of_a_collection_the_planner_has_not_seen(corpus):
    """A collection made after kb_posting was last analysed looks empty to the planner; a plain join
    then read all of its postings for every query term (README, Search speed, a million chunks)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE kb_posting")
    newer = collection_create(name="newer")
    for n in range(40):
        document_create_from_text(collection=newer, source_uri=f"note://n{n}", text=f"shock {n} pressure wave flow")
    keyword = bm25.KeywordQuery.of("shock pressure flow", filters.Filters(collection_ids=(newer.pk,)))
    sql, params = keyword.scorer._sum_per_chunk(list(keyword.scorer.weights), None)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = str(cursor.fetchone()[0])
    # Each term's postings found by the term (an index condition, or a filter on a table this
    # small), not every posting of the collection joined to the terms and filtered afterwards.
    assert "term = q.term" in plan
    assert "Join Filter" not in plan


def test_a_repeated_query_term_counts_repeatedly(corpus):
    once = search(query="flutter", collections=["aero"], mode="keyword").results[0].keyword_score
    twice = search(query="flutter flutter", collections=["aero"], mode="keyword").results[0].keyword_score
    assert twice == pytest.approx(2 * once)


def test_semantic_search_finds_meaning_without_shared_words(corpus):
    response = search(query="baking a loaf in the oven", collections=["aero"], mode="semantic", top_k=3)
    assert names(response)[0] == "cooking"
    assert 0 < response.results[0].similarity <= 1
    assert response.results[0].vector_rank == 1 and response.results[0].keyword_rank is None


def test_a_hybrid_result_carries_every_field_including_its_fused_rrf_value(corpus, settings):
    response = search(query="turbulent boundary layer separation", collections=["aero"], top_k=3)
    first = response.results[0]
    assert names(response)[0] == "boundary"
    assert (first.rank, first.vector_rank, first.keyword_rank) == (1, 1, 1)
    weight, k = response.semantic_weight, settings.KB_RRF_K
    assert weight == settings.KB_SEMANTIC_WEIGHT
    assert first.fused_score == pytest.approx(2 * weight / (k + 1) + 2 * (1 - weight) / (k + 1), rel=1e-5)
    as_dict = first.model_dump()
    for key in (
        "similarity",
        "content",
        "document_id",
        "source_uri",
        "collection",
        "chunk_index",
        "lines",
        "token_count",
        "metadata",
    ):
        assert as_dict[key] is not None, key
    assert as_dict["lines"] == "1-1" and as_dict["collection"] == "aero" and as_dict["metadata"]["topic"] == "boundary"


def keyword_relevance(query: str, collection_id: int, bm25: float) -> float:
    """BM25 over that of an average-length chunk holding every query term once, at most 1."""
    k1 = django_settings.KB_BM25_K1
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM kb_chunk WHERE collection_id = %s", [collection_id])
        (n,) = cursor.fetchone()
        full_match = 0.0
        for term, count in search_module.query_terms(query).items():
            cursor.execute(
                "SELECT count(*) FROM kb_chunk WHERE collection_id = %s AND search_vector @@ %s::tsquery",
                [collection_id, term],
            )
            (df,) = cursor.fetchone()
            full_match += count * math.log(1 + (n - df + 0.5) / (df + 0.5)) / (1 + k1)
    return min(1.0, bm25 / full_match)


@pytest.mark.parametrize("mode", ["hybrid", "semantic", "keyword"])
def test_the_score_is_one_scale_from_0_to_1_that_never_rises_down_the_list(corpus, mode):
    collection, _ = corpus
    query = "shock wave temperature of the flow"
    response = search(query=query, collections=["aero"], mode=mode, top_k=6)
    scores = [result.score for result in response.results]
    assert len(scores) >= 3 and all(0.0 <= score <= 1.0 for score in scores)
    assert scores == sorted(scores, reverse=True)
    first = response.results[0]
    semantic = max(0.0, first.similarity or 0.0)
    keyword = keyword_relevance(query, collection.pk, first.keyword_score or 0.0) if mode != "semantic" else 0.0
    weight = response.semantic_weight
    assert first.score == pytest.approx(weight * semantic + (1 - weight) * keyword, abs=2e-6)
    assert (first.fused_score is None) == (mode != "hybrid")


def test_hybrid_ranks_every_candidate_by_its_exact_score(corpus):
    collection, _ = corpus
    query = "shock wave temperature of the flow"
    convex = search(query=query, collections=["aero"], top_k=6)
    assert len(convex.results) >= 4
    weight = convex.semantic_weight
    for result in convex.results:  # the exact value of each, not capped by the one above
        keyword = keyword_relevance(query, collection.pk, result.keyword_score or 0.0)
        expected = weight * max(0.0, result.similarity) + (1 - weight) * keyword
        assert result.score == pytest.approx(expected, abs=2e-6)
    assert [r.score for r in convex.results] == sorted((r.score for r in convex.results), reverse=True)


def test_rrf_fusion_ranks_by_the_rrf_value(corpus):
    query = "shock wave temperature of the flow"
    convex = search(query=query, collections=["aero"], top_k=6)
    rrf = search(query=query, collections=["aero"], top_k=6, fusion="rrf")
    fused = [result.fused_score for result in rrf.results]
    assert fused == sorted(fused, reverse=True) and [r.score for r in rrf.results] == sorted(
        (r.score for r in rrf.results), reverse=True
    )
    assert {r.chunk_id for r in rrf.results} & {r.chunk_id for r in convex.results}


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_hybrid_looking_up_only_candidates_that_can_reach_the_top_ranks_as_if_it_looked_up_all(
    corpus, monkeypatch, top_k
):
    monkeypatch.setattr(service, "MIN_CANDIDATE_DEPTH", 3)  # full lists: the bounds are used
    queries = ["shock wave temperature of the flow", "boundary layer", "baking bread in an oven", "flutter speed"]
    assert_looking_up_contenders_is_looking_up_all(monkeypatch, "aero", queries, top_k)


def assert_looking_up_contenders_is_looking_up_all(monkeypatch, collection: str, queries: list[str], top_k: int):
    """Hybrid results (chunks and scores) are the same when every candidate's missing half is looked up."""
    pruned = {q: search(query=q, collections=[collection], top_k=top_k).results for q in queries}
    everything = service.contenders
    monkeypatch.setattr(
        service,
        "contenders",
        lambda ids, known, bm25, cosine, order, top_k, *rest: everything(
            ids, known, bm25, cosine, order, len(ids), *rest
        ),
    )
    for query in queries:
        reference = search(query=query, collections=[collection], top_k=top_k).results
        assert [(r.chunk_id, r.score) for r in pruned[query]] == [(r.chunk_id, r.score) for r in reference], query
        assert len(reference) == top_k


@pytest.mark.parametrize(("top_k", "looked_up"), [(1, [4]), (2, [4, 2])])
def test_a_candidate_is_looked_up_when_its_missing_half_could_still_lift_it_into_the_top(top_k, looked_up):
    relevance = fusion.Relevance(full_match=1.0, weight=0.5)
    keyword_hits = [(1, 0.9), (2, 0.8), (3, 0.7)]  # a full list (depth 3): a missing chunk has BM25 <= 0.7
    vector_hits = {4: (1, 0.9), 1: (2, 0.2), 5: (3, 0.1)}  # and cosine <= 0.1
    # Known so far: 1 scores 0.55 (both halves); 4 at least 0.45 and at most 0.8; 2 0.4..0.45; 3 and 5 below.
    ids = [1, 4, 2, 3, 5]
    cosine, bm25 = {c: sim for c, (_, sim) in vector_hits.items()}, dict(keyword_hits)
    found = fusion.contenders(ids, relevance.of_each(ids, cosine, bm25), bm25, cosine, relevance, top_k, 3, True)
    assert found == looked_up


def test_a_score_takes_each_half_within_its_range():
    relevance = fusion.Relevance(full_match=2.0, weight=0.5)
    similarities = {1: 0.8, 2: -0.3, 3: float("nan"), 4: None, 5: 1.5}
    bm25 = {1: 1.0, 2: 5.0, 3: 2.0, 4: 0.5}
    scores = relevance.of_each([1, 2, 3, 4, 5, 6], similarities, bm25)
    assert scores == {1: 0.65, 2: 0.5, 3: 0.5, 4: 0.125, 5: 0.5, 6: 0.0}
    assert relevance.of_each([6], similarities, bm25, similarity_cap=0.4, bm25_cap=1.0) == {6: 0.45}


@pytest.mark.parametrize(("weight", "mode"), [(0.0, "keyword"), (1.0, "semantic")])
def test_hybrid_at_either_end_of_the_weight_is_that_half_alone(corpus, weight, mode):
    query = "shock wave temperature of the flow"
    hybrid = search(query=query, collections=["aero"], top_k=6, semantic_weight=weight)
    alone = search(query=query, collections=["aero"], top_k=6, mode=mode)
    assert [r.chunk_id for r in hybrid.results] == [r.chunk_id for r in alone.results]
    assert len(alone.results) >= 3


def test_an_unknown_fusion_is_refused(corpus):
    with pytest.raises(KBError) as caught:
        search(query="flutter", collections=["aero"], fusion="borda")
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT


def test_a_keyword_score_is_the_share_of_the_query_words_a_chunk_holds(corpus):
    whole = search(query="flutter speed", collections=["aero"], mode="keyword").results[0]
    assert whole.source_uri == "note://flutter" and whole.score > 0.9
    # "zeppelin" is in no chunk: the same chunk now holds half of what was asked.
    half = search(query="flutter speed zeppelin", collections=["aero"], mode="keyword").results[0]
    assert half.source_uri == "note://flutter" and 0.2 < half.score < 0.7
    assert half.keyword_score == pytest.approx(whole.keyword_score, rel=1e-6)


def test_a_hybrid_result_found_by_meaning_alone_still_gets_its_keyword_part(corpus):
    results = search(query="baking bread temperature", collections=["aero"], top_k=6).results
    by_uri = {result.source_uri: result for result in results}
    assert by_uri["note://cooking"].keyword_score is not None and by_uri["note://cooking"].score > 0.3


def test_a_hybrid_score_counts_the_half_looked_up_after_the_lists_came_back(corpus, monkeypatch):
    """With lists 3 deep, "heat" is in the semantic list only: three chunks hold "better" or
    "temperature" with a higher BM25. Its BM25 is looked up, and its score counts it."""
    query = "better temperature"
    halves = {
        mode: {r.source_uri: r.score for r in search(query=query, collections=["aero"], mode=mode, top_k=6).results}
        for mode in ("keyword", "semantic")
    }
    assert "note://heat" not in list(halves["keyword"])[:3] and halves["keyword"]["note://heat"] > 0
    monkeypatch.setattr(service, "MIN_CANDIDATE_DEPTH", 3)
    (top,) = search(query=query, collections=["aero"], top_k=1).results
    weight = django_settings.KB_SEMANTIC_WEIGHT
    expected = weight * halves["semantic"]["note://heat"] + (1 - weight) * halves["keyword"]["note://heat"]
    assert (top.source_uri, top.score) == ("note://heat", pytest.approx(expected, abs=2e-6))


def test_a_search_loads_the_collections_it_names_as_the_orm_would(corpus):
    (loaded,) = filters.target_collections(["aero"])
    reference = Collection.objects.select_related("embedding_model").get(name="aero")
    for own, theirs in ((loaded, reference), (loaded.embedding_model, reference.embedding_model)):
        fields = type(theirs)._meta.concrete_fields
        assert [getattr(own, f.attname) for f in fields] == [getattr(theirs, f.attname) for f in fields]
        assert own._state.adding is False and own._state.db == "default"
    with pytest.raises(KBError) as caught:
        filters.target_collections(["aero", "nowhere"])
    assert caught.value.code == ErrorCode.COLLECTION_NOT_FOUND


def test_the_semantic_weight_moves_hybrid_between_its_halves(corpus):
    query = "temperature"
    keyword = names(search(query=query, collections=["aero"], mode="keyword"))
    semantic = names(search(query=query, collections=["aero"], mode="semantic"))
    assert names(search(query=query, collections=["aero"], semantic_weight=0.0)) == keyword
    assert names(search(query=query, collections=["aero"], semantic_weight=1.0)) == semantic


def test_a_collection_s_search_settings_are_the_defaults_of_a_search_of_it(corpus, settings):
    collection, _ = corpus
    assert (len(search(query="temperature", collections=["aero"]).results), search(query="x").mode) == (6, "hybrid")
    collection_update(collection=collection, search_top_k=2, search_hybrid=False, semantic_weight=0.9)
    own = search(query="temperature", collections=["aero"])
    assert (own.mode, own.semantic_weight, len(own.results)) == ("keyword", 0.0, 2)
    assert names(own) == names(search(query="temperature", collections=["aero"], mode="keyword"))[:2]
    chosen = search(query="temperature", collections=["aero"], top_k=4, mode="hybrid")
    assert (chosen.mode, chosen.semantic_weight, len(chosen.results)) == ("hybrid", 0.9, 4)
    # Across several collections the server's defaults apply: no one collection's choice wins.
    collection_create(name="other")
    across = search(query="temperature", collections=["aero", "other"])
    assert (across.mode, across.semantic_weight, len(across.results)) == ("hybrid", settings.KB_SEMANTIC_WEIGHT, 6)


def test_chunks_not_yet_embedded_are_still_found_by_their_words(corpus):
    collection, _ = corpus
    document_create_from_text(
        collection=collection, source_uri="note://fresh", text="Transonic buffet onset on airfoils."
    )
    assert "fresh" in names(search(query="transonic buffet", collections=["aero"], mode="keyword"))
    hybrid = search(query="transonic buffet", collections=["aero"])
    fresh = next(result for result in hybrid.results if result.source_uri == "note://fresh")
    assert (fresh.keyword_rank, fresh.vector_rank, fresh.similarity) == (1, None, None)


def test_a_deleted_document_is_never_returned(corpus):
    _, documents = corpus
    document_delete(doc_id=documents["flutter"].pk)
    for mode in ("keyword", "semantic", "hybrid"):
        assert "flutter" not in names(search(query="flutter aeroelastic", collections=["aero"], mode=mode))


@pytest.mark.parametrize("mode", ["keyword", "semantic", "hybrid"])
def test_filters_only_ever_narrow_the_results(corpus, mode):
    _, documents = corpus

    def found(**filters) -> set[str]:
        return set(names(search(query="speed temperature wings", collections=["aero"], mode=mode, top_k=10, **filters)))

    # Every document shares a word with the query but "boundary", which keyword search cannot find.
    findable = set(TOPICS) - ({"boundary"} if mode == "keyword" else set())
    assert found() == findable
    assert found(document_ids=[]) == set()
    assert found(document_ids=[documents["heat"].pk]) == {"heat"}
    assert found(document_ids=[documents["heat"].pk.lower()]) == {"heat"}  # a ULID in any case
    assert found(content_types=["markdown"]) == {"wings", "heat"}
    assert found(content_types=["pdf"]) == set()
    assert found(metadata={"lang": "fr"}) == {"cooking"}
    assert found(metadata={"topic": {"$in": ["heat", "shock"]}}) == {"heat", "shock"}
    assert found(metadata={"year": {"$gte": 2006}}) == {"boundary", "flutter", "cooking"} & findable
    assert found(metadata={"year": "2005"}) == set()  # typed: the string is not the number
    assert found(metadata={"no-such-key": 1}) == set()


def test_filtered_vector_search_still_fills_top_k_through_the_index(corpus, monkeypatch, settings):
    collection, _ = corpus
    # The HNSW index itself (the planner would scan and sort a table this small), returning only
    # top_k rows a pass: the filter must make it scan on (hnsw.iterative_scan).
    settings.KB_HNSW_EF_SEARCH = 1
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_sort = off")
    for n in range(30):
        kind = "markdown" if n % 3 == 0 else "plain_text"
        stored = document_create_from_text(
            collection=collection,
            source_uri=f"note://extra{n}",
            text=f"Extra note {n} about wind tunnels.",
            content_type=kind,
        )
        embed_now(stored.document.pk)
    monkeypatch.setattr(vectors, "EXACT_SCAN_LIMIT", 0)  # force the HNSW iterative scan path
    response = search(query="wind tunnel", collections=["aero"], mode="semantic", top_k=10, content_types=["markdown"])
    assert len(response.results) == 10
    assert {result.content_type for result in response.results} == {"markdown"}


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({"collections": ["missing"]}, ErrorCode.COLLECTION_NOT_FOUND),
        ({"metadata": {"year": {"$regex": "x"}}}, ErrorCode.INVALID_ARGUMENT),
        ({"metadata": {"year": {"$gt": [1]}}}, ErrorCode.INVALID_ARGUMENT),
        ({"metadata": {"$or": [{"topic": "wings"}, {"topic": "heat"}]}}, ErrorCode.INVALID_ARGUMENT),
        ({"metadata": {"$where": "1=1"}}, ErrorCode.INVALID_ARGUMENT),
        ({"top_k": 0}, ErrorCode.INVALID_ARGUMENT),
        ({"top_k": 101}, ErrorCode.INVALID_ARGUMENT),
        ({"mode": "fuzzy"}, ErrorCode.INVALID_ARGUMENT),
        ({"semantic_weight": 1.5}, ErrorCode.INVALID_ARGUMENT),
        ({"content_types": ["cobol"]}, ErrorCode.INVALID_ARGUMENT),
        ({"query": "   "}, ErrorCode.INVALID_ARGUMENT),
        ({"query": "shock wave pressure", "min_score": 1.5}, ErrorCode.INVALID_ARGUMENT),
    ],
)
def test_bad_arguments_are_refused(corpus, arguments, code):
    with pytest.raises(KBError) as error:
        search(**{"query": "wings", **arguments})
    assert error.value.code == code


def test_min_similarity_drops_results_less_similar_than_it(corpus):
    everything = search(query="shock wave pressure", collections=["aero"], top_k=10)
    strong = search(query="shock wave pressure", collections=["aero"], top_k=10, min_similarity=0.3)
    assert 0 < len(strong.results) < len(everything.results)
    assert all(result.similarity >= 0.3 for result in strong.results)


def test_min_score_drops_results_scoring_below_it(corpus):
    everything = search(query="shock wave pressure", collections=["aero"], top_k=10)
    cut = everything.results[1].score
    above = search(query="shock wave pressure", collections=["aero"], min_score=cut).results
    assert [result.chunk_id for result in above] == [
        result.chunk_id for result in everything.results if result.score >= cut
    ]
    assert len(above) >= 2


def test_repeated_queries_are_not_embedded_again(corpus):
    cache = search_module.query_embeddings
    search(query="an uncached query about nozzles", collections=["aero"], mode="semantic")
    misses, hits = cache.misses, cache.hits
    search(query="an uncached query about nozzles", collections=["aero"], mode="semantic")
    assert (cache.misses, cache.hits) == (misses, hits + 1)


def test_a_query_searched_in_other_collections_is_embedded_again(corpus):
    """A cached vector answers faster: shared between collections, it told a token limited to one
    which texts others had searched for elsewhere."""
    collection_create(name="private")
    cache = search_module.query_embeddings
    search(query="what the others look for", collections=["private"], mode="semantic")
    misses = cache.misses
    search(query="what the others look for", collections=["aero"], mode="semantic")
    assert cache.misses == misses + 1


def test_semantic_search_searches_the_graph_wider_as_it_grows_and_hybrid_does_not(corpus, monkeypatch):
    # The index of this small corpus stands for one EF_SEARCH_BASE_SIZE times larger.
    monkeypatch.setattr(vector_index, "EF_SEARCH_BASE_SIZE", 2)
    monkeypatch.setattr(vector_index, "_index_sizes", {})
    model = Collection.objects.get(name="aero").embedding_model
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM kb_embedding WHERE model_id = %s", [model.pk])
        vectors = cursor.fetchone()[0]
    breadths: list[int] = []

    def record(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "set_config('hnsw.ef_search'" in sql:  # what the graph search then uses
            context["cursor"].execute("SHOW hnsw.ef_search")
            breadths.append(int(context["cursor"].fetchone()[0]))
        return result

    with connection.execute_wrapper(record):
        search(query="shock wave pressure", collections=["aero"], mode="semantic")
        search(query="shock wave pressure", collections=["aero"], mode="hybrid")
    widened = round(django_settings.KB_HNSW_EF_SEARCH * math.sqrt(vectors / 2))
    assert vectors > 2
    assert breadths == [min(1000, widened), django_settings.KB_HNSW_EF_SEARCH]


def test_a_hybrid_search_takes_few_round_trips(corpus):
    # Each statement is a round trip for the web process and for Postgres: the query's terms and
    # statistics come in one, both graph settings in one.
    search(query="shock wave pressure", collections=["aero"])  # the query vector is cached
    with CaptureQueriesContext(connection) as statements:
        response = search(query="shock wave pressure", collections=["aero"])
    assert response.results
    # collections; savepoint; terms and statistics; BM25 top; graph settings; nearest; BM25 of
    # those found by meaning only; rows; release
    assert len(statements.captured_queries) == 9, "\n".join(
        " ".join(q["sql"].split())[:70] for q in statements.captured_queries
    )


def test_a_candidate_list_deeper_than_the_widest_graph_search_is_still_filled(corpus):
    # pgvector searches at most 1,000 wide; the iterative scan goes on for the rest.
    everything = Chunk.objects.filter(collection__name="aero").count()
    for mode in ("semantic", "hybrid"):
        response = search(query="shock wave", collections=["aero"], mode=mode, top_k=100, candidate_depth=5000)
        assert len(response.results) == min(100, everything)


def test_a_remembered_query_vector_is_searched_with_and_not_embedded(corpus):
    cache = search_module.query_embeddings
    aero = Collection.objects.get(name="aero")
    stored = cache.vector(aero.embedding_model, "supersonic flow over a cone", [aero.pk])
    vector = [float(value) for value in stored.strip("[]").split(",")]
    cache.remember(aero.embedding_model, "a query nobody embedded", [aero.pk], vector)
    misses = cache.misses
    by_vector = search(query="a query nobody embedded", collections=["aero"], mode="semantic").results
    assert cache.misses == misses
    expected = search(query="supersonic flow over a cone", collections=["aero"], mode="semantic").results
    assert [result.chunk_id for result in by_vector] == [result.chunk_id for result in expected] != []


def test_collections_with_different_models_are_searched_together(corpus, settings):
    with fake_ollama() as base:
        settings.OLLAMA_HOST = base
        other = collection_create(name="remote", embedding_provider="ollama", embedding_model="fake-embed")
        stored = document_create_from_text(collection=other, source_uri="note://remote-wings", text="wings wings sweep")
        embed_now(stored.document.pk)
        misses = search_module.query_embeddings.misses
        response = search(query="swept wings sweep", top_k=5)  # every collection
        assert search_module.query_embeddings.misses == misses + 2  # once per model
    found = names(response)
    assert {"wings", "remote-wings"} <= set(found)
    assert {result.collection for result in response.results} == {"aero", "remote"}


def test_a_dead_embedding_backend_degrades_hybrid_to_keyword_with_a_warning(db, settings):
    from tests.conftest import free_port

    settings.OLLAMA_HOST = f"http://127.0.0.1:{free_port()}"
    settings.EMBEDDING_TIMEOUT_SECONDS = 2
    collection = remote_collection(settings, name="remote", model="gone")
    document_create_from_text(collection=collection, source_uri="note://a", text="flutter of wings")
    response = search(query="flutter", collections=["remote"])
    assert names(response) == ["a"] and "Semantic search unavailable" in response.warnings[0]
    with pytest.raises(KBError) as error:
        search(query="flutter", collections=["remote"], mode="semantic")
    assert error.value.code == ErrorCode.EMBEDDING_ERROR


@pytest.fixture
def sectioned(db):
    """Two Markdown documents of several small chunks each, about the same subject, and a third elsewhere."""
    collection = collection_create(name="manuals", chunk_max_tokens=24, chunk_min_tokens=0)
    documents = {}
    for name, sections in {
        "glider": ["Launch", "Thermals", "Landing"],
        "sailplane": ["Rigging", "Thermals"],
        "bakery": ["Dough"],
    }.items():
        text = f"# {name.title()} manual\n\n" + "\n\n".join(
            f"## {section}\n\nThe {name} {section.lower()} section: circling in rising thermals gains height."
            if section == "Thermals"
            else f"## {section}\n\nThe {name} {section.lower()} section covers its own steps in order."
            for section in sections
        )
        stored = document_create_from_text(
            collection=collection, source_uri=f"manual://{name}", text=text, content_type="markdown", title=name
        )
        embed_now(stored.document.pk)
        documents[name] = stored.document
    return documents


def test_each_hit_carries_the_headings_of_its_section(sectioned):
    best = search(query="circling in rising thermals", collections=["manuals"], top_k=1).results[0]
    assert best.document_id in (sectioned["glider"].pk, sectioned["sailplane"].pk)
    assert best.heading_path == [f"{best.title.title()} manual", "Thermals"]


@pytest.mark.parametrize("mode", ["hybrid", "semantic", "keyword"])
def test_grouped_by_document_each_document_appears_once_as_its_best_chunk_with_its_hit_count(sectioned, mode):
    ungrouped = search(query="manual section steps thermals", collections=["manuals"], top_k=100, mode=mode).results
    grouped = search(
        query="manual section steps thermals", collections=["manuals"], top_k=100, mode=mode, group_by_document=True
    ).results
    hits_per_document = {}
    for result in ungrouped:
        hits_per_document.setdefault(result.document_id, []).append(result.chunk_id)
    assert len(hits_per_document) == 3 and len(ungrouped) > 3  # several chunks of one document matched
    assert [(r.document_id, r.chunk_id) for r in grouped] == [
        (document_id, chunk_ids[0]) for document_id, chunk_ids in hits_per_document.items()
    ]
    assert {r.document_id: r.document_hits for r in grouped} == {d: len(c) for d, c in hits_per_document.items()}
    assert [r.rank for r in grouped] == [1, 2, 3]
    assert all(r.document_hits is None for r in ungrouped)


def test_grouped_by_document_fills_top_k_with_distinct_documents(sectioned):
    grouped = search(query="manual section steps", collections=["manuals"], top_k=2, group_by_document=True)
    assert len({r.document_id for r in grouped.results}) == 2


@pytest.mark.parametrize("mode", ["hybrid", "semantic", "keyword"])
def test_grouped_by_document_looks_past_a_document_that_fills_the_candidate_lists(db, monkeypatch, mode):
    monkeypatch.setattr(service, "MIN_CANDIDATE_DEPTH", 4)  # top_k 3 grouped: lists 9 deep at first
    collection = collection_create(name="zoo", chunk_max_tokens=24, chunk_min_tokens=0)
    big = "\n\n".join(
        f"## Quokka {n}\n\nQuokka quokka quokkas: the quokka smiles on Rottnest, quokka {n}." for n in range(30)
    )
    texts = {"big": big, "small-1": "A quokka was seen.", "small-2": "Quokka tracks near the path."}
    for name, text in texts.items():
        stored = document_create_from_text(
            collection=collection, source_uri=f"zoo://{name}", text=text, content_type="markdown", title=name
        )
        embed_now(stored.document.pk)
    grouped = search(query="quokka", collections=["zoo"], top_k=3, mode=mode, group_by_document=True).results
    assert sorted(r.title for r in grouped) == ["big", "small-1", "small-2"]
    assert {r.title: r.document_hits for r in grouped}["big"] == Chunk.objects.filter(document__title="big").count()


@pytest.mark.parametrize("with_headings", [True, False])
def test_with_kb_embed_headings_a_chunk_is_embedded_after_its_section_titles(db, settings, with_headings):
    import numpy

    from kb.embedding_providers import embed_texts
    from kb.models import Chunk, Embedding

    settings.KB_EMBED_HEADINGS = with_headings
    collection = collection_create(name="handbook", chunk_max_tokens=24, chunk_min_tokens=0)
    text = (
        "# Glider\n\nAn introduction to flying a glider safely, from rigging to landing.\n\n"
        "## Thermals\n\nCircle in rising air to gain height, then glide on to the next one."
    )
    stored = document_create_from_text(collection=collection, source_uri="m://g", text=text, content_type="markdown")
    embed_now(stored.document.pk)
    chunk = Chunk.objects.get(document=stored.document, content__startswith="## Thermals")
    stored_vector = Embedding.objects.get(chunk=chunk).vector
    model = collection.embedding_model
    titled, bare = embed_texts(model.provider, model.name, [f"Glider > Thermals\n\n{chunk.content}", chunk.content])
    expected, other = (titled, bare) if with_headings else (bare, titled)
    assert numpy.allclose(stored_vector, expected, atol=1e-5) and not numpy.allclose(stored_vector, other, atol=1e-3)

    # Stored again under another title: with headings embedded, the old vector no longer fits and is not kept.
    renamed = document_create_from_text(
        collection=collection, source_uri="m://g", text=text.replace("# Glider", "# Sailplane"), content_type="markdown"
    )
    assert renamed.chunks_reused == (0 if with_headings else 1)


def test_copies_of_one_text_rank_by_chunk_id_whatever_top_k(corpus):
    # Equal similarities: a longer list extends a shorter one, as in keyword and hybrid lists.
    collection, _ = corpus
    copies = [
        document_create_from_text(collection=collection, source_uri=f"copy://{n}", text=TOPICS["flutter"]).document
        for n in range(3)
    ]
    for copy in reversed(copies):
        embed_now(copy.pk)
    query = "flutter of aeroelastic models"
    for kind in ("semantic", "hybrid", "keyword"):
        longest = search(query=query, collections=["aero"], mode=kind, top_k=4).results
        assert [r.source_uri for r in longest[:4]].count("note://flutter") == 1, kind
        ids = [r.chunk_id for r in longest if r.content == TOPICS["flutter"]]
        assert ids == sorted(ids) and len(ids) == 4, kind
        for top_k in (1, 2, 3):
            shorter = search(query=query, collections=["aero"], mode=kind, top_k=top_k).results
            assert [r.chunk_id for r in shorter] == [r.chunk_id for r in longest[:top_k]], (kind, top_k)
