from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views import csrf, defaults
from django.views.decorators.csrf import csrf_exempt

from kb.api.auth import sees_health_details
from kb.api.errors import read_only
from kb.errors import ErrorCode, KBError
from kb.selectors.health import health_report, ready


@read_only
def health(request: HttpRequest) -> JsonResponse:
    report = health_report(detailed=sees_health_details(request))
    return JsonResponse(report, status=503 if report["status"] == "error" else 200)


@read_only
def liveness(request: HttpRequest) -> JsonResponse:
    """The process answers (container health checks); readiness, with its dependencies, is /health/ready."""
    return JsonResponse({"status": "ok"})


@read_only
def readiness(request: HttpRequest) -> JsonResponse:
    """503 until the database, the broker and a worker for every queue are there (details: /health)."""
    ok = ready()
    return JsonResponse({"status": "ok" if ok else "not ready"}, status=200 if ok else 503)


def home(request: HttpRequest) -> HttpResponse:
    """There is no public site: the admin is where a person starts."""
    return redirect("admin:index")


# A book, in the admin's blue.
FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect x="2" y="1" width="12" height="14" '
    'rx="2" fill="#417690"/><rect x="5" y="4" width="6" height="1.5" fill="#fff"/>'
    '<rect x="5" y="7" width="6" height="1.5" fill="#fff"/></svg>'
)


def favicon(request: HttpRequest) -> HttpResponse:
    return HttpResponse(FAVICON, content_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not request.path_info.startswith("/api/"):
        return defaults.bad_request(request, exception)
    if isinstance(exception, DisallowedHost):  # Django's text advises which host to allow: the log's
        reason = ": its Host header names no host this server answers to"
    else:
        reason = f": {exception}" if exception and str(exception) else ""
    error = KBError(ErrorCode.INVALID_ARGUMENT, f"The request could not be read{reason}")
    return JsonResponse(error.as_dict(), status=400)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: the API's JSON shape under /api/ (django-ninja's own pages, /api/docs and
    /api/openapi.json, are not exempt: a PUT to them was Django's HTML page), Django's page elsewhere."""
    if not request.path_info.startswith("/api/"):
        return csrf.csrf_failure(request, reason)
    error = KBError(ErrorCode.PERMISSION_DENIED, f"Cross-site request refused ({reason or 'CSRF'})")
    return JsonResponse(error.as_dict(), status=error.http_status)


@csrf_exempt  # a POST to a mistyped path gets this answer, not a CSRF refusal
def api_not_found(request: HttpRequest, rest: str) -> JsonResponse:
    """Scripts get the API's JSON error shape for a mistyped path, not Django's HTML page."""
    error = KBError(ErrorCode.NOT_FOUND, f"No API endpoint at {request.path}; the endpoints are listed at /api/docs")
    return JsonResponse(error.as_dict(), status=error.http_status)
