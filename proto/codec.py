"""The one module that converts protobuf messages to domain types and back.

Protobuf objects never leave this module: everything else in the engine sees
`quorumgate.proto.model` values, so generated code reaches no rule and one decoder decides
what a body means. Decoding is strict, because two honest sidecars must read one transaction
the same way:

- a body must be the canonical protobuf encoding of what it decodes to (no unknown
  fields, no reordering, no duplicate fields), so one meaning has one byte string;
- enumerations in strings must be known, except two that default to the stricter value:
  `delegation_policy` other than `attenuated` is `none`, and `enforcement` other than
  `observe` is `enforce` (fail closed; docs/engine.md, "Tools, mandates and verdicts");
- anything a domain type refuses is a `CodecError`, which the engine reports as a
  `malformed` rejection. Error messages never quote a field value.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from quorumgate.proto import names, tx_pb2
from quorumgate.proto.model import (
    Admin,
    AdminOp,
    ArgCheck,
    ArgRole,
    ArgSpec,
    Argument,
    ArgumentRule,
    Confirm,
    Delegate,
    DelegationPolicy,
    Enforcement,
    EnvelopeArg,
    KeyHolder,
    Mandate,
    Proposal,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    Resume,
    Revoke,
    RoleTarget,
    RotateKey,
    RuleKind,
    SealedValue,
    SealEnvelope,
    SetEntries,
    SetMandate,
    SetRunTargets,
    SetSettings,
    SignedTx,
    Suspend,
    TargetRule,
    TargetSlot,
    Tier,
    ToolMode,
    ToolRules,
    ToolSpec,
    TxBody,
    TxKind,
    TxPayload,
    canonical_tool_list,
)

_ONEOF_KIND = {
    "proposal": TxKind.PROPOSAL,
    "confirm": TxKind.CONFIRM,
    "delegate": TxKind.DELEGATE,
    "revoke": TxKind.REVOKE,
    "seal_envelope": TxKind.SEAL_ENVELOPE,
    "admin": TxKind.ADMIN,
}


class CodecError(ValueError):
    """A transaction that cannot become a domain value. Carries what was learnt so far."""

    def __init__(self, message: str, *, nonce: int = 0, kind: TxKind = TxKind.MALFORMED):
        super().__init__(message)
        self.nonce = nonce
        self.kind = kind


def _parse(message: Any, data: bytes, what: str) -> None:
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise CodecError(f"{what}: not a protobuf message") from exc


def _is_canonical(message: Any, data: bytes) -> bool:
    """True when `data` is exactly the encoding of what it decoded to."""
    message.DiscardUnknownFields()
    return bytes(message.SerializeToString(deterministic=True)) == data


# ----------------------------------------------------------------------------- SignedTx


def encode_signed(tx: SignedTx) -> bytes:
    msg = tx_pb2.SignedTx(body=tx.body, signer=tx.signer, signature=tx.signature)
    return bytes(msg.SerializeToString())


def decode_signed(data: bytes) -> SignedTx:
    msg = tx_pb2.SignedTx()
    _parse(msg, data, "SignedTx")
    if not _is_canonical(msg, data):
        raise CodecError("SignedTx: not the canonical encoding (unknown or reordered fields)")
    try:
        return SignedTx(body=msg.body, signer=msg.signer, signature=msg.signature)
    except ValueError as exc:
        raise CodecError(f"SignedTx: {exc}") from exc


# ----------------------------------------------------------------------------- TxBody


def decode_body(data: bytes) -> TxBody:
    msg = tx_pb2.TxBody()
    _parse(msg, data, "TxBody")
    nonce = int(msg.nonce)
    case = msg.WhichOneof("kind")
    kind = TxKind.MALFORMED if case is None else _ONEOF_KIND[case]
    if not _is_canonical(msg, data):
        raise CodecError("TxBody: not the canonical encoding", nonce=nonce, kind=kind)
    if case is None:
        raise CodecError("TxBody: no transaction kind", nonce=nonce)
    try:
        payload = _decode_payload(case, getattr(msg, case))
        return TxBody(chain_id=msg.chain_id, nonce=nonce, payload=payload)
    except ValueError as exc:
        raise CodecError(f"{kind}: {exc}", nonce=nonce, kind=kind) from exc


def encode_body(body: TxBody) -> bytes:
    msg = tx_pb2.TxBody(chain_id=body.chain_id, nonce=body.nonce)
    payload = body.payload
    if isinstance(payload, Proposal):
        msg.proposal.CopyFrom(_encode_proposal(payload))
    elif isinstance(payload, Confirm):
        msg.confirm.CopyFrom(
            tx_pb2.Confirm(
                proposal_id=payload.proposal_id,
                card_digest=payload.card_digest,
                reject=payload.reject,
            )
        )
    elif isinstance(payload, Delegate):
        msg.delegate.CopyFrom(_encode_delegate(payload))
    elif isinstance(payload, Revoke):
        msg.revoke.CopyFrom(tx_pb2.Revoke(grant=payload.grant))
    elif isinstance(payload, SealEnvelope):
        msg.seal_envelope.CopyFrom(_encode_seal(payload))
    else:
        msg.admin.CopyFrom(_encode_admin(payload))
    return bytes(msg.SerializeToString(deterministic=True))


def _decode_payload(case: str, pb: Any) -> TxPayload:
    if case == "proposal":
        return _decode_proposal(pb)
    if case == "confirm":
        return Confirm(proposal_id=pb.proposal_id, card_digest=pb.card_digest, reject=pb.reject)
    if case == "delegate":
        return _decode_delegate(pb)
    if case == "revoke":
        return Revoke(grant=pb.grant)
    if case == "seal_envelope":
        return _decode_seal(pb)
    assert case == "admin", case
    return Admin(op=_decode_admin(pb))


def _optional_bytes(value: bytes) -> bytes | None:
    return value if value else None


def _optional_text(value: str) -> str | None:
    return value if value else None


def _decode_proposal(pb: Any) -> Proposal:
    arguments: list[Argument] = []
    for arg in pb.arguments:
        case = arg.WhichOneof("value")
        if case == "text":
            arguments.append(Argument(name=arg.name, text=arg.text))
        elif case == "handle":
            arguments.append(Argument(name=arg.name, handle=arg.handle))
        else:
            raise ValueError("argument without a value")
    return Proposal(
        run_id=pb.run_id,
        tool=pb.tool,
        target=pb.target,
        arguments=tuple(arguments),
        grant=_optional_bytes(pb.grant),
        targets=tuple(RoleTarget(role=t.role, target=t.target) for t in pb.targets),
        definition=_optional_bytes(pb.definition),
        commit_salt=_optional_bytes(pb.commit_salt),
        seal_to=tuple(pb.seal_to),
    )


def _encode_proposal(p: Proposal) -> Any:
    msg = tx_pb2.CallProposal(
        run_id=p.run_id,
        tool=p.tool,
        target=p.target,
        grant=p.grant or b"",
        definition=p.definition or b"",
        commit_salt=p.commit_salt or b"",
        seal_to=list(p.seal_to),
    )
    for extra in p.targets:
        msg.targets.add(role=extra.role, target=extra.target)
    for arg in p.arguments:
        if arg.handle is not None:
            msg.arguments.add(name=arg.name, handle=arg.handle)
        else:
            msg.arguments.add(name=arg.name, text=arg.text)
    return msg


def _decode_tool_list(pb: Any, field: str) -> tuple[str, ...] | None:
    if not pb.HasField(field):
        return None  # absent: null, unrestricted (never "no tools")
    return canonical_tool_list(list(getattr(pb, field).tools))


def _decode_target_rule(pb: Any) -> TargetRule:
    try:
        kind = RuleKind(pb.kind)
    except ValueError:
        raise ValueError("target rule kind: any, exact, prefix, host, host_suffix or set") from None
    try:
        mode = ToolMode(pb.mode) if pb.mode else None
        exposed = ToolMode(pb.when_exposed) if pb.when_exposed else None
    except ValueError:
        raise ValueError("rule mode must be read, direct, user_confirm or owner_confirm") from None
    return TargetRule(kind=kind, value=pb.value, mode=mode, role=pb.role, when_exposed=exposed)


def _encode_target_rule(rule: TargetRule) -> Any:
    return tx_pb2.TargetRule(
        kind=rule.kind.value,
        value=rule.value,
        mode="" if rule.mode is None else rule.mode.value,
        role=rule.role,
        when_exposed="" if rule.when_exposed is None else rule.when_exposed.value,
    )


def _decode_argument_rule(pb: Any) -> ArgumentRule:
    name = names.canonical_argument_name(pb.name)
    if name is None:
        raise ValueError("argument rule: name has no canonical form")
    try:
        check = ArgCheck(pb.check)
    except ValueError:
        raise ValueError("argument rule check: max, one_of or max_chars") from None
    return ArgumentRule(
        name=name,
        check=check,
        number=pb.number,
        values=tuple(sorted(set(pb.values))),
        count=int(pb.count),
    )


def _encode_argument_rule(rule: ArgumentRule) -> Any:
    return tx_pb2.ArgumentRule(
        name=rule.name,
        check=rule.check.value,
        number=rule.number,
        values=list(rule.values),
        count=rule.count,
    )


def _decode_rules(items: Any) -> tuple[ToolRules, ...]:
    out: dict[str, ToolRules] = {}
    for item in items:
        tool = names.canonical_tool_name(item.tool)
        if tool is None or tool in out:
            raise ValueError("rules: tool names must be valid and listed once")
        arguments = sorted((_decode_argument_rule(a) for a in item.arguments), key=lambda r: r.name)
        out[tool] = ToolRules(
            tool=tool,
            targets=tuple(_decode_target_rule(t) for t in item.targets),
            arguments=tuple(arguments),
        )
    return tuple(out[tool] for tool in sorted(out))


def _encode_rules(rules: tuple[ToolRules, ...]) -> list[Any]:
    return [
        tx_pb2.ToolRules(
            tool=entry.tool,
            targets=[_encode_target_rule(t) for t in entry.targets],
            arguments=[_encode_argument_rule(a) for a in entry.arguments],
        )
        for entry in rules
    ]


def encode_set_entries(op: SetEntries) -> Any:
    return tx_pb2.SetEntries(
        principal=op.principal, name=op.name, entries=[_encode_target_rule(e) for e in op.entries]
    )


def decode_set_entries(pb: Any) -> SetEntries:
    return _decode_set_entries(pb)


def _decode_set_entries(pb: Any) -> SetEntries:
    entries = {(rule.kind.value, rule.value): rule for rule in map(_decode_target_rule, pb.entries)}
    return SetEntries(
        principal=pb.principal,
        name=pb.name,
        entries=tuple(entries[key] for key in sorted(entries)),
    )


def _decode_delegate(pb: Any) -> Delegate:
    return Delegate(
        child=pb.child,
        run_id=pb.run_id,
        tools=_decode_tool_list(pb, "tools"),
        expires_at_ms=int(pb.expires_at_ms),
        parent_grant=_optional_bytes(pb.parent_grant),
        rules=_decode_rules(pb.rules),
    )


def _encode_delegate(d: Delegate) -> Any:
    msg = tx_pb2.Delegate(
        child=d.child,
        run_id=d.run_id,
        expires_at_ms=d.expires_at_ms,
        parent_grant=d.parent_grant or b"",
    )
    if d.tools is not None:
        msg.tools.CopyFrom(tx_pb2.ToolList(tools=list(d.tools)))
    msg.rules.extend(_encode_rules(d.rules))
    return msg


def _decode_seal(pb: Any) -> SealEnvelope:
    sealed = tuple(SealedValue(sink=item.sink, ciphertext=item.ciphertext) for item in pb.sealed)
    return SealEnvelope(
        kind=pb.kind,
        sealed=sealed,
        owner_principal=_optional_text(pb.owner_principal),
    )


def _encode_seal(s: SealEnvelope) -> Any:
    msg = tx_pb2.SealEnvelope(kind=s.kind, owner_principal=s.owner_principal or "")
    for item in s.sealed:
        msg.sealed.add(sink=item.sink, ciphertext=item.ciphertext)
    return msg


def decode_tool_spec(pb: Any) -> ToolSpec:
    name = names.canonical_tool_name(pb.name)
    if name is None:
        raise ValueError("tool name has no canonical form")
    try:
        mode = ToolMode(pb.mode)
    except ValueError:
        raise ValueError("mode must be read, direct, user_confirm or owner_confirm") from None
    raw_tier = pb.min_tier or Tier.DELEGATE.value
    if raw_tier not in (Tier.DELEGATE.value, Tier.MASTER.value):
        raise ValueError("min_tier must be delegate or master")
    envelope_args: dict[str, EnvelopeArg] = {}
    for item in pb.envelope_args:
        arg_name = names.canonical_argument_name(item.name)
        if arg_name is None or arg_name in envelope_args:
            raise ValueError("envelope argument names must be valid and unique")
        envelope_args[arg_name] = EnvelopeArg(
            name=arg_name, kind=item.kind, require_verified=item.require_verified
        )
    schemes = [s.lower() for s in pb.target_schemes]
    if len(set(schemes)) != len(schemes):
        raise ValueError("target schemes must be unique")
    declared: dict[str, ArgSpec] = {}
    for item in pb.arguments:
        arg_name = names.canonical_argument_name(item.name)
        if arg_name is None or arg_name in declared:
            raise ValueError("declared argument names must be valid and unique")
        try:
            role = ArgRole(item.role)
        except ValueError:
            raise ValueError("argument role: identity|recipient|amount|credential|text") from None
        declared[arg_name] = ArgSpec(arg_name, role)
    slots: dict[str, TargetSlot] = {}
    for item in pb.target_roles:
        if item.role in slots:
            raise ValueError("target roles must be unique")
        slot_schemes = [s.lower() for s in item.schemes]
        if len(set(slot_schemes)) != len(slot_schemes):
            raise ValueError("a target role's schemes must be unique")
        slots[item.role] = TargetSlot(item.role, tuple(sorted(slot_schemes)), int(item.max))
    return ToolSpec(
        name=name,
        mode=mode,
        sink=_optional_text(pb.sink),
        target_schemes=tuple(sorted(schemes)),
        envelope_args=tuple(envelope_args[key] for key in sorted(envelope_args)),
        min_tier=Tier(raw_tier),
        binds_caller=bool(pb.binds_caller),
        arguments=tuple(declared[key] for key in sorted(declared)),
        direct_override=bool(pb.direct_override),
        min_tier_declared=bool(pb.min_tier),
        target_roles=tuple(slots[key] for key in sorted(slots)),
        target_optional=bool(pb.target_optional),
        definition_digest=_optional_bytes(pb.definition_digest),
        untrusted_results=bool(pb.untrusted_results),
    )


def encode_tool_spec(spec: ToolSpec) -> Any:
    return tx_pb2.RegisterTool(
        name=spec.name,
        mode=spec.mode.value,
        sink=spec.sink or "",
        target_schemes=list(spec.target_schemes),
        envelope_args=[
            tx_pb2.EnvelopeArg(name=a.name, kind=a.kind, require_verified=a.require_verified)
            for a in spec.envelope_args
        ],
        min_tier=spec.min_tier.value if spec.min_tier_declared else "",
        binds_caller=spec.binds_caller,
        arguments=[tx_pb2.ArgSpec(name=a.name, role=a.role.value) for a in spec.arguments],
        direct_override=spec.direct_override,
        target_roles=[
            tx_pb2.TargetSlot(role=t.role, schemes=list(t.schemes), max=t.max)
            for t in spec.target_roles
        ],
        target_optional=spec.target_optional,
        definition_digest=spec.definition_digest or b"",
        untrusted_results=spec.untrusted_results,
    )


def decode_mandate(pb: Any) -> Mandate:
    enforcement = (
        Enforcement.OBSERVE if pb.enforcement == Enforcement.OBSERVE.value else Enforcement.ENFORCE
    )
    policy = (
        DelegationPolicy.ATTENUATED
        if pb.delegation_policy == DelegationPolicy.ATTENUATED.value
        else DelegationPolicy.NONE
    )
    depth = int(pb.max_delegation_depth) if pb.HasField("max_delegation_depth") else None
    return Mandate(
        allowed_tools=_decode_tool_list(pb, "allowed_tools"),
        enforcement=enforcement,
        suspended=bool(pb.suspended),
        delegation_policy=policy,
        max_delegation_depth=depth,
        rules=_decode_rules(pb.rules),
    )


def encode_mandate(agent_id: str, m: Mandate) -> Any:
    msg = tx_pb2.SetMandate(
        agent_id=agent_id,
        enforcement=m.enforcement.value,
        suspended=m.suspended,
        delegation_policy=m.delegation_policy.value,
    )
    if m.allowed_tools is not None:
        msg.allowed_tools.CopyFrom(tx_pb2.ToolList(tools=list(m.allowed_tools)))
    if m.max_delegation_depth is not None:
        msg.max_delegation_depth = m.max_delegation_depth
    msg.rules.extend(_encode_rules(m.rules))
    return msg


def _decode_admin(pb: Any) -> AdminOp:
    case = pb.WhichOneof("op")
    if case is None:
        raise ValueError("admin without an operation")
    op = getattr(pb, case)
    if case == "register_tool":
        return RegisterTool(spec=decode_tool_spec(op))
    if case == "register_agent":
        return RegisterAgent(agent_id=op.agent_id, public_key=op.public_key, principal=op.principal)
    if case == "register_principal":
        return RegisterPrincipal(
            principal_id=op.principal_id,
            public_key=op.public_key,
            deputies=tuple(op.deputies),
        )
    if case == "register_sink":
        return RegisterSink(sink_id=op.sink_id, public_key=op.public_key)
    if case == "set_mandate":
        return SetMandate(agent_id=op.agent_id, mandate=decode_mandate(op))
    if case == "suspend":
        return Suspend(agent_id=op.agent_id)
    if case == "set_entries":
        return _decode_set_entries(op)
    if case == "set_settings":
        return SetSettings(
            values=tuple(sorted((s.name, int(s.value)) for s in op.values)),
            clear=tuple(sorted(op.clear)),
        )
    if case == "set_run_targets":
        return SetRunTargets(agent_id=op.agent_id, run_id=op.run_id, targets=tuple(op.targets))
    if case == "rotate_key":
        holders = {holder.value: holder for holder in KeyHolder}
        if op.holder not in holders:
            raise ValueError("rotate_key: unknown holder")
        return RotateKey(
            holder=holders[op.holder],
            subject_id=op.subject_id,
            new_public_key=op.new_public_key,
            proof=op.proof,
        )
    assert case == "resume", case
    return Resume(agent_id=op.agent_id)


def _encode_admin(admin: Admin) -> Any:
    msg = tx_pb2.Admin()
    op = admin.op
    if isinstance(op, RegisterTool):
        msg.register_tool.CopyFrom(encode_tool_spec(op.spec))
    elif isinstance(op, RegisterAgent):
        msg.register_agent.CopyFrom(
            tx_pb2.RegisterAgent(
                agent_id=op.agent_id, public_key=op.public_key, principal=op.principal
            )
        )
    elif isinstance(op, RegisterPrincipal):
        msg.register_principal.CopyFrom(
            tx_pb2.RegisterPrincipal(
                principal_id=op.principal_id,
                public_key=op.public_key,
                deputies=list(op.deputies),
            )
        )
    elif isinstance(op, RegisterSink):
        msg.register_sink.CopyFrom(
            tx_pb2.RegisterSink(sink_id=op.sink_id, public_key=op.public_key)
        )
    elif isinstance(op, SetMandate):
        msg.set_mandate.CopyFrom(encode_mandate(op.agent_id, op.mandate))
    elif isinstance(op, Suspend):
        msg.suspend.CopyFrom(tx_pb2.AgentRef(agent_id=op.agent_id))
    elif isinstance(op, SetEntries):
        msg.set_entries.CopyFrom(encode_set_entries(op))
    elif isinstance(op, SetSettings):
        msg.set_settings.CopyFrom(
            tx_pb2.SetSettings(
                values=[tx_pb2.Setting(name=name, value=value) for name, value in op.values],
                clear=list(op.clear),
            )
        )
    elif isinstance(op, SetRunTargets):
        msg.set_run_targets.CopyFrom(
            tx_pb2.SetRunTargets(agent_id=op.agent_id, run_id=op.run_id, targets=list(op.targets))
        )
    elif isinstance(op, RotateKey):
        msg.rotate_key.CopyFrom(
            tx_pb2.RotateKey(
                holder=op.holder.value,
                subject_id=op.subject_id,
                new_public_key=op.new_public_key,
                proof=op.proof,
            )
        )
    else:
        msg.resume.CopyFrom(tx_pb2.AgentRef(agent_id=op.agent_id))
    return msg
