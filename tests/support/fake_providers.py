"""HTTP-level fakes of the Ollama and OpenAI embedding APIs (the only things we fake: they are
remote services). Vectors are deterministic bags of hashed words, so similar texts are close."""

import base64
import hashlib
import json
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.http_server import json_body, serve

DIMENSIONS = 16


def fake_vector(text: str) -> list[float]:
    vector = [0.0] * DIMENSIONS
    for word in text.lower().split():
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIMENSIONS] += 1.0
    vector[0] += 0.01  # never all zeros
    return vector


def _ollama_embed(handler, body):
    request = json_body(body)
    texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
    payload = {"model": request["model"], "embeddings": [fake_vector(text) for text in texts]}
    return 200, {"content-type": "application/json"}, json.dumps(payload).encode()


def _openai_embeddings(handler, body):
    request = json_body(body)
    texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
    as_base64 = request.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(texts):
        vector = fake_vector(text)
        embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if as_base64 else vector
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    payload = {
        "object": "list",
        "data": data,
        "model": request["model"],
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
    }
    return 200, {"content-type": "application/json"}, json.dumps(payload).encode()


@contextmanager
def fake_ollama(port: int = 0, *, delay: float = 0.0) -> Iterator[str]:
    """``delay``: seconds each request takes (a busy or distant server), same vectors."""

    def embed(handler, body):
        time.sleep(delay)
        return _ollama_embed(handler, body)

    with serve({"/api/embed": embed}, port=port) as base:
        yield base


@contextmanager
def fake_openai(port: int = 0) -> Iterator[str]:
    with serve({"/v1/embeddings": _openai_embeddings}, port=port) as base:
        yield f"{base}/v1"
