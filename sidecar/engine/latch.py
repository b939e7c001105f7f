"""The denial latch: a tool refused in a run stays refused in that run, and a run that
keeps trying is halted (docs/engine.md, "Verdicts and reasons").

A run's buckets are keyed by (agent, canonical tool) and remember the agents of the grant
chain whose scope shaped the refusal; a new mandate version of any of them clears what it
shaped. With split authority a pair refused in enough runs is refused in every run, so a
fresh run id does not reset the latch. Every table here is bounded, and eviction never
lets a flood of one-off refusals push out what is about to latch.
"""

from __future__ import annotations

from quorumgate.proto import limits
from quorumgate.proto.chainversions import latch_across_runs
from quorumgate.proto.model import Reason
from quorumgate.sidecar.engine.env import Caller, Env, Refusal
from quorumgate.sidecar.engine.state import AgentRecord, LatchBucket, LatchRun, RunKey
from quorumgate.sidecar.engine.statements import LatchFact


def touch(env: Env, run_key: RunKey) -> LatchRun | None:
    """The run's latch record, marked active now; None when nothing is latched in it."""
    run = env.state.latch_runs.get(run_key)
    if run is not None:
        env.state.latch_activity_seq += 1
        run.last_active = env.state.latch_activity_seq
    return run


def _run(env: Env, run_key: RunKey) -> LatchRun:
    runs = env.state.latch_runs
    run = runs.get(run_key)
    if run is not None:
        return run
    if len(runs) >= env.config.latch_runs_max:
        # least recently active first; sequence numbers are unique, so no ties
        oldest = min(runs, key=lambda key: runs[key].last_active)
        del runs[oldest]
    env.state.latch_activity_seq += 1
    run = LatchRun(last_active=env.state.latch_activity_seq)
    runs[run_key] = run
    return run


def first_denial(env: Env, run_key: RunKey, agent: str, tool: str, chain: tuple[str, ...]) -> bool:
    """Remember a scope denial. Returns True when it halts the run."""
    run = _run(env, run_key)
    members = tuple(sorted(set(chain)))
    if len(run.buckets) >= env.config.latch_buckets_per_run_max:
        run.halt_chain = members  # a run probing this many refused tools is halted
        env.notes.fact = LatchFact(0, True)
        return True
    bucket = LatchBucket(count=1, chain=members)
    run.buckets[(agent, tool)] = bucket
    if latch_across_runs(env.config.authority_version) and tool in env.state.tools:
        _count_across_runs(env, agent, tool, members)
    halts = bucket.count >= env.setting("latch_halt_threshold")
    env.notes.fact = LatchFact(0, halts)
    if halts:
        run.halt_chain = members
    return halts


def latched_across_runs(env: Env, agent: str, tool: str) -> bool:
    pair = env.state.cross_run.get((agent, tool))
    return pair is not None and pair.count >= env.setting("latch_cross_run_threshold")


def _count_across_runs(env: Env, agent: str, tool: str, members: tuple[str, ...]) -> None:
    """One more run in which (agent, tool) was refused. The table is bounded
    (CROSS_RUN_PAIRS_MAX): when full, the pair refused in the fewest runs goes first
    (then the smallest key), so a flood of one-off refusals cannot evict the pairs that
    are about to latch. Invented tools never reach it (only registered ones)."""
    table = env.state.cross_run
    pair = table.get((agent, tool))
    if pair is not None:
        pair.count += 1
        pair.chain = tuple(sorted(set(pair.chain) | set(members)))
        return
    if len(table) >= limits.CROSS_RUN_PAIRS_MAX:
        del table[min(table, key=lambda key: (table[key].count, key))]
    table[(agent, tool)] = LatchBucket(count=1, chain=members)


def repeat(env: Env, run_key: RunKey, bucket: LatchBucket, chain: tuple[str, ...]) -> bool:
    """A later attempt at a latched tool. Returns True when it halts the run."""
    before = bucket.count
    bucket.count += 1
    bucket.chain = tuple(sorted(set(bucket.chain) | set(chain)))
    halts = bucket.count >= env.setting("latch_halt_threshold")
    env.notes.fact = LatchFact(before, halts)
    if halts:
        env.state.latch_runs[run_key].halt_chain = bucket.chain
    return halts


def note_halted(env: Env, run: LatchRun, agent: str, tool: str | None) -> None:
    """A call refused because its run is halted: its fact is the count the run's bucket
    for this agent and tool holds (0 without one), and halted (docs/audit.md)."""
    bucket = None if tool is None else run.buckets.get((agent, tool))
    env.notes.fact = LatchFact(0 if bucket is None else bucket.count, True)


def clear_agent(env: Env, agent: str) -> None:
    """Drop every bucket whose scope this agent's mandate shaped, and its halts."""
    runs = env.state.latch_runs
    for run_key in sorted(runs):
        run = runs[run_key]
        for bucket_key in sorted(run.buckets):
            if agent in run.buckets[bucket_key].chain:
                del run.buckets[bucket_key]
        if run.halt_chain is not None and agent in run.halt_chain:
            run.halt_chain = None
        if not run.buckets and run.halt_chain is None:
            del runs[run_key]
    cross_run = env.state.cross_run
    for pair in sorted(cross_run):
        if agent in cross_run[pair].chain:
            del cross_run[pair]


def probe_denial(
    env: Env,
    caller: Caller,
    record: AgentRecord,
    tool: str,
    chain: tuple[str, ...] | None = None,
) -> None:
    """A call that probes what it may not know (an invented tool, another principal's
    target, a handle not its own; on chains where that `probes_latch`) counts toward the
    latch like a scope denial, so a run that keeps probing is halted. Raises unless it is
    the first such denial of this tool in the run (the caller then raises its reason); a
    later one is `repeat_denied`."""
    members = chain if chain is not None else (record.agent_id,)
    run = env.state.latch_runs.get(caller.run_key)
    bucket = None if run is None else run.buckets.get((record.agent_id, tool))
    if bucket is not None:
        if repeat(env, caller.run_key, bucket, members):
            raise Refusal(Reason.RUN_HALTED)
        raise Refusal(Reason.REPEAT_DENIED)
    if first_denial(env, caller.run_key, record.agent_id, tool, members):
        raise Refusal(Reason.RUN_HALTED)


def scope_denial(
    env: Env, caller: Caller, record: AgentRecord, tool: str, chain: tuple[str, ...]
) -> None:
    """A scope denial under enforce: latched; always raises."""
    if first_denial(env, caller.run_key, record.agent_id, tool, chain):
        raise Refusal(Reason.RUN_HALTED)
    raise Refusal(Reason.OUT_OF_SCOPE)
