"""A source's record of a document it created names that document: deleted by anyone, the record
goes with it (kb.models.SourceItem)."""

import django.db.models.deletion
from django.db import migrations, models

# Each record's document is its source's collection's one of that URI; a record whose document
# was deleted meanwhile no longer belongs to anything and goes.
LINK_ITEMS = """
    UPDATE kb_sourceitem AS item SET document_id = document.id
    FROM kb_source AS source, kb_document AS document
    WHERE source.id = item.source_id AND document.collection_id = source.collection_id
      AND document.source_uri = item.uri
"""
DROP_ORPHANS = "DELETE FROM kb_sourceitem WHERE document_id IS NULL"


class Migration(migrations.Migration):
    dependencies = [
        ("kb", "0012_ulid_case_insensitive"),
    ]

    operations = [
        migrations.AddField(
            model_name="sourceitem",
            name="document",
            field=models.ForeignKey(
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="kb.document",
            ),
        ),
        migrations.RunSQL([LINK_ITEMS, DROP_ORPHANS], reverse_sql=migrations.RunSQL.noop),
    ]
