"""Fixtures of the framework adapters' tests: the live cluster of `tests.support.cluster`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import cluster, live, owner, sink_key  # noqa: F401 (fixtures)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: starts real replica processes (minutes)")


HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of this folder runs a framework: `-m "not frameworks"` leaves them out,
    the default run keeps them (docs/frameworks/README.md)."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.live)
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.frameworks)


@pytest.fixture(autouse=True, scope="session")
def _no_trace_export() -> None:
    """The Agents SDK exports traces to OpenAI by default: these tests make no network call."""
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
