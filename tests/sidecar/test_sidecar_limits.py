"""What a caller may hold waiting at a sidecar, and what each executed height costs the
sidecar for the callers waiting on it (runtime/readwaits.py, sidecar/waits.py).

One real sidecar, in this process, fed by a stand-in replica (tests/sidecar/standin.py).
The attacker is a key the cluster does not know: it may read the verdicts of transactions it
signed, so it may open `Receipts` streams and `GetReceipt` long polls naming them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, read_seed
from quorumgate.proto.model import Tier, ToolMode
from quorumgate.runtime.readwaits import READ_WAITS_PER_KEY_MAX, READ_WAITS_STRANGERS_MAX
from quorumgate.sidecar import node as sidecar_node
from quorumgate.sidecar.engine.statements import ConfirmationCard
from quorumgate.sidecar.node import METHOD_GET_RECEIPT, METHOD_RECEIPTS, PENDING_FETCHES_MAX
from tests.sidecar.standin import RPC_S, World, auth, own, poll, signed_call, world

__all__ = ["world"]  # the fixture, used by name
LONG_WAIT_MS = 120_000  # long polls in these tests wait until the test ends them


@dataclass
class Follower:
    """A Receipts stream read in the background: what it got, and how it ended."""

    task: asyncio.Task[None]
    got: list[spb.ReceiptBatch]
    ended: list[grpc.StatusCode]


def follow(w: World, key: SigningKey, request: spb.ReceiptsRequest) -> Follower:
    got: list[spb.ReceiptBatch] = []
    ended: list[grpc.StatusCode] = []
    stub = w.stub()

    async def read() -> None:
        try:
            async for batch in stub.Receipts(request, metadata=auth(w.spec, key, METHOD_RECEIPTS)):
                got.append(batch)
        except grpc.aio.AioRpcError as err:
            ended.append(err.code())

    return Follower(asyncio.create_task(read()), got, ended)


def long_poll(
    w: World, key: SigningKey, request: spb.ReceiptRequest
) -> asyncio.Task[spb.ReceiptReply]:
    stub = w.stub()
    metadata = auth(w.spec, key, METHOD_GET_RECEIPT)

    async def ask() -> spb.ReceiptReply:
        reply: spb.ReceiptReply = await stub.GetReceipt(request, timeout=RPC_S, metadata=metadata)
        return reply

    return asyncio.create_task(ask())


async def end(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_strangers_hold_a_bounded_number_of_receipt_streams_and_members_still_read(
    world: World,
) -> None:
    """Each stream a stranger opens (naming a transaction it signed) was held for as long
    as it stayed open, and woken, with a store read, at every executed height. Strangers
    now hold READ_WAITS_STRANGERS_MAX streams together; the rest are refused at once with
    RESOURCE_EXHAUSTED, and the owner's stream and a stranger's admitted one still get
    their verdicts."""
    w = world
    keys = [SigningKey.generate() for _ in range(READ_WAITS_STRANGERS_MAX + 8)]
    followers: list[Follower] = []
    tasks: list[asyncio.Task[None]] = []
    for key in keys:
        followers.append(follow(w, key, spb.ReceiptsRequest(from_height=1, own=[own(key)])))
        tasks.append(followers[-1].task)
    try:
        await poll(
            lambda: sum(f.ended == [grpc.StatusCode.RESOURCE_EXHAUSTED] for f in followers) == 8,
            "8 of the strangers' streams refused with RESOURCE_EXHAUSTED",
        )
        await poll(lambda: w.waiting() == READ_WAITS_STRANGERS_MAX, "the rest held")
        owner = SigningKey(read_seed(w.spec.directory / OWNER_KEY_FILE))
        watcher = follow(w, owner, spb.ReceiptsRequest(from_height=1))
        tasks.append(watcher.task)
        await poll(lambda: w.waiting() == READ_WAITS_STRANGERS_MAX + 1, "the owner's held")
        # the streams reach the sidecar in no set order: take two it holds
        first, second = [i for i, f in enumerate(followers) if not f.ended][:2]
        await w.replica.commit((signed_call(w.spec, keys[first]),))
        await poll(lambda: bool(watcher.got) and bool(followers[first].got), "both answered")
        assert [len(b.receipts) for b in watcher.got] == [1]
        assert followers[first].got[0].receipts[0].leaf.tx_id == own(keys[first]).tx_id
        assert not followers[second].got, "a stranger read a verdict that is not its own"
    finally:
        await end(tasks)


async def test_a_long_poll_beyond_the_bound_is_answered_at_once_not_held(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key's long polls were unbounded. A key now holds READ_WAITS_PER_KEY_MAX; a
    long poll past that is answered at once with what the sidecar has (here: nothing
    yet), as a poll is, so an honest client goes on by polling and loses nothing."""
    monkeypatch.setattr(sidecar_node, "RECEIPT_WAIT_MS_MAX", LONG_WAIT_MS)
    w = world
    key = SigningKey.generate()
    request = spb.ReceiptRequest(proposal_id=own(key).tx_id, nonce=1, wait_ms=LONG_WAIT_MS)
    polls = [long_poll(w, key, request) for _ in range(READ_WAITS_PER_KEY_MAX + 8)]
    try:
        await poll(lambda: sum(p.done() for p in polls) == 8, "8 long polls answered at once")
        answered = [p.result() for p in polls if p.done()]
        assert all(not r.found and r.executed_height == 0 for r in answered)
        await poll(lambda: w.waiting() == READ_WAITS_PER_KEY_MAX, "the rest held")
        # a held one is answered as soon as its verdict is executed
        await w.replica.commit((signed_call(w.spec, key),))
        await poll(lambda: all(p.done() for p in polls), "every held long poll answered")
        assert all(p.result().found for p in polls if p.result().executed_height >= 1)
        assert sum(p.result().found for p in polls) == READ_WAITS_PER_KEY_MAX
    finally:
        await end(polls)


