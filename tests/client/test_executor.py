"""The executor against the engine directly (no processes): certificates are built from the
engine's own verdicts and signed with test receipt keys, sealed values are read from the
engine (`Engine.sealed_value`). Every refusal is typed."""

from __future__ import annotations

import dataclasses
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import ClusterSpec, MemberSpec
from quorumgate.proto.model import (
    Argument,
    Confirm,
    EnvelopeArg,
    Outcome,
    Proposal,
    RoleTarget,
    SealedValue,
    SealEnvelope,
    TargetSlot,
    ToolMode,
)
from quorumgate.sdk.executor import (
    AuthorizedCall,
    CertificateExpired,
    CertificateRejected,
    CertificateReused,
    EngineSource,
    EnvelopeUnopenable,
    Executor,
    ExecutorRefused,
    HandleRefused,
    MemoryUsedProposals,
    NotAllowed,
    SqliteUsedProposals,
    UsedProposals,
    WrongCall,
)
from quorumgate.sidecar.engine.statements import BlockResult, ConfirmationCard
from quorumgate.sidecar.receipts import (
    Certificate,
    Receipt,
    ReceiptLeaf,
    Validity,
    assemble_certificate,
    leaf_from_verdict,
    merkle_path,
    merkle_root,
    sign_block,
)
from quorumgate.sidecar.wire import encode_certificate
from tests.engine.harness import CHAIN, World

URL = "https://example.com/x"
RECEIPT_KEYS = [SigningKey(bytes([k + 1]) * 32) for k in range(4)]


def _spec() -> ClusterSpec:
    members = tuple(
        MemberSpec(
            i,
            "127.0.0.1",
            10 + i,
            20 + i,
            30 + i,
            40 + i,
            bytes(32),
            bytes(RECEIPT_KEYS[i].verify_key),
        )
        for i in range(4)
    )
    return ClusterSpec(Path("."), CHAIN, bytes(32), members)


def certify(
    result: BlockResult,
    index: int = 0,
    signers: tuple[int, ...] = (0, 1),
    edit: Callable[[ReceiptLeaf], ReceiptLeaf] = lambda leaf: leaf,
    validity: Validity | None = None,
) -> Certificate:
    """What f+1 sidecars would sign for this block (`edit`: what they put in the leaves;
    `validity`: the window they sign, on a chain whose receipts expire)."""
    leaves = [edit(leaf_from_verdict(result.height, i, v)) for i, v in enumerate(result.verdicts)]
    hashes = [leaf.hash(CHAIN) for leaf in leaves]
    root, path = merkle_root(hashes), tuple(merkle_path(hashes, index))
    receipts = [
        Receipt(
            leaves[index],
            path,
            sign_block(
                RECEIPT_KEYS[s],
                s,
                CHAIN,
                result.height,
                root,
                result.state_root,
                len(leaves),
                validity,
            ),
        )
        for s in signers
    ]
    return assemble_certificate(CHAIN, receipts)


@dataclasses.dataclass
class Setup:
    world: World
    vault: PrivateKey
    third: PrivateKey
    handle: str
    victim_handle: str


@pytest.fixture
def setup() -> Setup:
    world = World()
    vault = world.add_sink("vault")
    third = world.add_sink("third")
    world.add_tool("vault.store", sink="vault", envelope_args=(EnvelopeArg("secret", "card"),))
    world.add_tool(
        "vault.pay",
        mode=ToolMode.USER_CONFIRM,
        sink="vault",
        envelope_args=(EnvelopeArg("secret", "card"),),
    )
    world.add_tool("web.post")
    world.add_agent("alice", ["vault.store", "vault.pay"])
    world.add_agent("mallory", ["vault.store", "vault.pay"])
    handle = world.seal(world.keys["alice"], "card", b"alice-card", ["vault"]).subject
    victim = world.seal(world.keys["alice"], "card", b"alice-other", ["vault"]).subject
    return Setup(world, vault, third, handle, victim)


def _call(
    s: Setup, agent: str, tool: str, handle: str, nonce: int | None = None
) -> tuple[bytes, BlockResult]:
    payload = Proposal(
        run_id="run-1", tool=tool, target=URL, arguments=(Argument("secret", handle=handle),)
    )
    data = s.world.tx(s.world.keys[agent], payload, nonce)
    return data, s.world.block([data])


