# Rule.count_statuses and Override.expires_at (issue 22).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_throttle', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='override',
            name='expires_at',
            field=models.DateTimeField(blank=True, help_text='When this override stops applying. Empty: never.', null=True, verbose_name='expires'),
        ),
        migrations.AddField(
            model_name='rule',
            name='count_statuses',
            field=models.CharField(blank=True, default='', help_text='Empty: every request counts. Else the statuses that count, comma-separated: 401,403 (failed logins), 4xx, 5xx,429. The request is counted before the view; what it took is given back when its response has another status.', max_length=200, verbose_name='count only responses'),
        ),
    ]
