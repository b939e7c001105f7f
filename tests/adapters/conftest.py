"""Fixtures of the framework adapters' tests: the live cluster of `tests.support.cluster`."""

from __future__ import annotations

import pytest

from tests.support.cluster import cluster, live, owner, sink_key  # noqa: F401 (fixtures)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: starts real replica processes (minutes)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.live)


@pytest.fixture(autouse=True, scope="session")
def _no_trace_export() -> None:
    """The Agents SDK exports traces to OpenAI by default: these tests make no network call."""
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
