"""One committed block through the engine: everything a height produces, ready to record.

Shared by the sidecar process (sidecar/node.py) and replay (sidecar/replay.py), so a
replayed height is computed exactly as it was the first time.
"""

from __future__ import annotations

from dataclasses import replace

from nacl.signing import SigningKey

from quorumgate.proto.chainversions import commits_arguments
from quorumgate.proto.model import Proposal
from quorumgate.replica.types import Block
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.statements import NO_LATCH_FACT, BlockResult, LatchFact
from quorumgate.sidecar.ledger import NO_EXTRA, LedgerExtra, extra_for
from quorumgate.sidecar.receipts import Validity, leaf_from_verdict, root_and_paths, sign_block
from quorumgate.sidecar.store import ExecutedHeight


def execute_block(
    engine: Engine, key: SigningKey, signer: int, chain_id: str, block: Block, epoch: int = 0
) -> ExecutedHeight:
    """Run `block` (committed, so its signatures were checked by the replicas that
    certified it) and sign the block statement of its verdicts with `key`, this member's
    receipt key of `epoch`, the block's epoch (sidecar/receiptkeys.py)."""
    height = block.height
    result = engine.execute_block(
        height, block.timestamp_ms, list(block.payload), verify_signatures=False
    )
    leaves = tuple(leaf_from_verdict(height, i, v) for i, v in enumerate(result.verdicts))
    root, paths = root_and_paths([leaf.hash(chain_id) for leaf in leaves])
    # On a chain whose receipts expire, the window is the block's time (agreed in the
    # committed block, never this process's clock) plus the TTL in effect after the block
    ttl_ms = engine.certificate_ttl_ms()
    validity = None if ttl_ms is None else Validity(block.timestamp_ms, block.timestamp_ms + ttl_ms)
    signed = sign_block(
        key, signer, chain_id, height, root, result.state_root, len(leaves), validity, epoch
    )
    return ExecutedHeight(
        height=height,
        block_hash=block.hash,
        block_time_ms=block.timestamp_ms,
        result=result,
        leaves=leaves,
        paths=tuple(tuple(p) for p in paths),
        signed=signed,
        state_delta=engine.state_delta(),
        ledger_extras=ledger_extras(engine, result),
    )


def ledger_extras(engine: Engine, result: BlockResult) -> tuple[LedgerExtra, ...] | None:
    """On a chain that commits arguments, each verdict's commitments and sealed salts
    (docs/audit.md, "Argument commitments"): those of the call its own transaction
    proposed, found by transaction id, and none for any other verdict (a confirmation
    settles a call whose commitments its proposal's entry already holds). The calls come
    from the engine's side output (`BlockResult.calls`, what it parsed while judging the
    block), so the block is parsed once. A proposal's extra also carries what the latch
    did with it (docs/audit.md, "Repeat counts and halts"), read off the same side
    output. None on other chains: their ledger entries stay of version 1."""
    if not commits_arguments(engine.config.receipt_version):
        return None
    calls: dict[bytes, Proposal] = {}
    for tx_id, call in result.calls:
        calls.setdefault(tx_id, call)
    verdicts = result.verdicts
    facts = result.latch_facts or (NO_LATCH_FACT,) * len(verdicts)
    if len(facts) != len(verdicts):
        raise ValueError("one latch fact per verdict")
    return tuple(
        _with_fact(extra_for(calls[v.tx_id]), fact) if v.tx_id in calls else NO_EXTRA
        for v, fact in zip(verdicts, facts, strict=True)
    )


def _with_fact(extra: LedgerExtra, fact: LatchFact) -> LedgerExtra:
    return replace(extra, repeat=fact.repeat, halted=fact.halted)
