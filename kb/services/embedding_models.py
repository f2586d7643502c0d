from django.conf import settings
from django.db import transaction

from kb.errors import ErrorCode, KBError
from kb.models import EMBEDDING_MODEL_NAME_MAX_LENGTH, EmbeddingModel, EmbeddingProvider
from kb.storable import check_storable
from kb.vector_index import ensure_hnsw_index

# Dimensions known without asking the provider; others are learnt from the first vector (a
# remote model chosen for a collection is asked at once: embedding_model_choose).
KNOWN_DIMENSIONS = {("local", "all-MiniLM-L6-v2"): 384}


def embedding_model_get_or_create(*, provider: str, name: str) -> EmbeddingModel:
    name = _checked_name(provider, name)
    model, created = EmbeddingModel.objects.get_or_create(provider=provider, name=name)
    known = KNOWN_DIMENSIONS.get((provider, name))
    if created and known:
        model = embedding_model_record_dimensions(model=model, dimensions=known)
    return model


def _checked_name(provider: str, name: str) -> str:
    """The name a provider is asked for, refused if it cannot name a model."""
    if provider not in EmbeddingProvider.values:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"Unknown embedding provider {provider!r}; use one of {', '.join(EmbeddingProvider.values)}",
        )
    name = default_model_for(provider, name.strip())
    if not name:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "Embedding model name must not be empty")
    if len(name) > EMBEDDING_MODEL_NAME_MAX_LENGTH:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "Embedding model name is too long")
    check_storable(name, what="embedding model name")
    if provider == EmbeddingProvider.LOCAL:
        _check_local_model(name)
    return name


def embedding_model_choose(*, provider: str, name: str | None) -> EmbeddingModel:
    """The model a collection is given or switched to, checked before anything accepts it.

    A blank name is the provider's default. A local model's files must be there; a remote model
    that has never given a vector is asked for one now: a provider that refuses it (unknown model,
    bad key) gives INVALID_ARGUMENT, one that cannot be reached EMBEDDING_ERROR. Its row is written
    only once it has answered: a refused name leaves nothing behind."""
    from kb.embedding_providers import EmbeddingError, embed_texts

    name = _checked_name(provider, model_name_for(provider, name))
    model = EmbeddingModel.objects.filter(provider=provider, name=name).first()
    if model is None and (provider, name) in KNOWN_DIMENSIONS:
        model = embedding_model_get_or_create(provider=provider, name=name)
    if model is not None and model.dimensions is not None:
        return model
    try:
        vectors = embed_texts(provider, name, ["A short text to check the model."])
    except EmbeddingError as error:
        code = ErrorCode.EMBEDDING_ERROR if error.retryable else ErrorCode.INVALID_ARGUMENT
        raise KBError(code, f"Cannot use the embedding model {provider}:{name}: {error.message}") from None
    model = embedding_model_get_or_create(provider=provider, name=name)
    if model.dimensions is not None:
        return model
    return embedding_model_record_dimensions(model=model, dimensions=len(vectors[0]))


def model_name_for(provider: str, name: str | None) -> str:
    """The model asked of a provider for a name a curator gave (blank: the provider's default)."""
    return default_model_for(provider, (name or "").strip() or settings.EMBEDDING_DEFAULT_MODELS.get(provider, ""))


def default_model_for(provider: str, name: str) -> str:
    """The model a provider is asked for: its own default when the name is another provider's
    default (a form that switched the provider and kept the old default: ``ollama:all-MiniLM-L6-v2``
    fails every embedding). An empty name stays empty: it is refused."""
    defaults = settings.EMBEDDING_DEFAULT_MODELS
    others = {model for other, model in defaults.items() if other != provider}
    if name in others and name != defaults.get(provider):
        return defaults.get(provider, name)
    return name


def _check_local_model(name: str) -> None:
    """A local model must be one the provider can load (it never downloads), checked without loading it."""
    from kb.embedding_providers import EmbeddingError, local_model_path

    try:
        local_model_path(name)
    except EmbeddingError as error:
        raise KBError(ErrorCode.INVALID_ARGUMENT, error.message) from None


def embedding_model_default() -> EmbeddingModel:
    return embedding_model_get_or_create(provider=settings.EMBEDDING_PROVIDER, name=settings.EMBEDDING_MODEL)


def embedding_model_record_dimensions(*, model: EmbeddingModel, dimensions: int) -> EmbeddingModel:
    """Record the dimension of a model's vectors (once) and build its HNSW index."""
    if model.dimensions == dimensions:
        return model
    with transaction.atomic():
        locked = EmbeddingModel.objects.select_for_update().get(pk=model.pk)
        if locked.dimensions is None:
            locked.dimensions = dimensions
            locked.save(update_fields=["dimensions"])
            ensure_hnsw_index(locked)
        elif locked.dimensions != dimensions:
            raise KBError(
                ErrorCode.EMBEDDING_ERROR,
                f"{locked.provider}:{locked.name} returned {dimensions}-dimensional vectors, "
                f"but its stored vectors have {locked.dimensions} dimensions",
            )
    return locked
