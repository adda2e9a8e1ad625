"""The metric names a PromQL expression reads, for the tests that check the alert rules and the dashboard against the
metrics that really exist (tests/integration/roles/test_monitoring.py, and molecule/site/tests against the real Prometheus)."""

from __future__ import annotations

import re

# PromQL's own words that read like metric names: functions, aggregations, operators and modifiers.
WORDS = {"sum", "max", "min", "avg", "count", "by", "on", "and", "or", "unless", "without", "rate", "irate", "increase",
         "delta", "histogram_quantile", "time", "le", "bool", "ignoring", "group_left", "group_right", "offset"}  # fmt: skip


def metric_names(expression: str) -> set[str]:
    """The metric names in ``expression``: label matchers, grouping labels, ranges and PromQL's words left out."""
    text = re.sub(r"\{[^}]*\}", " ", expression)
    text = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    return {token for token in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text) if token not in WORDS}
