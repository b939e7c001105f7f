from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SignedTx(_message.Message):
    __slots__ = ("body", "signer", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signer: bytes
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., signer: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class TxBody(_message.Message):
    __slots__ = ("chain_id", "nonce", "proposal", "confirm", "delegate", "revoke", "seal_envelope", "admin")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    SEAL_ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    chain_id: str
    nonce: int
    proposal: CallProposal
    confirm: Confirm
    delegate: Delegate
    revoke: Revoke
    seal_envelope: SealEnvelope
    admin: Admin
    def __init__(self, chain_id: _Optional[str] = ..., nonce: _Optional[int] = ..., proposal: _Optional[_Union[CallProposal, _Mapping]] = ..., confirm: _Optional[_Union[Confirm, _Mapping]] = ..., delegate: _Optional[_Union[Delegate, _Mapping]] = ..., revoke: _Optional[_Union[Revoke, _Mapping]] = ..., seal_envelope: _Optional[_Union[SealEnvelope, _Mapping]] = ..., admin: _Optional[_Union[Admin, _Mapping]] = ...) -> None: ...

class Argument(_message.Message):
    __slots__ = ("name", "text", "handle")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    text: str
    handle: str
    def __init__(self, name: _Optional[str] = ..., text: _Optional[str] = ..., handle: _Optional[str] = ...) -> None: ...

class CallProposal(_message.Message):
    __slots__ = ("run_id", "tool", "target", "arguments", "grant", "targets", "definition", "commit_salt", "seal_to")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SALT_FIELD_NUMBER: _ClassVar[int]
    SEAL_TO_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tool: str
    target: str
    arguments: _containers.RepeatedCompositeFieldContainer[Argument]
    grant: bytes
    targets: _containers.RepeatedCompositeFieldContainer[RoleTarget]
    definition: bytes
    commit_salt: bytes
    seal_to: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, run_id: _Optional[str] = ..., tool: _Optional[str] = ..., target: _Optional[str] = ..., arguments: _Optional[_Iterable[_Union[Argument, _Mapping]]] = ..., grant: _Optional[bytes] = ..., targets: _Optional[_Iterable[_Union[RoleTarget, _Mapping]]] = ..., definition: _Optional[bytes] = ..., commit_salt: _Optional[bytes] = ..., seal_to: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RoleTarget(_message.Message):
    __slots__ = ("role", "target")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    role: str
    target: str
    def __init__(self, role: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class Confirm(_message.Message):
    __slots__ = ("proposal_id", "card_digest", "reject")
    PROPOSAL_ID_FIELD_NUMBER: _ClassVar[int]
    CARD_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    proposal_id: bytes
    card_digest: bytes
    reject: bool
    def __init__(self, proposal_id: _Optional[bytes] = ..., card_digest: _Optional[bytes] = ..., reject: _Optional[bool] = ...) -> None: ...

class ToolList(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tools: _Optional[_Iterable[str]] = ...) -> None: ...

class TargetRule(_message.Message):
    __slots__ = ("kind", "value", "mode", "role", "when_exposed")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WHEN_EXPOSED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    value: str
    mode: str
    role: str
    when_exposed: str
    def __init__(self, kind: _Optional[str] = ..., value: _Optional[str] = ..., mode: _Optional[str] = ..., role: _Optional[str] = ..., when_exposed: _Optional[str] = ...) -> None: ...

class ArgumentRule(_message.Message):
    __slots__ = ("name", "check", "number", "values", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    check: str
    number: str
    values: _containers.RepeatedScalarFieldContainer[str]
    count: int
    def __init__(self, name: _Optional[str] = ..., check: _Optional[str] = ..., number: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ..., count: _Optional[int] = ...) -> None: ...

class ToolRules(_message.Message):
    __slots__ = ("tool", "targets", "arguments")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    tool: str
    targets: _containers.RepeatedCompositeFieldContainer[TargetRule]
    arguments: _containers.RepeatedCompositeFieldContainer[ArgumentRule]
    def __init__(self, tool: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[TargetRule, _Mapping]]] = ..., arguments: _Optional[_Iterable[_Union[ArgumentRule, _Mapping]]] = ...) -> None: ...

class Delegate(_message.Message):
    __slots__ = ("child", "run_id", "tools", "expires_at_ms", "parent_grant", "rules")
    CHILD_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PARENT_GRANT_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    child: bytes
    run_id: str
    tools: ToolList
    expires_at_ms: int
    parent_grant: bytes
    rules: _containers.RepeatedCompositeFieldContainer[ToolRules]
    def __init__(self, child: _Optional[bytes] = ..., run_id: _Optional[str] = ..., tools: _Optional[_Union[ToolList, _Mapping]] = ..., expires_at_ms: _Optional[int] = ..., parent_grant: _Optional[bytes] = ..., rules: _Optional[_Iterable[_Union[ToolRules, _Mapping]]] = ...) -> None: ...

class Revoke(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: bytes
    def __init__(self, grant: _Optional[bytes] = ...) -> None: ...

class SealedValue(_message.Message):
    __slots__ = ("sink", "ciphertext")
    SINK_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    sink: str
    ciphertext: bytes
    def __init__(self, sink: _Optional[str] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class SealEnvelope(_message.Message):
    __slots__ = ("kind", "sealed", "owner_principal")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    OWNER_PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    sealed: _containers.RepeatedCompositeFieldContainer[SealedValue]
    owner_principal: str
    def __init__(self, kind: _Optional[str] = ..., sealed: _Optional[_Iterable[_Union[SealedValue, _Mapping]]] = ..., owner_principal: _Optional[str] = ...) -> None: ...

class EnvelopeArg(_message.Message):
    __slots__ = ("name", "kind", "require_verified")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    require_verified: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., require_verified: _Optional[bool] = ...) -> None: ...

class ArgSpec(_message.Message):
    __slots__ = ("name", "role")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class RegisterTool(_message.Message):
    __slots__ = ("name", "mode", "sink", "target_schemes", "envelope_args", "min_tier", "binds_caller", "arguments", "direct_override", "target_roles", "target_optional", "definition_digest", "untrusted_results")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SINK_FIELD_NUMBER: _ClassVar[int]
    TARGET_SCHEMES_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_ARGS_FIELD_NUMBER: _ClassVar[int]
    MIN_TIER_FIELD_NUMBER: _ClassVar[int]
    BINDS_CALLER_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    DIRECT_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ROLES_FIELD_NUMBER: _ClassVar[int]
    TARGET_OPTIONAL_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_DIGEST_FIELD_NUMBER: _ClassVar[int]
    UNTRUSTED_RESULTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    mode: str
    sink: str
    target_schemes: _containers.RepeatedScalarFieldContainer[str]
    envelope_args: _containers.RepeatedCompositeFieldContainer[EnvelopeArg]
    min_tier: str
    binds_caller: bool
    arguments: _containers.RepeatedCompositeFieldContainer[ArgSpec]
    direct_override: bool
    target_roles: _containers.RepeatedCompositeFieldContainer[TargetSlot]
    target_optional: bool
    definition_digest: bytes
    untrusted_results: bool
    def __init__(self, name: _Optional[str] = ..., mode: _Optional[str] = ..., sink: _Optional[str] = ..., target_schemes: _Optional[_Iterable[str]] = ..., envelope_args: _Optional[_Iterable[_Union[EnvelopeArg, _Mapping]]] = ..., min_tier: _Optional[str] = ..., binds_caller: _Optional[bool] = ..., arguments: _Optional[_Iterable[_Union[ArgSpec, _Mapping]]] = ..., direct_override: _Optional[bool] = ..., target_roles: _Optional[_Iterable[_Union[TargetSlot, _Mapping]]] = ..., target_optional: _Optional[bool] = ..., definition_digest: _Optional[bytes] = ..., untrusted_results: _Optional[bool] = ...) -> None: ...

class TargetSlot(_message.Message):
    __slots__ = ("role", "schemes", "max")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SCHEMES_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    role: str
    schemes: _containers.RepeatedScalarFieldContainer[str]
    max: int
    def __init__(self, role: _Optional[str] = ..., schemes: _Optional[_Iterable[str]] = ..., max: _Optional[int] = ...) -> None: ...

class RegisterAgent(_message.Message):
    __slots__ = ("agent_id", "public_key", "principal")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    public_key: bytes
    principal: str
    def __init__(self, agent_id: _Optional[str] = ..., public_key: _Optional[bytes] = ..., principal: _Optional[str] = ...) -> None: ...

class RegisterPrincipal(_message.Message):
    __slots__ = ("principal_id", "public_key", "deputies")
    PRINCIPAL_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    DEPUTIES_FIELD_NUMBER: _ClassVar[int]
    principal_id: str
    public_key: bytes
    deputies: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, principal_id: _Optional[str] = ..., public_key: _Optional[bytes] = ..., deputies: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterSink(_message.Message):
    __slots__ = ("sink_id", "public_key")
    SINK_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    sink_id: str
    public_key: bytes
    def __init__(self, sink_id: _Optional[str] = ..., public_key: _Optional[bytes] = ...) -> None: ...

class SetMandate(_message.Message):
    __slots__ = ("agent_id", "allowed_tools", "enforcement", "suspended", "delegation_policy", "max_delegation_depth", "rules")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    ENFORCEMENT_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    DELEGATION_POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_DELEGATION_DEPTH_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    allowed_tools: ToolList
    enforcement: str
    suspended: bool
    delegation_policy: str
    max_delegation_depth: int
    rules: _containers.RepeatedCompositeFieldContainer[ToolRules]
    def __init__(self, agent_id: _Optional[str] = ..., allowed_tools: _Optional[_Union[ToolList, _Mapping]] = ..., enforcement: _Optional[str] = ..., suspended: _Optional[bool] = ..., delegation_policy: _Optional[str] = ..., max_delegation_depth: _Optional[int] = ..., rules: _Optional[_Iterable[_Union[ToolRules, _Mapping]]] = ...) -> None: ...

class SetEntries(_message.Message):
    __slots__ = ("principal", "name", "entries")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    principal: str
    name: str
    entries: _containers.RepeatedCompositeFieldContainer[TargetRule]
    def __init__(self, principal: _Optional[str] = ..., name: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[TargetRule, _Mapping]]] = ...) -> None: ...

