"""Tokens say explicitly whether they are limited to collections (deleting the last one of them
no longer turns a limited token into one for every collection), and collection names are checked
with fullmatch (a trailing newline is not part of a valid name)."""

from django.db import migrations, models

import kb.models


def mark_limited_tokens(apps, schema_editor):
    ApiToken = apps.get_model("kb", "ApiToken")
    ApiToken.objects.filter(collections__isnull=False).update(limited_to_collections=True)


class Migration(migrations.Migration):
    dependencies = [("kb", "0004_bm25_models")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="limited_to_collections",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(mark_limited_tokens, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="collection",
            name="name",
            field=models.CharField(max_length=100, unique=True, validators=[kb.models.validate_collection_name_field]),
        ),
    ]
