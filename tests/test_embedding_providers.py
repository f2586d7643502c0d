"""The three providers behind one interface; Ollama and OpenAI against HTTP-level fakes."""

import subprocess
import sys

import pytest

from kb.embeddings import EmbeddingError, embed_texts
from tests.conftest import ROOT, free_port
from tests.support.fake_providers import DIMENSIONS, fake_ollama, fake_openai, fake_vector
from tests.support.http_server import serve


def test_the_local_model_gives_normalised_384_dimensional_vectors():
    first, second, unrelated = embed_texts(
        "local",
        "all-MiniLM-L6-v2",
        ["boundary layer transition", "transition of boundary layers", "chocolate cake recipe"],
    )
    assert len(first) == 384
    assert abs(sum(value * value for value in first) - 1.0) < 1e-3

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(first, second) > cosine(first, unrelated) + 0.3


def test_an_unknown_local_model_is_refused_rather_than_downloaded():
    with pytest.raises(EmbeddingError) as error:
        embed_texts("local", "BAAI/bge-large-en", ["x"])
    assert not error.value.retryable and "nothing is downloaded" in error.value.message


def test_ollama_vectors_come_back_in_batches(settings):
    settings.EMBEDDING_BATCH_SIZE = 2
    with fake_ollama() as base:
        settings.OLLAMA_HOST = base
        vectors = embed_texts("ollama", "nomic-embed-text", ["a b", "c", "d e f"])
    assert vectors == [fake_vector("a b"), fake_vector("c"), fake_vector("d e f")]


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_openai_compatible_servers_work_through_the_base_url(settings, encoding):
    with fake_openai() as base:
        settings.OPENAI_BASE_URL = base
        settings.OPENAI_API_KEY = "sk-test"
        vectors = embed_texts("openai", "text-embedding-3-small", ["alpha beta", "gamma"])
    assert [len(vector) for vector in vectors] == [DIMENSIONS, DIMENSIONS]
    assert vectors[0] == pytest.approx(fake_vector("alpha beta"))


def test_a_dead_backend_is_a_retryable_embedding_error(settings):
    settings.OLLAMA_HOST = f"http://127.0.0.1:{free_port()}"
    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{free_port()}/v1"
    settings.EMBEDDING_TIMEOUT_SECONDS = 2
    for provider in ("ollama", "openai"):
        with pytest.raises(EmbeddingError) as error:
            embed_texts(provider, "any-model", ["text"])
        assert error.value.retryable and error.value.code == "EMBEDDING_ERROR"
        assert "unreachable" in error.value.message


def test_refusals_are_not_retried_and_say_what_to_do(settings):
    routes = {
        "/api/embed": lambda h, b: (404, {"content-type": "application/json"}, b'{"error": "model \\"x\\" not found"}'),
        "/v1/embeddings": lambda h, b: (
            401,
            {"content-type": "application/json"},
            b'{"error": {"message": "bad key"}}',
        ),
    }
    with serve(routes) as base:
        settings.OLLAMA_HOST = base
        settings.OPENAI_BASE_URL = f"{base}/v1"
        with pytest.raises(EmbeddingError) as ollama_error:
            embed_texts("ollama", "x", ["text"])
        with pytest.raises(EmbeddingError) as openai_error:
            embed_texts("openai", "x", ["text"])
    assert not ollama_error.value.retryable and "ollama pull x" in ollama_error.value.message
    assert not openai_error.value.retryable and "bad key" in openai_error.value.message


def test_overloaded_backends_are_retryable(settings):
    with serve({"/v1/embeddings": lambda h, b: (503, {}, b"busy")}) as base:
        settings.OPENAI_BASE_URL = f"{base}/v1"
        with pytest.raises(EmbeddingError) as error:
            embed_texts("openai", "x", ["text"])
    assert error.value.retryable


def test_importing_the_tasks_does_not_load_the_ml_stack():
    code = (
        "import django, os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings'; django.setup(); "
        "import kb.tasks, kb.services.ingest, config.asgi; "
        "print(sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules))"
    )
    output = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "[]"
