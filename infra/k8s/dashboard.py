"""The mirror's Grafana dashboard, as code: one per mirror, shipped in a ConfigMap that Grafana's sidecar loads.

Built as the dashboard JSON model (schemaVersion 39) from the series spark_app.metrics serves, so a renamed metric
fails the test that checks every query names a served series.
"""

from __future__ import annotations

import hashlib
from typing import Any

from infra.k8s.series import (
    CHECKPOINT_AGE_METRIC,
    HEARTBEAT_AGE_METRIC,
    LAG_METRIC,
    LATENCY_METRIC,
    QUARANTINED_METRIC,
    RECORDS_METRIC,
)

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 12  # two panels a row on Grafana's 24-column grid
HEIGHT = 8
PERCENTILES = ((0.5, "50"), (0.99, "99"), (0.999, "99.9"))


def _panel(index: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"x": (index % 2) * WIDTH, "y": (index // 2) * HEIGHT, "w": WIDTH, "h": HEIGHT},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard(instance: str) -> dict[str, Any]:
    """Throughput, lag, replication latency percentiles, checkpoint and heartbeat age, quarantined topics."""
    sel = f'{{app_kubernetes_io_instance="{instance}"}}'
    latency = f"sum by (flow, le) (rate({LATENCY_METRIC}_bucket{sel}[5m]))"
    panels = [
        ("Throughput (records/s)", "ops", [(f"sum by (flow) (rate({RECORDS_METRIC}{sel}[5m]))", "{{flow}}")]),
        ("Lag (records behind the source)", "short", [(f"sum by (flow) ({LAG_METRIC}{sel})", "{{flow}}")]),
        (
            "Replication latency percentiles",
            "s",
            [(f"histogram_quantile({q}, {latency})", f"{{{{flow}}}} p{label}") for q, label in PERCENTILES],
        ),
        ("Checkpoint age", "s", [(f"max by (flow) ({CHECKPOINT_AGE_METRIC}{sel})", "{{flow}}")]),
        ("Heartbeat age", "s", [(f"max by (flow) ({HEARTBEAT_AGE_METRIC}{sel})", "{{flow}}")]),
        ("Quarantined topics", "short", [(f"max by (flow) ({QUARANTINED_METRIC}{sel})", "{{flow}}")]),
    ]
    return {
        "uid": hashlib.sha256(instance.encode()).hexdigest()[:20],  # stable across updates, unique per mirror
        "title": f"Kafka mirror {instance}",
        "tags": ["mirrorkit", "kafka"],
        "schemaVersion": SCHEMA_VERSION,
        "editable": False,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]
        },
        "panels": [_panel(i, title, unit, targets) for i, (title, unit, targets) in enumerate(panels)],
    }
