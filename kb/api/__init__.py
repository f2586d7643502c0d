"""The REST API (django-ninja), mounted at /api/ with its OpenAPI documentation at /api/docs.

Every endpoint checks the caller's token (kb.api.auth) and calls a service or selector; the
routers hold no other logic. Errors are ``{"error": {"code", "message"}}`` (kb.api.errors).
"""

from ninja import NinjaAPI
from ninja.operation import Operation

from kb.api import collections, documents, search, sources
from kb.api.auth import BearerToken, JsonBodies
from kb.api.errors import install_error_handlers, read_only


class KnowledgeBaseAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Operation) -> str:
        # Short ids (``search_chunks``, not ``kb_api_search_search_chunks``) for generated clients.
        return operation.view_func.__name__


api = KnowledgeBaseAPI(
    title="Knowledge base API",
    version="1.0.0",
    description=(
        "Collections, documents, hybrid search and statistics of the knowledge base. "
        "Send an API token as `Authorization: Bearer <token>` (create one in the admin or with "
        "`manage.py kb_token create`); on the embedded loopback default tokens are optional. "
        'Errors are `{"error": {"code": ..., "message": ...}}`.'
    ),
    urls_namespace="api",
    auth=BearerToken(),
    parser=JsonBodies(),
    docs_decorator=read_only,
)
install_error_handlers(api)
api.add_router("/collections", collections.router)
api.add_router("", documents.router)
api.add_router("", search.router)
api.add_router("", sources.router)
