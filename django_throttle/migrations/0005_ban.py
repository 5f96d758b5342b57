# Ban: clients refused everywhere by ThrottleMiddleware (issue 32).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_throttle', '0004_rule_cost_header'),
    ]

    operations = [
        migrations.CreateModel(
            name='Ban',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(help_text='As the dashboard writes it: ip:203.0.113.7, a network ip:203.0.113.0/24 or ip:2001:db8::/48, user:42, header:<value> or param:<value>.', max_length=255, verbose_name='client key')),
                ('reason', models.TextField(blank=True, verbose_name='reason')),
                ('expires_at', models.DateTimeField(blank=True, help_text='When this ban stops applying. Empty: never.', null=True, verbose_name='expires')),
                ('created_at', models.DateTimeField(auto_now_add=True, verbose_name='created')),
                ('updated_at', models.DateTimeField(auto_now=True, verbose_name='updated')),
            ],
            options={
                'verbose_name': 'ban',
                'verbose_name_plural': 'bans',
                'ordering': ['-created_at', 'key'],
                'constraints': [models.UniqueConstraint(fields=('key',), name='django_throttle_one_ban')],
            },
        ),
    ]
