"""Fixtures of the drill tests: the real PostgreSQL server the `ship` drill copies into and
stops and starts (tests.support.postgres, docs/drills.md)."""

from __future__ import annotations

from tests.support.postgres import postgres_server  # noqa: F401 (fixture)