def _executor(
    s: Setup,
    sink: str = "vault",
    key: PrivateKey | None = None,
    used: UsedProposals | Path | None = None,
) -> Executor:
    """An executor with its own record of used certificates (a fresh one unless given)."""
    store = used if used is not None else MemoryUsedProposals()
    return Executor(_spec(), sink, key or s.vault, EngineSource(s.world.engine), used=store)


def test_an_allowed_call_opens_its_own_envelope(setup: Setup) -> None:
    data, result = _call(setup, "alice", "vault.store", setup.handle)
    verdict = result.verdicts[0]
    assert verdict.outcome.value == "allow"
    executor = _executor(setup)
    cert = certify(result)
    call = executor.verify(
        encode_certificate(cert),
        proposal_id=verdict.tx_id,
        tool="vault.store",
        target=URL,
        transaction=data,
    )
    assert call.handles == (("secret", setup.handle),) and call.bound_by == "leaf"
    assert executor.open_envelope(call, "secret") == b"alice-card"
    assert executor.open_all(call) == {"secret": b"alice-card"}
    assert "alice-card" not in repr(call) and not call.flagged
    # not in this call, though sealed to this sink and owned by the same principal
    with pytest.raises(HandleRefused) as err:
        executor.open_handle(call, setup.victim_handle)
    assert err.value.reason == "not_in_call"
    # the wrong key, or a sink the handle was not sealed to
    with pytest.raises(EnvelopeUnopenable):
        _executor(setup, key=PrivateKey.generate()).open_envelope(call, "secret")
    with pytest.raises(HandleRefused) as err:
        _executor(setup, "third", setup.third).open_envelope(call, "secret")
    assert err.value.reason == "not_sealed_to_sink"
    # without the transaction an executor knows of no envelope at all (another executor:
    # this one has used the certificate)
    fresh = _executor(setup)
    bare = fresh.verify(cert, proposal_id=verdict.tx_id, tool="vault.store", target=URL)
    assert bare.handles == () and bare.bound_by == "none"
    with pytest.raises(HandleRefused):
        fresh.open_envelope(bare, "secret")


def test_anything_but_an_allow_for_this_call_is_refused(setup: Setup) -> None:
    executor = _executor(setup)
    # mallory names alice's handle: the engine denies it, and so the executor refuses
    _, result = _call(setup, "mallory", "vault.store", setup.handle)
    verdict = result.verdicts[0]
    assert (verdict.outcome.value, verdict.reason.value) == ("deny", "handle_violation")
    with pytest.raises(NotAllowed) as denied:
        executor.verify(certify(result), proposal_id=verdict.tx_id, tool="vault.store", target=URL)
    assert denied.value.reason == "deny"
    # pending is not allowed either
    _, pending = _call(setup, "alice", "vault.pay", setup.handle)
    with pytest.raises(NotAllowed) as waiting:
        executor.verify(
            certify(pending), proposal_id=pending.verdicts[0].tx_id, tool="vault.pay", target=URL
        )
    assert waiting.value.reason == "pending"

    _, result = _call(setup, "alice", "vault.store", setup.handle)
    pid = result.verdicts[0].tx_id
    cert = certify(result)
    other_id = b"\x01" * 32
    cases = [
        (
            dict(proposal_id=other_id, tool="vault.store", target=URL),
            CertificateRejected,
            "wrong_proposal",
        ),
        (
            dict(proposal_id=pid, tool="vault.store", target=URL + "/o"),
            WrongCall,
            "target_mismatch",
        ),
        (dict(proposal_id=pid, tool="web.post", target=URL), WrongCall, "target_mismatch"),
    ]
    for kwargs, kind, reason in cases:
        with pytest.raises(kind) as err:
            executor.verify(cert, **kwargs)  # type: ignore[arg-type]
        assert err.value.reason == reason
    for bad, reason in [
        (dataclasses.replace(cert, signatures=cert.signatures[:1]), "too_few_receipts"),
        (dataclasses.replace(cert, signatures=(cert.signatures[0], (7, b"x" * 64))), "non_member"),
        (dataclasses.replace(cert, chain_id="qg-other"), "wrong_chain"),
        (dataclasses.replace(cert, state_root=b"\x00" * 32), "bad_signature"),
    ]:
        with pytest.raises(CertificateRejected) as err:
            executor.verify(bad, proposal_id=pid, tool="vault.store", target=URL)
        assert err.value.reason == reason
    with pytest.raises(CertificateRejected) as err:
        executor.verify(
            b"\xff\xff not a certificate", proposal_id=pid, tool="vault.store", target=URL
        )
    # a transaction that is not the certified one
    other, _ = _call(setup, "alice", "vault.store", setup.handle)
    with pytest.raises(WrongCall) as err:
        executor.verify(cert, proposal_id=pid, tool="vault.store", target=URL, transaction=other)
    assert err.value.reason == "transaction_mismatch"
    # none of these refusals used the certificate up: it still runs its own call, once
    call = executor.verify(cert, proposal_id=pid, tool="vault.store", target=URL)
    assert call.proposal_id == pid


