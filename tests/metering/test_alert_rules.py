"""The shipped alert rules (hub_config/prometheus/wmla-alerts.yml) with Debian's promtool.

``promtool check rules`` accepts them; ``promtool test rules`` runs wmla-alerts.test.yml, whose
recorded series are a healthy instance (no alert fires) and one case per alert (it fires when it
should and not before). Every metric the rules read is one the service exports.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "hub_config" / "prometheus" / "wmla-alerts.yml"
RULE_TESTS = REPO / "hub_config" / "prometheus" / "wmla-alerts.test.yml"
METERING = REPO / "extension" / "metering"
STORAGE = REPO / "extension" / "storage"  # the storage quotas' families
PROMTOOL = shutil.which("promtool")
ALERTS = {
    "WmlaMetricsUnreachable",
    "WmlaStoreUnavailable",
    "WmlaSchedulingLoopStalled",
    "WmlaJobPendingPastEstimate",
    "WmlaPreemptionStorm",
    "WmlaGpusIdleWhileJobsWait",
    "WmlaGpuHeldIdle",
    "WmlaStorageOverSoftLimit",
}

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is missing: Debian's prometheus package has it (.ci/run installs it)",
)


def _rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def _promtool(*args: str) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120
    )


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    out = _promtool("check", "rules", RULES.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in out.stdout


@needs_promtool
def test_each_alert_fires_on_its_case_and_none_in_a_healthy_run() -> None:
    out = _promtool("test", "rules", RULE_TESTS.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    # the recorded cases cover every alert: quiet in the healthy run, firing in its own case
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    healthy = next(t for t in tests if t["name"] == "healthy")
    assert {c["alertname"] for c in healthy["alert_rule_test"] if not c["exp_alerts"]} == ALERTS
    fired = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if c["exp_alerts"]}
    assert fired == ALERTS


def test_the_rules_read_only_metrics_the_service_exports() -> None:
    rules = _rules()
    assert {r["alert"] for r in rules} == ALERTS
    exported = "\n".join(p.read_text() for p in [*METERING.glob("*.py"), *STORAGE.glob("*.py")])
    for rule in rules:
        for name in set(re.findall(r"\bwmla_[a-z_]+", rule["expr"])):
            # counters are declared without _total, histograms without _bucket
            base = re.sub(r"_(total|bucket|sum|count)$", "", name)
            assert f'"{base}"' in exported, f"{rule['alert']}: {name} is not exported"
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
