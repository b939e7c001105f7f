"""The executor against the engine directly (no processes): certificates are built from the
engine's own verdicts and signed with test receipt keys, sealed values are read from the
engine (`Engine.sealed_value`). Every refusal is typed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import ClusterSpec, MemberSpec
from quorumgate.proto.model import (
    Argument,
    Confirm,
    EnvelopeArg,
    Proposal,
    SealedValue,
    SealEnvelope,
    ToolMode,
)
from quorumgate.sdk.executor import (
    CertificateRejected,
    EngineSource,
    EnvelopeUnopenable,
    Executor,
    HandleRefused,
    NotAllowed,
    WrongCall,
)
from quorumgate.sidecar.engine.statements import BlockResult, ConfirmationCard
from quorumgate.sidecar.receipts import (
    Certificate,
    Receipt,
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


def certify(result: BlockResult, index: int = 0, signers: tuple[int, ...] = (0, 1)) -> Certificate:
    """What f+1 honest sidecars would sign for this block."""
    leaves = [leaf_from_verdict(result.height, i, v) for i, v in enumerate(result.verdicts)]
    hashes = [leaf.hash(CHAIN) for leaf in leaves]
    root, path = merkle_root(hashes), tuple(merkle_path(hashes, index))
    receipts = [
        Receipt(
            leaves[index],
            path,
            sign_block(
                RECEIPT_KEYS[s], s, CHAIN, result.height, root, result.state_root, len(leaves)
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


def _executor(s: Setup, sink: str = "vault", key: PrivateKey | None = None, **kw: bool) -> Executor:
    return Executor(_spec(), sink, key or s.vault, EngineSource(s.world.engine), **kw)


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
    # without the transaction the executor knows of no envelope at all
    bare = executor.verify(cert, proposal_id=verdict.tx_id, tool="vault.store", target=URL)
    with pytest.raises(HandleRefused):
        executor.open_envelope(bare, "secret")


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


def test_a_forked_body_is_refused_because_the_leaf_binds_the_body(setup: Setup) -> None:
    """Alice signs a second body with the nonce of an allowed call, naming another handle.
    The receipt leaf carries the digest of the body that was committed and judged, so the
    forked body does not match the certificate, whatever the executor's settings."""
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
    for executor in (_executor(setup), _executor(setup, require_bound_arguments=True)):
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
    confirm = world.block([world.tx(world.keys["alice"], Confirm(verdict.tx_id, card.digest))])
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
    strict = _executor(setup, require_bound_arguments=True)
    strict_call = strict.verify(
        cert, proposal_id=verdict.tx_id, tool="vault.pay", target=URL, card=card
    )
    assert strict.open_envelope(strict_call, "secret") == b"alice-card"
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
