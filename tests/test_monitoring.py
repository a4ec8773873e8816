"""deploy/monitoring/: the Grafana dashboard's queries name only metrics warmgate exports (as the
app's real registry has them), the alert rules pass Prometheus's own ``promtool check rules`` and
``promtool test rules``, and the kustomize component fits deploy/base."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from router.app import build_apps
from router.config import parse_config
from router.keys import METRICS
from router.scale.state import Phase
from tests.deploy_tree import build, kubectl
from tests.helpers import ROOT

MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "warmgate-dashboard.json"
RULES = MONITORING / "prometheusrule.yaml"
RULE_TESTS = ROOT / "tests" / "promtool" / "warmgate-rules.test.yaml"
METRIC = re.compile(r"\bwarmgate_[a-z0-9_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$target": ".*"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not found (make test installs Debian's prometheus package)")
    return found


async def exported_names() -> set[str]:
    """Every series name the app's registry can export: the router's own metrics and the
    API's and the dashboard's, as build_apps registers them (a config with models and clouds)."""
    data = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "targets": {
            "t": {
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "static", "url": "http://127.0.0.1:9"},
            }
        },
        "models": {"m": {"placements": [{"target": "t"}, {"cloud": "c", "model": "x"}]}},
        "clouds": {"c": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "WG_TEST_NO_KEY"}},
        "policy": {"daily_cloud_budget_usd": 1},
        "api": {"allow_anonymous": True},
    }
    apps = build_apps(parse_config(data, "<test>", "."))
    names = set()
    for family in apps.admin[METRICS].registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of the dashboard, template variables included."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            out.append((panel["title"], target["expr"]))
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            out.append((f"${variable['name']}", query["query"]))
    return out


def rule_groups() -> list[dict[str, Any]]:
    rule = yaml.safe_load(RULES.read_text())
    assert rule["kind"] == "PrometheusRule"
    return list(rule["spec"]["groups"])


async def test_the_dashboard_queries_name_only_metrics_warmgate_exports() -> None:
    exported = await exported_names()
    assert "warmgate_cold_start_eta_seconds" in exported, "the gauge the ETA alert needs"
    used = set()
    for title, expr in dashboard_queries():
        names = set(METRIC.findall(expr))
        assert names, f"{title}: {expr!r} names no warmgate metric"
        assert names <= exported, f"{title}: {sorted(names - exported)} are not exported"
        used |= names
    # What the issue asks the dashboard to show is there.
    for wanted in (
        "warmgate_target_phase",
        "warmgate_cold_starts_total",
        "warmgate_cold_start_seconds_bucket",
        "warmgate_hold_outcomes_total",
        "warmgate_gpu_seconds_total",
        "warmgate_decisions_total",
        "warmgate_cloud_spend_usd_total",
        "warmgate_cloud_spend_by_model_usd_total",
        "warmgate_cloud_budget_remaining_usd",
        "warmgate_cloud_budget_usd",
        "warmgate_leader",
    ):
        assert wanted in used, wanted


def panel(title: str) -> dict[str, Any]:
    dashboard = json.loads(DASHBOARD.read_text())
    [found] = [p for p in dashboard["panels"] if p["title"] == title]
    return found  # type: ignore[no-any-return]


def test_every_panel_queries_and_the_day_is_drawn() -> None:
    """Every panel but a row has a query (which the test above holds to exported metrics); the
    day as warmgate's own dashboard draws it: phases as a state timeline (every phase mapped),
    GPU-hours stacked by what for, the cloud spend stacked per model."""
    dashboard = json.loads(DASHBOARD.read_text())
    for p in dashboard["panels"]:
        assert p["type"] == "row" or p.get("targets"), f"{p['title']}: no query"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    phases = panel("Phase")
    assert phases["type"] == "state-timeline"
    assert "warmgate_target_phase" in phases["targets"][0]["expr"]
    mapped = {
        text["text"]
        for mapping in phases["fieldConfig"]["defaults"]["mappings"]
        for text in mapping["options"].values()
    }
    assert mapped == {phase.value for phase in Phase}
    hours = panel("GPU-hours per hour, stacked")
    assert "warmgate_gpu_seconds_total" in hours["targets"][0]["expr"]
    assert hours["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    spend = panel("Cloud spend per model")
    assert "by (model)" in spend["targets"][0]["expr"]
    assert "warmgate_cloud_spend_by_model_usd_total" in spend["targets"][0]["expr"]
    assert spend["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"


async def test_the_rules_name_only_metrics_warmgate_exports() -> None:
    exported = await exported_names()
    alerts = {}
    for group in rule_groups():
        for rule in group["rules"]:
            names = set(METRIC.findall(rule["expr"]))
            assert names and names <= exported, (rule["alert"], sorted(names - exported))
            alerts[rule["alert"]] = rule
    assert set(alerts) == {
        "WarmgateTargetFailed",
        "WarmgateColdStartSlow",
        "WarmgateHoldsTimingOut",
        "WarmgateCloudBudget80",
        "WarmgateNoLeader",
        "WarmgateRolloutNotConverged",
        "WarmgateLifecycleFailing",
    }
    assert all(rule["labels"]["severity"] for rule in alerts.values())


def test_the_dashboard_queries_parse(tmp_path: Path) -> None:
    """Each query, its Grafana variables filled in, as a recording rule promtool parses."""
    tool = promtool()
    rules = []
    for i, (_, expr) in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        if expr.startswith("label_values("):
            expr = expr.removeprefix("label_values(").rsplit(",", 1)[0]
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def plain_rules(tmp_path: Path) -> Path:
    """The PrometheusRule's spec.groups as the plain rules file Prometheus (and promtool) reads."""
    path = tmp_path / "warmgate-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    return path


