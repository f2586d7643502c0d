from django.http import HttpRequest, JsonResponse

from kb import selectors
from kb.api.auth import sees_health_details
from kb.errors import ErrorCode, KBError


def health(request: HttpRequest) -> JsonResponse:
    report = selectors.health_report(detailed=sees_health_details(request))
    return JsonResponse(report, status=200 if report["status"] == "ok" else 503)


def api_not_found(request: HttpRequest, rest: str) -> JsonResponse:
    """Scripts get the API's JSON error shape for a mistyped path, not Django's HTML page."""
    error = KBError(ErrorCode.NOT_FOUND, f"No API endpoint at {request.path}; the endpoints are listed at /api/docs")
    return JsonResponse(error.as_dict(), status=error.http_status)
