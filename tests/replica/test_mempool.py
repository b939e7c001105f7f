"""The mempool (replica/mempool.py): admission, replay, fairness, bounds.

Keys are derived from names and Ed25519 signatures are deterministic, so every test here
is deterministic; hypothesis drives the random workloads. Signature verification is
counted by wrapping `quorumgate.proto.tx.verify_signature`, which `parse` calls.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from quorumgate.proto import tx
from quorumgate.proto.model import Argument, Proposal, Reason, SignedTx
from quorumgate.proto.nonces import NonceWindow
from quorumgate.replica import mempool as mempool_module
from quorumgate.replica.mempool import (
    STATUS_OF_REASON,
    Admission,
    Mempool,
    MempoolLimits,
)
from quorumgate.replica.types import Block, QuorumCert, genesis_block
from tests.engine.harness import CHAIN, World, signing_key

SECRET = "hunter2-do-not-echo"


# --------------------------------------------------------------------------- helpers


def _key(name: str) -> SigningKey:
    return signing_key(name)


def _signer(name: str) -> bytes:
    return bytes(_key(name).verify_key)


@functools.cache
def _tx(name: str, nonce: int, run: str = "run-1", chain: str = CHAIN, target: str = "") -> bytes:
    """A signed proposal; cached because signing is the slow part of these tests."""
    payload = Proposal(
        run_id=run,
        tool="kb.search",
        target=target or "https://example.com/",
        arguments=(Argument(name="q", text=SECRET),),
    )
    return tx.build(chain, nonce, payload, _key(name))


def _forged(data: bytes) -> bytes:
    """The same transaction with one bit of its signature flipped."""
    signed = tx.parse(data, verify=False).signed
    signature = bytes([signed.signature[0] ^ 1]) + signed.signature[1:]
    return tx.encode_signed(SignedTx(body=signed.body, signer=signed.signer, signature=signature))


def _chain(payloads: Sequence[Sequence[bytes]], parent: Block | None = None) -> list[Block]:
    """Blocks extending `parent` (genesis by default), one per payload, each certified."""
    parent = parent or genesis_block(CHAIN)
    blocks = []
    for payload in payloads:
        justify = QuorumCert(parent.view, parent.height, parent.hash)
        block = Block.create(
            CHAIN,
            parent.hash,
            parent.view + 1,
            parent.height + 1,
            justify,
            parent.timestamp_ms + 1,
            0,
            tuple(payload),
        )
        blocks.append(block)
        parent = block
    return blocks


def _block(*payload: bytes) -> Block:
    return _chain([payload])[0]


class _VerifyCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real: Callable[[SignedTx], bool] = tx.verify_signature

        def counting(signed: SignedTx) -> bool:
            self.calls += 1
            return real(signed)

        monkeypatch.setattr(tx, "verify_signature", counting)


@pytest.fixture
def verifies(monkeypatch: pytest.MonkeyPatch) -> _VerifyCounter:
    return _VerifyCounter(monkeypatch)


def _refused(admission: Admission, reason: str, status: str) -> None:
    assert not admission.accepted
    assert (admission.reason, admission.status) == (reason, status)
    assert SECRET not in admission.detail


# --------------------------------------------------------------------------- admission


def test_valid_transaction_is_accepted_with_its_signer_nonce_id() -> None:
    pool = Mempool(CHAIN)
    admission = pool.admit(_tx("alice", 1))
    assert admission == Admission(True, tx.tx_id(_signer("alice"), 1), "ok", "", "OK")
    assert (pool.size, pool.bytes, pool.pending()) == (1, len(_tx("alice", 1)), True)
    pool.assert_invariants()


@pytest.mark.parametrize(
    "data",
    [b"", b"junk", b"\xff" * 40, b"\x0a\x05hello", _tx("alice", 1)[:-7]],
    ids=["empty", "text", "ff", "wrong-shape", "truncated"],
)
def test_malformed_bytes_are_invalid_argument_without_an_id(data: bytes) -> None:
    pool = Mempool(CHAIN)
    admission = pool.admit(data)
    _refused(admission, "malformed", "INVALID_ARGUMENT")
    assert admission.tx_id is None
    assert pool.size == 0 and pool.refused == {"malformed": 1}


def test_forged_signature_is_invalid_argument_bad_signature() -> None:
    pool = Mempool(CHAIN)
    admission = pool.admit(_forged(_tx("alice", 1)))
    _refused(admission, "bad_signature", "INVALID_ARGUMENT")
    assert admission.tx_id is None and pool.size == 0
    # the genuine transaction is still welcome afterwards
    assert pool.admit(_tx("alice", 1)).accepted


def test_transaction_for_another_chain_is_failed_precondition() -> None:
    pool = Mempool(CHAIN)
    admission = pool.admit(_tx("alice", 1, chain="other-chain"))
    _refused(admission, "wrong_chain", "FAILED_PRECONDITION")
    assert admission.tx_id == tx.tx_id(_signer("alice"), 1)


def test_oversized_transaction_is_refused_before_any_parsing_or_verification(
    verifies: _VerifyCounter,
) -> None:
    pool = Mempool(CHAIN, MempoolLimits(tx_bytes_max=300))
    big = _tx("alice", 1, target="https://example.com/" + "x" * 200)
    assert len(big) > 300
    _refused(pool.admit(big), "too_large", "INVALID_ARGUMENT")
    _refused(Mempool(CHAIN).admit(b"\x0a" + bytes(64 * 1024)), "too_large", "INVALID_ARGUMENT")
    assert verifies.calls == 0


def test_committed_nonce_is_refused_forever_as_already_exists() -> None:
    pool = Mempool(CHAIN, MempoolLimits(nonce_window=4))
    first = _tx("alice", 1)
    assert pool.admit(first).accepted
    pool.on_commit([_block(first)])
    assert pool.size == 0
    replay = pool.admit(first)
    _refused(replay, "replayed", "ALREADY_EXISTS")
    assert replay.tx_id == tx.tx_id(_signer("alice"), 1)
    # another body under the spent nonce is the same transaction id: refused too
    _refused(pool.admit(_tx("alice", 1, run="other")), "replayed", "ALREADY_EXISTS")
    # long after the window moved on, nonce 1 is below the low-water mark: still refused
    pool.on_commit(_chain([[_tx("alice", n)] for n in range(2, 12)]))
    _refused(pool.admit(first), "replayed", "ALREADY_EXISTS")
    assert pool.admit(_tx("alice", 12)).accepted


def test_nonce_beyond_the_window_is_refused_as_replayed_like_the_engine() -> None:
    pool = Mempool(CHAIN, MempoolLimits(nonce_window=4))
    _refused(pool.admit(_tx("alice", 5)), "replayed", "ALREADY_EXISTS")
    assert pool.admit(_tx("alice", 4)).accepted


def test_after_a_base_taken_from_a_peer_no_window_claims_what_came_before_it() -> None:
    """A replica that took a pruned peer's committed base (docs/pruning.md) never saw the
    commits below it: a signer it never saw may have spent nonces there, so its next one
    is not refused as beyond a window anchored at zero."""
    pool = Mempool(CHAIN, MempoolLimits(nonce_window=4))
    pool.on_commit([_block(_tx("bob", 1))])
    _refused(pool.admit(_tx("alice", 9)), "replayed", "ALREADY_EXISTS")
    pool.forget_history()
    assert not pool.complete_history
    assert pool.admit(_tx("alice", 9)).accepted
    assert pool.admit(_tx("bob", 9)).accepted  # bob's window, anchored before, is gone too
    pool.on_commit([_block(_tx("carol", 3))])
    _refused(pool.admit(_tx("carol", 3)), "replayed", "ALREADY_EXISTS")  # seen: still refused


def test_same_signer_and_nonce_with_other_bytes_while_pending_is_conflicting_nonce() -> None:
    pool = Mempool(CHAIN)
    first = pool.admit(_tx("alice", 1, run="a"))
    second = pool.admit(_tx("alice", 1, run="b"))
    _refused(second, "conflicting_nonce", "ALREADY_EXISTS")
    assert second.tx_id == first.tx_id
    assert pool.size == 1 and pool.recent(5) == [_tx("alice", 1, run="a")]


def test_identical_resubmission_returns_the_same_id_without_verifying_again(
    verifies: _VerifyCounter,
) -> None:
    pool = Mempool(CHAIN)
    data = _tx("alice", 1)
    first = pool.admit(data)
    assert verifies.calls == 1
    for _ in range(3):
        again = pool.admit(bytes(bytearray(data)))  # equal bytes, another object
        assert again.accepted and again.tx_id == first.tx_id and again.status == "OK"
    assert verifies.calls == 1
    assert (pool.size, pool.accepted, pool.resubmitted) == (1, 1, 3)


def test_a_copy_gossiped_after_its_commit_is_refused_without_verifying_again(
    verifies: _VerifyCounter,
) -> None:
    """A peer's regossip (or a slow one's first gossip) of a transaction that
    already committed here once cost a second Ed25519 check before being refused as replayed.
    Bytes this replica verified are refused on the spot, with the same answer."""
    pool = Mempool(CHAIN)
    data = _tx("alice", 1)
    assert pool.admit(data).accepted
    pool.on_commit([_block(data)])
    late = pool.admit(bytes(bytearray(data)))
    _refused(late, "replayed", "ALREADY_EXISTS")
    assert verifies.calls == 1
    assert (pool.signatures_verified, pool.signatures_cached) == (1, 1)


def test_a_transaction_first_seen_in_a_block_is_not_verified_again_on_admission(
    verifies: _VerifyCounter,
) -> None:
    pool = Mempool(CHAIN)
    data = _tx("alice", 1)
    assert pool.check(_block(data)) is None  # the proposal came before the gossip
    assert pool.admit(data).accepted
    assert verifies.calls == 1
    pool.on_commit([_block(data)])
    _refused(pool.admit(data), "replayed", "ALREADY_EXISTS")
    assert verifies.calls == 1


def test_forged_bytes_are_verified_each_time_and_never_remembered(
    verifies: _VerifyCounter,
) -> None:
    pool = Mempool(CHAIN)
    forged = _forged(_tx("alice", 1))
    for calls in (1, 2):
        _refused(pool.admit(forged), "bad_signature", "INVALID_ARGUMENT")
        assert verifies.calls == calls
    assert pool.signatures_cached == 0


def test_every_reason_maps_to_the_status_the_client_api_uses() -> None:
    assert STATUS_OF_REASON == {
        "ok": "OK",
        "malformed": "INVALID_ARGUMENT",
        "bad_signature": "INVALID_ARGUMENT",
        "too_large": "INVALID_ARGUMENT",
        "wrong_chain": "FAILED_PRECONDITION",
        "replayed": "ALREADY_EXISTS",
        "conflicting_nonce": "ALREADY_EXISTS",
        "mempool_full": "RESOURCE_EXHAUSTED",
        "signer_full": "RESOURCE_EXHAUSTED",
        "bad_member_entry": "INVALID_ARGUMENT",
    }
    # the reasons shared with the engine are spelled as the engine spells them
    for reason in ("malformed", "bad_signature", "wrong_chain", "replayed"):
        assert Reason(reason).value == reason


# --------------------------------------------------------------------------- back-pressure


def test_count_limit_is_resource_exhausted_until_a_commit_makes_room() -> None:
    pool = Mempool(CHAIN, MempoolLimits(txs_max=3, per_signer_txs_max=3))
    for name in ("a", "b", "c"):
        assert pool.admit(_tx(name, 1)).accepted
    full = pool.admit(_tx("d", 1))
    _refused(full, "mempool_full", "RESOURCE_EXHAUSTED")
    assert full.tx_id == tx.tx_id(_signer("d"), 1)
    pool.on_commit([_block(_tx("a", 1))])
    assert pool.admit(_tx("d", 1)).accepted
    assert pool.refused == {"mempool_full": 1}


def test_byte_limit_is_resource_exhausted() -> None:
    size = len(_tx("a", 1))
    pool = Mempool(CHAIN, MempoolLimits(bytes_max=2 * size + size // 2, tx_bytes_max=size))
    assert pool.admit(_tx("a", 1)).accepted
    assert pool.admit(_tx("b", 1)).accepted
    _refused(pool.admit(_tx("c", 1)), "mempool_full", "RESOURCE_EXHAUSTED")
    assert pool.bytes == 2 * size


def test_per_signer_limit_is_resource_exhausted_while_others_still_get_in() -> None:
    pool = Mempool(CHAIN, MempoolLimits(per_signer_txs_max=2))
    assert pool.admit(_tx("alice", 1)).accepted
    assert pool.admit(_tx("alice", 2)).accepted
    _refused(pool.admit(_tx("alice", 3)), "signer_full", "RESOURCE_EXHAUSTED")
    assert pool.admit(_tx("bob", 1)).accepted


# --------------------------------------------------------------------------- take


def test_batch_of_fifty_serves_a_busy_signer_and_ten_light_ones_alike() -> None:
    pool = Mempool(CHAIN)
    for nonce in range(1, 1001):
        assert pool.admit(_tx("busy", nonce)).accepted
    light = [f"light-{i}" for i in range(10)]
    for name in light:
        for nonce in range(1, 11):
            assert pool.admit(_tx(name, nonce)).accepted
    batch = pool.take((), 50, 1 << 30)
    assert len(batch) == 50
    parsed = [tx.parse(data, verify=False) for data in batch]
    signers = {p.signer for p in parsed}
    assert signers == {_signer(n) for n in ["busy", *light]}
    # round-robin: no signer has more than its share, rounded up
    per_signer = [sum(p.signer == s for p in parsed) for s in signers]
    assert max(per_signer) - min(per_signer) <= 1
    # each signer's transactions come in nonce order, starting at its lowest
    for signer in signers:
        nonces = [p.nonce for p in parsed if p.signer == signer]
        assert nonces == list(range(1, len(nonces) + 1))


def test_signers_left_out_of_a_full_round_go_first_in_the_next_batch() -> None:
    pool = Mempool(CHAIN)
    names = [f"s{i:02}" for i in range(20)]
    for name in names:
        for nonce in (1, 2):
            assert pool.admit(_tx(name, nonce)).accepted
    first = pool.take((), 10, 1 << 30)
    second = pool.take(_chain([first]), 10, 1 << 30)
    signers_first = {tx.parse(d, verify=False).signer for d in first}
    signers_second = {tx.parse(d, verify=False).signer for d in second}
    assert len(signers_first) == len(signers_second) == 10
    assert signers_first.isdisjoint(signers_second)


def test_take_leaves_out_what_the_uncommitted_chain_carries_and_removes_nothing() -> None:
    pool = Mempool(CHAIN)
    txs = [_tx("alice", n) for n in range(1, 5)] + [_tx("bob", 1)]
    for data in txs:
        assert pool.admit(data).accepted
    # the chain carries alice 1 in our bytes and alice 2 in another leader's bytes
    chain = _chain([[txs[0]], [_tx("alice", 2, run="elsewhere")]])
    batch = pool.take(chain, 100, 1 << 30)
    assert sorted(batch) == sorted([txs[2], txs[3], txs[4]])
    assert pool.size == 5
    assert sorted(pool.take((), 100, 1 << 30)) == sorted(txs)


def test_take_respects_count_and_byte_budgets_without_reordering_a_signer() -> None:
    pool = Mempool(CHAIN)
    small = _tx("alice", 1)
    big = _tx("alice", 2, target="https://example.com/" + "y" * 500)
    other = _tx("bob", 1)
    for data in (small, big, other):
        assert pool.admit(data).accepted
    assert pool.take((), 0, 1 << 30) == ()
    assert len(pool.take((), 2, 1 << 30)) == 2
    # alice's nonce 2 does not fit, and her nonce 3 may not jump it: bob's fits
    batch = pool.take((), 10, len(small) + len(other) + 10)
    assert sorted(batch) == sorted([small, other])


def test_commit_removes_transactions_whatever_bytes_carried_their_id() -> None:
    pool = Mempool(CHAIN)
    mine = _tx("alice", 1, run="mine")
    assert pool.admit(mine).accepted
    assert pool.admit(_tx("bob", 1)).accepted
    pool.on_commit([_block(_tx("alice", 1, run="theirs"))])
    assert pool.recent(10) == [_tx("bob", 1)]
    _refused(pool.admit(mine), "replayed", "ALREADY_EXISTS")
    pool.assert_invariants()


def test_recent_gives_pending_transactions_oldest_first() -> None:
    pool = Mempool(CHAIN)
    order = [_tx("bob", 2), _tx("alice", 1), _tx("bob", 1)]
    for data in order:
        assert pool.admit(data).accepted
    assert pool.recent(0) == []
    assert pool.recent(2) == order[:2]
    assert pool.recent(10) == order
    pool.on_commit([_block(order[0])])
    assert pool.recent(10) == order[1:]


# --------------------------------------------------------------------------- check


def test_check_accepts_a_good_block_and_verifies_pending_transactions_not_at_all(
    verifies: _VerifyCounter,
) -> None:
    pool = Mempool(CHAIN)
    pending = [_tx("alice", 1), _tx("bob", 1)]
    for data in pending:
        pool.admit(data)
    assert verifies.calls == 2
    assert pool.check(_block(*pending)) is None
    assert verifies.calls == 2


def test_check_verifies_unknown_transactions_once_then_remembers_them(
    verifies: _VerifyCounter,
) -> None:
    pool = Mempool(CHAIN)
    block = _block(_tx("alice", 1), _tx("bob", 1))
    assert pool.check(block) is None
    assert verifies.calls == 2
    assert pool.check(_chain([[_tx("bob", 1), _tx("carol", 1)]])[0]) is None
    assert verifies.calls == 3
    assert pool.check(_block()) is None  # an empty block is always fine


def test_check_refuses_a_block_with_a_forged_signature() -> None:
    pool = Mempool(CHAIN)
    good = _tx("alice", 1)
    assert pool.admit(good).accepted
    assert pool.check(_block(_tx("bob", 1), _forged(good))) == "bad_signature"
    assert pool.blocks_refused == {"bad_signature": 1}


def test_check_refuses_a_transaction_id_twice_in_one_block() -> None:
    pool = Mempool(CHAIN)
    data = _tx("alice", 1)
    assert pool.check(_block(data, data)) == "duplicate_tx"
    assert pool.check(_block(data, _tx("alice", 1, run="twin"))) == "duplicate_tx"
    assert pool.admit(data).accepted  # pending now: same answer through the fast path
    assert pool.check(_block(_tx("alice", 1, run="twin"), data)) == "duplicate_tx"


def test_check_refuses_foreign_chain_malformed_and_oversized_transactions() -> None:
    pool = Mempool(CHAIN, MempoolLimits(tx_bytes_max=300))
    good = _tx("alice", 1)
    assert pool.check(_block(good, _tx("bob", 1, chain="other-chain"))) == "wrong_chain"
    assert pool.check(_block(good, b"junk")) == "malformed"
    big = _tx("bob", 1, target="https://example.com/" + "z" * 300)
    assert pool.check(_block(good, big)) == "too_large"
    assert pool.check(_block(good)) is None


# --------------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    "overrides",
    [
        {"txs_max": 0},
        {"bytes_max": -1},
        {"verified_cache_max": 0},
        {"tx_bytes_max": 64 * 1024 + 1},
        {"txs_max": 10, "per_signer_txs_max": 11},
        {"bytes_max": 1000, "tx_bytes_max": 1001},
        {"nonce_window": 64, "window_nonces_max": 63},
    ],
)
def test_inconsistent_limits_are_refused_at_construction(overrides: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        MempoolLimits(**overrides)


def test_module_is_pure_no_io_clock_or_randomness() -> None:
    tree = ast.parse(Path(mempool_module.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    tops = {name.split(".")[0] for name in imported}
    forbidden = {"asyncio", "grpc", "aiosqlite", "time", "datetime", "random", "secrets", "os"}
    assert not tops & forbidden
    assert tops <= {"__future__", "bisect", "collections", "dataclasses", "itertools",
                    "quorumgate"}  # fmt: skip
    # within QuorumGate: the replica layer and the formats below it, never the sidecar
    ours = {name for name in imported if name.startswith("quorumgate")}
    assert ours and all(
        name.startswith(("quorumgate.replica.", "quorumgate.proto")) for name in ours
    ), ours


# --------------------------------------------------------------------------- garbage


def _mutations(data: bytes) -> st.SearchStrategy[bytes]:
    flip = st.tuples(st.integers(0, len(data) - 1), st.integers(1, 255)).map(
        lambda p: data[: p[0]] + bytes([data[p[0]] ^ p[1]]) + data[p[0] + 1 :]
    )
    cut = st.integers(0, len(data) - 1).map(lambda i: data[:i])
    extend = st.binary(min_size=1, max_size=8).map(lambda tail: data + tail)
    return st.one_of(flip, cut, extend)


@settings(max_examples=300, deadline=None)
@given(garbage=st.one_of(st.binary(max_size=300), _mutations(_tx("alice", 1))))
def test_garbage_never_raises_out_of_admit_or_check(garbage: bytes) -> None:
    pool = Mempool(CHAIN)
    admission = pool.admit(garbage)
    assert admission.status == STATUS_OF_REASON[admission.reason]
    if not admission.accepted:
        assert admission.detail and SECRET not in admission.detail
    reason = pool.check(_block(garbage))
    assert reason is None or isinstance(reason, str)
    pool.on_commit([_block(garbage)])
    pool.assert_invariants()


# --------------------------------------------------------------------------- bounds


NAMES = ("n0", "n1", "n2", "n3", "n4")
SMALL = MempoolLimits(
    txs_max=6,
    bytes_max=5 * len(_tx("n0", 1)),
    per_signer_txs_max=2,
    tx_bytes_max=2 * len(_tx("n0", 1)),
    nonce_window=6,
    signers_tracked_max=2,
    window_nonces_max=8,
    verified_cache_max=3,
    block_ids_cached_max=2,
)

TxSpec = tuple[str, int, str]  # (signer name, nonce, run: "a" and "b" give other bytes)


@dataclass(frozen=True)
class Admit:
    spec: TxSpec


@dataclass(frozen=True)
class Garbage:
    data: bytes


@dataclass(frozen=True)
class Propose:
    txs_max: int


@dataclass(frozen=True)
class Commit:
    blocks: int


@dataclass(frozen=True)
class CheckForeign:
    specs: list[TxSpec]


Operation = Admit | Garbage | Propose | Commit | CheckForeign

_tx_spec = st.tuples(st.sampled_from(NAMES), st.integers(1, 8), st.sampled_from(("a", "b")))
_admit = st.builds(Admit, _tx_spec)
_operation: st.SearchStrategy[Operation] = st.one_of(
    _admit,
    _admit,
    _admit,
    st.builds(Garbage, st.binary(max_size=64)),
    st.builds(Propose, st.integers(0, 5)),
    st.builds(Commit, st.integers(1, 2)),
    st.builds(CheckForeign, st.lists(_tx_spec, max_size=4)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=st.lists(_operation, max_size=50))
def test_every_bound_holds_under_a_random_workload(operations: list[Operation]) -> None:
    pool = Mempool(CHAIN, SMALL)
    uncommitted: list[Block] = []
    tip = genesis_block(CHAIN)
    for op in operations:
        if isinstance(op, Admit):
            admission = pool.admit(_tx(*op.spec))
            assert admission.status == STATUS_OF_REASON[admission.reason]
        elif isinstance(op, Garbage):
            assert not pool.admit(op.data).accepted
        elif isinstance(op, Propose):
            batch = pool.take(uncommitted, op.txs_max, SMALL.bytes_max)
            assert len(batch) <= op.txs_max
            assert not {d for b in uncommitted for d in b.payload} & set(batch)
            block = _chain([batch], tip)[0]
            assert pool.check(block) is None  # our own batches always pass
            uncommitted.append(block)
            tip = block
        elif isinstance(op, Commit):
            done, uncommitted = uncommitted[: op.blocks], uncommitted[op.blocks :]
            pool.on_commit(done)
        else:
            pool.check(_block(*(_tx(*spec) for spec in op.specs)))
        pool.assert_invariants()
        assert pool.size <= SMALL.txs_max and pool.bytes <= SMALL.bytes_max
        assert pool.signers_tracked <= SMALL.signers_tracked_max
        assert pool.window_nonces <= SMALL.window_nonces_max
        assert pool.verified_cached <= SMALL.verified_cache_max
        assert pool.blocks_cached <= SMALL.block_ids_cached_max


# --------------------------------------------------------------------------- the engine


WINDOW = 8
AGENTS = ("alice", "bob")
_nonce_blocks = st.lists(
    st.lists(
        st.tuples(st.sampled_from(AGENTS), st.integers(1, 3 * WINDOW), st.sampled_from("abx")),
        max_size=6,
    ),
    min_size=1,
    max_size=10,
)


def _world() -> tuple[World, dict[bytes, NonceWindow]]:
    world = World(overrides={"nonce_window": WINDOW})
    world.add_tool("kb.search")
    for name in AGENTS:
        world.add_agent(name, None)
    windows = {bytes(world.owner.verify_key): world.engine.state.owner_nonces}
    for name in AGENTS:
        windows[_signer(name)] = world.engine.state.agents[name].nonces
    return world, windows


def _log_blocks(world: World, start: int = 0) -> list[Block]:
    return _chain([txs for _, _, txs in world.log[start:]])


def _engine_tx(name: str, nonce: int, run: str) -> bytes:
    """Runs "a" and "b" are two bodies for one (signer, nonce); "x" is for another chain,
    which the engine refuses without spending the nonce."""
    return _tx(name, nonce, run, chain="other-chain" if run == "x" else CHAIN)


def _replay_rows(
    world: World, windows: dict[bytes, NonceWindow]
) -> Iterator[tuple[bytes, int, bool]]:
    for signer, window in windows.items():
        for nonce in range(1, 3 * WINDOW + 2):
            yield signer, nonce, not window.is_fresh(nonce, WINDOW)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=_nonce_blocks)
def test_mempool_refuses_as_replayed_exactly_what_the_engine_refuses(
    blocks: list[list[tuple[str, int, str]]],
) -> None:
    world, windows = _world()
    pool = Mempool(CHAIN, MempoolLimits(nonce_window=WINDOW))
    pool.on_commit(_log_blocks(world))  # the owner's administration, from genesis
    for spec in blocks:
        payload = [_engine_tx(name, nonce, run) for name, nonce, run in spec]
        for data in payload:
            engine = world.engine.admission_check(data)
            admission = pool.admit(data)
            assert (admission.reason == "replayed") == (engine.reason is Reason.REPLAYED)
        start = len(world.log)
        world.block(payload)
        pool.on_commit(_log_blocks(world, start))
        for signer, nonce, engine_refuses in _replay_rows(world, windows):
            assert pool.replayed(signer, nonce) == engine_refuses, (signer.hex()[:8], nonce)
        pool.assert_invariants()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=_nonce_blocks, skipped=st.integers(0, 4), tracked=st.integers(1, 3))
def test_without_full_history_the_mempool_refuses_only_engine_replays_or_committed_ids(
    blocks: list[list[tuple[str, int, str]]], skipped: int, tracked: int
) -> None:
    world, windows = _world()
    # This mempool misses the first `skipped` blocks after setup, and can keep only
    # `tracked` windows: both leave it unsure of some low-water marks.
    pool = Mempool(
        CHAIN,
        MempoolLimits(nonce_window=WINDOW, signers_tracked_max=tracked),
        complete_history=False,
    )
    committed: set[tuple[bytes, int]] = set()
    for index, spec in enumerate(blocks):
        payload = [_engine_tx(name, nonce, run) for name, nonce, run in spec]
        start = len(world.log)
        world.block(payload)
        committed |= {(_signer(name), nonce) for name, nonce, run in spec if run != "x"}
        if index >= skipped:
            pool.on_commit(_log_blocks(world, start))
        for signer, nonce, engine_refuses in _replay_rows(world, windows):
            if pool.replayed(signer, nonce):
                assert engine_refuses or (signer, nonce) in committed
        pool.assert_invariants()


def test_evicting_a_window_makes_the_mempool_lenient_never_stricter() -> None:
    pool = Mempool(CHAIN, MempoolLimits(nonce_window=4, signers_tracked_max=1))
    pool.on_commit(_chain([[_tx("alice", n) for n in range(1, 7)]]))
    assert pool.complete_history and pool.replayed(_signer("alice"), 6)
    assert pool.replayed(_signer("alice"), 11)  # beyond alice's window 6 + 4
    pool.on_commit([_block(_tx("bob", 1))])  # alice's window is evicted
    assert (pool.signers_tracked, pool.windows_evicted, pool.complete_history) == (1, 1, False)
    # alice's low-water mark is lost: her old nonces are left to the engine, and a high
    # nonce is no longer refused as beyond a window the mempool cannot place
    alice = _signer("alice")
    assert not pool.replayed(alice, 6) and not pool.replayed(alice, 11)
    # a signer first met now gets a partial window: committed nonces only
    pool.on_commit([_block(_tx("carol", 9))])
    carol = _signer("carol")
    assert pool.replayed(carol, 9) and not pool.replayed(carol, 1)
    assert not pool.replayed(carol, 100)
