"""Forms of the admin's pages. They check the shape of the input; the services decide the rest
(their validators are reused here so that mistakes show next to the field, not as a crash)."""

import json
from typing import Any

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator

from kb.errors import KBError
from kb.ingestion.formats import CONTENT_TYPES
from kb.models import DEFAULT_TOP_K, MAX_TOP_K, ApiToken, Collection, EmbeddingProvider, Source
from kb.search import MODES
from kb.services.collections import (
    validate_chunk_settings,
    validate_collection_name,
    validate_description,
    validate_semantic_weight,
)
from kb.services.embedding_models import embedding_model_choose, model_name_for
from kb.services.sources import validate_source_fields
from kb.services.tokens import validate_expiry
from kb.storable import parse_json

CONTENT_TYPE_CHOICES = [("", "Detect automatically")] + [(kind, kind) for kind in CONTENT_TYPES]


class JSONObjectField(forms.CharField):
    """A JSON object typed into a textarea; empty means none."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60, "spellcheck": "false"})

    def to_python(self, value: Any) -> dict[str, Any] | None:
        text = (super().to_python(value) or "").strip()
        if not text:
            return None
        try:
            parsed = parse_json(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise forms.ValidationError('Use a JSON object, like {"author": "Smith"}.')
        return parsed


# --- collections ----------------------------------------------------------------------------


class CollectionForm(forms.ModelForm):
    # kb/collection_form.js puts the chosen provider's default model in the model field.
    embedding_provider = forms.ChoiceField(
        choices=EmbeddingProvider.choices,
        widget=forms.Select(attrs={"data-default-models": json.dumps(settings.EMBEDDING_DEFAULT_MODELS)}),
    )
    embedding_model_name = forms.CharField(
        label="Embedding model",
        max_length=200,
        required=False,
        help_text="Blank, or another provider's default: this provider's default. Defaults: "
        + ", ".join(f"{provider}: {model}" for provider, model in settings.EMBEDDING_DEFAULT_MODELS.items())
        + ". Changing it re-embeds the collection in the background; search switches when it is done.",
    )
    search_top_k = forms.IntegerField(
        label="Search top k", initial=DEFAULT_TOP_K, validators=[MinValueValidator(1), MaxValueValidator(MAX_TOP_K)]
    )

    class Media:
        js = ["kb/collection_form.js"]

    class Meta:
        model = Collection
        fields = [
            "name",
            "description",
            "chunk_max_tokens",
            "chunk_min_tokens",
            "chunk_overlap_tokens",
            "search_top_k",
            "search_hybrid",
            "semantic_weight",
        ]
        help_texts = {
            "semantic_weight": "Share of semantic search in hybrid ranking, 0 to 1. Empty: the server default "
            "(KB_SEMANTIC_WEIGHT).",
            "chunk_max_tokens": "New chunk settings apply to documents ingested or re-ingested later.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        collection = self.instance
        if collection.pk:
            model = collection.next_embedding_model or collection.embedding_model
            self.initial.setdefault("embedding_provider", model.provider)
            self.initial.setdefault("embedding_model_name", model.name)
        else:
            self.initial.setdefault("embedding_provider", settings.EMBEDDING_PROVIDER)
            self.initial.setdefault("embedding_model_name", settings.EMBEDDING_MODEL)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        try:
            if "name" in data:
                validate_collection_name(data["name"])
            if all(data.get(key) is not None for key in ("chunk_max_tokens", "chunk_min_tokens")):
                validate_chunk_settings(
                    max_tokens=data["chunk_max_tokens"],
                    min_tokens=data["chunk_min_tokens"],
                    overlap_tokens=data.get("chunk_overlap_tokens") or 0,
                )
            validate_semantic_weight(data.get("semantic_weight"))
            validate_description(data.get("description") or "")
        except KBError as error:
            raise forms.ValidationError(error.message) from None
        self._check_model(data)
        return data

    def _check_model(self, data: dict[str, Any]) -> None:
        """A new or changed model must be one its provider can embed with (asked now, not after saving)."""
        provider = data.get("embedding_provider")
        if not provider:
            return
        collection = self.instance
        shown = (collection.next_embedding_model or collection.embedding_model) if collection.pk else None
        if shown and (shown.provider, shown.name) == (
            provider,
            model_name_for(provider, data.get("embedding_model_name")),
        ):
            return
        try:
            embedding_model_choose(provider=provider, name=data.get("embedding_model_name"))
        except KBError as error:
            self.add_error("embedding_model_name", f"{error.message} ({error.code})")


# --- documents ------------------------------------------------------------------------------


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    widget = MultipleFileInput

    def clean(self, data: Any, initial: Any = None) -> list[Any]:
        single = super().clean
        files = data if isinstance(data, list | tuple) else [data]
        # No file at all is checked like a single missing one (required or not).
        return [single(item, initial) for item in files] if files else [single(None, initial)]


def _collection_field() -> forms.ModelChoiceField:
    return forms.ModelChoiceField(queryset=Collection.objects.only("id", "name").order_by("name"))


class DocumentUploadForm(forms.Form):
    required_css_class = "required"

    collection = _collection_field()
    # An empty file is the service's to refuse, by name, while the others are stored.
    files = MultipleFileField(label="Files", help_text="Select one file or several at once.", allow_empty_file=True)
    content_type = forms.ChoiceField(choices=CONTENT_TYPE_CHOICES, required=False, label="Content type")
    metadata = JSONObjectField(required=False, help_text='Added to every file, e.g. {"author": "Smith"}.')


class DocumentSourceForm(forms.Form):
    required_css_class = "required"

    collection = _collection_field()
    uri = forms.CharField(
        label="URL or data: URI",
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60, "spellcheck": "false"}),
        help_text="An https:// or http:// address (public hosts only), a data: URI, or a file:// path inside "
        "KB_FILE_ROOTS (a folder ingests every supported file in it).",
    )
    title = forms.CharField(required=False, max_length=500)
    content_type = forms.ChoiceField(choices=CONTENT_TYPE_CHOICES, required=False, label="Content type")
    metadata = JSONObjectField(required=False)


# --- search playground ----------------------------------------------------------------------


class PlaygroundForm(forms.Form):
    required_css_class = "required"

    q = forms.CharField(label="Query", widget=forms.TextInput(attrs={"size": 60}))  # the search checks its length
    collections = forms.ModelMultipleChoiceField(
        queryset=Collection.objects.only("id", "name").order_by("name"),
        to_field_name="name",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None selected: every collection.",
    )
    # Optional with defaults, so that a link with only ?q=... runs a search.
    mode = forms.ChoiceField(
        choices=[(mode, mode) for mode in MODES],
        required=False,
        widget=forms.RadioSelect,
        help_text="None chosen: the collection's setting, else hybrid.",
    )
    semantic_weight = forms.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        help_text="Hybrid only. Empty: the collection's setting or the server default.",
    )
    top_k = forms.IntegerField(
        min_value=1,
        max_value=MAX_TOP_K,
        required=False,
        label="Top k",
        help_text=f"Empty: the collection's, else {DEFAULT_TOP_K}.",
    )
    min_score = forms.FloatField(required=False, label="Minimum score (0 to 1)")
    min_similarity = forms.FloatField(required=False, min_value=-1.0, max_value=1.0, label="Minimum similarity")
    content_types = forms.MultipleChoiceField(
        choices=[(kind, kind) for kind in CONTENT_TYPES], required=False, widget=forms.SelectMultiple(attrs={"size": 4})
    )
    metadata = JSONObjectField(
        required=False,
        label="Metadata filter",
        help_text='For example {"author": "Smith", "year": {"$gte": 2020}}. Operators: $eq $ne $gt $gte $lt $lte $in.',
    )

    def search_arguments(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "query": data["q"],
            "collections": [collection.name for collection in data["collections"]] or None,
            "mode": data["mode"] or None,
            "semantic_weight": data["semantic_weight"],
            "top_k": data["top_k"],
            "min_score": data["min_score"],
            "min_similarity": data["min_similarity"],
            "content_types": data["content_types"] or None,
            "metadata": data["metadata"],
        }


# --- API tokens -----------------------------------------------------------------------------


class ApiTokenForm(forms.ModelForm):
    """Offers only the scopes the signed-in curator may hand out (the admin sets ``grantable``)."""

    grantable: list[str] = []

    class Meta:
        model = ApiToken
        fields = ["name", "scope", "collections", "expires_at"]
        help_texts = {"collections": "None selected: every collection."}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "scope" in self.fields:
            scope = self.fields["scope"]
            scope.choices = [(value, label) for value, label in scope.choices if value in self.grantable]
            if not self.grantable:
                scope.help_text = (
                    "Your account may not hand out tokens: "
                    "it needs to view collections, documents, chunks, sources and sync runs."
                )

    def clean_expires_at(self) -> Any:
        expires_at = self.cleaned_data.get("expires_at")
        try:
            validate_expiry(expires_at)
        except KBError as error:
            raise forms.ValidationError(error.message) from None
        return expires_at


# --- sources --------------------------------------------------------------------------------


class LinesField(forms.CharField):
    """A list typed one item per line."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60, "spellcheck": "false"})

    def prepare_value(self, value: Any) -> Any:
        return "\n".join(value) if isinstance(value, list) else value

    def to_python(self, value: Any) -> list[str]:
        return [line.strip() for line in (super().to_python(value) or "").splitlines() if line.strip()]


class SourceForm(forms.ModelForm):
    include = LinesField(
        required=False, help_text="Globs a file must match, one per line (e.g. *.md). None: every file."
    )
    exclude = LinesField(required=False, help_text="Globs of files to leave out, one per line (e.g. drafts/*).")
    urls = LinesField(required=False, label="URLs", help_text="http(s) URLs to follow, one per line.")

    class Meta:
        model = Source
        fields = ["name", "collection", "folder", "recursive", "include", "exclude", "urls", "sitemap_url",
                  "interval_minutes"]  # fmt: skip
        widgets = {
            "folder": forms.TextInput(attrs={"size": 80}),
            "sitemap_url": forms.URLInput(attrs={"size": 80}),
        }
        help_texts = {
            "folder": "A folder under KB_FILE_ROOTS. Give a folder, or URLs and/or a sitemap.",
            "interval_minutes": "Sync on this schedule. Empty: only when asked (Sync now).",
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        try:
            data.update(validate_source_fields(**{key: data[key] for key in self.Meta.fields if key != "collection"}))
        except KBError as error:
            raise forms.ValidationError(error.message) from None
        return data
