"""The shipper's operations metrics (docs/audit.md, "Operations") against a live 4-node
cluster: an outvoted sidecar is counted by its member index, and while the database is
down the lag keeps growing with the certified head instead of freezing at its last value."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from quorumgate.audit.shipper import ShipOptions, Shipper
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.delivery import Channels
from quorumgate.sdk.sync import SyncClient
from tests.audit.test_ship_live import (
    LyingSidecar,
    fresh_db,
    metric,
    owner_key,
    ship_all,
)
from tests.polling import until
from tests.support.cluster import new_agent

DOWN_WAIT_S = 30.0


@pytest.fixture
async def channels(cluster: ClusterSpec) -> AsyncIterator[Channels]:
    made = Channels(cluster)
    try:
        yield made
    finally:
        await made.close()


async def test_an_outvoted_sidecar_is_counted_by_its_member_index(
    cluster: ClusterSpec, owner: SyncClient, channels: Channels, postgres_dsn: str
) -> None:
    new_agent(owner, ["web.get"])
    dsn = fresh_db(postgres_dsn, "ship_metrics_liar")
    stubs = [*channels.sidecars[:3], LyingSidecar(channels.sidecars[3], cluster.chain_id)]
    shipper = Shipper(cluster, owner_key(cluster), stubs, ShipOptions(dsn))
    try:
        await ship_all(shipper, stubs)
    finally:
        shipper.close()
    name = "qg_ship_sidecar_refusals_total"
    assert metric(shipper, name, sidecar="3", reason="ledger differs") >= 1
    for honest in ("0", "1", "2"):
        assert metric(shipper, name, sidecar=honest, reason="ledger differs") == 0
    assert metric(shipper, "qg_ship_certified_height") >= 1


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_lag_grows_while_the_database_is_down(
    cluster: ClusterSpec, owner: SyncClient, channels: Channels
) -> None:
    new_agent(owner, ["web.get"])
    dsn = f"postgresql://qg@127.0.0.1:{_closed_port()}/postgres?connect_timeout=2"
    shipper = Shipper(cluster, owner_key(cluster), channels.sidecars, ShipOptions(dsn))
    stop = asyncio.Event()
    task = asyncio.create_task(shipper.run(stop))
    try:
        await until(
            "the lag to show the certified head while the database is down",
            lambda: (
                metric(shipper, "qg_ship_database_errors_total") >= 1
                and metric(shipper, "qg_ship_lag_heights") >= 1
            ),
            DOWN_WAIT_S,
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, DOWN_WAIT_S)
        shipper.close()
    assert metric(shipper, "qg_ship_lag_heights") == metric(shipper, "qg_ship_certified_height")