class AgentRef(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class Admin(_message.Message):
    __slots__ = ("register_tool", "register_agent", "register_sink", "set_mandate", "suspend", "resume", "set_entries", "register_principal", "set_settings", "set_run_targets", "rotate_key")
    REGISTER_TOOL_FIELD_NUMBER: _ClassVar[int]
    REGISTER_AGENT_FIELD_NUMBER: _ClassVar[int]
    REGISTER_SINK_FIELD_NUMBER: _ClassVar[int]
    SET_MANDATE_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    SET_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    REGISTER_PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    SET_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    SET_RUN_TARGETS_FIELD_NUMBER: _ClassVar[int]
    ROTATE_KEY_FIELD_NUMBER: _ClassVar[int]
    register_tool: RegisterTool
    register_agent: RegisterAgent
    register_sink: RegisterSink
    set_mandate: SetMandate
    suspend: AgentRef
    resume: AgentRef
    set_entries: SetEntries
    register_principal: RegisterPrincipal
    set_settings: SetSettings
    set_run_targets: SetRunTargets
    rotate_key: RotateKey
    def __init__(self, register_tool: _Optional[_Union[RegisterTool, _Mapping]] = ..., register_agent: _Optional[_Union[RegisterAgent, _Mapping]] = ..., register_sink: _Optional[_Union[RegisterSink, _Mapping]] = ..., set_mandate: _Optional[_Union[SetMandate, _Mapping]] = ..., suspend: _Optional[_Union[AgentRef, _Mapping]] = ..., resume: _Optional[_Union[AgentRef, _Mapping]] = ..., set_entries: _Optional[_Union[SetEntries, _Mapping]] = ..., register_principal: _Optional[_Union[RegisterPrincipal, _Mapping]] = ..., set_settings: _Optional[_Union[SetSettings, _Mapping]] = ..., set_run_targets: _Optional[_Union[SetRunTargets, _Mapping]] = ..., rotate_key: _Optional[_Union[RotateKey, _Mapping]] = ...) -> None: ...

class RotateKey(_message.Message):
    __slots__ = ("holder", "subject_id", "new_public_key", "proof")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    holder: str
    subject_id: str
    new_public_key: bytes
    proof: bytes
    def __init__(self, holder: _Optional[str] = ..., subject_id: _Optional[str] = ..., new_public_key: _Optional[bytes] = ..., proof: _Optional[bytes] = ...) -> None: ...

class SetRunTargets(_message.Message):
    __slots__ = ("agent_id", "run_id", "targets")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    run_id: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent_id: _Optional[str] = ..., run_id: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ...) -> None: ...

class Setting(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...

class SetSettings(_message.Message):
    __slots__ = ("values", "clear")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Setting]
    clear: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[_Union[Setting, _Mapping]]] = ..., clear: _Optional[_Iterable[str]] = ...) -> None: ...