async def test_a_long_poll_nobody_could_be_answered_is_refused_before_it_waits(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger naming a proposal it cannot prove it signed (no nonce, nothing of its
    own) is refused whatever gets executed; it used to be held for the whole wait first,
    then refused."""
    monkeypatch.setattr(sidecar_node, "RECEIPT_WAIT_MS_MAX", LONG_WAIT_MS)
    w = world
    stranger = SigningKey.generate()
    someone = SigningKey.generate()
    request = spb.ReceiptRequest(proposal_id=own(someone).tx_id, wait_ms=LONG_WAIT_MS)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await w.stub().GetReceipt(
            request, timeout=RPC_S, metadata=auth(w.spec, stranger, METHOD_GET_RECEIPT)
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_an_executed_height_costs_no_store_read_per_waiting_caller(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At every executed height each waiting stream of an agent or stranger read that
    height's ledger from the store, and each waiting long poll read its receipt: a
    thousand waiting callers were two thousand store reads per height. The sidecar now
    keeps, for its recent heights, which transactions and principals each holds, and goes
    to the store only for a caller whose verdict is there."""
    monkeypatch.setattr(sidecar_node, "RECEIPT_WAIT_MS_MAX", LONG_WAIT_MS)
    w = world
    store = w.sidecar.store
    assert store is not None
    reads: dict[str, int] = {"ledger_at": 0, "receipt": 0, "receipts_at": 0}

    def counted(name: str) -> None:
        real = getattr(store, name)

        async def wrapper(*args: Any) -> Any:
            reads[name] += 1
            return await real(*args)

        monkeypatch.setattr(store, name, wrapper)

    for name in reads:
        counted(name)
    callers = 40
    keys = [SigningKey.generate() for _ in range(callers)]
    followers = [follow(w, k, spb.ReceiptsRequest(from_height=1, own=[own(k)])) for k in keys]
    polls = [
        long_poll(w, k, spb.ReceiptRequest(proposal_id=own(k).tx_id, nonce=1, wait_ms=LONG_WAIT_MS))
        for k in keys
    ]
    try:
        await poll(lambda: w.waiting() == 2 * callers, "every stream and long poll held")
        before = dict(reads)
        heights = 20
        top = await w.replica.commit(*([()] * (heights - 1)), (signed_call(w.spec, keys[0]),))
        await poll(lambda: w.executed == top, "the sidecar executed every height")
        await poll(lambda: polls[0].done() and bool(followers[0].got), "keys[0] answered")
        await poll(lambda: w.waiting() == 2 * callers - 1, "the others wait on")
        spent = {name: reads[name] - before[name] for name in reads}
        # keys[0]'s answer may read its height (a stream: ledger and receipts; the long
        # poll: its receipt); nobody else's wait reads anything
        assert spent["ledger_at"] <= 1 and spent["receipts_at"] <= 1, spent
        assert spent["receipt"] <= 1, spent
        assert polls[0].result().found
        assert followers[0].got[0].height == top
    finally:
        await end([f.task for f in followers] + polls)


async def test_fetching_the_proposals_of_cards_opens_a_bounded_number_of_streams(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Pending` reads the signed proposal of a card it no longer holds in memory (after a
    restart) from the replica's committed block, over a stream of its own. Each call opened
    its own, all at once, under the sidecar's key: a principal asking again and again held
    that many streams at the replica, whose bound on a key's streams would then refuse the
    sidecar's own log stream when it reconnects. At most PENDING_FETCHES_MAX run now; the
    others wait their turn, and every call still gets its proposal."""
    w = world
    key = SigningKey.generate()
    data = signed_call(w.spec, key)
    top = await w.replica.commit((data,))
    await poll(lambda: w.executed == top, "the block executed")
    opened = {"now": 0, "max": 0}  # the sidecar's channels to its replica, opened from here
    real = sidecar_node.aio_channel

    @contextlib.asynccontextmanager
    async def counted(*args: Any, **kwargs: Any) -> AsyncIterator[grpc.aio.Channel]:
        async with real(*args, **kwargs) as channel:
            opened["now"] += 1
            opened["max"] = max(opened["max"], opened["now"])
            try:
                yield channel
            finally:
                opened["now"] -= 1

    monkeypatch.setattr(sidecar_node, "aio_channel", counted)
    card = ConfirmationCard(
        chain_id=w.spec.chain_id,
        proposal_id=own(key).tx_id,
        principal="p",
        tier=Tier.MASTER,
        delegate_of="",
        tool="kb.search",
        mode=ToolMode.USER_CONFIRM,
        min_tier=Tier.DELEGATE,
        canonical_target="https://example.com/",
        argument_names=(),
        handles=(),
        body_digest=bytes(32),
        created_height=top,
        expires_at_ms=10**12,
    )
    answers = await asyncio.gather(*(w.sidecar.proposal_transactions([card]) for _ in range(40)))
    assert all(a == {card.proposal_id: data} for a in answers)
    assert opened["max"] == PENDING_FETCHES_MAX, opened


async def test_what_readers_ask_never_queues_on_the_writers_connection(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers' store reads went through the one connection `record` writes through, so
    a reader scanning old heights (a stranger's Receipts stream from height 1 reads the
    ledger of every height it passes) put its reads in the queue before every height the
    sidecar executed. They now go through a read-only connection of their own."""
    w = world
    writer = w.sidecar.store
    assert writer is not None
    asked: dict[str, int] = {}
    for name in ("receipt", "receipts_at", "ledger_at", "principal_at", "card"):
        real = getattr(writer, name)

        async def wrapper(*args: Any, name: str = name, real: Any = real) -> Any:
            asked[name] = asked.get(name, 0) + 1
            return await real(*args)

        monkeypatch.setattr(writer, name, wrapper)
    key = SigningKey.generate()
    heights = 70  # more than the heights indexed in memory: the oldest are read
    top = await w.replica.commit((signed_call(w.spec, key),), *([()] * (heights - 1)))
    await poll(lambda: w.executed == top, "every height executed")
    mine = follow(w, key, spb.ReceiptsRequest(from_height=1, own=[own(key)]))
    owner = SigningKey(read_seed(w.spec.directory / OWNER_KEY_FILE))
    everything = follow(w, owner, spb.ReceiptsRequest(from_height=1))
    try:
        await poll(lambda: bool(mine.got) and bool(everything.got), "both streams answered")
        reply = await w.stub().GetReceipt(
            spb.ReceiptRequest(proposal_id=own(key).tx_id, nonce=1),
            timeout=RPC_S,
            metadata=auth(w.spec, key, METHOD_GET_RECEIPT),
        )
        assert reply.found and reply.receipt.leaf.height == 1
        assert mine.got[0].height == everything.got[0].height == 1
        assert asked == {}, f"readers used the writer's connection: {asked}"
    finally:
        await end([mine.task, everything.task])


async def test_a_stream_from_old_heights_finds_its_verdicts_in_one_read_not_one_per_height(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's (or a stranger's) Receipts stream read every height's ledger it passed,
    one store trip each, to find its own verdicts: from height 1 on a long chain, that is
    a trip per height per stream. Heights older than those indexed in memory are now
    searched `RECEIPTS_SCAN_HEIGHTS` at a time in one read."""
    w = world
    reads = w.sidecar.reads
    assert reads is not None
    trips = {"n": 0}
    for name in ("ledger_at", "receipts_at", "heights_holding"):
        real = getattr(reads, name, None)
        if real is None:
            continue

        async def wrapper(*args: Any, real: Any = real) -> Any:
            trips["n"] += 1
            return await real(*args)

        monkeypatch.setattr(reads, name, wrapper)
    key = SigningKey.generate()
    old, recent = signed_call(w.spec, key, 1), signed_call(w.spec, key, 2)
    top = await w.replica.commit((old,), *([()] * 180), (recent,), *([()] * 19))
    await poll(lambda: w.executed == top, "every height executed")
    assert top == 201 and 1 not in w.sidecar._recent and 182 in w.sidecar._recent
    mine = follow(w, key, spb.ReceiptsRequest(from_height=1, own=[own(key, 1), own(key, 2)]))
    try:
        await poll(lambda: len(mine.got) == 2, "both verdicts streamed")
        assert [b.height for b in mine.got] == [1, 182]
        # one search of heights 1..137, then each verdict's height read: 1 + 2 + 2
        assert trips["n"] <= 5, trips
    finally:
        await end([mine.task])
