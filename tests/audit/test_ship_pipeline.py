"""The shipper's faster path (docs/audit.md, "What the shipper trusts") against a live
4-node cluster: the running shipper reads the next round while the batch before is being
written, and the copy still verifies, batch after batch; and receipts asked of f+1
sidecars first still certify everything when one of those is silent (the others are
asked then)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from quorumgate.audit import follow
from quorumgate.audit.shipper import ShipOptions, Shipper
from quorumgate.audit.store import read_cursor
from quorumgate.audit.verify import TrustedHead, check_copy
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.delivery import Channels
from quorumgate.sdk.sync import SyncClient
from tests.audit.test_ship_live import (
    RUN,
    URL,
    count,
    fresh_db,
    metric,
    owner_key,
    ship_all,
)
from tests.polling import until
from tests.support.cluster import new_agent

CALLS = 5  # allowed calls, each a ledger entry, on top of the agent's registration
SMALL_BATCH_VERDICTS = 2  # so that a handful of entries makes several batches
COPY_WAIT_S = 60.0


@pytest.fixture
async def channels(cluster: ClusterSpec) -> AsyncIterator[Channels]:
    made = Channels(cluster)
    try:
        yield made
    finally:
        await made.close()


def make_calls(owner: SyncClient, cluster: ClusterSpec) -> None:
    _, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as qg:
        for i in range(CALLS):
            assert qg.propose("web.get", URL, {"q": str(i)}, run_id=RUN).allowed


async def test_the_pipelined_shipper_writes_batch_after_batch_and_the_copy_verifies(
    cluster: ClusterSpec,
    owner: SyncClient,
    channels: Channels,
    postgres_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_calls(owner, cluster)
    monkeypatch.setattr(follow, "SHIP_BATCH_VERDICTS_MAX", SMALL_BATCH_VERDICTS)
    dsn = fresh_db(postgres_dsn, "ship_pipelined")
    status = await channels.sidecars[0].Status(spb.SidecarStatusRequest(), timeout=5)
    shipper = Shipper(cluster, owner_key(cluster), channels.sidecars, ShipOptions(dsn))
    stop = asyncio.Event()
    task = asyncio.create_task(shipper.run(stop))

    def copied() -> bool:
        with psycopg.connect(dsn) as conn:
            try:
                cursor = read_cursor(conn, cluster.chain_id)
            except psycopg.errors.UndefinedTable:
                return False  # the shipper has not made its tables yet
        return cursor.entries >= status.ledger_entries

    try:
        await until("the copy to reach the ledger", copied, COPY_WAIT_S)
    finally:
        stop.set()
        await task
        shipper.close()
    batches = count(dsn, "SELECT count(*) FROM qg_batches")
    assert batches >= status.ledger_entries // SMALL_BATCH_VERDICTS
    assert count(dsn, "SELECT max(verdicts) FROM qg_batches") <= SMALL_BATCH_VERDICTS
    assert metric(shipper, "qg_ship_verdicts_total") == count(
        dsn, "SELECT count(*) FROM qg_verdicts"
    )
    with psycopg.connect(dsn) as conn:
        report = check_copy(conn, cluster, TrustedHead())
    assert report.problems == []
    assert report.rows >= status.ledger_entries


class SilentReceipts:
    """A sidecar that answers everything but sends no receipts: its stream ends empty."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    def Receipts(self, request: spb.ReceiptsRequest, **kwargs: Any) -> Any:
        class Nothing:
            def cancel(self) -> None:
                return None

            async def __aiter__(self) -> AsyncIterator[spb.ReceiptBatch]:
                for batch in ():
                    yield batch

        return Nothing()


async def test_a_silent_sidecar_among_the_first_f_plus_1_sends_the_shipper_to_the_others(
    cluster: ClusterSpec, owner: SyncClient, channels: Channels, postgres_dsn: str
) -> None:
    make_calls(owner, cluster)
    dsn = fresh_db(postgres_dsn, "ship_silent_receipts")
    # Sidecar 0 is among the f+1 asked first (the lowest ready indices whose page agreed).
    stubs = [SilentReceipts(channels.sidecars[0]), *channels.sidecars[1:]]
    shipper = Shipper(cluster, owner_key(cluster), stubs, ShipOptions(dsn))
    try:
        status = await ship_all(shipper, stubs)
    finally:
        shipper.close()
    assert count(dsn, "SELECT count(*) FROM qg_verdicts") == status.ledger_entries
    with psycopg.connect(dsn) as conn:
        assert check_copy(conn, cluster, TrustedHead()).problems == []