def test_the_rules_pass_promtool_check(tmp_path: Path) -> None:
    tool = promtool()
    out = subprocess.run(
        [tool, "check", "rules", str(plain_rules(tmp_path))], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_the_alerts_pass_promtool_unit_tests(tmp_path: Path) -> None:
    tool = promtool()
    suite = yaml.safe_load(RULE_TESTS.read_text())
    suite["rule_files"] = [str(plain_rules(tmp_path))]
    tested = {t["alertname"] for case in suite["tests"] for t in case["alert_rule_test"]}
    assert len(tested) >= 2 and tested <= {
        rule["alert"] for group in rule_groups() for rule in group["rules"]
    }
    path = tmp_path / "warmgate-rules.test.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    out = subprocess.run([tool, "test", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# -- the kustomize component --------------------------------------------------------------------


def with_monitoring(tmp_path: Path) -> list[dict[str, Any]]:
    """deploy/base with the component, as an overlay renders it."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy" / "base", overlay)],
        "components": [os.path.relpath(MONITORING, overlay)],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    out = subprocess.run(
        [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def test_deploy_base_stays_free_of_the_prometheus_operator() -> None:
    kinds = {(o["apiVersion"], o["kind"]) for o in build("base")}
    assert not {k for k in kinds if k[0].startswith("monitoring.coreos.com/")}


def test_the_component_scrapes_every_replica_and_ships_the_dashboard(tmp_path: Path) -> None:
    objects = with_monitoring(tmp_path)
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    schema = kubernetes_validate.utils.latest_version()
    for name in ("warmgate-metrics",):
        kubernetes_validate.validate(by_kind["Service"][name], schema, strict=True)
    dashboard_map = by_kind["ConfigMap"]["warmgate-grafana-dashboard"]
    kubernetes_validate.validate(dashboard_map, schema, strict=True)
    assert dashboard_map["metadata"]["namespace"] == "monitoring"
    assert dashboard_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard_map["data"]["warmgate-dashboard.json"])
    assert shipped == json.loads(DASHBOARD.read_text())

    router = by_kind["Deployment"]["warmgate"]
    pod_labels = router["spec"]["template"]["metadata"]["labels"]
    (container,) = router["spec"]["template"]["spec"]["containers"]
    ports = {p["name"] for p in container["ports"]}
    service = by_kind["Service"]["warmgate-metrics"]
    assert service["metadata"]["namespace"] == router["metadata"]["namespace"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["clusterIP"] == "None", "each replica scraped, not one of them"
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "admin" and "admin" in ports

    monitor = by_kind["ServiceMonitor"]["warmgate"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    selected = [
        s
        for s in by_kind["Service"].values()
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert selected == [service], "exactly the metrics Service"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"

    rule = by_kind["PrometheusRule"]["warmgate"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == rule_groups()
