"""Okapi BM25 over the postings the database maintains (kb/migrations/0002), with the collection
statistics of exactly the collections searched. Exact, with MaxScore-style pruning: the rare terms
are scored over their whole posting lists, the common ones only for the candidates, and the
pruning is undone whenever it could change the top results.
"""

import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from kb.replicas import read_connection
from kb.search.filters import Filters

# Postings read in full before the remaining (common) query terms are only looked up.
POSTINGS_BUDGET = 20000
# A query's terms that are scored, the heaviest first: a query of 10,000 characters of common words
# (1,200 terms) would read the postings of every one. CISI's longest query has 117.
MAX_SCORED_TERMS = 128


QUERY_TERMS_SQL = (
    "SELECT lexeme, coalesce(array_length(positions, 1), 1) AS count FROM unnest(to_tsvector('english', %s))"
)


def query_terms(query: str) -> dict[str, int]:
    """Stemmed query terms with their counts (a repeated term counts repeatedly)."""
    with read_connection().cursor() as cursor:
        cursor.execute(QUERY_TERMS_SQL, [query])
        return dict(cursor.fetchall())


@dataclass(frozen=True)
class KeywordQuery:
    """A query's BM25 terms over the searched chunks, its ``full_match`` scale, and how many chunks
    the collections searched hold (0 when the query has no term to look up)."""

    scorer: "BM25Scorer | None"
    full_match: float
    chunks: float = 0.0

    @classmethod
    def of(cls, query: str, filters: Filters) -> "KeywordQuery":
        """Okapi BM25 with Lucene's idf, over the statistics of exactly the collections searched."""
        if not filters.collection_ids:
            return cls(scorer=None, full_match=0.0)
        # The query's terms with their counts, each term's document frequency and the collections'
        # totals in one round trip instead of three (README, Many clients at once).
        with read_connection().cursor() as cursor:
            cursor.execute(
                f"""
                WITH terms AS ({QUERY_TERMS_SQL}),
                totals AS (
                    SELECT coalesce(sum(chunk_count), 0)::float8 AS chunks,
                           coalesce(sum(total_length), 0)::float8 AS length
                    FROM kb_collection_stats WHERE collection_id = ANY(%s)
                )
                SELECT t.lexeme, t.count, totals.chunks, totals.length,
                       (SELECT coalesce(sum(df), 0)::float8 FROM kb_term_stats
                        WHERE collection_id = ANY(%s) AND term = t.lexeme)
                FROM terms t CROSS JOIN totals
                """,
                [query, list(filters.collection_ids), list(filters.collection_ids)],
            )
            rows = cursor.fetchall()
        if not rows or not rows[0][2]:
            return cls(scorer=None, full_match=0.0)
        chunk_total, length_total = rows[0][2], rows[0][3]
        terms = {term: count for term, count, *_ in rows}
        frequencies = {term: df for term, _, _, _, df in rows if df}
        idf = {
            term: math.log(1 + (chunk_total - frequencies.get(term, 0) + 0.5) / (frequencies.get(term, 0) + 0.5))
            for term in terms
        }
        # One occurrence in a chunk of average length adds weight / (1 + k1) (see BM25Scorer.score).
        full_match = sum(count * idf[term] for term, count in terms.items()) / (1 + settings.KB_BM25_K1)
        weights = {term: count * idf[term] for term, count in terms.items() if frequencies.get(term)}
        if len(weights) > MAX_SCORED_TERMS:  # the heaviest: the rarest, whose postings are the shortest
            weights = dict(sorted(weights.items(), key=lambda item: -item[1])[:MAX_SCORED_TERMS])
        scorer = BM25Scorer(filters, weights, frequencies, avgdl=length_total / chunk_total) if weights else None
        return cls(scorer=scorer, full_match=full_match, chunks=chunk_total)

    def top(self, depth: int) -> list[tuple[int, float]]:
        """The ``depth`` best chunks by BM25, best first."""
        return self.scorer.top(depth) if self.scorer else []

    def scores(self, chunk_ids: list[int]) -> dict[int, float]:
        """BM25 of just these chunks (those holding no query term are left out: their score is 0)."""
        if not self.scorer or not chunk_ids:
            return {}
        return self.scorer.score(list(self.scorer.weights), chunk_ids=chunk_ids)


