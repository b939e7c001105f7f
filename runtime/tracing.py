"""Per-stage trace lines for the latency breakdown (docs/benchmarks.md, "Where one call's
time goes").

Off unless `QG_TRACE_DIR` names a directory in a process's environment (`quorumgate bench
--breakdown` sets it for the cluster it starts): then each process appends one line per
event to `<dir>/<process>.trace`, `<CLOCK_MONOTONIC ns> <event> <fields...>`. The clock
is the same for every process of one machine, so the bench joins the lines of all of them
with its own. Tracing never carries anything but heights, views, durations and short
transaction id prefixes (public: derived from signer and nonce)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TextIO

TRACE_DIR_ENV = "QG_TRACE_DIR"
TX_PREFIX_HEX = 16  # characters of a transaction id a trace line carries


class Tracer:
    def __init__(self, process: str) -> None:
        directory = os.environ.get(TRACE_DIR_ENV)
        self._file: TextIO | None = None
        if directory:
            self._file = (Path(directory) / f"{process}.trace").open("a", buffering=1)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def event(self, kind: str, *fields: object) -> None:
        if self._file is not None:
            line = " ".join([str(time.monotonic_ns()), kind, *(str(f) for f in fields)])
            self._file.write(line + "\n")


def tx_prefix(tx_id: bytes) -> str:
    return tx_id.hex()[:TX_PREFIX_HEX]
