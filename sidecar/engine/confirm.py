"""Confirmation cards: holding a call for a person's answer, and settling it.

A call whose mode needs confirmation becomes `pending` with a card built by the engine
from the canonical call. A Confirm naming the card's digest settles it, after the call is
judged again against the state as it is now, so a suspension or narrowing in between
still stops it. Who may answer is the chain's (docs/engine.md, "Principals and
confirmation"): with `only_principals_answer_cards`, the card's confirmer alone (a
principal, a deputy it names, or the owner; never an agent), who may also reject it;
otherwise the proposer, its master or the owner.
"""

from __future__ import annotations

from collections.abc import Callable

from quorumgate.proto import limits
from quorumgate.proto.canonical import sha256
from quorumgate.proto.chainversions import only_principals_answer_cards
from quorumgate.proto.model import (
    Confirm,
    Outcome,
    Proposal,
    Reason,
    Tier,
    ToolMode,
    ToolSpec,
    TxKind,
)
from quorumgate.proto.tx import ParsedTx
from quorumgate.sidecar.engine import provenance
from quorumgate.sidecar.engine.arguments import argument_name, check_handle
from quorumgate.sidecar.engine.env import Caller, Env, Refusal, principal_name, rejected
from quorumgate.sidecar.engine.provenance import Exposure
from quorumgate.sidecar.engine.scope import effective_scope, judge_rules, permits
from quorumgate.sidecar.engine.state import AgentRecord, PendingCall
from quorumgate.sidecar.engine.statements import (
    OWNER_PRINCIPAL,
    PRINCIPAL_PREFIX,
    ConfirmationCard,
    Verdict,
    target_digest,
)
from quorumgate.sidecar.engine.targets import split_call

Answer = Callable[[Outcome, Reason], Verdict]


def hold(
    env: Env,
    parsed: ParsedTx,
    caller: Caller,
    proposal: Proposal,
    spec: ToolSpec,
    mode: ToolMode,
    canonical: str,
    flagged: bool,
    links: tuple[str, ...] = (),
    exposure: Exposure | None = None,
) -> ConfirmationCard:
    """Keep the call pending and return its card; Refusal when too many are pending. The
    card says when the run is `exposure`d, and by which call (docs/provenance.md)."""
    state, config = env.state, env.config
    pending = state.pending
    if parsed.tx_id in pending:  # impossible: tx ids are unique per (signer, nonce)
        raise AssertionError("pending proposal id reused")
    mine = state.count("pending", caller.principal)
    if len(pending) >= config.pending_max or mine >= config.pending_per_principal_max:
        raise Refusal(Reason.PENDING_LIMIT)
    handles = tuple(
        sorted(
            (argument_name(arg), arg.handle) for arg in proposal.arguments if arg.handle is not None
        )
    )
    expires = env.now_ms + env.setting("confirmation_ttl_ms")
    # the card names who alone answers it, on chains where no one else may
    answers_alone = only_principals_answer_cards(config.authority_version)
    confirmer = confirmer_of(env, caller.run_owner, mode) if answers_alone else ""
    card = ConfirmationCard(
        chain_id=config.chain_id,
        proposal_id=parsed.tx_id,
        principal=caller.principal,
        tier=caller.tier,
        delegate_of=caller.delegate_of,
        tool=spec.name,
        mode=mode,
        min_tier=spec.min_tier,
        canonical_target=canonical,
        argument_names=tuple(argument_name(arg) for arg in proposal.arguments),
        handles=handles,
        body_digest=sha256(parsed.signed.body),
        created_height=env.height,
        expires_at_ms=expires,
        confirmer=confirmer,
        links=links,
        exposed_by=None if exposure is None else (exposure.height, exposure.tool),
    )
    pending[parsed.tx_id] = PendingCall(
        proposal_id=parsed.tx_id,
        principal=caller.principal,
        run_owner=caller.run_owner,
        run_id=caller.run_id,
        tier=caller.tier,
        grant=proposal.grant,
        tool=spec.name,
        canonical_target=canonical,
        handles=handles,
        flagged=flagged,
        card=card,
        expires_at_ms=expires,
    )
    return card


