"""The Grafana dashboard (docs/operating.md): valid, and every metric it names is one the
replicas, sidecars, the proxy or the audit shipper (docs/audit.md) export (a renamed metric
must not leave a blank panel)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.registry import CollectorRegistry

from quorumgate.audit.shipper import ShipMetrics
from quorumgate.proxy.app import ProxyMetrics
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.sidecar.node import SidecarMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "cluster" / "dashboards" / "quorumgate.json"
METRIC_RE = re.compile(r"\bqg_[a-z_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def exported(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry's metrics can export, labelled or not."""
    names = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def test_every_metric_the_dashboard_names_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {name for expr in exprs for name in METRIC_RE.findall(expr)}
    available = (
        exported(ReplicaMetrics(0).registry)
        | exported(SidecarMetrics().registry)
        | exported(ProxyMetrics().registry)
        | exported(ShipMetrics().registry)
    )
    assert named, "the dashboard names no metric"
    assert sorted(named - available) == []
    # the list: heights, views, timeouts, commit and certificate latency, mempool,
    # submissions by result, verdicts by outcome and reason, divergence alarms
    for wanted in (
        "qg_replica_committed_height", "qg_sidecar_executed_height", "qg_replica_views_total",
        "qg_replica_timeouts_total", "qg_replica_commit_latency_seconds_bucket",
        "qg_proxy_decision_seconds_bucket", "qg_replica_mempool_txs",
        "qg_replica_submissions_total", "qg_sidecar_verdicts_total", "qg_sidecar_divergence",
    ):  # fmt: skip
        assert wanted in named, wanted
    # the audit shipper's operations (docs/audit.md, "Metrics"): its lag behind the
    # certified head, batches written, retries and refusals
    for wanted in (
        "qg_ship_lag_heights", "qg_ship_batches_total", "qg_ship_retries_total",
        "qg_ship_refusals_total", "qg_ship_sidecar_refusals_total",
        "qg_ship_database_errors_total",
    ):  # fmt: skip
        assert wanted in named, wanted
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
