"""Protobuf <-> domain for receipts and certificates (sidecar/receipts.py), and the
registry a sidecar serves."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from quorumgate.proto import codec, tx_pb2
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.model import SetEntries
from quorumgate.sidecar.engine.state import EngineState
from quorumgate.sidecar.receipts import (
    Certificate,
    CertificateError,
    Receipt,
    ReceiptLeaf,
    SignedBlock,
    Validity,
)


def leaf_to_pb(leaf: ReceiptLeaf, out: spb.ReceiptLeaf) -> None:
    out.height = leaf.height
    out.index = leaf.index
    out.tx_id = leaf.tx_id
    out.proposal_id = leaf.proposal_id
    out.kind = leaf.kind
    out.outcome = leaf.outcome
    out.reason = leaf.reason
    out.target_digest = leaf.target_digest
    out.card_digest = leaf.card_digest
    out.mandate_version = leaf.mandate_version
    out.body_digest = leaf.body_digest


def leaf_from_pb(msg: spb.ReceiptLeaf) -> ReceiptLeaf:
    return ReceiptLeaf(
        height=msg.height,
        index=msg.index,
        tx_id=msg.tx_id,
        proposal_id=msg.proposal_id,
        kind=msg.kind,
        outcome=msg.outcome,
        reason=msg.reason,
        target_digest=msg.target_digest,
        card_digest=msg.card_digest,
        mandate_version=msg.mandate_version,
        body_digest=msg.body_digest,
    )


def _validity_to_pb(validity: Validity | None, out: spb.Validity) -> None:
    if validity is not None:
        out.block_time_ms = validity.block_time_ms
        out.valid_until_ms = validity.valid_until_ms


def _validity_from_pb(msg: spb.Receipt | spb.Certificate) -> Validity | None:
    """The window, or None when the message has none (presence, not zero, decides);
    `CertificateError` for one that ends before it starts."""
    if not msg.HasField("validity"):
        return None
    return Validity(msg.validity.block_time_ms, msg.validity.valid_until_ms)


def receipt_to_pb(receipt: Receipt) -> spb.Receipt:
    out = spb.Receipt(
        path=list(receipt.path),
        leaf_count=receipt.block.leaf_count,
        verdict_root=receipt.block.verdict_root,
        state_root=receipt.block.state_root,
        signer=receipt.block.signer,
        signature=receipt.block.signature,
        epoch=receipt.block.epoch,
    )
    leaf_to_pb(receipt.leaf, out.leaf)
    if receipt.block.validity is not None:
        _validity_to_pb(receipt.block.validity, out.validity)
    return out


def receipt_from_pb(msg: spb.Receipt) -> Receipt:
    """A receipt off the wire; `CertificateError` for a validity window that cannot be."""
    leaf = leaf_from_pb(msg.leaf)
    block = SignedBlock(
        leaf.height,
        msg.verdict_root,
        msg.state_root,
        msg.leaf_count,
        msg.signer,
        msg.signature,
        _validity_from_pb(msg),
        msg.epoch,
    )
    return Receipt(leaf, tuple(msg.path), block)


def certificate_to_pb(cert: Certificate) -> spb.Certificate:
    out = spb.Certificate(
        path=list(cert.path),
        leaf_count=cert.leaf_count,
        verdict_root=cert.verdict_root,
        state_root=cert.state_root,
        chain_id=cert.chain_id,
        epoch=cert.epoch,
    )
    leaf_to_pb(cert.leaf, out.leaf)
    for signer, signature in cert.signatures:
        out.signatures.add(signer=signer, signature=signature)
    if cert.validity is not None:
        _validity_to_pb(cert.validity, out.validity)
    return out


def certificate_from_pb(msg: spb.Certificate) -> Certificate:
    return Certificate(
        chain_id=msg.chain_id,
        leaf=leaf_from_pb(msg.leaf),
        path=tuple(msg.path),
        leaf_count=msg.leaf_count,
        verdict_root=msg.verdict_root,
        state_root=msg.state_root,
        signatures=tuple((s.signer, s.signature) for s in msg.signatures),
        validity=_validity_from_pb(msg),
        epoch=msg.epoch,
    )


def encode_certificate(cert: Certificate) -> bytes:
    return bytes(certificate_to_pb(cert).SerializeToString())


def decode_certificate(data: bytes) -> Certificate:
    msg = spb.Certificate()
    try:
        msg.ParseFromString(data)
    except DecodeError as err:
        raise CertificateError("malformed", "undecodable certificate") from err
    return certificate_from_pb(msg)


@dataclass(frozen=True, slots=True)
class RegistryScope:
    """Whom a registry read answers, and so what of the registry it holds
    (docs/security/reads-and-certificates.md): the owner, members and auditors everything
    (`REGISTRY_ALL`); an agent its own entry; a principal itself, the agents that act for
    it and their named sets. Both of the latter also get the tool specs and the sinks'
    public keys, what calling a tool needs (a tool's rules, mode and sink; a key to seal
    an envelope to), and neither gets the settings made in the log."""

    agent: str = ""
    principal: str = ""

    def __post_init__(self) -> None:
        assert not (self.agent and self.principal), "a scope is one agent or one principal"

    @property
    def label(self) -> str:
        """What `RegistryReply.scope` says: "all", "agent:<id>" or "principal:<id>"."""
        if self.agent:
            return f"agent:{self.agent}"
        return f"principal:{self.principal}" if self.principal else "all"


REGISTRY_ALL = RegistryScope()


def registry_scope(state: EngineState, key: bytes, role: bool) -> RegistryScope | None:
    """The scope of a registry read signed by `key` (`role`: the owner's, a member's or an
    auditor's), or None: a key the registry does not know is told nothing of it."""
    if role:
        return REGISTRY_ALL
    agent = state.agent_by_key.get(key)
    if agent is not None:
        return RegistryScope(agent=agent)
    principal = state.principal_by_key.get(key)
    return None if principal is None else RegistryScope(principal=principal)


def registry_content(
    state: EngineState, scope: RegistryScope = REGISTRY_ALL
) -> spb.RegistryContent:
    """The registry part of an engine state as `scope` may read it, each list sorted by id
    (a pure function of the state and the scope: honest sidecars at one height build the
    same bytes for one caller)."""
    everything = scope == REGISTRY_ALL
    if everything:
        agent_ids = sorted(state.agents)
    elif scope.agent:
        agent_ids = [scope.agent] if scope.agent in state.agents else []
    else:
        agent_ids = sorted(a for a, p in state.agent_principal.items() if p == scope.principal)
    content = spb.RegistryContent()
    for agent_id in agent_ids:
        record = state.agents[agent_id]
        agent = content.agents.add(
            agent_id=agent_id,
            public_key=record.public_key,
            mandate_version=record.mandate_version,
            suspended=record.suspended,
        )
        if record.mandate is not None:
            agent.mandate.CopyFrom(codec.encode_mandate(agent_id, record.mandate))
        agent.principal = state.agent_principal.get(agent_id, "")
    for name in sorted(state.tools):
        content.tools.append(codec.encode_tool_spec(state.tools[name]))
    for sink_id in sorted(state.sinks):
        content.sinks.append(tx_pb2.RegisterSink(sink_id=sink_id, public_key=state.sinks[sink_id]))
    principal_ids = sorted(state.principals) if everything else [scope.principal]
    for principal_id in (p for p in principal_ids if p in state.principals):
        person = state.principals[principal_id]
        content.principals.append(
            tx_pb2.RegisterPrincipal(
                principal_id=principal_id,
                public_key=person.public_key,
                deputies=list(person.deputies),
            )
        )
    set_owners = None if everything else set(agent_ids) if scope.principal else set()
    for owner, set_name in sorted(state.sets):
        if set_owners is not None and owner not in set_owners:
            continue
        content.sets.append(
            codec.encode_set_entries(SetEntries(owner, set_name, state.sets[(owner, set_name)]))
        )
    for setting in sorted(state.settings) if everything else ():
        content.settings.append(tx_pb2.Setting(name=setting, value=state.settings[setting]))
    return content
