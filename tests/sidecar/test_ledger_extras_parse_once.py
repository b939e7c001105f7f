"""The ledger's argument commitments come from the calls the engine parsed while judging
the block (`BlockResult.calls`, docs/audit.md, "Argument commitments"), not from a second
parse of the block: they must be exactly the extras a second parse gives, for every kind
of transaction a block may hold, as a sidecar executes it (signatures checked by the
replicas, so the engine does not check them again)."""

from __future__ import annotations

from quorumgate.proto import tx as txlib
from quorumgate.proto.model import Proposal
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.statements import NO_LATCH_FACT, BlockResult
from quorumgate.sidecar.execution import _with_fact, ledger_extras
from quorumgate.sidecar.ledger import NO_EXTRA, LedgerExtra, extra_for
from tests.engine.harness import CHAIN, World, text


def _parsed_again(result: BlockResult, payload: list[bytes]) -> tuple[LedgerExtra, ...]:
    """The extras as a second parse of every transaction of the block gives them."""
    calls: dict[bytes, Proposal] = {}
    for data in payload:
        try:
            parsed = txlib.parse(data, verify=False)
        except txlib.TxRejected:
            continue
        if isinstance(parsed.body.payload, Proposal):
            calls.setdefault(parsed.tx_id, parsed.body.payload)
    facts = result.latch_facts or (NO_LATCH_FACT,) * len(result.verdicts)
    return tuple(
        _with_fact(extra_for(calls[v.tx_id]), fact) if v.tx_id in calls else NO_EXTRA
        for v, fact in zip(result.verdicts, facts, strict=True)
    )


def _mixed_block(world: World) -> list[bytes]:
    alice = world.keys["alice"]
    call = world.tx(alice, Proposal(run_id="run-1", tool="kb.search",
                                    target="https://example.com/x",
                                    arguments=(text("q"),)))  # fmt: skip
    refused = world.tx(alice, Proposal(run_id="run-1", tool="wire.transfer",
                                       target="https://example.com/y"))  # fmt: skip
    other_chain = txlib.build(CHAIN + "-other", world.next_nonce(alice),
                              Proposal(run_id="run-1", tool="kb.search",
                                       target="https://example.com/z"), alice)  # fmt: skip
    forged = bytearray(world.tx(alice, Proposal(run_id="run-1", tool="kb.search",
                                                target="https://example.com/w")))  # fmt: skip
    forged[-1] ^= 1  # a bad signature: unchecked here, as on a sidecar
    return [call, call, refused, b"\x00garbage", other_chain, bytes(forged)]


def test_the_side_output_gives_the_extras_a_second_parse_gives() -> None:
    world = World(verify=False)
    for tool in ("kb.search", "wire.transfer"):
        world.add_tool(tool)
    world.add_agent("alice", ["kb.search"])
    payload = _mixed_block(world)
    result = world.block(payload)
    extras = ledger_extras(world.engine, result)
    assert extras is not None
    assert extras == _parsed_again(result, payload)
    assert sum(extra is not NO_EXTRA for extra in extras) >= 3  # the calls got theirs
    # and every earlier block (admin transactions only) too
    for (_, _, txs), earlier in zip(world.log, world.results, strict=True):
        assert ledger_extras(world.engine, earlier) == _parsed_again(earlier, txs)


def test_replay_hands_out_the_same_calls() -> None:
    world = World(verify=False)
    world.add_tool("kb.search")
    world.add_agent("alice", ["kb.search"])
    world.block(_mixed_block(world))
    fresh = Engine(world.engine.config)
    for (height, time_ms, txs), first in zip(world.log, world.results, strict=True):
        again = fresh.execute_block(height, time_ms, txs, verify_signatures=False)
        assert again == first
