"""The mirror's alerting rules: each links a runbook section that exists, and DR bookkeeping switched off alerts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.k8s.mirror_app import alert_rules
from infra.schema import Alerts

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "operations" / "alerts.md"


def test_every_alert_links_its_own_section_of_the_alerts_runbook():
    rules = alert_rules("m", Alerts(runbook_url="https://docs.example.org/mirrorkit/operations/alerts/"))
    sections = {h.lower() for h in re.findall(r"^## (\w+)$", RUNBOOK.read_text(), re.MULTILINE)}
    links = {r["alert"]: r["annotations"]["runbook_url"] for r in rules}
    assert links == {a: f"https://docs.example.org/mirrorkit/operations/alerts/#{a.lower()}" for a in links}
    assert {a.lower() for a in links} == sections, "one runbook section per alert, and none for an alert gone"


def test_dr_topics_the_dr_sync_cannot_use_fire_a_critical_alert_at_once():
    (rule,) = [r for r in alert_rules("m", Alerts()) if r["alert"] == "MirrorkitDrUnusable"]
    assert rule["expr"] == 'max by (flow) (mirrorkit_dr_unusable_topics{app_kubernetes_io_instance="m"}) > 0'
    assert (rule["for"], rule["labels"]["severity"]) == ("0m", "critical")


def test_a_runbook_url_that_is_not_https_or_carries_an_anchor_is_refused_naming_the_key():
    for bad in ("http://docs.example.org/alerts", "https://docs.example.org/alerts#x", "docs/operations/alerts.md"):
        with pytest.raises(ValidationError, match="runbook_url"):
            Alerts(runbook_url=bad)
