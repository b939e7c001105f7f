"""A call's arguments: names, ambient identity, declarations, envelopes and handles.

No argument may say who the caller is (the signed transaction does), a credential travels
only as an envelope handle, and a handle is usable only by its owner toward a sink it was
sealed to (the BRAH paper, eq. (5); docs/engine.md, "Tools, mandates and verdicts").
"""

from __future__ import annotations

from quorumgate.proto import names
from quorumgate.proto.chainversions import arguments_by_declaration, refuses_plaintext_secrets
from quorumgate.proto.model import ArgRole, Argument, EnvelopeArg, Reason, ToolSpec
from quorumgate.sidecar.engine.env import Env, Refusal
from quorumgate.sidecar.engine.secrets import name_is_credential, secret_shape

# An argument name with no canonical form is recorded as this; never a valid name.
INVALID_ARGUMENT_NAME = "!"


def argument_name(arg: Argument) -> str:
    """The argument's canonical name as verdicts and cards record it."""
    return names.canonical_argument_name(arg.name) or INVALID_ARGUMENT_NAME


def check_arguments(
    env: Env, principal: str, spec: ToolSpec, arguments: tuple[Argument, ...]
) -> None:
    """Refuse the first argument that is malformed, repeated, names an identity, carries
    a raw value where a handle is needed, or is a handle the caller may not use."""
    if spec.binds_caller and arguments:
        # a status tool answers for the caller alone, so an argument could only ask about
        # someone else: no existence oracle (the BRAH paper, §7.3)
        raise Refusal(Reason.STATUS_TOOL_ARGUMENT)
    seen: set[str] = set()
    by_declaration = arguments_by_declaration(env.config.authority_version) and bool(
        spec.arguments
    )
    for arg in arguments:
        name = names.canonical_argument_name(arg.name)
        if name is None or name in seen:
            raise Refusal(Reason.MALFORMED_ARGUMENT)
        seen.add(name)
        envelope = spec.envelope_arg(name)
        if by_declaration:
            _check_declared(env, principal, spec, name, envelope, arg)
            continue
        # Declared envelope carriers are exempt from the identity ban (the BRAH paper,
        # AST-01); a handle can only be the caller's own (the dereference rule below).
        if envelope is None and names.is_ambient_identity_name(name):
            raise Refusal(Reason.AMBIENT_IDENTITY_ARGUMENT)
        if arg.handle is None:
            screens = refuses_plaintext_secrets(env.config.canonical_version)
            if envelope is not None or names.is_raw_secret_name(name):
                raise Refusal(Reason.ENVELOPE_REQUIRED)
            if screens and name_is_credential(name):
                raise Refusal(Reason.ENVELOPE_REQUIRED)
            if screens and secret_shape(arg.text or ""):
                raise Refusal(Reason.SECRET_IN_PLAINTEXT)
            continue
        check_handle(env, principal, spec, envelope, arg.handle)


def _check_declared(
    env: Env,
    principal: str,
    spec: ToolSpec,
    name: str,
    envelope: EnvelopeArg | None,
    arg: Argument,
) -> None:
    """A tool that declares its arguments is judged by declaration, not by argument
    names: an undeclared argument is refused (so `on_behalf_of` cannot ride along); an
    identity is never sent (the tool takes the caller from the signed transaction); a
    credential only as a handle; values shaped like secrets are refused as everywhere."""
    declared = spec.declared_arg(name)
    if declared is None and envelope is None:
        raise Refusal(Reason.UNDECLARED_ARGUMENT)
    if declared is not None and declared.role is ArgRole.IDENTITY:
        raise Refusal(Reason.AMBIENT_IDENTITY_ARGUMENT)
    if arg.handle is None:
        if envelope is not None or (declared and declared.role is ArgRole.CREDENTIAL):
            raise Refusal(Reason.ENVELOPE_REQUIRED)
        if secret_shape(arg.text or ""):
            raise Refusal(Reason.SECRET_IN_PLAINTEXT)
    else:
        check_handle(env, principal, spec, envelope, arg.handle)


def check_handle(
    env: Env, principal: str, spec: ToolSpec, envelope: EnvelopeArg | None, handle: str
) -> None:
    """A handle is usable only by its owner, only toward a sink it was sealed to. An
    unknown handle and another principal's handle get the same answer, so a refusal says
    nothing about whether the handle exists."""
    record = env.state.handles.get(handle)
    if (
        record is None
        or record.owner != principal
        or spec.sink is None
        or spec.sink not in record.sinks
    ):
        raise Refusal(Reason.HANDLE_VIOLATION)
    if envelope is not None and (
        record.kind != envelope.kind or (envelope.require_verified and not record.verified)
    ):
        raise Refusal(Reason.HANDLE_KIND_MISMATCH)
