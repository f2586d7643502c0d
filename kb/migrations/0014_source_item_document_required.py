"""In a migration of its own: Postgres refuses to alter a table with the deferred foreign-key
checks of 0013's update still pending in the same transaction."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kb", "0013_source_item_document"),
    ]

    operations = [
        migrations.AlterField(
            model_name="sourceitem",
            name="document",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="kb.document"),
        ),
    ]