def test_a_forked_body_is_refused_because_the_leaf_binds_the_body(setup: Setup) -> None:
    """Alice signs a second body with the nonce of an allowed call, naming another handle.
    The receipt leaf carries the digest of the body that was committed and judged, so the
    forked body does not match the certificate."""
    _, result = _call(setup, "alice", "vault.store", setup.handle)
    nonce = setup.world.nonces[bytes(setup.world.keys["alice"].verify_key)]
    forked = setup.world.tx(
        setup.world.keys["alice"],
        Proposal(
            run_id="run-1",
            tool="vault.store",
            target=URL,
            arguments=(Argument("secret", handle=setup.victim_handle),),
        ),
        nonce,
    )
    pid = result.verdicts[0].tx_id
    executor = _executor(setup)
    with pytest.raises(WrongCall) as err:
        executor.verify(
            certify(result), proposal_id=pid, tool="vault.store", target=URL, transaction=forked
        )
    assert err.value.reason == "transaction_mismatch"


def test_a_confirmed_call_is_bound_by_its_card(setup: Setup) -> None:
    world = setup.world
    data, pending = _call(setup, "alice", "vault.pay", setup.handle)
    verdict = pending.verdicts[0]
    card = verdict.card
    assert card is not None
    # the owner confirms: it may answer any card, whichever authority version the engine runs
    confirm = world.block([world.tx(world.owner, Confirm(verdict.tx_id, card.digest))])
    assert (confirm.verdicts[0].outcome.value, confirm.verdicts[0].kind.value) == (
        "allow",
        "confirm",
    )
    cert = certify(confirm)
    executor = _executor(setup)
    call = executor.verify(
        cert,
        proposal_id=verdict.tx_id,
        tool="vault.pay",
        target=URL,
        transaction=data,
        card=card.to_bytes(),
    )
    assert call.bound_by == "card" and executor.open_envelope(call, "secret") == b"alice-card"
    # the card alone names the envelopes (another executor: this one has used the certificate)
    other_executor = _executor(setup)
    card_only = other_executor.verify(
        cert, proposal_id=verdict.tx_id, tool="vault.pay", target=URL, card=card
    )
    assert card_only.bound_by == "card" and card_only.handles == (("secret", setup.handle),)
    assert other_executor.open_envelope(card_only, "secret") == b"alice-card"
    # the certificate names a card: without it, nothing binds the arguments
    for transaction in (data, None):
        with pytest.raises(WrongCall) as err:
            _executor(setup).verify(
                cert,
                proposal_id=verdict.tx_id,
                tool="vault.pay",
                target=URL,
                transaction=transaction,
            )
        assert err.value.reason == "card_required"
    # a forked body with the same nonce does not match the card's body digest
    nonce = world.nonces[bytes(world.keys["alice"].verify_key)] - 1
    forked = world.tx(
        world.keys["alice"],
        Proposal(
            run_id="run-1",
            tool="vault.pay",
            target=URL,
            arguments=(Argument("secret", handle=setup.victim_handle),),
        ),
        nonce,
    )
    with pytest.raises(WrongCall) as err:
        executor.verify(
            cert,
            proposal_id=verdict.tx_id,
            tool="vault.pay",
            target=URL,
            transaction=forked,
            card=card,
        )
    assert err.value.reason == "transaction_mismatch"
    # a card that is not the certified one
    other: ConfirmationCard = dataclasses.replace(card, canonical_target="vault.pay https://x/")
    with pytest.raises(WrongCall) as err:
        executor.verify(cert, proposal_id=verdict.tx_id, tool="vault.pay", target=URL, card=other)
    assert err.value.reason == "card_mismatch"
    # and a card offered for a verdict that names none
    _, direct = _call(setup, "alice", "vault.store", setup.handle)
    with pytest.raises(WrongCall) as err:
        executor.verify(
            certify(direct),
            proposal_id=direct.verdicts[0].tx_id,
            tool="vault.store",
            target=URL,
            card=card,
        )
    assert err.value.reason == "card_not_certified"


