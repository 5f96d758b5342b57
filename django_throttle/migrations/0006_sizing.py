# SizingCount: the sizing of a limit from real traffic (issue 32).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_throttle', '0005_ban'),
    ]

    operations = [
        migrations.CreateModel(
            name='SizingCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('rule', models.CharField(max_length=100, verbose_name='rule')),
                ('hour', models.DateTimeField(verbose_name='hour')),
                ('reached', models.PositiveIntegerField(verbose_name='count reached')),
                ('count', models.PositiveBigIntegerField(default=0, verbose_name='count')),
            ],
            options={
                'verbose_name': 'sizing count',
                'verbose_name_plural': 'sizing counts',
                'default_permissions': (),
                'indexes': [models.Index(fields=['hour'], name='django_throttle_sizing_hour')],
                'constraints': [models.UniqueConstraint(fields=('rule', 'hour', 'reached'), name='django_throttle_sizing_once')],
            },
        ),
    ]