@dataclass
class BM25Scorer:
    """Exact top-k BM25 with MaxScore-style pruning.

    Terms are taken rarest first into the *essential* set until the postings read reach a
    budget. Only chunks holding an essential term are candidates; the other terms' weights are
    added for the best candidates by index look-ups. A chunk outside the candidates scores at
    most the sum of the other terms' upper bounds (a term adds less than its idf weight), and a
    candidate below the look-up cut at most its partial score plus that sum: when either could
    reach the k-th best score, the next term becomes essential and the query runs again.
    """

    filters: Filters
    weights: dict[str, float]
    frequencies: dict[str, int]
    avgdl: float

    def top(self, depth: int) -> list[tuple[int, float]]:
        ordered = sorted(self.weights, key=lambda term: self.frequencies[term])
        essential_count = 1
        read = self.frequencies[ordered[0]]
        while essential_count < len(ordered) and read + self.frequencies[ordered[essential_count]] <= POSTINGS_BUDGET:
            read += self.frequencies[ordered[essential_count]]
            essential_count += 1
        while True:
            essential, rest = ordered[:essential_count], ordered[essential_count:]
            result = self._attempt(essential, rest, depth)
            if result is not None:
                return result
            # Twice the terms each time: a query of many common words is settled in a few attempts,
            # not one per word (1,200 words had taken 520 statements).
            essential_count *= 2

    def _attempt(self, essential: list[str], rest: list[str], depth: int) -> list[tuple[int, float]] | None:
        if not rest:
            return self.best(essential, limit=depth)
        rest_bound = sum(self.weights[term] for term in rest)
        cut = max(depth * 4, 200)
        # Ranked by the database: only the candidates worth a look-up, and the best one below them.
        ranked = self.best(essential, limit=cut + 1)
        probed, unprobed = ranked[:cut], ranked[cut:]
        full = dict(probed)
        for chunk_id, extra in self.score(rest, chunk_ids=[chunk_id for chunk_id, _ in probed]).items():
            full[chunk_id] += extra
        best = sorted(full.items(), key=lambda item: -item[1])[:depth]
        threshold = best[-1][1] if len(best) == depth else 0.0
        outsiders_could_win = rest_bound > threshold or (unprobed and unprobed[0][1] + rest_bound > threshold)
        return None if outsiders_could_win else best

    def score(self, terms: list[str], chunk_ids: list[int]) -> dict[int, float]:
        """Sum of the BM25 contributions of ``terms`` for each of ``chunk_ids`` that holds one."""
        sql, params = self._sum_per_chunk(terms, chunk_ids)
        with read_connection().cursor() as cursor:
            cursor.execute(sql, params)
            return dict(cursor.fetchall())

    def best(self, terms: list[str], *, limit: int) -> list[tuple[int, float]]:
        """The ``limit`` chunks with the highest sum of the contributions of ``terms``, best first."""
        sql, params = self._sum_per_chunk(terms, None)
        with read_connection().cursor() as cursor:
            cursor.execute(f"{sql} ORDER BY 2 DESC, 1 LIMIT %s", [*params, limit])
            return cursor.fetchall()

    def _sum_per_chunk(self, terms: list[str], chunk_ids: list[int] | None) -> tuple[str, list[Any]]:
        k1, b = settings.KB_BM25_K1, settings.KB_BM25_B
        restrict = "" if chunk_ids is None else "AND chunk_id = ANY(%s)"
        allowed, allowed_params = self._allowed_join()
        # k1 * (1 - b + b * length / avgdl), as float8: numbers bound untyped would be numeric, whose
        # arithmetic made summing the postings take three times as long as reading them.
        # LATERAL: each term's postings are read through the (collection, term) index whatever the
        # planner believes of the collection. A collection created after kb_posting was last
        # analysed looks empty to it, and a plain join then read all its postings for every term
        # (147 ms instead of 5 for a Cranfield query beside a million-chunk collection).
        sql = f"""
            SELECT p.chunk_id, sum(q.weight * p.tf / (p.tf + %s::float8 + %s::float8 * p.chunk_length))
            FROM unnest(%s::text[], %s::float8[]) AS q(term, weight)
            CROSS JOIN LATERAL (
                SELECT chunk_id, tf, chunk_length FROM kb_posting
                WHERE collection_id = ANY(%s) AND term = q.term {restrict}
                OFFSET 0  -- kept a subquery per term: the planner would flatten it into the plain join
            ) AS p
            {allowed}
            GROUP BY p.chunk_id
        """
        params: list[Any] = [k1 * (1 - b), k1 * b / self.avgdl, list(terms), [self.weights[term] for term in terms]]
        params.append(list(self.filters.collection_ids))
        if chunk_ids is not None:
            params.append(chunk_ids)
        return sql, [*params, *allowed_params]

    def _allowed_join(self) -> tuple[str, list[Any]]:
        if not self.filters.narrows_documents:
            return "", []
        where, params = self.filters.sql("d")
        return f"JOIN kb_chunk c ON c.id = p.chunk_id JOIN kb_document d ON d.id = c.document_id AND {where}", params
