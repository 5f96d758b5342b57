# Rule.block_growth (issue 32): blocks that grow for a client who comes back.

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_throttle', '0002_count_statuses_expires_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='rule',
            name='block_growth',
            field=models.PositiveIntegerField(default=1, help_text="Each further block of a client that comes back while its last block is remembered (DJANGO_THROTTLE['BLOCK_MEMORY'], a day by default) lasts this many times the one before, up to 7 days. Example: 4 makes blocks of 60 s, 4, 16 and 64 minutes. 1 = every block as long.", validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000)], verbose_name='block growth'),
        ),
    ]
