"""Tools that declare their arguments: identity is decided by
declaration, not by a list of names, and registration refuses what BRAH's static gates
refuse: a confirm-gated tool that does not state its tier, and a `direct` tool that takes
a recipient, an amount or a credential without an explicit, recorded override."""

from __future__ import annotations

from quorumgate.proto.model import (
    Admin,
    ArgRole,
    ArgSpec,
    Argument,
    EnvelopeArg,
    Outcome,
    Reason,
    RegisterTool,
    ToolMode,
    ToolSpec,
)
from quorumgate.sidecar.engine.core import Engine
from tests.engine.harness import World


def _register(world: World, spec: ToolSpec) -> tuple[Outcome, Reason]:
    verdict = world.one(world.owner, Admin(op=RegisterTool(spec=spec)))
    return verdict.outcome, verdict.reason


def _args(**roles: ArgRole) -> tuple[ArgSpec, ...]:
    return tuple(ArgSpec(name, role) for name, role in sorted(roles.items()))


def test_a_confirm_gated_tool_must_state_its_tier() -> None:
    world = World()
    for mode in (ToolMode.USER_CONFIRM, ToolMode.OWNER_CONFIRM):
        unstated = ToolSpec("pay.send", mode, target_schemes=("https",), min_tier_declared=False)
        assert _register(world, unstated) == (Outcome.REJECTED, Reason.TIER_UNDECLARED)
        stated = ToolSpec("pay.send", mode, target_schemes=("https",))
        assert _register(world, stated) == (Outcome.APPLIED, Reason.OK)
    # read and direct tools need not
    quiet = ToolSpec("kb.search", ToolMode.READ, min_tier_declared=False)
    assert _register(world, quiet) == (Outcome.APPLIED, Reason.OK)


def test_a_direct_tool_with_a_recipient_amount_or_credential_needs_a_recorded_override() -> None:
    world = World()
    for role in (ArgRole.RECIPIENT, ArgRole.AMOUNT, ArgRole.CREDENTIAL):
        spec = ToolSpec("wire.send", ToolMode.DIRECT, arguments=_args(x=role))
        assert _register(world, spec) == (Outcome.REJECTED, Reason.DIRECT_NEEDS_OVERRIDE), role
    gated = ToolSpec("wire.send", ToolMode.USER_CONFIRM, arguments=_args(to=ArgRole.RECIPIENT))
    assert _register(world, gated) == (Outcome.APPLIED, Reason.OK)
    text_only = ToolSpec("notes.add", ToolMode.DIRECT, arguments=_args(body=ArgRole.TEXT))
    assert _register(world, text_only) == (Outcome.APPLIED, Reason.OK)
    override = ToolSpec(
        "wire.send", ToolMode.DIRECT, arguments=_args(to=ArgRole.RECIPIENT), direct_override=True
    )
    # applied, and the verdict (so the ledger) says it ran past the gate on purpose
    assert _register(world, override) == (Outcome.APPLIED, Reason.DIRECT_OVERRIDE)


def test_declarations_are_refused_on_chains_of_authority_version_1() -> None:
    world = World(overrides={"authority_version": 1})
    declared = ToolSpec("notes.add", ToolMode.DIRECT, arguments=_args(body=ArgRole.TEXT))
    assert _register(world, declared) == (Outcome.REJECTED, Reason.INVALID_SPEC)
    unstated = ToolSpec("pay.send", ToolMode.USER_CONFIRM, min_tier_declared=False)
    assert _register(world, unstated) == (Outcome.APPLIED, Reason.OK)  # version 1 rules


def _mail_world() -> World:
    world = World()
    world.add_sink("mail")
    spec = ToolSpec(
        "mail.send",
        ToolMode.USER_CONFIRM,
        sink="mail",
        target_schemes=("mailto",),
        envelope_args=(EnvelopeArg("api_key", "token"),),
        arguments=_args(
            to=ArgRole.RECIPIENT,
            cc=ArgRole.RECIPIENT,
            subject=ArgRole.TEXT,
            acting_as=ArgRole.IDENTITY,
            password=ArgRole.CREDENTIAL,
        ),
    )
    world.admin(RegisterTool(spec=spec))
    world.add_agent("mailer", ["mail.send"])
    return world


def test_a_declared_tool_judges_arguments_by_declaration_not_by_name() -> None:
    """The attack: `recipient`, `to`, `cc`... were refused as ambient identity while
    `on_behalf_of`, `agent_id`, `impersonate`, `acting_as`, `tenant_id` passed. A tool that
    declares its arguments takes exactly those, and never an identity."""
    world = _mail_world()

    def call(*args: Argument) -> Reason:
        target = "mailto:bob@example.com"
        return world.propose("mailer", "mail.send", target, args=args).reason

    text = Argument
    ok = call(text("to", text="ann@example.com"), text("cc", text="cy@example.com"))
    assert ok is Reason.CONFIRMATION_REQUIRED  # recipients by declaration: allowed
    for name in ("on_behalf_of", "agent_id", "impersonate", "tenant_id", "recipient"):
        assert call(text(name, text="x")) is Reason.UNDECLARED_ARGUMENT, name
    assert call(text("acting_as", text="alice")) is Reason.AMBIENT_IDENTITY_ARGUMENT
    assert call(text("password", text="hunter2")) is Reason.ENVELOPE_REQUIRED
    assert call(text("api_key", text="k")) is Reason.ENVELOPE_REQUIRED
    assert call(text("subject", text="4111 1111 1111 1111")) is Reason.SECRET_IN_PLAINTEXT


def test_an_undeclared_tool_keeps_the_name_rules() -> None:
    world = World()
    world.add_tool("tickets.open", schemes=("https",))
    world.add_agent("a", ["tickets.open"])
    refused = world.propose("a", "tickets.open", args=[Argument("user_id", text="7")])
    assert refused.reason is Reason.AMBIENT_IDENTITY_ARGUMENT


def test_declarations_survive_the_state_bytes() -> None:
    world = _mail_world()
    copy = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    assert copy.state.tools == world.engine.state.tools
    assert copy.state_bytes() == world.engine.state_bytes()
    unstated = ToolSpec("pay.send", ToolMode.DIRECT, min_tier_declared=False)
    world.admin(RegisterTool(spec=unstated))
    again = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    assert again.state.tools["pay.send"].min_tier_declared is False
