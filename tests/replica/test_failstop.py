"""Fail-stop (docs/consensus/protocol.md, "Byzantine peers"): a replica or sidecar whose core task
dies must not go on serving as if alive. An unexpected end of any long-lived task stops the process
with exit status 70 after logging the traceback, so `status` shows it dead and a supervisor restarts
it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from quorumgate.proto.clusterfile import CONSENSUS_KEY_FILE, init_cluster, read_seed
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.replica.node import ReplicaNode
from quorumgate.runtime.process import EXIT_FAIL_STOP, FailStop, serve

SERVE_DEADLINE_S = 30.0


class FakeService:
    def __init__(self, body: str) -> None:
        self.failstop = FailStop()
        self.body = body
        self.stopped = False

    async def _run(self) -> None:
        await asyncio.sleep(0)
        if self.body == "raise":
            raise ValueError("broken invariant")
        if self.body == "forever":
            await asyncio.Event().wait()

    async def start(self) -> None:
        self.failstop.spawn(self._run(), "work")

    async def stop(self) -> None:
        self.stopped = True
        await self.failstop.cancel_all()


@pytest.mark.parametrize("body", ["raise", "return"])
async def test_a_task_that_ends_stops_the_service_with_the_fail_stop_status(
    body: str, caplog: pytest.LogCaptureFixture
) -> None:
    service = FakeService(body)
    await service.start()
    with caplog.at_level(logging.ERROR):
        code = await asyncio.wait_for(serve(service, asyncio.Event()), SERVE_DEADLINE_S)
    assert code == EXIT_FAIL_STOP and service.stopped
    assert any("event=fail_stop task=work" in r.getMessage() for r in caplog.records)
    if body == "raise":
        assert any(r.exc_info and r.exc_info[0] is ValueError for r in caplog.records)


async def test_a_stop_request_is_a_clean_exit() -> None:
    service = FakeService("forever")
    await service.start()
    stop = asyncio.Event()
    stop.set()
    assert await asyncio.wait_for(serve(service, stop), SERVE_DEADLINE_S) == 0
    assert service.stopped


async def test_a_replica_whose_core_task_dies_stops_instead_of_serving_on(
    tmp_path: Path,
) -> None:
    """The real replica shell: its core loop raises on the next tick."""
    spec = init_cluster(tmp_path / "c", 4)
    seed = read_seed(spec.node_dir(0) / CONSENSUS_KEY_FILE)
    node = ReplicaNode(spec, 0, Ed25519Signer(seed))
    await node.start()
    try:
        core = node.core
        assert core is not None

        def broken(now_ms: int) -> list[object]:
            raise RuntimeError("an invariant the core relies on broke")

        core.on_tick = broken  # type: ignore[method-assign]
        code = await asyncio.wait_for(serve(node, asyncio.Event()), SERVE_DEADLINE_S)
    finally:
        if node.store is not None and not node.failstop.failed.done():
            await node.stop()
    assert code == EXIT_FAIL_STOP
    assert isinstance(node.failstop.failed.result(), RuntimeError)
