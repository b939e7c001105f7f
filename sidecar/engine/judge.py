"""A proposal's decision: its canonical call, then the judging order of docs/engine.md.

A proposal is judged in this order; the first step that refuses decides:

1. quota: over a quota -> `quota_exceeded`; the latch is not touched; then, on chains
   where `runs_opened_by_the_chain`, a run no transaction of the agent opened ->
   `run_not_opened`;
2. a halted run -> `run_halted`, whatever the tool;
3. unknown tool -> `unknown_tool`; a call made on another definition than the one the
   owner pinned -> `tool_definition_changed`; no mandate -> `no_mandate`;
4. suspension, the agent's or any delegator's -> `suspended`; never latched;
5. the delegation chain: unknown, mismatched, revoked, expired, refused by policy or too
   deep -> `delegation_*`;
6. the latch: a tool already refused in this run (or, with `latch_across_runs`, in enough
   runs) -> `repeat_denied`, and the attempt that reaches the threshold -> `run_halted`;
7. scope: outside the effective scope -> `out_of_scope` (latched) under enforce, or a
   `flag` under observe (any enforce up the chain enforces);
8. the canonical target and the target and argument rules of every layer (with
   `links_in_text`, the links inside text arguments too: a link no `link` rule matches
   makes the call `user_confirm`, docs/engine.md "Links inside text");
9. tier: a direct tool that requires `master` refuses a delegate;
10. the arguments: malformed, ambient identity, raw values where envelopes are required,
    handle violations;
11. mode: `user_confirm` / `owner_confirm` -> `pending` with a card; otherwise `allow`
    (or `flag`).
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumgate.proto import limits, names
from quorumgate.proto.chainversions import (
    links_in_text,
    probes_latch,
    refuses_plaintext_secrets,
    runs_opened_by_the_chain,
    targets_by_role,
)
from quorumgate.proto.model import (
    ArgRole,
    Outcome,
    Proposal,
    Reason,
    Tier,
    ToolMode,
    ToolSpec,
    TxKind,
)
from quorumgate.proto.runs import names_opened_run
from quorumgate.proto.tx import ParsedTx
from quorumgate.sidecar.engine import confirm, latch, provenance, quotas
from quorumgate.sidecar.engine.arguments import argument_name, check_arguments
from quorumgate.sidecar.engine.env import Caller, Env, Refusal
from quorumgate.sidecar.engine.links import LINK_SCHEMES, TooManyLinks, find_links
from quorumgate.sidecar.engine.scope import effective_scope, judge_rules, permits
from quorumgate.sidecar.engine.secrets import secret_in_target
from quorumgate.sidecar.engine.state import AgentRecord, LatchRun
from quorumgate.sidecar.engine.statements import ConfirmationCard, Verdict, target_digest
from quorumgate.sidecar.engine.targets import (
    NO_TARGET,
    UNCHECKED_TARGET,
    TargetRefused,
    canonical_call,
    canonicalize_target,
)
from quorumgate.sidecar.engine.trace import Trace

FurtherTargets = tuple[tuple[str, str], ...]  # (role, canonical target), sorted


@dataclass(frozen=True)
class Call:
    """A proposal's call in canonical form, as far as it has one: the canonical tool and
    its spec (None when not registered), the main target and the further targets (or
    UNCHECKED_TARGET and none when refused), and why the targets were refused."""

    tool: str | None
    spec: ToolSpec | None
    target: str
    further_targets: FurtherTargets
    target_refusal: Reason | None
    # The canonical links inside its text arguments, sorted, each once (chains with
    # `links_in_text`): judged in the `link` role, listed on its card; not part of the
    # canonical call, since the signed body the certificate binds already fixes them.
    links: tuple[str, ...] = ()

    @property
    def canonical(self) -> str:
        tool = self.tool if self.tool is not None else UNCHECKED_TARGET
        return canonical_call(tool, self.target, self.further_targets)


def propose(
    env: Env,
    parsed: ParsedTx,
    proposal: Proposal,
    record: AgentRecord,
    trace: Trace | None = None,
) -> Verdict:
    """The verdict on an agent's proposal; judging it may change the latch, the quotas
    and the pending calls. `trace`, when given, records what the judging consulted
    (sidecar/engine/trace.py); it never changes the verdict."""
    caller = caller_of(env, record, proposal)
    call = canonical_form(env, proposal, record.agent_id)
    canonical = call.canonical
    argument_names = tuple(argument_name(arg) for arg in proposal.arguments)

    def verdict(outcome: Outcome, reason: Reason, card: ConfirmationCard | None = None) -> Verdict:
        return Verdict(
            tx_id=parsed.tx_id,
            kind=TxKind.PROPOSAL,
            outcome=outcome,
            reason=reason,
            mandate_version=record.mandate_version,
            principal=record.agent_id,
            tier=caller.tier,
            delegate_of=caller.delegate_of,
            canonical_target=canonical,
            target_digest=target_digest(canonical),
            argument_names=argument_names,
            proposal_id=parsed.tx_id,
            card=card,
            card_digest=b"" if card is None else card.digest,
        )

    # on its own mandate an agent acts in a run one of its transactions opened (`n<k>`,
    # proto/runs.py), never in one it names
    run_opened = (
        not runs_opened_by_the_chain(env.config.authority_version)
        or proposal.grant is not None
        or names_opened_run(proposal.run_id, parsed.nonce)
    )
    try:
        flagged, mode = judge(env, caller, record, proposal, call, run_opened, trace)
        assert call.spec is not None and call.tool is not None
        if mode.needs_confirmation:
            card = confirm.hold(
                env, parsed, caller, proposal, call.spec, mode, canonical, flagged, call.links,
                provenance.exposure(env, caller.run_key),
            )  # fmt: skip
            return verdict(Outcome.PENDING, Reason.CONFIRMATION_REQUIRED, card)
    except Refusal as refusal:
        return verdict(Outcome.DENY, refusal.reason)
    # the call may run: if its results are untrusted, its run is exposed from here
    # (docs/provenance.md, "When a run becomes exposed")
    provenance.mark_exposed(env, caller.run_key, call.tool, parsed.tx_id)
    if flagged:
        return verdict(Outcome.FLAG, Reason.OUT_OF_SCOPE_OBSERVED)
    return verdict(Outcome.ALLOW, Reason.OK)


def caller_of(env: Env, record: AgentRecord, proposal: Proposal) -> Caller:
    """Who asks: from the signing agent and the grant chain in the log, never a field."""
    if proposal.grant is None:
        return Caller(record.agent_id, Tier.MASTER, "", record.agent_id, proposal.run_id)
    grant = env.state.grants.get(proposal.grant)
    if grant is None or grant.child != record.agent_id or grant.run_id != proposal.run_id:
        # an unusable grant: the call is refused below and touches only its own run,
        # never a run of someone else's namespace
        return Caller(record.agent_id, Tier.DELEGATE, "", record.agent_id, proposal.run_id)
    return Caller(record.agent_id, Tier.DELEGATE, grant.grantor, grant.run_owner, proposal.run_id)


def canonical_form(env: Env, proposal: Proposal, principal: str) -> Call:
    """The call's canonical tool and targets. A target that has no canonical form, or
    that carries a secret, is recorded as UNCHECKED_TARGET, so no verdict, artifact or
    card keeps it; the refusal waits for its step of the judging order."""
    tool = names.canonical_tool_name(proposal.tool)
    spec = env.state.tools.get(tool) if tool is not None else None
    if spec is None:
        return Call(tool, spec, UNCHECKED_TARGET, (), None)
    version = env.config.canonical_version
    try:
        target = canonicalize_target(
            proposal.target,
            principal=principal,
            schemes=spec.target_schemes,
            binds_caller=spec.binds_caller,
            version=version,
            optional=spec.target_optional,
        )
        further = further_targets(env, proposal, spec, principal)
        links = links_of(env, proposal, spec, principal)
    except TargetRefused as exc:
        return Call(tool, spec, UNCHECKED_TARGET, (), exc.reason)
    if refuses_plaintext_secrets(version) and any(
        secret_in_target(each) for each in (target, *(t for _, t in further))
    ):
        return Call(tool, spec, UNCHECKED_TARGET, (), Reason.SECRET_IN_PLAINTEXT)
    return Call(tool, spec, target, further, None, links)


def links_of(env: Env, proposal: Proposal, spec: ToolSpec, principal: str) -> tuple[str, ...]:
    """The canonical links inside the plain arguments `spec` declares as text, sorted and
    each once (sidecar/engine/links.py has the grammar). More than LINKS_PER_ARGUMENT_MAX
    in one argument or LINKS_PER_CALL_MAX in all is `too_many_links`; a link without a
    canonical form is refused like any target. Raises TargetRefused."""
    if not links_in_text(env.config.canonical_version):
        return ()
    found: list[str] = []
    for arg in proposal.arguments:
        declared = spec.declared_arg(names.canonical_argument_name(arg.name) or "")
        if arg.text is None or declared is None or declared.role is not ArgRole.TEXT:
            continue
        try:
            found += find_links(arg.text)
        except TooManyLinks:
            raise TargetRefused(Reason.TOO_MANY_LINKS, "too many links in one argument") from None
        if len(found) > limits.LINKS_PER_CALL_MAX:
            raise TargetRefused(Reason.TOO_MANY_LINKS, "too many links in one call")
    version = env.config.canonical_version
    canonical = {
        canonicalize_target(link, principal=principal, schemes=LINK_SCHEMES, version=version)
        for link in found
    }
    return tuple(sorted(canonical))


def further_targets(env: Env, proposal: Proposal, spec: ToolSpec, principal: str) -> FurtherTargets:
    """The canonical (role, target) pairs of a call's further targets, sorted: each in a
    role the tool declares, under that role's schemes, at most its `max`, none twice.
    Raises TargetRefused."""
    if not proposal.targets:
        return ()
    version = env.config.canonical_version
    if not targets_by_role(version):
        raise TargetRefused(Reason.MALFORMED_TARGET, "this chain takes one target per call")
    out: set[tuple[str, str]] = set()
    counts: dict[str, int] = {}
    for further in proposal.targets:
        slot = spec.slot(further.role)
        if slot is None:
            raise TargetRefused(Reason.TARGET_SCHEME_NOT_ALLOWED, "a role the tool lacks")
        counts[further.role] = counts.get(further.role, 0) + 1
        if counts[further.role] > slot.max:
            raise TargetRefused(Reason.MALFORMED_TARGET, "more targets than the role takes")
        canonical = canonicalize_target(
            further.target, principal=principal, schemes=slot.schemes, version=version
        )
        if canonical == NO_TARGET or (further.role, canonical) in out:
            raise TargetRefused(Reason.MALFORMED_TARGET, "an empty or repeated target")
        out.add((further.role, canonical))
    return tuple(sorted(out))


def judge(
    env: Env,
    caller: Caller,
    record: AgentRecord,
    proposal: Proposal,
    call: Call,
    run_opened: bool = True,
    trace: Trace | None = None,
) -> tuple[bool, ToolMode]:
    """Steps 1-10 of the module docstring. Returns whether the call is flagged, and the
    mode it runs in (the tool's, or the one its rules name); raises Refusal. `trace`,
    when given, records the scope, every rule layer's say and the mode."""
    run = _admit(env, caller, record, call.tool, run_opened)
    tool, spec = _registered(env, caller, record, proposal, call)
    mandate = record.mandate
    if mandate is None:
        raise Refusal(Reason.NO_MANDATE)
    if record.suspended:
        raise Refusal(Reason.SUSPENDED)
    scope, enforce, chain, layers = effective_scope(
        env, record, mandate, proposal.grant, caller.run_id
    )
    _refuse_latched(env, caller, record, tool, run, chain)
    flagged = False
    if trace is not None:
        trace.record_scope(scope, enforce, permits(scope, tool))
    if not permits(scope, tool):
        if enforce:
            latch.scope_denial(env, caller, record, tool, chain)
        flagged = True
    if call.target_refusal is not None:
        if probes_latch(env.config.canonical_version) and (
            call.target_refusal is Reason.CROSS_PRINCIPAL_TARGET
        ):
            latch.probe_denial(env, caller, record, tool, chain)
        raise Refusal(call.target_refusal)
    # the target and argument rules of every layer, on the canonical target, with the
    # run's provenance (docs/provenance.md)
    exposed = provenance.exposure(env, caller.run_key)
    own = provenance.run_targets(env, caller.run_key)
    if trace is not None:
        trace.record_provenance(exposed, own)
    permitted, mode = judge_rules(
        env,
        layers,
        spec,
        call.target,
        proposal.arguments,
        record.agent_id,
        call.further_targets,
        call.links,
        trace,
        exposed is not None,
        own,
    )
    if trace is not None:
        trace.record_modes(spec.mode, mode)
    if not permitted:
        if enforce:
            latch.scope_denial(env, caller, record, tool, chain)
        flagged = True
    # after the rules: a rule that runs a master-only tool directly does not let a
    # delegate through (its confirmation would have checked the tier)
    delegate = caller.tier is Tier.DELEGATE
    if spec.min_tier is Tier.MASTER and delegate and not mode.needs_confirmation:
        raise Refusal(Reason.TIER_INSUFFICIENT)
    try:
        check_arguments(env, record.agent_id, spec, proposal.arguments)
    except Refusal as refusal:
        if probes_latch(env.config.canonical_version) and (
            refusal.reason is Reason.HANDLE_VIOLATION
        ):
            latch.probe_denial(env, caller, record, tool, chain)
        raise
    return flagged, mode


def _admit(
    env: Env, caller: Caller, record: AgentRecord, tool: str | None, run_opened: bool
) -> LatchRun | None:
    """Steps 1-2: the quotas, the run, a halt. Returns the run's latch record, if any."""
    if not quotas.admits(env, record, tool, caller.run_key):
        raise Refusal(Reason.QUOTA_EXCEEDED)
    if not run_opened:
        raise Refusal(Reason.RUN_NOT_OPENED)  # not latched: there is no run to latch
    run = latch.touch(env, caller.run_key)
    if run is not None and run.halt_chain is not None:
        latch.note_halted(env, run, record.agent_id, tool)
        raise Refusal(Reason.RUN_HALTED)
    return run


def _registered(
    env: Env, caller: Caller, record: AgentRecord, proposal: Proposal, call: Call
) -> tuple[str, ToolSpec]:
    """Step 3's tool: registered, and called on the definition the owner pinned."""
    if call.spec is None or call.tool is None:
        if probes_latch(env.config.canonical_version):
            # an invented tool is a probe: recorded, and counted toward the latch
            latch.probe_denial(env, caller, record, call.tool or UNCHECKED_TARGET)
        raise Refusal(Reason.UNKNOWN_TOOL)
    digest = call.spec.definition_digest
    if digest is not None and proposal.definition != digest:
        # The tool changed under its name (a poisoned description arrives this way) or the
        # call does not say on what it was made. Not a scope decision, so not latched:
        # the owner pins the new definition, or the upstream puts the old one back.
        raise Refusal(Reason.TOOL_DEFINITION_CHANGED)
    return call.tool, call.spec


def _refuse_latched(
    env: Env,
    caller: Caller,
    record: AgentRecord,
    tool: str,
    run: LatchRun | None,
    chain: tuple[str, ...],
) -> None:
    """Step 6: a tool latched in this run, or across runs, is refused again (and counts
    toward the run's halt)."""
    bucket = None if run is None else run.buckets.get((record.agent_id, tool))
    if bucket is not None:
        if latch.repeat(env, caller.run_key, bucket, chain):
            raise Refusal(Reason.RUN_HALTED)
        raise Refusal(Reason.REPEAT_DENIED)
    if latch.latched_across_runs(env, record.agent_id, tool):
        # refused in enough runs: refused in this one too, which it counts toward
        if latch.first_denial(env, caller.run_key, record.agent_id, tool, chain):
            raise Refusal(Reason.RUN_HALTED)
        raise Refusal(Reason.REPEAT_DENIED)
