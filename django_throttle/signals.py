"""The signals of django_throttle. Receivers are connected in ``receivers`` by AppConfig.ready()."""

from __future__ import annotations

from django.dispatch import Signal

# Sent for every rejected request (shadow=False) and every would-be rejection of a
# log-only rule (shadow=True), with the request, the rule's name and the Decision.
request_throttled = Signal()

# Sent when this process finds the store unavailable (available=False, error=...) and
# when it reaches it again (available=True); once per change, not per request.
store_state_changed = Signal()

# Sent by bulk writes to the Rule table, which send no model signals (update(),
# bulk_create(), bulk_update()), so every process reloads its rules.
rules_written = Signal()