def confirmer_of(env: Env, run_owner: str, mode: ToolMode) -> str:
    """Who alone answers a card. `owner_confirm`: the owner; `user_confirm`: the principal
    of the run's owner (the agent at the root of the delegation chain: the person the
    whole run acts for), or the owner for an agent registered without one."""
    if mode is ToolMode.OWNER_CONFIRM:
        return OWNER_PRINCIPAL
    principal = env.state.agent_principal.get(run_owner)
    return OWNER_PRINCIPAL if principal is None else PRINCIPAL_PREFIX + principal


def confirm(
    env: Env,
    parsed: ParsedTx,
    confirm: Confirm,
    record: AgentRecord | None,
    principal_id: str | None = None,
) -> Verdict:
    """Settle a pending call: `record` is the signing agent (None for the owner), or
    `principal_id` the signing principal."""
    answers_alone = only_principals_answer_cards(env.config.authority_version)
    pending = env.state.pending.get(confirm.proposal_id)
    if principal_id is not None:
        confirmer = PRINCIPAL_PREFIX + principal_id
    else:
        confirmer = principal_name(record)
    if confirm.reject and not answers_alone:
        return rejected(parsed, Reason.INVALID_SPEC, principal=confirmer)
    if pending is None:
        return rejected(parsed, Reason.UNKNOWN_PROPOSAL, principal=confirmer)
    verdict = _answer_for(env, parsed, pending, confirmer)
    if env.now_ms >= pending.expires_at_ms:
        drop_pending(env, pending.proposal_id)
        return verdict(Outcome.REJECTED, Reason.CONFIRMATION_EXPIRED)
    if answers_alone:
        return _answer(env, pending, confirm, confirmer, verdict)
    return _answer_as_proposer_side(env, pending, confirm, record, verdict)


def _answer_for(env: Env, parsed: ParsedTx, pending: PendingCall, confirmer: str) -> Answer:
    """The verdict of a Confirm for `pending`: it answers for the call it settles."""
    principal_record = env.state.agents[pending.principal]

    def verdict(outcome: Outcome, reason: Reason) -> Verdict:
        return Verdict(
            tx_id=parsed.tx_id,
            kind=TxKind.CONFIRM,
            outcome=outcome,
            reason=reason,
            mandate_version=principal_record.mandate_version,
            principal=pending.principal,
            tier=pending.tier,
            delegate_of=pending.card.delegate_of,
            canonical_target=pending.canonical_target,
            target_digest=target_digest(pending.canonical_target),
            argument_names=pending.argument_names,
            proposal_id=pending.proposal_id,
            card_digest=pending.card.digest,
            subject=confirmer,
        )

    return verdict


def _answer_as_proposer_side(
    env: Env,
    pending: PendingCall,
    confirm: Confirm,
    record: AgentRecord | None,
    verdict: Answer,
) -> Verdict:
    """Chains where the proposer, its master or the owner confirms (`_confirmer_tier`),
    at a tier no lower than the tool's."""
    confirmer_tier = _confirmer_tier(pending, record)
    if confirmer_tier is None:
        return verdict(Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED)
    if confirm.card_digest != pending.card.digest:
        return verdict(Outcome.REJECTED, Reason.CARD_DIGEST_MISMATCH)
    spec = env.state.tools.get(pending.tool)
    min_tier = pending.card.min_tier
    if spec is not None and spec.min_tier.rank > min_tier.rank:
        min_tier = spec.min_tier
    if confirmer_tier.rank < min_tier.rank:
        return verdict(Outcome.REJECTED, Reason.TIER_INSUFFICIENT)
    del env.state.pending[pending.proposal_id]
    return _settle(env, pending, spec, verdict)


