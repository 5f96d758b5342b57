# Rule.cost_header (issue 32): a cost known after the response.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_throttle', '0003_rule_block_growth'),
    ]

    operations = [
        migrations.AddField(
            model_name='rule',
            name='cost_header',
            field=models.CharField(blank=True, default='', help_text="A response header holding the request's actual cost, a whole number (tokens an LLM call used: X-Tokens-Used). The request takes its cost before the view (1 by default); the difference is charged or given back when the response ends. Empty: the cost taken stands. Not for concurrency rules.", max_length=100, verbose_name='cost from response header'),
        ),
    ]
