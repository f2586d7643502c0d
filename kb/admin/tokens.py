"""API tokens: created through the token service, shown in plain text exactly once, revoked by action."""

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from kb.admin.common import CuratedAdmin, adopt, run_each
from kb.forms import ApiTokenForm
from kb.models import ApiToken, Collection
from kb.services.tokens import scopes_grantable_by, token_create, token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(CuratedAdmin):
    form = ApiTokenForm
    list_display = [
        "name",
        "prefix",
        "scope",
        "collections_column",
        "state",
        "created_by",
        "created_at",
        "last_used_at",
    ]
    list_filter = ["scope"]
    list_select_related = ["created_by"]
    search_fields = ["name", "prefix"]
    filter_horizontal = ["collections"]
    actions = ["revoke"]

    def get_form(self, request: HttpRequest, obj: ApiToken | None = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        form.grantable = scopes_grantable_by(request.user)
        if "collections" in form.base_fields and not request.user.has_perm("kb.view_collection"):
            form.base_fields["collections"].queryset = Collection.objects.none()  # not even their names
        return form

    def get_list_display(self, request: HttpRequest) -> list[str]:
        return _collections_seen_by(request, super().get_list_display(request))

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiToken]:
        return super().get_queryset(request).prefetch_related("collections")

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        if obj is None:
            return ["name", "scope", "collections", "expires_at"]
        return _collections_seen_by(request, [*self.list_display, "expires_at", "revoked_at"])

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        # A token is not edited: revoke it and create another. Only its hash is stored anyway.
        return [] if obj is None else self.get_fields(request, obj)

    @admin.display(description="Collections")
    def collections_column(self, obj: ApiToken) -> str:
        return obj.collections_label()

    @admin.display(description="State")
    def state(self, obj: ApiToken) -> str:
        return obj.state

    def save_model(self, request: HttpRequest, obj: ApiToken, form: ApiTokenForm, change: bool) -> None:
        if change:
            return
        data = form.cleaned_data
        token, plaintext = token_create(
            name=data["name"],
            scope=data["scope"],
            collections=[collection.name for collection in data["collections"]],
            created_by=request.user,
            expires_at=data["expires_at"],
        )
        adopt(obj, token)
        # Kept on the request only: response_add shows it once and it is never stored.
        request.kb_token_plaintext = plaintext

    def save_related(self, request: HttpRequest, form: ApiTokenForm, formsets: Any, change: bool) -> None:
        """token_create already linked the collections."""

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None) -> HttpResponse:
        plaintext = getattr(request, "kb_token_plaintext", None)
        if plaintext is None:
            return super().response_add(request, obj, post_url_continue)
        # Shown even when asked for in a popup: a token whose plaintext nobody saw is useless.
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "API token created",
            "token": obj,
            "plaintext": plaintext,
            "list_url": reverse("admin:kb_apitoken_changelist"),
        }
        response = TemplateResponse(request, "admin/kb/apitoken/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(permissions=["change"], description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        run_each(
            request,
            list(queryset.filter(revoked_at__isnull=True).values_list("prefix", "name")),
            lambda token: token_revoke(prefix=token[0]),
            done="Revoked {count} token{s}.",
            name=lambda token: token[1],
        )


def _collections_seen_by(request: HttpRequest, fields: list[str]) -> list[str]:
    """A token's collections are named only to a curator who may view collections."""
    return fields if request.user.has_perm("kb.view_collection") else [f for f in fields if f != "collections_column"]
