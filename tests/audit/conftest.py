"""Fixtures of the audit tests (docs/audit.md): a live 4-node cluster
(`tests.support.cluster`) and a real PostgreSQL server (`tests.support.postgres`)."""

from __future__ import annotations

import pytest

from tests.support.cluster import cluster, live, owner, sink_key  # noqa: F401 (fixtures)
from tests.support.postgres import postgres_dsn  # noqa: F401 (fixture)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.live)
