from django.apps import AppConfig


class KbConfig(AppConfig):
    name = "kb"
    verbose_name = "Knowledge base"
    default_auto_field = "django.db.models.BigAutoField"
