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
def fake_ollama(port: int = 0, *, delay: float = 0.0, models: tuple[str, ...] | None = None) -> Iterator[str]:
    """``delay``: seconds each request takes (a busy or distant server), same vectors.
    ``models``: the only models it has pulled (others get Ollama's 404); None: any."""

    def embed(handler, body):
        time.sleep(delay)
        model = json_body(body)["model"]
        if models is not None and model not in models:
            error = {"error": f'model "{model}" not found, try pulling it first'}
            return 404, {"content-type": "application/json"}, json.dumps(error).encode()
        return _ollama_embed(handler, body)

    with serve({"/api/embed": embed}, port=port) as base:
        yield base


@contextmanager
def fake_openai(port: int = 0) -> Iterator[str]:
    with serve({"/v1/embeddings": _openai_embeddings}, port=port) as base:
        yield f"{base}/v1"


def remote_collection(settings, *, name: str, provider: str = "ollama", model: str | None = None, **options):
    """A collection of a remote model, created while its provider answered (a model is checked
    then: embedding_model_choose). The provider's address is put back afterwards: the test
    decides what answers from now on."""
    from kb.services.collections import collection_create

    saved = settings.OLLAMA_HOST, settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY
    with fake_ollama() as ollama_base, fake_openai() as openai_base:
        settings.OLLAMA_HOST, settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = ollama_base, openai_base, "sk-x"
        try:
            return collection_create(name=name, embedding_provider=provider, embedding_model=model, **options)
        finally:
            settings.OLLAMA_HOST, settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = saved
