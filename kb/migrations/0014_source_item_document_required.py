"""In a migration of its own: Postgres refuses to alter a table with the update of 0013 still
pending in the same transaction. The record goes with its document in the database (as chunks do:
kb.models), so Django's deletes of documents stay one statement."""

import django.db.models.deletion
from django.db import migrations, models

from kb.migration_operations import cascade_foreign_key


class Migration(migrations.Migration):
    dependencies = [
        ("kb", "0013_source_item_document"),
    ]

    operations = [
        migrations.AlterField(
            model_name="sourceitem",
            name="document",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="kb.document",
            ),
        ),
        cascade_foreign_key("kb_sourceitem", "document_id", "kb_document"),
    ]
