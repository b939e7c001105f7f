"""Fixtures and hooks of the client SDK tests: the live cluster they share is
`tests.support.cluster` (imported by the proxy's, the gateway's and the console's tests too)."""

from __future__ import annotations

import pytest

from tests.support.cluster import cluster, live, owner, sink_key  # noqa: F401 (fixtures)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: starts real replica processes (minutes)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.live)