def test_a_tampered_ciphertext_does_not_open(setup: Setup) -> None:
    world = setup.world
    garbage = SealedBox(PrivateKey.generate().public_key).encrypt(b"not for the vault")
    sealed = world.one(world.keys["alice"], SealEnvelope("card", (SealedValue("vault", garbage),)))
    data, result = _call(setup, "alice", "vault.store", sealed.subject)
    executor = _executor(setup)
    call = executor.verify(
        certify(result),
        proposal_id=result.verdicts[0].tx_id,
        tool="vault.store",
        target=URL,
        transaction=data,
    )
    with pytest.raises(EnvelopeUnopenable) as err:
        executor.open_envelope(call, "secret")
    assert "not for the vault" not in str(err.value)


# ------------------------------------------------------------------ confirmed calls, targets


def _confirmed(s: Setup, agent: str, handle: str) -> tuple[bytes, BlockResult, ConfirmationCard]:
    """`agent` proposes `vault.pay` with its own `handle` and the owner confirms the card:
    the signed proposal, the Confirm's block and the card."""
    world = s.world
    data, pending = _call(s, agent, "vault.pay", handle)
    verdict = pending.verdicts[0]
    assert verdict.outcome.value == "pending" and verdict.card is not None
    confirm = world.block([world.tx(world.owner, Confirm(verdict.tx_id, verdict.card.digest))])
    leaf = certify(confirm).leaf
    assert (leaf.kind, leaf.outcome, leaf.proposal_id) == ("confirm", "allow", verdict.tx_id)
    assert leaf.tx_id != verdict.tx_id and leaf.card_digest == verdict.card.digest
    return data, confirm, verdict.card


def _fork(s: Setup, agent: str, tool: str, handle: str, nonce: int) -> bytes:
    """A second body `agent` signs under `nonce`, naming `handle`."""
    payload = Proposal(
        run_id="run-1", tool=tool, target=URL, arguments=(Argument("secret", handle=handle),)
    )
    return s.world.tx(s.world.keys[agent], payload, nonce)


def test_a_confirmed_certificate_does_not_open_another_principals_envelope(setup: Setup) -> None:
    """Mallory proposes a payment with her own card and it is confirmed; then she signs a second
    body under the same nonce naming Alice's card (sealed to the same sink) and presents the
    confirmed certificate with that body and no card. The confirm leaf binds the card, not a
    body, so without the card nothing binds the arguments: refused, Alice's card never opened."""
    world = setup.world
    own = world.seal(world.keys["mallory"], "card", b"mallory-card", ["vault"]).subject
    nonce = world.nonces[bytes(world.keys["mallory"].verify_key)] + 1
    data, confirm, card = _confirmed(setup, "mallory", own)
    pid, cert = card.proposal_id, certify(confirm)
    forked = _fork(setup, "mallory", "vault.pay", setup.handle, nonce)
    assert forked != data
    opened: list[bytes] = []

    def attempt(transaction: bytes, card: ConfirmationCard | None = None) -> None:
        executor = _executor(setup)
        call = executor.verify(
            cert, proposal_id=pid, tool="vault.pay", target=URL, transaction=transaction, card=card
        )
        opened.extend(executor.open_all(call).values())

    with pytest.raises(WrongCall) as err:
        attempt(transaction=forked)
    assert err.value.reason == "card_required"
    assert "alice" not in str(err.value) and setup.handle not in str(err.value)
    # with her card, the forked body is not the one the card binds
    with pytest.raises(WrongCall) as err:
        attempt(transaction=forked, card=card)
    assert err.value.reason == "transaction_mismatch"
    # Alice's own confirmed certificate does not take Mallory's body either
    _, alice_confirm, alice_card = _confirmed(setup, "alice", setup.victim_handle)
    for offered, reason in ((None, "card_required"), (alice_card, "transaction_mismatch")):
        with pytest.raises(WrongCall) as err:
            _executor(setup).verify(
                certify(alice_confirm),
                proposal_id=alice_card.proposal_id,
                tool="vault.pay",
                target=URL,
                transaction=forked,
                card=offered,
            )
        assert err.value.reason == reason
    assert opened == []
    # the honest call still runs, and opens Mallory's own card only
    attempt(transaction=data, card=card)
    assert opened == [b"mallory-card"]


