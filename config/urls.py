from django.contrib import admin
from django.urls import path, re_path

from kb import views
from kb.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("health", views.health, name="health"),
    path("api/", api.urls),
    re_path(r"^api/(?P<rest>.*)$", views.api_not_found),
]
