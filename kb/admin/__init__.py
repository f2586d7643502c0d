"""The Django admin as the knowledge base's home.

Each model's admin lives in its own module; the pages that are not a model's list or form
(adding documents, live status, the search playground) are in ``kb.admin.views``. Every write
calls a service in ``kb.services``; every read that is not a plain list is a selector.
"""

from django.contrib import admin

from kb.admin import chunks, collections, documents, sources, tokens

admin.site.site_header = "Knowledge base"
admin.site.site_title = "Knowledge base admin"
admin.site.index_title = "Dashboard"
# The breadcrumbs and the dashboard lead everywhere; the document list needs the width more.
admin.site.enable_nav_sidebar = False

__all__ = ["chunks", "collections", "documents", "sources", "tokens"]
