"""API tokens, newest first."""

from django.db.models import QuerySet

from kb.models import ApiToken


def token_list() -> QuerySet[ApiToken]:
    return ApiToken.objects.select_related("created_by").prefetch_related("collections").order_by("-created_at")