def test_a_body_neither_the_card_nor_the_leaf_binds_is_refused(setup: Setup) -> None:
    """Sidecars that put no body digest (or no card digest) in the leaf: a transaction is
    then bound by nothing, and the executor takes no handles from it."""
    world = setup.world
    data, result = _call(setup, "alice", "vault.store", setup.handle)
    pid = result.verdicts[0].tx_id
    unbound = certify(result, edit=lambda leaf: dataclasses.replace(leaf, body_digest=b""))
    with pytest.raises(WrongCall) as err:
        _executor(setup).verify(
            unbound, proposal_id=pid, tool="vault.store", target=URL, transaction=data
        )
    assert err.value.reason == "arguments_not_bound"
    # a confirm leaf that names no card: the Confirm's id is not the proposal's, so its body
    # digest does not bind the proposal's body either
    own = world.seal(world.keys["mallory"], "card", b"mallory-card", ["vault"]).subject
    nonce = world.nonces[bytes(world.keys["mallory"].verify_key)] + 1
    _, confirm, card = _confirmed(setup, "mallory", own)
    cardless = certify(confirm, edit=lambda leaf: dataclasses.replace(leaf, card_digest=b""))
    forked = _fork(setup, "mallory", "vault.pay", setup.handle, nonce)
    with pytest.raises(WrongCall) as err:
        _executor(setup).verify(
            cardless, proposal_id=card.proposal_id, tool="vault.pay", target=URL, transaction=forked
        )
    assert err.value.reason == "arguments_not_bound"
    # without a transaction such a call verifies, but carries no envelope
    call = _executor(setup).verify(unbound, proposal_id=pid, tool="vault.store", target=URL)
    assert call.handles == () and call.bound_by == "none"


def test_a_certificate_is_used_once_per_executor(setup: Setup) -> None:
    data, result = _call(setup, "alice", "vault.store", setup.handle)
    pid = result.verdicts[0].tx_id
    executor = _executor(setup)
    call = executor.verify(
        certify(result), proposal_id=pid, tool="vault.store", target=URL, transaction=data
    )
    assert executor.open_envelope(call, "secret") == b"alice-card"
    # the same certificate, or another certificate for the same proposal (other signers,
    # with or without the transaction): the call has run
    for cert, transaction in ((certify(result), data), (certify(result, signers=(2, 3)), None)):
        with pytest.raises(CertificateReused) as err:
            executor.verify(
                cert, proposal_id=pid, tool="vault.store", target=URL, transaction=transaction
            )
        assert err.value.reason == "already_used" and isinstance(err.value, ExecutorRefused)
        assert str(err.value) == "executor refused: already_used"
    # a confirmed call too: once
    _, confirm, card = _confirmed(setup, "alice", setup.victim_handle)
    confirmed = executor.verify(
        certify(confirm), proposal_id=card.proposal_id, tool="vault.pay", target=URL, card=card
    )
    assert confirmed.bound_by == "card"
    with pytest.raises(CertificateReused):
        executor.verify(
            certify(confirm), proposal_id=card.proposal_id, tool="vault.pay", target=URL, card=card
        )


