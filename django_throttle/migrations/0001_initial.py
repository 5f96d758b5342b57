# The tables of django_throttle: the ten migrations of its development squashed into one
# before the first release.

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
    ]

    operations = [
        migrations.CreateModel(
            name='Rejection',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('rule', models.CharField(max_length=100, verbose_name='rule')),
                ('key', models.CharField(max_length=16, verbose_name='key digest')),
                ('display', models.CharField(max_length=100, verbose_name='client')),
                ('action', models.CharField(choices=[('reject', 'rejected (429)'), ('unavailable', 'store down, failed closed (503)'), ('shadow', 'would reject (log-only rule)')], max_length=12, verbose_name='action')),
                ('minute', models.DateTimeField(verbose_name='minute')),
                ('minutes', models.PositiveSmallIntegerField(db_default=1, default=1, verbose_name='minutes')),
                ('count', models.PositiveBigIntegerField(default=0, verbose_name='count')),
            ],
            options={
                'verbose_name': 'rejection',
                'verbose_name_plural': 'rejections',
                'default_permissions': (),
                'indexes': [models.Index(fields=['minute'], name='django_throttle_rej_minute'), models.Index(fields=['rule', 'minute'], name='django_throttle_rej_rule'), models.Index(fields=['minutes', 'minute'], name='django_throttle_rej_length')],
                'constraints': [models.UniqueConstraint(fields=('rule', 'key', 'action', 'minute'), name='django_throttle_rejection_once')],
            },
        ),
        migrations.CreateModel(
            name='Dashboard',
            fields=[
            ],
            options={
                'verbose_name': 'dashboard',
                'verbose_name_plural': 'dashboard',
                'proxy': True,
                'default_permissions': ('view',),
                'indexes': [],
                'constraints': [],
            },
            bases=('django_throttle.rejection',),
        ),
        migrations.CreateModel(
            name='Rule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(help_text='A unique name, shown in headers and on the dashboard. Example: login.', max_length=100, unique=True, verbose_name='name')),
                ('scope', models.CharField(help_text="What the rule covers. '*' is every request; '/api/' a path prefix; '^/users/\\d+/$' a regular expression on the path; any other word a scope name: views decorated with @throttle('login') and URL patterns named 'login' (or 'namespace:name').", max_length=255, verbose_name='scope')),
                ('methods', models.CharField(blank=True, help_text="Comma-separated HTTP methods the rule counts, e.g. 'POST,PUT'. Empty = all. GET counts HEAD too (Django answers HEAD with the GET view).", max_length=100, verbose_name='methods')),
                ('key_kind', models.CharField(choices=[('ip', 'client IP address'), ('user', 'authenticated user'), ('user_or_ip', 'user, or IP when anonymous'), ('header', 'request header'), ('param', 'query or form parameter'), ('global', 'one counter for everyone'), ('custom', 'custom key function')], default='ip', help_text='Who gets a counter of their own: one per IP, per user, per header value, ...', max_length=20, verbose_name='key')),
                ('key_arg', models.CharField(blank=True, help_text="For 'header': the header name (X-Api-Key). For 'param': the parameter (q). For 'custom': the name of a function in DJANGO_THROTTLE['KEY_FUNCTIONS'] (tenant).", max_length=100, verbose_name='key argument')),
                ('limit', models.IntegerField(help_text='Requests allowed per unit of time. Example: 5 (with unit minute).', validators=[django.core.validators.MinValueValidator(1, 'The limit must allow at least 1 request.'), django.core.validators.MaxValueValidator(1000000000, 'The limit can be at most %(limit_value)s.')], verbose_name='limit')),
                ('per', models.PositiveIntegerField(default=1, help_text='How many units the window lasts: 15 (with unit minute) for 100 per 15 minutes.', validators=[django.core.validators.MinValueValidator(1, 'A window is at least 1 unit long.'), django.core.validators.MaxValueValidator(1000000, 'A window can be at most %(limit_value)s units long.')], verbose_name='per')),
                ('unit', models.CharField(choices=[('second', 'second'), ('minute', 'minute'), ('hour', 'hour'), ('day', 'day'), ('week', 'calendar week, from Monday 00:00'), ('month', 'calendar month, from the 1st 00:00')], default='minute', help_text='The unit of time the limit is counted over.', max_length=10, verbose_name='unit')),
                ('algorithm', models.CharField(choices=[('token_bucket', 'token bucket'), ('leaky_bucket', 'leaky bucket'), ('fixed_window', 'fixed window'), ('sliding_window_log', 'sliding window log'), ('sliding_window_counter', 'sliding window counter'), ('concurrency', 'concurrency (requests in flight)')], default='sliding_window_counter', help_text='Sliding window counter is a good default; token bucket allows bursts; leaky bucket smooths traffic; sliding window log is exact and uses the most memory; fixed window is the cheapest.', max_length=30, verbose_name='algorithm')),
                ('burst', models.IntegerField(blank=True, help_text='Token and leaky bucket only: the bucket size, i.e. how many requests may come at once. Example: 20 with a limit of 5/second. Empty = the limit.', null=True, validators=[django.core.validators.MinValueValidator(1, 'The burst must be at least 1.'), django.core.validators.MaxValueValidator(1000000000, 'The burst can be at most %(limit_value)s.')], verbose_name='burst')),
                ('applies_to', models.CharField(choices=[('all', 'everyone'), ('anonymous', 'anonymous clients only'), ('authenticated', 'authenticated users only'), ('groups', 'members of the chosen groups')], default='all', help_text="Whose requests the rule counts; 'groups' counts members of the groups below.", max_length=20, verbose_name='applies to')),
                ('exempt_staff', models.BooleanField(default=False, help_text='Staff users are never counted.', verbose_name='exempt staff')),
                ('exempt_networks', models.TextField(blank=True, help_text="CIDRs never counted by this rule, comma- or newline-separated: 10.0.0.0/8, 2001:db8::/32. (DJANGO_THROTTLE['EXEMPT_NETWORKS'] exempts from every rule.)", verbose_name='exempt networks')),
                ('block_seconds', models.PositiveIntegerField(default=0, help_text='Once this rule rejects a client, reject it for this many seconds, whatever the window says. Example: 3600 after 5 failed logins in 15 minutes. 0 = no block.', validators=[django.core.validators.MaxValueValidator(31622400, 'A block can last at most %(limit_value)s seconds.')], verbose_name='block for (seconds)')),
                ('action', models.CharField(choices=[('reject', 'reject with 429'), ('delay', 'delay until the slot (leaky bucket)'), ('log', 'log only (shadow mode)')], default='reject', help_text='Reject answers 429. Delay (leaky bucket only) holds the request until its turn. Log only records would-be rejections, to try a rule before enforcing it.', max_length=10, verbose_name='action')),
                ('fail_mode', models.CharField(choices=[('default', 'as the FAIL_OPEN setting says'), ('open', 'open: admit while the store is down'), ('closed', 'closed: answer 503 while the store is down')], default='default', help_text='Closed suits login and password reset; open suits a general API.', max_length=10, verbose_name='when the store is down')),
                ('enabled', models.BooleanField(default=True, verbose_name='enabled')),
                ('created_at', models.DateTimeField(auto_now_add=True, verbose_name='created')),
                ('updated_at', models.DateTimeField(auto_now=True, verbose_name='updated')),
                ('exempt_groups', models.ManyToManyField(blank=True, help_text='Members of these groups are never counted.', related_name='throttle_exemptions', to='auth.group', verbose_name='exempt groups')),
                ('groups', models.ManyToManyField(blank=True, help_text="With 'members of the chosen groups': the groups whose members it counts.", related_name='throttle_rules', to='auth.group', verbose_name='groups')),
            ],
            options={
                'verbose_name': 'rate-limit rule',
                'verbose_name_plural': 'rate-limit rules',
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='Override',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(help_text='As the dashboard writes it: user:42, ip:203.0.113.7 (IPv6: its network, as keyed), header:<value>, param:<value>, custom:<value>, or global.', max_length=255, verbose_name='client key')),
                ('limit', models.PositiveIntegerField(blank=True, help_text="This client's limit per the rule's window. Empty when exempt.", null=True, validators=[django.core.validators.MinValueValidator(1, 'The limit must allow at least 1 request.'), django.core.validators.MaxValueValidator(1000000000, 'The limit can be at most %(limit_value)s.')], verbose_name='limit')),
                ('exempt', models.BooleanField(default=False, verbose_name='exempt')),
                ('rule', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='overrides', to='django_throttle.rule', verbose_name='rule')),
            ],
            options={
                'verbose_name': 'override',
                'verbose_name_plural': 'overrides',
                'ordering': ['rule__name', 'key'],
                'constraints': [models.UniqueConstraint(fields=('rule', 'key'), name='django_throttle_one_override')],
            },
        ),
    ]
