"""Replay's executing process: blocks go to a second process, which
checks each block's certificate and executes it; the outcomes come back in order. A block
whose certificate does not verify ends the stream with the reason, and nothing after it is
executed or returned — in the second process as in this one."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quorumgate.replica.types import Block, QuorumCert
from quorumgate.sidecar import replay as replay_module
from quorumgate.sidecar.engine.core import Engine, EngineConfig
from quorumgate.sidecar.execution import execute_block
from quorumgate.sidecar.replay import _executed, _WorkerSetup
from quorumgate.sidecar.store import SidecarStore
from tests.consensus.helpers import CHAIN, chain_of, make_block, membership, qc_for

RECEIPT_SEED = bytes(range(32))


def _config() -> EngineConfig:
    return EngineConfig(chain_id=CHAIN, owner_public_key=bytes(32))


def _setup(checkpoint_heights: int = 1_000) -> _WorkerSetup:
    return _WorkerSetup(_config(), RECEIPT_SEED, 1, membership(), None, checkpoint_heights)


async def _stream(blocks: list[Block]) -> AsyncIterator[Block]:
    for block in blocks:
        yield block


async def _outcomes(blocks: list[Block], workers: int, setup: _WorkerSetup) -> list[object]:
    out = []
    async for block, outcome in _executed(_stream(blocks), setup, workers):
        out.append((block.height, outcome))
    return out


@pytest.mark.parametrize("workers", [0, 1])
def test_outcomes_come_back_in_order_and_match_an_engine_run_here(workers: int) -> None:
    blocks = chain_of(range(1, 41))[1:]  # 40 blocks: more than one batch to the worker
    got = asyncio.run(_outcomes(blocks, workers, _setup(checkpoint_heights=16)))
    assert [height for height, _ in got] == list(range(1, 41))
    engine = Engine(_config())
    key = replay_module.SigningKey(RECEIPT_SEED)
    for block, (_, outcome) in zip(blocks, got, strict=True):
        assert not isinstance(outcome, str), outcome
        executed, state = outcome  # type: ignore[misc]
        here = execute_block(engine, key, 1, CHAIN, block)
        assert executed.signed == here.signed and executed.result == here.result
        # the engine state comes along exactly at the checkpoint heights
        assert (state is not None) == (block.height % 16 == 0)
        if state is not None:
            assert state == engine.state_bytes()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_forged_certificate_ends_the_stream_and_nothing_after_it_runs(workers: int) -> None:
    blocks = chain_of(range(1, 6))  # genesis and 5 blocks
    # block 4's certificate for block 3: signed by members 0 and 1, and one signature that
    # is member 2's over another block (a forgery a replica's store could carry)
    good = qc_for(blocks[3])
    other = qc_for(blocks[2])
    forged = QuorumCert(
        good.view, good.height, good.block_hash, (*good.signatures[:2], other.signatures[2])
    )
    fourth = make_block(blocks[3], 4, forged)
    fifth = make_block(fourth, 5)
    stream = [*blocks[1:4], fourth, fifth]
    got = asyncio.run(_outcomes(stream, workers, _setup()))
    assert [height for height, _ in got] == [1, 2, 3, 4]
    assert all(not isinstance(outcome, str) for _, outcome in got[:3])
    assert isinstance(got[3][1], str) and "bad signature" in got[3][1]


def test_the_setup_never_prints_the_receipt_key() -> None:
    """The receipt key's seed crosses to the worker pickled; a repr (a log line, a
    traceback's locals) never shows it."""
    text = repr(_setup())
    assert RECEIPT_SEED.hex() not in text and repr(RECEIPT_SEED) not in text


def test_the_first_height_recorded_carries_the_whole_state(tmp_path: Path) -> None:
    """Replay compares the heights its store holds and records the rest. A store written
    by an older build holds the state whole (or in schema 3's parts); a delta of only the
    last height's changes cannot be recorded over it, so the first recorded height's delta
    is full whatever the store held — and the store accepts it."""
    blocks = chain_of(range(1, 9))[1:]
    setup = dataclasses.replace(_setup(), recorded_height=5)
    got = asyncio.run(_outcomes(blocks, 1, setup))
    deltas = [outcome[0].state_delta for _, outcome in got]  # type: ignore[index]
    assert [d.full for d in deltas] == [True, False, False, False, False, True, False, False]

    async def record() -> None:
        store = await SidecarStore.open(tmp_path / "sidecar.db", CHAIN)
        try:
            for _, outcome in got[:5]:  # heights 1..5 recorded whole, as an old build did
                executed = outcome[0]  # type: ignore[index]
                engine_state = _state_after(blocks, executed.height)
                await store.record(dataclasses.replace(executed, state_delta=None,
                                                       engine_state=engine_state))  # fmt: skip
            for _, outcome in got[5:]:
                await store.record(outcome[0])  # type: ignore[index]
            assert await store.engine_state() == _state_after(blocks, 8)
        finally:
            await store.close()

    asyncio.run(record())


def _state_after(blocks: list[Block], height: int) -> bytes:
    engine = Engine(_config())
    key = replay_module.SigningKey(RECEIPT_SEED)
    for block in blocks[:height]:
        execute_block(engine, key, 1, CHAIN, block)
    return engine.state_bytes()