def test_used_certificates_survive_a_restart(setup: Setup, tmp_path: Path) -> None:
    data, result = _call(setup, "alice", "vault.store", setup.handle)
    pid, cert = result.verdicts[0].tx_id, certify(result)
    path = tmp_path / "state" / "used.db"  # the parent is created too
    executor = _executor(setup, used=path)
    executor.verify(cert, proposal_id=pid, tool="vault.store", target=URL, transaction=data)
    executor.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for extra in (path.with_name("used.db-wal"), path.with_name("used.db-shm")):
        if extra.exists():
            assert stat.S_IMODE(extra.stat().st_mode) & 0o077 == 0
    # a new process, the same file: the certificate stays used
    with SqliteUsedProposals(path) as store:
        restarted = _executor(setup, used=store)
        with pytest.raises(CertificateReused):
            restarted.verify(cert, proposal_id=pid, tool="vault.store", target=URL)
        # another proposal is still fresh
        _, other = _call(setup, "alice", "vault.store", setup.handle)
        restarted.verify(
            certify(other), proposal_id=other.verdicts[0].tx_id, tool="vault.store", target=URL
        )
    # a closed store refuses to vouch for anything
    _, late = _call(setup, "alice", "vault.store", setup.handle)
    with pytest.raises(ExecutorRefused) as err:
        restarted.verify(
            certify(late), proposal_id=late.verdicts[0].tx_id, tool="vault.store", target=URL
        )
    assert err.value.reason == "used_store_unavailable"


def test_each_executor_may_run_a_certificate_once(setup: Setup, tmp_path: Path) -> None:
    """Single use is per executor (per record of used certificates): two sinks, each with
    its own store, each accept the certificate once; an executor sharing a store does not."""
    data, result = _call(setup, "alice", "vault.store", setup.handle)
    pid, cert = result.verdicts[0].tx_id, certify(result)
    vault_db, third_db = tmp_path / "vault.db", tmp_path / "third.db"
    calls: list[AuthorizedCall] = []
    for sink, key, db in (("vault", setup.vault, vault_db), ("third", setup.third, third_db)):
        with _executor(setup, sink, key, used=db) as executor:
            calls.append(
                executor.verify(
                    cert, proposal_id=pid, tool="vault.store", target=URL, transaction=data
                )
            )
            with pytest.raises(CertificateReused):
                executor.verify(cert, proposal_id=pid, tool="vault.store", target=URL)
    assert [c.handles for c in calls] == [(("secret", setup.handle),)] * 2
    with _executor(setup, used=vault_db) as again, pytest.raises(CertificateReused):
        again.verify(cert, proposal_id=pid, tool="vault.store", target=URL)


