"""Fixtures of the live suites: clusters of real replica processes on loopback.

`live_cluster(n)` makes a cluster directory under the test's tmp_path and starts it; its
finalizer stops every process it started (SIGTERM, then SIGKILL after a bound) whether the
test passed or failed, and prints the nodes' log tails when it failed. The controller and
the helpers tests import live in `tests.support.live`. `hosts` gives four machines, each
a network namespace with its own address on one bridge (`tests.support.netns`), for the
tests of several hosts.

These tests start real processes and take minutes; deselect them with `-m "not live"`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.live import LiveCluster
from tests.support.netns import Hosts, bridged_hosts

HOSTS = 4  # the machines a namespaced cluster starts on


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: starts real replica processes (minutes)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.live)


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember whether a test's body failed, so its fixture can print the logs."""
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


@pytest.fixture
def live_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., LiveCluster]]:
    """`live_cluster(n)` makes a cluster of n members under tmp_path and starts it
    (`start=False` to start it yourself); every process is stopped at teardown."""
    clusters: list[LiveCluster] = []

    def make(n: int, *, start: bool = True, name: str = "") -> LiveCluster:
        cluster = LiveCluster.create(tmp_path / (name or f"cluster-{len(clusters)}"), n)
        clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    try:
        yield make
    finally:
        failed = request.node.stash.get(_FAILED, False)
        for cluster in clusters:
            if failed:
                print(f"\n=== {cluster.spec.directory} at failure: {cluster.describe()}")
                print(cluster.log_tails())
            cluster.close()


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    """Four machines, each its own network namespace and address, on one bridge
    (`tests/support/netns.py`); more with `hosts.add()`. Deleted at teardown, after the
    test stopped its processes. Only a test marked `NEEDS_ROOT` asks for it."""
    with bridged_hosts(HOSTS) as made:
        yield made
