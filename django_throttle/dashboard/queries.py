"""The dashboard's figures: rejections per rule over a period, top clients, recent rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from django.db.models import Max, Sum
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..models import Rejection
from ..rejection_log import ACTIONS
from ..rejection_log.database import as_datetime, epoch_of


@dataclass(frozen=True)
class Period:
    span: timedelta
    bucket: int  # seconds per point of the chart
    label: Any
    tick_format: str  # django.utils.dateformat


PERIODS = MappingProxyType(
    {
        "hour": Period(timedelta(hours=1), 60, _("last hour"), "H:i"),
        "day": Period(timedelta(days=1), 15 * 60, _("last day"), "H:i"),
        "week": Period(timedelta(days=7), 2 * 3600, _("last week"), "D H:i"),
    }
)
DEFAULT_PERIOD = "hour"
MAX_SERIES = 8  # rules drawn one by one; the rest are summed as "other rules"
TOP_KEYS = 20
RECENT = 20
OTHER_RULES = "(other rules)"


def dashboard_data(rule: str | None, period: str, now: datetime | None = None) -> dict[str, Any]:
    """Everything the dashboard shows, for one rule (None: all) over one period."""
    spec = PERIODS[period]
    now = now or timezone.now()
    epoch = epoch_of(now)
    end_epoch = (epoch // spec.bucket + 1) * spec.bucket
    n = int(spec.span.total_seconds()) // spec.bucket
    start_epoch = end_epoch - n * spec.bucket
    start, end = as_datetime(start_epoch), as_datetime(end_epoch)
    rows = Rejection.objects.filter(minute__gte=start, minute__lt=end)
    if rule:
        rows = rows.filter(rule=rule)

    # One pass over the period's sums per rule, action and row start gives the totals and the
    # chart: the bucket of a row is found here, not by a database function (SQLite's date
    # truncation is a Python call per row). Old rows are quarter hours and two hours (see
    # rejection_log.compact), so a week is at most some thousands of sums per rule.
    totals: dict[str, dict[str, int]] = {}
    points: dict[str, list[int]] = {}
    sums = rows.values("rule", "action", "minute").annotate(total=Sum("count")).order_by()
    for point in sums:
        name, total = point["rule"], point["total"]
        figures = totals.setdefault(name, dict.fromkeys((*ACTIONS, "total"), 0))
        figures[point["action"]] += total
        figures["total"] += total
        index = (epoch_of(point["minute"]) - start_epoch) // spec.bucket
        if 0 <= index < n:
            points.setdefault(name, [0] * n)[index] += total
    by_total = sorted(totals, key=lambda name: (-totals[name]["total"], name))

    drawn = by_total[:MAX_SERIES]
    series = {name: points.get(name, [0] * n) for name in drawn}
    if len(by_total) > MAX_SERIES:
        other = series[OTHER_RULES] = [0] * n
        for name in by_total[MAX_SERIES:]:
            for index, total in enumerate(points.get(name, ())):
                other[index] += total

    top = rows.values("rule", "key", "display").annotate(total=Sum("count"), last=Max("minute"))
    top_keys = list(top.order_by("-total", "rule", "display")[:TOP_KEYS])
    recent = list(
        rows.order_by("-minute", "-count", "rule").values(
            "minute", "minutes", "rule", "key", "display", "action", "count"
        )[:RECENT]
    )
    return {
        "period": period,
        "rule": rule or None,
        "start": start,
        "end": end,
        "bucket_seconds": spec.bucket,
        "buckets": [as_datetime(start_epoch + i * spec.bucket) for i in range(n)],
        "series": [{"rule": name, "counts": counts} for name, counts in series.items()],
        "totals": [{"rule": name, **totals[name]} for name in by_total],
        "top_keys": top_keys,
        "recent": recent,
    }


def local_time(value: datetime) -> datetime:
    return timezone.localtime(value) if timezone.is_aware(value) else value
