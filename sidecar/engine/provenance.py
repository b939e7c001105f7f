"""What a run has taken in, and what its principal said it is about (docs/provenance.md).

A tool registered with `untrusted_results` returns content nobody vouches for: a web page,
outside mail, a channel message, an uploaded file. The run in which a call of such a tool
is allowed becomes *exposed*, at that call's height, and stays exposed: from then on a
target rule's `when_exposed` mode applies to its calls (sidecar/engine/rules.py). The
point is the verdict that lets the call run (an `allow` or `flag` at proposal, or the
confirmation that settles its card), because that is the first committed fact after
which a certificate exists and the content may reach the agent; the engine never learns
whether the tool did run, so it counts a call that could have run (the safe direction).

A run is keyed by (run owner, run id), and a delegate under a grant acts in its
delegator's run: the run's exposure is one fact for every agent of the chain, whichever
of them took the content in, before or after the grant (docs/provenance.md,
"Delegation").

A run's own targets (`SetRunTargets`, signed by the run owner's principal, a deputy it
names, or the owner; never an agent) are judged as in a clean run: exposure adds nothing
to them, and nothing else changes (a target no rule matches stays out of scope).

The table of runs is bounded (RUN_RECORDS_MAX); when full, the record written least
recently goes first, and its owner's *floor* rises to that run's opening nonce: every run
of the owner opened at or below the floor counts as exposed and has no own targets, so
forgetting never makes a run cleaner or wider than it was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quorumgate.proto.chainversions import run_scoped_targets, runs_carry_provenance
from quorumgate.proto.model import (
    Admin,
    Delegate,
    Reason,
    RegisterTool,
    SetMandate,
    SetRunTargets,
    ToolRules,
    TxPayload,
)
from quorumgate.proto.runs import opened_run
from quorumgate.sidecar.engine.env import Env
from quorumgate.sidecar.engine.state import RunKey, RunRecord
from quorumgate.sidecar.engine.targets import TargetRefused, canonicalize_target

# Runs whose exposure or own targets the state keeps at once; past it the least recently
# written record goes (and its owner's floor rises, see the module docstring).
RUN_RECORDS_MAX = 16_384
# What a card says for a run exposed through its owner's floor (its record was evicted).
EVICTED_TOOL = "-"


@dataclass(frozen=True)
class Exposure:
    """Why a run counts as exposed: the height and tool of the call that exposed it (or
    EVICTED_TOOL and 0 when only the owner's floor remembers it)."""

    height: int
    tool: str


def exposure(env: Env, run_key: RunKey) -> Exposure | None:
    """The run's exposure on chains with provenance, else None (never exposed)."""
    if not runs_carry_provenance(env.config.authority_version):
        return None
    record = env.state.runs.get(run_key)
    if record is not None and record.exposed_height is not None:
        return Exposure(record.exposed_height, record.exposed_tool)
    if _below_floor(env, run_key):
        return Exposure(0, EVICTED_TOOL)
    return None


def run_targets(env: Env, run_key: RunKey) -> frozenset[str]:
    """The run's own canonical targets (none on chains without them)."""
    if not run_scoped_targets(env.config.authority_version) or _below_floor(env, run_key):
        return frozenset()
    record = env.state.runs.get(run_key)
    return frozenset() if record is None else frozenset(record.targets)


def _below_floor(env: Env, run_key: RunKey) -> bool:
    floor = env.state.run_floors.get(run_key[0])
    nonce = opened_run(run_key[1])
    return floor is not None and (nonce is None or nonce <= floor)


def mark_exposed(env: Env, run_key: RunKey, tool: str, proposal_id: bytes) -> None:
    """A call of `tool` was allowed in the run: the run is exposed from this height, if
    the tool's results are untrusted and the run was clean (the first exposure is kept)."""
    if not runs_carry_provenance(env.config.authority_version):
        return
    spec = env.state.tools.get(tool)
    if spec is None or not spec.untrusted_results or exposure(env, run_key) is not None:
        return
    record = env.state.runs.get(run_key) or RunRecord()
    _put(
        env,
        run_key,
        replace(record, exposed_height=env.height, exposed_tool=tool, exposed_proposal=proposal_id),
    )


def set_targets(env: Env, run_key: RunKey, targets: tuple[str, ...]) -> None:
    """Replace the run's own targets (already canonical); none and a clean run drops the
    record."""
    record = env.state.runs.get(run_key) or RunRecord()
    if not targets and record.exposed_height is None:
        env.state.runs.pop(run_key, None)
        return
    _put(env, run_key, replace(record, targets=targets))


def _put(env: Env, run_key: RunKey, record: RunRecord) -> None:
    runs = env.state.runs
    if run_key not in runs and len(runs) >= RUN_RECORDS_MAX:
        # least recently written first; the key breaks ties, so every sidecar picks alike
        oldest = min(runs, key=lambda key: (runs[key].touched_height, key))
        del runs[oldest]
        nonce = opened_run(oldest[1]) or 0
        floors = env.state.run_floors
        floors[oldest[0]] = max(floors.get(oldest[0], 0), nonce)
    runs[run_key] = replace(record, touched_height=env.height)


def canonical_run_targets(env: Env, op: SetRunTargets) -> tuple[str, ...] | None:
    """The run's targets in canonical form (each under its own scheme, a path as `file`,
    `CURRENT_USER` bound to the run's owner), sorted and each once; None when one has no
    canonical form."""
    out: set[str] = set()
    for value in op.targets:
        scheme = "file" if value.startswith("/") else value.partition(":")[0].lower()
        try:
            out.add(
                canonicalize_target(
                    value,
                    principal=op.agent_id,
                    schemes=(scheme,),
                    version=env.config.canonical_version,
                )
            )
        except TargetRefused:
            return None
    return tuple(sorted(out))


def apply_run_targets(env: Env, op: SetRunTargets, principal_id: str | None) -> Reason | None:
    """Name a run's own targets, signed by `principal_id` (None: the owner); why not, or
    None once applied. Only the run owner's principal or a deputy it names (or the owner)
    may: an agent, even the run's own, never widens what its exposed run calls directly.
    Refused: an unknown agent, a run id that names no opened run (`n<nonce>`,
    proto/runs.py), a run forgotten below its owner's floor, a target without a canonical
    form (`malformed_target`)."""
    if op.agent_id not in env.state.agents:
        return Reason.UNKNOWN_AGENT
    if principal_id is not None and not _answers_for(env, principal_id, op.agent_id):
        return Reason.NOT_RUN_PRINCIPAL
    run_key = (op.agent_id, op.run_id)
    if opened_run(op.run_id) is None or _below_floor(env, run_key):
        return Reason.INVALID_SPEC
    targets = canonical_run_targets(env, op)
    if targets is None:
        return Reason.MALFORMED_TARGET
    set_targets(env, run_key, targets)
    return None


def _answers_for(env: Env, principal_id: str, agent_id: str) -> bool:
    """The agent's principal, or a deputy that principal names (as the state is now)."""
    own = env.state.agent_principal.get(agent_id)
    if own is None:
        return False
    if own == principal_id:
        return True
    record = env.state.principals.get(own)
    return record is not None and principal_id in record.deputies


def uses_provenance(payload: TxPayload) -> bool:
    """Whether a transaction says anything only chains with provenance read: a tool with
    `untrusted_results`, a rule with `when_exposed`, a SetRunTargets. On other chains such
    a transaction is malformed, as it was before these fields existed (its body held a
    field the decoder did not know)."""
    if isinstance(payload, Delegate):
        return _rules_use_exposure(payload.rules)
    if not isinstance(payload, Admin):
        return False
    op = payload.op
    if isinstance(op, RegisterTool):
        return op.spec.untrusted_results
    if isinstance(op, SetMandate):
        return _rules_use_exposure(op.mandate.rules)
    return isinstance(op, SetRunTargets)


def _rules_use_exposure(rules: tuple[ToolRules, ...]) -> bool:
    return any(rule.when_exposed is not None for entry in rules for rule in entry.targets)
