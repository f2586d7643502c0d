"""A sync run keeps the name of the collection it ran in (kb.models.SyncRun.collection_name); the
runs kept from before get their source's collection, the best that is known of them."""

from django.db import migrations, models

NAME_KEPT_RUNS = """
    UPDATE kb_syncrun AS run SET collection_name = collection.name
    FROM kb_source AS source, kb_collection AS collection
    WHERE source.id = run.source_id AND collection.id = source.collection_id
"""


class Migration(migrations.Migration):
    dependencies = [
        ("kb", "0014_source_item_document_required"),
    ]

    operations = [
        migrations.AddField(
            model_name="syncrun",
            name="collection_name",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.RunSQL(NAME_KEPT_RUNS, reverse_sql=migrations.RunSQL.noop),
    ]
