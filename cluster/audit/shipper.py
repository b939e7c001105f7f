"""`quorumgate ship`: the verdict ledger into PostgreSQL, trusting no single sidecar
(docs/audit.md). One round: every sidecar's executed height and a page of its ledger; the
entries f+1 of them return identically; those that link to the copy's head; those with a
certificate of f+1 signed receipts that says the same; then one transaction. Its own
process, with its own Prometheus registry (as replica/metrics.py keeps one per process)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from nacl.signing import SigningKey
from prometheus_client import CollectorRegistry, Counter, Gauge

from quorumgate.audit.acked import AckedFiles, acked_height
from quorumgate.audit.follow import LearnEpochs, Reader, Refusal, Round, read_round
from quorumgate.audit.records import Batch, Cursor
from quorumgate.audit.store import (
    CursorMoved,
    Written,
    connect,
    cursor_leaf_count,
    read_cursor,
    write_batch,
)
from quorumgate.proto.clusterfile import ClusterSpec

log = logging.getLogger("quorumgate.ship")

SHIP_IDLE_S = 0.5  # between rounds when there was nothing new to ship
SHIP_RETRY_S_MAX = 10.0  # the longest pause before writing a batch again after a failure
SHIP_WRITE_ATTEMPTS_MAX = 5  # tries of one batch before the round gives up (and starts over)
ACKED_COPY = "postgresql"  # this copy's name among those bounding the acknowledged height


class ShipMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.lag = Gauge(
            "qg_ship_lag_heights",
            "Heights f+1 sidecars executed that the copy does not reach yet",
            registry=r,
        )
        self.shipped_height = Gauge(
            "qg_ship_shipped_height", "Height of the last verdict in the copy", registry=r
        )
        self.batches = Counter(
            "qg_ship_batches", "Batches written, by result", ["result"], registry=r
        )
        self.verdicts = Counter("qg_ship_verdicts", "Verdicts written to the copy", registry=r)
        self.retries = Counter(
            "qg_ship_retries", "Batch writes tried again after a database failure", registry=r
        )
        self.refusals = Counter(
            "qg_ship_refusals",
            "Answers not taken, by what was wrong (a sidecar's, or no f+1 agreement)",
            ["reason"],
            registry=r,
        )
        # Which sidecar was outvoted or did not answer: the same refusals as above, those
        # that are one sidecar's, by its member index (a bounded label: n members).
        self.sidecar_refusals = Counter(
            "qg_ship_sidecar_refusals",
            "Refusals of one sidecar's answer, by member index and reason",
            ["sidecar", "reason"],
            registry=r,
        )
        self.certified_height = Gauge(
            "qg_ship_certified_height",
            "The height f+1 sidecars executed, as the shipper last read it",
            registry=r,
        )
        self.database_errors = Counter(
            "qg_ship_database_errors",
            "Rounds given up because the database failed (the shipper waits, then resumes)",
            registry=r,
        )


@dataclass(frozen=True, slots=True)
class ShipOptions:
    dsn: str
    idle_s: float = SHIP_IDLE_S


class Shipper:
    def __init__(
        self,
        spec: ClusterSpec,
        key: SigningKey,
        stubs: Sequence[Any],
        options: ShipOptions,
        acked: AckedFiles | None = None,
        learn: LearnEpochs | None = None,
    ) -> None:
        """`learn`: how to read the chain of epochs, whose receipt keys and heights every
        certificate is checked against (`follow.ShipEpochs`); None on a chain that runs
        no epochs."""
        self.spec = spec
        self.reader = Reader(spec, key, stubs, learn)
        self.options = options
        self.acked = acked  # where the copy's acknowledged height goes (docs/pruning.md)
        self.metrics = ShipMetrics()
        self.conn: psycopg.Connection[Any] | None = None
        self.shipped_height = 0  # the copy's last height, as the last round read it

    def _db(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.options.dsn)
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    async def next_round(self, cursor: Cursor) -> Round:
        """The certified verdicts after `cursor` (at most a batch), and the refusals."""
        return await read_round(self.spec, self.reader, cursor)

    def write(self, batch: Batch, cursor: Cursor) -> Written:
        """Write one batch, again after a failure (a lost answer included): the batch key
        makes a resend of a batch that did commit write nothing."""
        for attempt in range(SHIP_WRITE_ATTEMPTS_MAX):
            try:
                result = write_batch(self._db(), batch, cursor)
            except psycopg.OperationalError as error:
                self.metrics.retries.inc()
                log.warning("batch %s not acknowledged (%s); sending it again", batch.key,
                            type(error).__name__)  # fmt: skip
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if attempt + 1 == SHIP_WRITE_ATTEMPTS_MAX:
                    raise
                continue
            self.metrics.batches.labels(result=result.value).inc()
            if result is Written.WRITTEN:
                self.metrics.verdicts.inc(len(batch.verdicts))
            return result
        raise AssertionError("unreachable")

    def _acknowledged(self, cursor: Cursor, batch: Batch | None = None) -> None:
        """Tell the acknowledged-height files where the committed copy ends: after `batch`
        (committed after `cursor`), or at `cursor` as the copy holds it."""
        if self.acked is None:
            return
        if batch is not None:
            end, count = batch.after(cursor), batch.verdicts[-1].certificate.leaf_count
        else:
            end, count = cursor, cursor_leaf_count(self._db(), self.spec.chain_id, cursor)
        self.acked.report(ACKED_COPY, acked_height(end, count))

    async def ship_once(self) -> int:
        """One round: read, check, write. Returns how many verdicts it shipped."""
        cursor = read_cursor(self._db(), self.spec.chain_id)
        found = await self.next_round(cursor)
        self._count(found)
        shipped_height = self.shipped_height = cursor.height
        if not found.verdicts:
            self._acknowledged(cursor)
        else:
            batch = Batch(self.spec.chain_id, tuple(found.verdicts))
            try:
                self.write(batch, cursor)
            except CursorMoved:
                # another shipper wrote first: start over from the copy's cursor
                self.metrics.refusals.labels(reason="cursor moved").inc()
                return 0
            # written now or before (a resend): committed with the cursor past it
            self._acknowledged(cursor, batch)
            shipped_height = self.shipped_height = batch.verdicts[-1].entry.height
        self.metrics.shipped_height.set(shipped_height)
        # Heights without verdicts hold no entry: the copy is whole through the executed
        # height when the round took everything f+1 sidecars agreed on.
        behind = 0 if found.caught_up else found.executed - shipped_height
        self.metrics.lag.set(max(0, behind))
        return len(found.verdicts)

    def _count(self, found: Round) -> None:
        for refusal in found.refusals:
            self.metrics.refusals.labels(reason=refusal.reason).inc()
            if refusal.sidecar >= 0:
                self.metrics.sidecar_refusals.labels(
                    sidecar=str(refusal.sidecar), reason=refusal.reason
                ).inc()
        self.metrics.certified_height.set(found.executed)

    async def lag_without_database(self) -> None:
        """While the database is down the copy stands still and the cluster goes on: the
        lag is the certified height read now less the copy's last height, so that it grows
        on a dashboard instead of freezing at its last value (docs/audit.md, "Metrics")."""
        refusals: list[Refusal] = []
        heights = await self.reader.executed_heights(refusals)
        ranked = sorted(heights.values(), reverse=True)
        if len(ranked) > self.reader.f:
            executed = ranked[self.reader.f]
            self.metrics.certified_height.set(executed)
            self.metrics.lag.set(max(0, executed - self.shipped_height))

    async def run(self, stop: asyncio.Event) -> None:
        pause = self.options.idle_s
        pipe = _Pipeline()
        while not stop.is_set():
            try:
                shipped = await self.pipelined_round(pipe)
                pause = self.options.idle_s
            except psycopg.Error as error:
                log.warning("database unavailable (%s)", type(error).__name__)
                self.metrics.database_errors.inc()
                pipe.reset()
                self.close()
                self.conn = None
                await self.lag_without_database()
                shipped, pause = 0, min(pause * 2, SHIP_RETRY_S_MAX)
            if not shipped:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
        with contextlib.suppress(psycopg.Error, CursorMoved):
            await self.settle(pipe)  # the batch in flight when asked to stop: let it commit

    async def pipelined_round(self, pipe: _Pipeline) -> int:
        """One round of `run`: the next round is read from where the batch being written
        ends, while a thread writes it (docs/audit.md, "What the shipper trusts"). Nothing
        is trusted the earlier for it: the round's entries are checked against that head,
        and its batch is written only where the copy's cursor is that head."""
        if pipe.cursor is None:
            pipe.cursor = read_cursor(self._db(), self.spec.chain_id)
            self.shipped_height = pipe.cursor.height
            self._acknowledged(pipe.cursor)
        found = await self.next_round(pipe.cursor)
        if not await self.settle(pipe):
            return 0  # the batch before was not the copy's next: read again from the copy
        self._count(found)
        if found.verdicts:
            batch = Batch(self.spec.chain_id, tuple(found.verdicts))
            pipe.writing = asyncio.create_task(asyncio.to_thread(self.write, batch, pipe.cursor))
            pipe.batch, pipe.before, pipe.cursor = batch, pipe.cursor, batch.after(pipe.cursor)
        # The lag counts from the copy's committed height, not the batch still in flight.
        behind = found.executed - self.shipped_height
        self.metrics.lag.set(0 if found.caught_up and not found.verdicts else max(0, behind))
        return len(found.verdicts)

    async def settle(self, pipe: _Pipeline) -> bool:
        """Wait for the batch in flight; False (and the cursor forgotten) when the copy did
        not take it as its next batch. A database error propagates, the pipe emptied."""
        writing, batch, before = pipe.writing, pipe.batch, pipe.before
        if writing is None or batch is None or before is None:
            return True
        pipe.writing = pipe.batch = pipe.before = None
        try:
            result = await writing
        except CursorMoved:
            # another shipper wrote first: start over from the copy's cursor
            self.metrics.refusals.labels(reason="cursor moved").inc()
            pipe.reset()
            return False
        except BaseException:
            pipe.reset()
            raise
        if result is not Written.WRITTEN:
            pipe.reset()  # a resend: the copy's own cursor says where it stands
            return False
        self.shipped_height = batch.verdicts[-1].entry.height
        self.metrics.shipped_height.set(self.shipped_height)
        self._acknowledged(before, batch)
        return True


@dataclass
class _Pipeline:
    """`run`'s state between rounds: the batch a thread is writing, and the cursor the copy
    will have once it commits (None: read it from the copy)."""

    cursor: Cursor | None = None
    batch: Batch | None = None
    before: Cursor | None = None  # where the copy stands until `batch` commits
    writing: asyncio.Task[Written] | None = None

    def reset(self) -> None:
        self.cursor = self.batch = self.before = self.writing = None
