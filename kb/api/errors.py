"""Every error of the REST API is ``{"error": {"code", "message"}}`` with the seed's HTTP status.

Services raise KBError; the handlers below also translate what Django and django-ninja raise
(invalid input, oversized requests, database failures) into the same shape.
"""

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import SuspiciousOperation
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError

from kb.api.schemas import ErrorOut
from kb.errors import HTTP_STATUS, ErrorCode, KBError, database_error
from kb.middleware import request_middleware

logger = logging.getLogger(__name__)

# Any endpoint may answer these: bad input, missing or invalid token, too weak a scope, database down.
COMMON_ERRORS = (
    ErrorCode.INVALID_ARGUMENT,
    ErrorCode.UNAUTHORIZED,
    ErrorCode.PERMISSION_DENIED,
    ErrorCode.DATABASE_ERROR,
)


def with_errors(ok: dict[int, Any], *codes: ErrorCode) -> dict[Any, Any]:
    """An endpoint's ``response=``: its success schema and the statuses of the errors it may raise."""
    statuses = frozenset(HTTP_STATUS[code] for code in (*COMMON_ERRORS, *codes))
    return {**ok, statuses: ErrorOut}


def install_error_handlers(api: NinjaAPI) -> None:
    def handler(translate: Callable[[Any], KBError]) -> Callable[[HttpRequest, Exception], HttpResponse]:
        def respond(request: HttpRequest, exc: Exception) -> HttpResponse:
            error = translate(exc)
            return api.create_response(request, error.as_dict(), status=error.http_status)

        return respond

    api.add_exception_handler(KBError, handler(lambda exc: exc))
    api.add_exception_handler(ValidationError, handler(_invalid_input))
    api.add_exception_handler(SuspiciousOperation, handler(_refused_request))
    api.add_exception_handler(DatabaseError, handler(_database_error))
    api.add_exception_handler(HttpError, _http_error_handler(api))


def _invalid_input(exc: ValidationError) -> KBError:
    problems = []
    for error in exc.errors[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part not in ("body", "payload"))
        problems.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
    return KBError(ErrorCode.INVALID_ARGUMENT, "Invalid request: " + "; ".join(problems))


def _refused_request(exc: SuspiciousOperation) -> KBError:
    # Too large a request body or too many files (DATA_UPLOAD_MAX_MEMORY_SIZE, DATA_UPLOAD_MAX_NUMBER_FILES).
    return KBError(ErrorCode.INVALID_ARGUMENT, f"Request refused: {exc}")


def _database_error(exc: DatabaseError) -> KBError:
    logger.exception("database error in an API request", exc_info=exc)
    return database_error(exc)


def _http_error_handler(api: NinjaAPI) -> Callable[[HttpRequest, Exception], HttpResponse]:
    codes = {401: ErrorCode.UNAUTHORIZED, 403: ErrorCode.PERMISSION_DENIED}

    def respond(request: HttpRequest, exc: Exception) -> HttpResponse:
        assert isinstance(exc, HttpError)
        if isinstance(exc.__cause__, KBError):  # our parser's refusal, which django-ninja wraps
            return api.create_response(request, exc.__cause__.as_dict(), status=exc.__cause__.http_status)
        code = codes.get(exc.status_code, ErrorCode.INVALID_ARGUMENT)
        return api.create_response(request, KBError(code, str(exc)).as_dict(), status=exc.status_code)

    return respond


def _method_not_allowed_as_json(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """django-ninja answers a method its path does not take in plain text; the API's shape instead."""
    if response.status_code != 405 or not request.path_info.startswith("/api/"):
        return response
    return method_not_allowed(request, response.headers.get("Allow", "").split(","))


def method_not_allowed(request: HttpRequest, methods: list[str]) -> JsonResponse:
    """405 METHOD_NOT_ALLOWED in the API's shape, with the methods the path takes."""
    allowed = ", ".join(sorted(method.strip() for method in methods))
    message = f"{request.method} is not allowed on {request.path}; it takes {allowed}"
    error = KBError(ErrorCode.METHOD_NOT_ALLOWED, message)
    answer = JsonResponse(error.as_dict(), status=error.http_status)
    answer["Allow"] = allowed
    return answer


method_not_allowed_as_json = request_middleware(translate=_method_not_allowed_as_json)


def read_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A view that only reads (the health probes, the OpenAPI schema and its documentation page)
    takes GET and HEAD; any other method is a JSON 405. It had been Django's HTML CSRF page for a
    POST (there is nothing to write, so no cross-site write to refuse), and the schema had answered
    TRACE and OPTIONS with its whole text."""

    @csrf_exempt
    @functools.wraps(view)
    def reader(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return method_not_allowed(request, ["GET", "HEAD"])
        return view(request, *args, **kwargs)

    return reader