def _answer(
    env: Env, pending: PendingCall, confirm: Confirm, confirmer: str, verdict: Answer
) -> Verdict:
    """Only the card's confirmer answers; its answers naming a wrong digest lock the
    proposal at the CARD_WRONG_DIGESTS_MAX-th (others' answers count for nothing, so no
    one else can lock a call out); a reject or a lock takes the card out of the state at
    once."""
    proposal_id = pending.proposal_id
    if not may_answer(env, confirmer, pending.card.confirmer):
        return verdict(Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED)
    if confirm.card_digest != pending.card.digest:
        wrong = env.state.wrong_digests.get(proposal_id, 0) + 1
        if wrong >= limits.CARD_WRONG_DIGESTS_MAX:
            drop_pending(env, proposal_id)
            return verdict(Outcome.DENY, Reason.CARD_LOCKED)
        env.state.wrong_digests[proposal_id] = wrong
        return verdict(Outcome.REJECTED, Reason.CARD_DIGEST_MISMATCH)
    drop_pending(env, proposal_id)
    if confirm.reject:
        return verdict(Outcome.DENY, Reason.CONFIRMATION_REJECTED)
    return _settle(env, pending, env.state.tools.get(pending.tool), verdict)


def _settle(env: Env, pending: PendingCall, spec: ToolSpec | None, verdict: Answer) -> Verdict:
    """The answer for a confirmed call, judged again as the state is now."""
    record = env.state.agents[pending.principal]
    try:
        flagged = _recheck(env, pending, record, spec)
    except Refusal as refusal:
        return verdict(Outcome.DENY, refusal.reason)
    # confirmed: the call may run now, so a tool with untrusted results exposes its run
    # from this height (docs/provenance.md)
    provenance.mark_exposed(
        env, (pending.run_owner, pending.run_id), pending.tool, pending.proposal_id
    )
    if flagged:
        return verdict(Outcome.FLAG, Reason.OUT_OF_SCOPE_OBSERVED)
    return verdict(Outcome.ALLOW, Reason.OK)


def may_answer(env: Env, who: str, card_confirmer: str) -> bool:
    """The card's confirmer, or a principal the card's principal names as its deputy
    (as the state is now: a deputy named or removed later counts from then)."""
    if who == card_confirmer:
        return True
    if not (who.startswith(PRINCIPAL_PREFIX) and card_confirmer.startswith(PRINCIPAL_PREFIX)):
        return False
    named = env.state.principals.get(card_confirmer.removeprefix(PRINCIPAL_PREFIX))
    return named is not None and who.removeprefix(PRINCIPAL_PREFIX) in named.deputies


def drop_pending(env: Env, proposal_id: bytes) -> None:
    del env.state.pending[proposal_id]
    env.state.wrong_digests.pop(proposal_id, None)


def _confirmer_tier(pending: PendingCall, record: AgentRecord | None) -> Tier | None:
    if record is None:
        return Tier.OWNER
    if pending.card.mode is ToolMode.OWNER_CONFIRM:
        return None
    if record.agent_id == pending.principal:
        return pending.tier
    if pending.tier is Tier.DELEGATE and record.agent_id == pending.run_owner:
        return Tier.MASTER  # the master the delegate acts for (the BRAH paper, §6.8)
    return None


def _recheck(env: Env, pending: PendingCall, record: AgentRecord, spec: ToolSpec | None) -> bool:
    """Judge a pending call again at confirmation time (no quota, no latch writes)."""
    run = env.state.latch_runs.get((pending.run_owner, pending.run_id))
    if run is not None and run.halt_chain is not None:
        raise Refusal(Reason.RUN_HALTED)
    if spec is None:
        raise Refusal(Reason.UNKNOWN_TOOL)
    mandate = record.mandate
    if mandate is None:
        raise Refusal(Reason.NO_MANDATE)
    if record.suspended:
        raise Refusal(Reason.SUSPENDED)
    scope, enforce, _, layers = effective_scope(env, record, mandate, pending.grant, pending.run_id)
    flagged = pending.flagged
    target, further_targets = split_call(pending.tool, pending.canonical_target)
    permitted, _ = judge_rules(env, layers, spec, target, None, record.agent_id, further_targets)
    if not (permits(scope, pending.tool) and permitted):
        if enforce:
            raise Refusal(Reason.OUT_OF_SCOPE)
        flagged = True
    for name, handle in pending.handles:
        check_handle(env, record.agent_id, spec, spec.envelope_arg(name), handle)
    return flagged
