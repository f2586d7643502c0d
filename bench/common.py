"""Shared set-up for the benchmarks: Django on its own data (var/bench), BEIR loading, metrics."""

import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT.parent / "shared" / "eval"


def setup_django(*, migrate: bool = True) -> None:
    """Benchmarks keep their own embedded Postgres and broker files in var/bench; ``migrate=False``
    for those that need the settings only, not the database."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("KB_VAR_DIR", str(ROOT / "var" / "bench"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django
    from django.core.management import call_command

    django.setup()
    if migrate:
        call_command("migrate", verbosity=0)


def read_jsonl(path: Path) -> Iterator[dict]:
    with path.open() as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def load_beir(name: str) -> tuple[list[dict], list[dict], dict[str, dict[str, int]]]:
    folder = EVAL / name
    corpus = list(read_jsonl(folder / "corpus.jsonl"))
    queries = list(read_jsonl(folder / "queries.jsonl"))
    qrels: dict[str, dict[str, int]] = {}
    with (folder / "qrels" / "test.tsv").open() as handle:
        next(handle)
        for line in handle:
            query_id, doc_id, score = line.rstrip("\n").split("\t")
            qrels.setdefault(query_id, {})[doc_id] = int(score)
    return corpus, [q for q in queries if q["_id"] in qrels], qrels


def ndcg_at(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    """nDCG with linear gains, as trec_eval / pytrec_eval (and so BEIR) compute it."""
    dcg = sum(max(relevant.get(doc, 0), 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((grade for grade in relevant.values() if grade > 0), reverse=True)[:k]
    idcg = sum(grade / math.log2(i + 2) for i, grade in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: list[str], relevant: dict[str, int], k: int = 100) -> float:
    positives = {doc for doc, grade in relevant.items() if grade > 0}
    return len(positives & set(ranked[:k])) / len(positives) if positives else 0.0


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Timer:
    def __enter__(self) -> "Timer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
