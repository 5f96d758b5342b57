# budget.py: wait until every rule on a path has a request left
import json
import time
from urllib.parse import urlencode
from urllib.request import Request, urlopen


def wait_for_budget(base, path, method="GET", headers=None):
    """Sleep until every rule a ``method`` request to ``path`` meets has a request left."""
    query = urlencode({"path": path, "method": method})
    while True:
        request = Request(f"{base}/throttle/status/?{query}", headers=headers or {})
        with urlopen(request, timeout=10) as answer:
            rules = json.load(answer)["rules"]
        spent = [rule for rule in rules if rule["remaining"] == 0]
        if not spent:
            return
        time.sleep(max(1, max(rule["reset"] for rule in spent) - time.time()))
