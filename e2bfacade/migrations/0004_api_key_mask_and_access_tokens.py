"""E2B's shapes for keys (a UUID id, the mask, lastUsed) and access tokens.

Existing keys get a UUID each (added nullable, filled row by row, then made unique): a
callable default would give every existing row the same one. Their mask suffix stays
empty, since their last characters were never stored."""

import django.db.models.deletion
import uuid
from django.db import migrations, models


def fill_public_ids(apps, schema_editor):  # type: ignore[no-untyped-def]
    ApiKey = apps.get_model("e2bfacade", "ApiKey")
    for key in ApiKey.objects.filter(public_id__isnull=True).only("pk"):
        ApiKey.objects.filter(pk=key.pk).update(public_id=uuid.uuid4())


class Migration(migrations.Migration):

    dependencies = [
        ('e2bfacade', '0003_rate_limit_unlogged'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='last_used_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='apikey',
            name='masked_suffix',
            field=models.CharField(blank=True, default='', editable=False, max_length=4),
        ),
        migrations.AddField(
            model_name='apikey',
            name='public_id',
            field=models.UUIDField(editable=False, null=True),
        ),
        migrations.RunPython(fill_public_ids, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='apikey',
            name='public_id',
            field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True),
        ),
        migrations.AddField(
            model_name='apikey',
            name='value_length',
            field=models.PositiveSmallIntegerField(default=0, editable=False),
        ),
        migrations.CreateModel(
            name='AccessToken',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(blank=True, max_length=255)),
                ('token_hash', models.CharField(editable=False, max_length=64)),
                ('value_length', models.PositiveSmallIntegerField(editable=False)),
                ('masked_prefix', models.CharField(editable=False, max_length=2)),
                ('masked_suffix', models.CharField(editable=False, max_length=4)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='access_tokens', to='e2bfacade.team')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('token_hash',), name='accesstoken_hash_unique')],
            },
        ),
    ]
