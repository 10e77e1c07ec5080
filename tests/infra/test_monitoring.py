"""Monitoring that loads: kube-prometheus-stack selects our PodMonitor and rules, and Grafana's sidecar loads the
dashboard, which shows what an operator of the mirror must see."""

from __future__ import annotations

import copy
import json
import re

import pytest

from tests.infra.harness import ROOT, Run, run_values, stack_values, with_secrets

ACTIVE_ACTIVE = ROOT / "stacks" / "topologies" / "active-active.yaml"
PODMONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
RULES = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
METRICS_SOURCE = (ROOT / "spark_app" / "metrics.py").read_text()


def dashboards(run: Run) -> list[tuple[dict, dict]]:
    """(ConfigMap metadata, parsed dashboard) for each dashboard ConfigMap."""
    found = []
    for config_map in run.of_type("kubernetes:core/v1:ConfigMap"):
        for key, text in (config_map.plain.get("data") or {}).items():
            if key.endswith(".json"):
                found.append((config_map.plain["metadata"], json.loads(text)))
    return found


@pytest.mark.parametrize("stack", ["active-active", "dr-msk-to-eventhubs"])
def test_the_pod_monitor_and_rules_carry_kube_prometheus_stacks_release_label(stack, stack_runs):
    run = stack_runs[stack]
    for typ in (PODMONITOR, RULES):
        found = run.of_type(typ)
        assert found and all(r.plain["metadata"]["labels"]["release"] == "kube-prometheus-stack" for r in found)


def test_monitoring_labels_are_the_stacks_to_choose():
    values = copy.deepcopy(with_secrets(stack_values(ACTIVE_ACTIVE)))
    values["mirrorkit:mirror"]["monitoring_labels"] = {"release": "prom", "team": "data"}
    run = run_values(values)
    for typ in (PODMONITOR, RULES):
        for r in run.of_type(typ):
            labels = r.plain["metadata"]["labels"]
            assert labels["release"] == "prom" and labels["team"] == "data"


def test_each_mirror_ships_a_grafana_dashboard_for_the_sidecar(stack_runs):
    run = stack_runs["active-active"]
    found = dashboards(run)
    assert len(found) == 2  # one per site's mirror
    for metadata, dashboard in found:
        assert metadata["labels"]["grafana_dashboard"] == "1" and metadata["namespace"] == "monitoring"
        assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
        titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
        for shown in ("throughput", "lag", "latency", "checkpoint age", "heartbeat age", "quarantined"):
            assert shown in titles, shown
        exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        assert any("histogram_quantile(0.99" in e for e in exprs) and any("histogram_quantile(0.5" in e for e in exprs)
        for panel in dashboard["panels"]:
            assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["type"] and panel["datasource"]
            assert all(t["refId"] for t in panel["targets"])
        for name in {n for e in exprs for n in re.findall(r"\bmirrorkit_[a-z_]+", e)}:
            served = re.sub(r"_(total|bucket)$", "", name)
            assert f'"{served}"' in METRICS_SOURCE, f"{name}: the mirror serves no such series"
        # Each dashboard shows its own mirror only, even when stacks share a Prometheus.
        instance = metadata["name"].removesuffix("-dashboard")
        assert all(f'app_kubernetes_io_instance="{instance}"' in e for e in exprs)
