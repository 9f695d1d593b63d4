"""deploy/monitoring: the Prometheus alert rules pass `promtool check rules` and their unit tests
(`promtool test rules`), every dashboard query is valid PromQL (promtool checks it as a recording
rule), and every metric a panel or a rule uses is one the agent declares (its Prometheus
registry, what /metrics serves) and the docs' Metrics table (docs/operating/metrics.md)
documents."""

from __future__ import annotations

import importlib
import json
import pathlib
import re
import subprocess
from typing import Any

import msgspec.yaml
import prometheus_client
import pytest

from tests.support.crds import REPO_ROOT
from tests.support.docs import documented_metrics

MONITORING = REPO_ROOT / "deploy" / "monitoring"
RULES = MONITORING / "nodeagent-alerts.yaml"
RULE_TESTS = MONITORING / "nodeagent-alerts.test.yaml"
DASHBOARD = MONITORING / "nodeagent-dashboard.json"
PACKAGE = REPO_ROOT / "python" / "nodeagent"
METRIC = re.compile(r"\bnodeagent_[a-z0-9_]+\b")
# Grafana's variables, replaced by values Prometheus accepts for the syntax check.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=120, check=False
    )


def rule_expressions() -> list[str]:
    doc = msgspec.yaml.decode(RULES.read_bytes())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def dashboard_targets() -> list[tuple[str, dict[str, Any]]]:
    """(panel title, target) of every query of the dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target) for panel in doc["panels"] for target in panel.get("targets", [])
    ]


def declared_metrics() -> set[str]:
    """The sample names the agent's registry can serve: every module of the package that defines
    metrics is imported, then each family's samples by type."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "prometheus_client" in path.read_text():
            module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
            importlib.import_module(module)
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"),
        "info": ("_info",),
    }
    names = set()
    for family in prometheus_client.REGISTRY.collect():
        for suffix in suffixes.get(family.type, ("",)):
            names.add(family.name + suffix)
    return {name for name in names if name.startswith("nodeagent_")}


def used_metrics() -> dict[str, set[str]]:
    """Metric names used, by where (alert name or panel title)."""
    used: dict[str, set[str]] = {}
    doc = msgspec.yaml.decode(RULES.read_bytes())
    for group in doc["groups"]:
        for rule in group["rules"]:
            for name in METRIC.findall(rule["expr"]):
                used.setdefault(name, set()).add(rule.get("alert") or rule.get("record"))
    for title, target in dashboard_targets():
        for name in METRIC.findall(target["expr"]):
            used.setdefault(name, set()).add(f"panel {title!r}")
    return used


def test_rules_check() -> None:
    answer = _promtool("check", "rules", str(RULES))
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert "SUCCESS" in answer.stdout


def test_rule_unit_tests_pass() -> None:
    answer = _promtool("test", "rules", str(RULE_TESTS))
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert "SUCCESS" in answer.stdout


def test_rule_unit_tests_catch_a_wrong_expectation(tmp_path: pathlib.Path) -> None:
    # The unit tests compare labels and annotations: a wrong one fails.
    (tmp_path / RULES.name).write_text(RULES.read_text())
    broken = tmp_path / RULE_TESTS.name
    broken.write_text(RULE_TESTS.read_text().replace("severity: critical", "severity: page"))
    answer = _promtool("test", "rules", str(broken))
    assert answer.returncode != 0
    assert "NodeagentDown" in answer.stdout + answer.stderr


def test_every_alert_has_severity_and_summary() -> None:
    doc = msgspec.yaml.decode(RULES.read_bytes())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    # What the issue asks operators to be told about, each with a rule unit test.
    must = {
        "NodeagentDown",
        "NodeagentComponentNotReady",
        "NodeagentResourceSlicePoolsFailing",
        "NodeagentPluginRejected",
        "NodeagentResourceSliceWriteErrors",
        "NodeagentCNRWriteErrors",
        "NodeagentEventLoopLagging",
        "NodeagentWatchdogNotifyFailing",
    }
    assert must <= set(names)
    assert must <= tested


def test_dashboard_queries_are_valid_promql(tmp_path: pathlib.Path) -> None:
    rules = []
    for i, (_, target) in enumerate(dashboard_targets()):
        expr = target["expr"]
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unknown Grafana variable in {target['expr']}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_bytes(msgspec.yaml.encode({"groups": [{"name": "dashboard", "rules": rules}]}))
    answer = _promtool("check", "rules", str(path))
    assert answer.returncode == 0, answer.stdout + answer.stderr


def test_dashboard_shape() -> None:
    doc = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in doc["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert variables == {"datasource", "instance"}
    for title, target in dashboard_targets():
        assert target["datasource"]["uid"] == "${datasource}", title
        assert 'instance=~"$instance"' in target["expr"], title
    used = used_metrics()
    # What the issue asks the dashboard to show.
    for name in (
        "nodeagent_component_ready",
        "nodeagent_plugins_registered",
        "nodeagent_resourceslice_syncs_total",
        "nodeagent_resourceslice_writes_total",
        "nodeagent_api_requests_total",
        "nodeagent_watch_restarts_total",
        "nodeagent_loop_lag_seconds",
    ):
        assert any(where.startswith("panel") for where in used.get(name, ())), name


def test_every_metric_used_is_declared_and_documented() -> None:
    declared, documented = declared_metrics(), documented_metrics()
    assert "nodeagent_component_ready" in declared
    assert "nodeagent_config_last_known_good_info" in documented
    for name, where in sorted(used_metrics().items()):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in declared, f"{name} (used by {sorted(where)}) is not a metric of the agent"
        assert base in documented or name in documented, (
            f"{name} (used by {sorted(where)}) is not in docs/operating/metrics.md's table"
        )


@pytest.mark.parametrize("name", ["nodeagent_no_such_metric", "nodeagent_loop_lag"])
def test_an_undeclared_name_is_caught(name: str) -> None:
    assert name not in declared_metrics()
