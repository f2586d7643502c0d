from django.http import HttpRequest, JsonResponse

from kb import selectors


def health(request: HttpRequest) -> JsonResponse:
    report = selectors.health_report()
    return JsonResponse(report, status=200 if report["status"] == "ok" else 503)