def test_a_claim_is_atomic_across_connections(tmp_path: Path) -> None:
    path = tmp_path / "used.db"
    stores = [SqliteUsedProposals(path) for _ in range(8)]
    memory = MemoryUsedProposals()
    pid = b"\x07" * 32
    wins: list[bool] = []
    memory_wins: list[bool] = []
    barrier = threading.Barrier(len(stores))

    def claim(store: SqliteUsedProposals) -> None:
        barrier.wait()
        wins.append(store.claim(pid))
        memory_wins.append(memory.claim(pid))

    threads = [threading.Thread(target=claim, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.close()
    assert sorted(wins) == [False] * 7 + [True]
    assert sorted(memory_wins) == [False] * 7 + [True]


def test_the_executor_checks_a_target_in_any_spelling_with_the_sdks_helper(setup: Setup) -> None:
    """The executor canonicalizes the target it acts on with the helper
    governed tools use (`quorumgate.sdk.targets.certified_target`) and hands back the
    canonical form; another resource, however spelled, is refused."""
    _, result = _call(setup, "alice", "vault.store", setup.handle)
    verdict = result.verdicts[0]
    cert = certify(result)
    call = _executor(setup).verify(
        cert, proposal_id=verdict.tx_id, tool="VAULT.Store", target="HTTPS://Example.COM:443/./x"
    )
    assert call.target == URL
    for other in ("https://example.com/y", "https://example.com/x/", "https://evil.example/x"):
        with pytest.raises(WrongCall) as wrong:
            _executor(setup).verify(
                cert, proposal_id=verdict.tx_id, tool="vault.store", target=other
            )
        assert wrong.value.reason == "target_mismatch"


def test_the_executor_checks_every_further_target(setup: Setup) -> None:
    """A call with several targets (a message to three recipients) is
    certified for exactly those; the executor acting on another recipient list, a missing
    or an added recipient, is refused; the canonical forms come back in the order given."""
    w = setup.world
    w.add_tool(
        "vault.mail",
        sink="vault",
        schemes=("mailto",),
        envelope_args=(EnvelopeArg("secret", "card"),),
        target_roles=(TargetSlot("recipient", ("mailto",), max=4),),
    )
    w.set_mandate("alice", ["vault.mail"])
    payload = Proposal(
        run_id="run-1",
        tool="vault.mail",
        target="mailto:ann@example.com",
        arguments=(Argument("secret", handle=setup.handle),),
        targets=(
            RoleTarget("recipient", "mailto:bo@Example.COM"),
            RoleTarget("recipient", "mailto:cy@example.com"),
        ),
    )
    result = w.block([w.tx(w.keys["alice"], payload)])
    verdict = result.verdicts[0]
    assert verdict.outcome is Outcome.ALLOW, verdict.reason
    cert = certify(result)
    spec = dataclasses.replace(_spec(), canonical_version=3)

    def executor() -> Executor:
        source = EngineSource(w.engine)
        return Executor(spec, "vault", setup.vault, source, used=MemoryUsedProposals())

    mail = "mailto:ann@example.com"
    call = executor().verify(
        cert,
        proposal_id=verdict.tx_id,
        tool="vault.mail",
        target=mail,
        targets=[("recipient", "mailto:cy@example.com"), ("recipient", "mailto:bo@EXAMPLE.com")],
    )
    assert call.targets == (
        ("recipient", "mailto:cy@example.com"),
        ("recipient", "mailto:bo@example.com"),
    )
    for wrong in (
        [],  # the recipients left out
        [("recipient", "mailto:bo@example.com")],  # one missing
        [
            ("recipient", "mailto:bo@example.com"),
            ("recipient", "mailto:cy@example.com"),
            ("recipient", "mailto:eve@evil.example"),  # one added
        ],
        [("recipient", "mailto:bo@example.com"), ("recipient", "mailto:eve@evil.example")],
        [("grantee", "mailto:bo@example.com"), ("recipient", "mailto:cy@example.com")],
    ):
        with pytest.raises(WrongCall) as refused:
            executor().verify(
                cert, proposal_id=verdict.tx_id, tool="vault.mail", target=mail, targets=wrong
            )
        assert refused.value.reason == "target_mismatch"


# ------------------------------------------------------------------ validity windows

EXPIRING = 2  # the receipt version `init` writes: certificates carry a signed window


def _windowed(w: World, result: BlockResult) -> Certificate:
    """The certificate f+1 sidecars of a chain whose receipts expire sign: the block's time
    and the TTL in effect after it, from the engine (sidecar/execution.py does the same)."""
    ttl_ms = w.engine.certificate_ttl_ms()
    assert ttl_ms is not None
    window = Validity(result.block_time_ms, result.block_time_ms + ttl_ms)
    return certify(result, validity=window)


def _windowed_executor(
    s: Setup, now_ms: int, used: UsedProposals | None = None, **options: int
) -> Executor:
    spec = dataclasses.replace(_spec(), receipt_version=EXPIRING)
    return Executor(
        spec,
        "vault",
        s.vault,
        EngineSource(s.world.engine),
        used=used if used is not None else MemoryUsedProposals(),
        clock_ms=lambda: now_ms,
        **options,  # type: ignore[arg-type]
    )


def test_a_lost_used_store_reopens_only_the_validity_window(setup: Setup) -> None:
    """The attack: an executor runs a call once, then loses its record of used certificates
    (a wiped disk, a new host) and is shown the same certificate again. Without a window
    it ran it again, however old the certificate (one from a block executed at 1970's block
    time was accepted by an executor whose clock said 2026). Now, past the window the f+1
    sidecars signed, the certificate is refused whatever the record holds; within it, a
    lost record still lets it run again: that window is the bound the docs state."""
    _, result = _call(setup, "alice", "vault.store", setup.handle)
    verdict = result.verdicts[0]
    cert = _windowed(setup.world, result)
    assert cert.validity is not None
    block_ms, until_ms = cert.validity.block_time_ms, cert.validity.valid_until_ms
    assert until_ms - block_ms == 300_000  # minutes by default
    ask = {"proposal_id": verdict.tx_id, "tool": "vault.store", "target": URL}
    first = _windowed_executor(setup, block_ms + 1_000)
    first.verify(cert, **ask)  # type: ignore[arg-type]
    with pytest.raises(CertificateReused):
        first.verify(cert, **ask)  # type: ignore[arg-type]
    skew = first.clock_skew_ms
    # the record lost, within the window: it runs again (the bounded window)
    _windowed_executor(setup, until_ms + skew).verify(cert, **ask)  # type: ignore[arg-type]
    for now_ms in (until_ms + skew + 1, block_ms + 86_400_000):
        with pytest.raises(CertificateExpired) as refused:
            _windowed_executor(setup, now_ms).verify(cert, **ask)  # type: ignore[arg-type]
        assert refused.value.reason == "expired"
    with pytest.raises(CertificateExpired) as early:  # a clock far behind the block time
        _windowed_executor(setup, block_ms - skew - 1).verify(cert, **ask)  # type: ignore[arg-type]
    assert early.value.reason == "not_yet_valid"


def test_an_expired_certificate_is_refused_before_it_is_used_up(setup: Setup) -> None:
    """The window is checked before the claim: a refused certificate takes no record."""
    _, result = _call(setup, "alice", "vault.store", setup.handle)
    cert = _windowed(setup.world, result)
    assert cert.validity is not None
    used = MemoryUsedProposals()
    late = _windowed_executor(setup, cert.validity.valid_until_ms + 86_400_000, used=used)
    ask = {"proposal_id": result.verdicts[0].tx_id, "tool": "vault.store", "target": URL}
    with pytest.raises(CertificateExpired):
        late.verify(cert, **ask)  # type: ignore[arg-type]
    assert used.claim(result.verdicts[0].tx_id)  # still unclaimed


def test_an_executor_shortens_the_window_for_itself(setup: Setup) -> None:
    _, result = _call(setup, "alice", "vault.store", setup.handle)
    cert = _windowed(setup.world, result)
    assert cert.validity is not None
    ask = {"proposal_id": result.verdicts[0].tx_id, "tool": "vault.store", "target": URL}
    two_minutes = cert.validity.block_time_ms + 120_000
    strict = _windowed_executor(
        setup, two_minutes, certificate_age_ms_max=60_000, clock_skew_ms=1_000
    )
    with pytest.raises(CertificateExpired):
        strict.verify(cert, **ask)  # type: ignore[arg-type]
    _windowed_executor(setup, two_minutes, clock_skew_ms=1_000).verify(cert, **ask)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="receipt version 2"):
        Executor(
            _spec(), "vault", setup.vault, EngineSource(setup.world.engine),
            used=MemoryUsedProposals(), certificate_age_ms_max=60_000,
        )  # fmt: skip


def test_a_window_stripped_or_stretched_or_where_none_belongs_is_refused(setup: Setup) -> None:
    """Dropping the window to pass as a certificate of a chain whose receipts never expire,
    or moving its end, breaks the f+1 signatures; a windowed certificate shown to an
    executor of a chain from before is refused too (its sidecars never sign one)."""
    _, result = _call(setup, "alice", "vault.store", setup.handle)
    cert = _windowed(setup.world, result)
    assert cert.validity is not None
    ask = {"proposal_id": result.verdicts[0].tx_id, "tool": "vault.store", "target": URL}
    now = cert.validity.block_time_ms + 1_000
    stretched = Validity(cert.validity.block_time_ms, cert.validity.valid_until_ms * 2)
    for forged, reason in (
        (dataclasses.replace(cert, validity=None), "no_validity"),
        (dataclasses.replace(cert, validity=stretched), "bad_signature"),
    ):
        with pytest.raises(CertificateRejected) as refused:
            _windowed_executor(setup, now).verify(forged, **ask)  # type: ignore[arg-type]
        assert refused.value.reason == reason
    with pytest.raises(CertificateRejected) as old_chain:
        _executor(setup).verify(cert, **ask)  # type: ignore[arg-type]
    assert old_chain.value.reason == "unexpected_validity"
