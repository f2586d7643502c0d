from django.contrib import admin
from django.urls import path, re_path

from kb import views
from kb.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", views.home, name="home"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("health", views.health, name="health"),
    path("health/live", views.liveness, name="liveness"),
    path("health/ready", views.readiness, name="readiness"),
    path("api/", views.api_not_found, {"rest": ""}),  # before django-ninja's root, an HTML 404
    path("api/", api.urls),
    re_path(r"^api/(?P<rest>[\s\S]*)$", views.api_not_found),  # [\s\S]: "%0A" in a path too
]

# A request Django itself refuses (a malformed multipart body, a header past its limits) gets the
# API's JSON error shape on /api/ paths.
handler400 = views.bad_request
