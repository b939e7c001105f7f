"""The database the `ship` drill copies into, and how the drill stops and starts its
server (docs/drills.md, "The ship drill's database"): the operator's DSN and two commands,
split like a shell line and run without a shell."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from quorumgate.ops.drills.report import DrillError


@dataclass(frozen=True)
class ShipTarget:
    """The operator's PostgreSQL for the copy, and how to stop and start its server."""

    dsn: str
    db_stop: tuple[str, ...]
    db_start: tuple[str, ...]

    @classmethod
    def parse(cls, dsn: str | None, stop_cmd: str | None, start_cmd: str | None) -> ShipTarget:
        if not dsn or not stop_cmd or not start_cmd:
            raise DrillError(
                "the ship drill needs --dsn, --db-stop-cmd and --db-start-cmd (docs/drills.md)"
            )
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise DrillError("the ship drill needs pip install 'quorumgate[audit]'") from None
        return cls(dsn, tuple(shlex.split(stop_cmd)), tuple(shlex.split(start_cmd)))
